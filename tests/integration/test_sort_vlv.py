"""Server-side sorting (RFC 2891) and virtual list views
(draft-ietf-ldapext-ldapv3-vlv-09): the same sorted searches and windows
against Pando and against slapd with its sssvlv overlay, holding the same
entries; then what slapd does not decide for us (criticality, access,
limits), against the RFC."""

import random
import shutil
from pathlib import Path

import pytest

import ber
from conftest import SUFFIX, Pando, ldif_entry, server_with
from test_differential import SLAPD, SLAPADD, Slapd

HAVE_SLAPD = Path(SLAPD).exists() and Path(SLAPADD).exists()
pytestmark = pytest.mark.skipif(not shutil.which("ldapsearch"), reason="ldap-utils not installed")

PEOPLE = "ou=People," + SUFFIX
SORT_REQ, SORT_RESP = "1.2.840.113556.1.4.473", "1.2.840.113556.1.4.474"
VLV_REQ, VLV_RESP = "2.16.840.1.113730.3.4.9", "2.16.840.1.113730.3.4.10"
N = 240

CONFIG = """
[limits]
max_sort_entries = 250

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "auth" }]

[[access]]
attrs = ["employeeNumber"]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = ["search"] }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }, { who = "*", rights = "read" }]
"""


def people():
    rnd = random.Random(2891)
    given = ["Ana", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal"]
    out = [(PEOPLE, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"]})]
    for i in range(N):
        uid = "u%04d" % rnd.randrange(10000) + "x%03d" % i
        a = {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
             "uid": [uid], "cn": [uid], "sn": ["Sn%02d" % rnd.randrange(40)],
             "givenName": [given[i % len(given)]], "employeeNumber": [str(rnd.randrange(1000))]}
        if i % 5 == 0:
            a["description"] = ["desc %03d" % rnd.randrange(1000)]
        if i == 7:
            a["userPassword"] = ["reader-secret"]
        out.append(("uid=%s,%s" % (uid, PEOPLE), a))
    return out


def reader_dn():
    return people()[8][0]


class SlapdSss(Slapd):
    """slapd with the sssvlv overlay on its database."""

    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        text = conf.read_text().replace("moduleload back_mdb", "moduleload back_mdb\nmoduleload sssvlv")
        conf.write_text(text + "overlay sssvlv\n")


@pytest.fixture(scope="module")
def pando(tmp_path_factory):
    s = server_with(tmp_path_factory.mktemp("sort"), "pando-sort", CONFIG, people())
    yield s
    s.stop_and_verify()


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    if not HAVE_SLAPD or not Path("/usr/lib/ldap/sssvlv.la").exists():
        pytest.skip("slapd or its sssvlv overlay not installed")
    base = tmp_path_factory.mktemp("sort-slapd")
    top = (SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"], "o": ["example"]})
    full = base / "full.ldif"
    full.write_text("\n".join(ldif_entry(dn, a) for dn, a in [top] + people()))
    s = SlapdSss(base / "slapd")
    s.load(full)
    s.start()
    yield s
    s.stop()


# ------------------------------------------------------------ BER helpers


def sort_value(keys):
    """keys: [(attr, rule or None, reverse)]."""
    items = []
    for attr, rule, reverse in keys:
        parts = ber.octets(attr)
        if rule:
            parts += ber.octets(rule, tag=0x80)
        if reverse:
            parts += ber.boolean(True, tag=0x81)
        items.append(ber.seq(parts))
    return ber.seq(*items)


def vlv_value(before, after, offset=None, count=0, value=None):
    target = (ber.octets(value, tag=0x81) if value is not None
              else ber.seq(ber.integer(offset), ber.integer(count), tag=0xA0))
    return ber.seq(ber.integer(before), ber.integer(after), target)


def ints(body):
    return [int.from_bytes(v, "big", signed=True) for _, v in ber.children(body, 0, len(body))]


def decode_sort_response(raw):
    _, s, e = ber.read_tlv(raw, 0)
    parts = ber.children(raw, s, e)
    return int.from_bytes(parts[0][1], "big"), (parts[1][1].decode() if len(parts) > 1 else None)


def decode_vlv_response(raw):
    _, s, e = ber.read_tlv(raw, 0)
    parts = ber.children(raw, s, e)
    return tuple(int.from_bytes(v, "big") for _, v in parts[:3])


def search(server, controls, filt="(objectClass=inetOrgPerson)", attrs=("sn",), user=None, size=0):
    """(result code, [dn], {oid: raw control value})."""
    import ldap3
    if user:
        c = server.conn(user=user[0], password=user[1]) if isinstance(server, Pando) else None
    else:
        c = server.conn()
    c.search(PEOPLE, filt, search_scope=ldap3.LEVEL, attributes=list(attrs),
             controls=controls, size_limit=size)
    dns = [e["dn"] for e in c.response if e["type"] == "searchResEntry"]
    ctrls = {oid: v.get("value") for oid, v in (c.result.get("controls") or {}).items()}
    raw = {}
    for oid, v in ctrls.items():
        raw[oid] = v if isinstance(v, (bytes, bytearray)) else v
    c.unbind()
    return c.result["result"], dns, raw


def raw_search(server, controls):
    """For result codes ldap3 cannot name (60, 76): (code, entries, {oid: value})."""
    with ber.Conn("127.0.0.1", server.port) as c:
        assert ber.simple_bind(c, server.admin_dn, server.admin_pw) == 0
        ctrls = [ber.control(oid, crit, value) for oid, crit, value in controls]
        op = ber.search_op(PEOPLE, scope=1, filt=ber.f_eq("objectClass", "inetOrgPerson"), attrs=["1.1"])
        c.send(ber.message(2, op, ctrls))
        entries = 0
        while True:
            m = c.recv_msg()
            if m["op"] == "entry":
                entries += 1
                continue
            got = {}
            if m["controls"]:
                for _, ctl in ber.children(m["controls"], 0, len(m["controls"])):
                    parts = ber.children(ctl, 0, len(ctl))
                    got[parts[0][1].decode()] = parts[-1][1]
            return m["code"], entries, got


def sorted_search(server, keys, critical=False, **kw):
    return search(server, [(SORT_REQ, critical, sort_value(keys))], **kw)


def vlv_search(server, keys, before, after, **target):
    controls = [(SORT_REQ, False, sort_value(keys)), (VLV_REQ, False, vlv_value(before, after, **target))]
    return search(server, controls)


# ------------------------------------------------------------ differential

SORTS = [
    [("uid", "caseIgnoreOrderingMatch", False)],
    [("uid", "caseIgnoreOrderingMatch", True)],
    [("sn", "caseIgnoreOrderingMatch", False), ("uid", "caseIgnoreOrderingMatch", True)],
    [("givenName", "caseIgnoreOrderingMatch", True), ("sn", "caseIgnoreOrderingMatch", False),
     ("uid", "caseIgnoreOrderingMatch", False)],
    [("description", "caseIgnoreOrderingMatch", False), ("uid", "caseIgnoreOrderingMatch", False)],
    [("description", "caseIgnoreOrderingMatch", True), ("uid", "caseIgnoreOrderingMatch", False)],
]


@pytest.mark.parametrize("keys", SORTS, ids=["uid", "-uid", "sn,-uid", "-givenName,sn,uid", "description", "-description"])
def test_sorted_like_slapd(pando, slapd, keys):
    p = sorted_search(pando, keys)
    s = sorted_search(slapd, keys)
    assert p[0] == s[0] == 0
    assert len(p[1]) == N
    assert [d.lower() for d in p[1]] == [d.lower() for d in s[1]]
    assert decode_sort_response(p[2][SORT_RESP]) == (0, None)


WINDOWS = [
    dict(before=0, after=4, offset=1, count=0),
    dict(before=2, after=3, offset=100, count=0),
    dict(before=5, after=5, offset=N, count=0),
    dict(before=1, after=1, offset=10, count=N // 2),
    dict(before=1, after=1, offset=10, count=N * 2),
    dict(before=3, after=2, value=b"u5"),
    dict(before=1, after=1, value=b"zzz"),
    dict(before=0, after=0, offset=0, count=0),
]


@pytest.mark.parametrize("window", WINDOWS, ids=[str(i) for i in range(len(WINDOWS))])
def test_vlv_windows_like_slapd(pando, slapd, window):
    keys = [("uid", "caseIgnoreOrderingMatch", False)]
    p = vlv_search(pando, keys, **window)
    s = vlv_search(slapd, keys, **window)
    assert p[0] == s[0] == 0, (p[0], s[0])
    assert [d.lower() for d in p[1]] == [d.lower() for d in s[1]]
    pv, sv = decode_vlv_response(p[2][VLV_RESP]), decode_vlv_response(s[2][VLV_RESP])
    assert pv == sv, (pv, sv)


def test_vlv_offset_past_the_end(pando, slapd):
    keys = [("uid", "caseIgnoreOrderingMatch", False)]
    controls = [(SORT_REQ, False, sort_value(keys)), (VLV_REQ, False, vlv_value(0, 1, offset=N + 5, count=0))]
    p, s = raw_search(pando, controls), raw_search(slapd, controls)
    assert p[0] == s[0] == 76 and p[1] == s[1] == 0
    # The VLV result is offsetRangeError: 61 in the draft Pando follows,
    # 77 in the older draft slapd follows.
    assert decode_vlv_response(p[2][VLV_RESP])[2] == 61


def test_paged_sorted_pages_concatenate(pando, slapd):
    """Sort with paged results: the pages, in turn, are the sorted list."""
    import ldap3
    keys = [("sn", "caseIgnoreOrderingMatch", False), ("uid", "caseIgnoreOrderingMatch", False)]
    whole = sorted_search(pando, keys)[1]
    for server in (pando, slapd):
        c = server.conn()
        got, cookie = [], None
        for _ in range(20):
            c.search(PEOPLE, "(objectClass=inetOrgPerson)", search_scope=ldap3.LEVEL, attributes=["sn"],
                     paged_size=50, paged_cookie=cookie, controls=[(SORT_REQ, False, sort_value(keys))])
            assert c.result["result"] == 0, c.result
            got += [e["dn"].lower() for e in c.response if e["type"] == "searchResEntry"]
            cookie = c.result["controls"]["1.2.840.113556.1.4.319"]["value"]["cookie"]
            if not cookie:
                break
        c.unbind()
        assert got == [d.lower() for d in whole], server


# ------------------------------------------------------------ Pando against the RFC


def test_attributes_without_ordering_rule_sort_by_their_equality(pando):
    """cn has no ORDERING in the standard schema: a non-critical sort by it
    is sorted as its equality rule compares (slapd refuses with
    inappropriateMatching); a critical one is refused (test_hostile_search)."""
    code, dns, ctrls = sorted_search(pando, [("cn", None, False)])
    assert code == 0 and decode_sort_response(ctrls[SORT_RESP]) == (0, None)
    uids = [d.split(",")[0][4:] for d in dns]
    assert uids == sorted(uids, key=str.lower)


def test_unsortable_by_criticality(pando):
    # Unknown attribute: non-critical → unsorted results, sortResult 16.
    code, dns, ctrls = sorted_search(pando, [("noSuchAttr", None, False)])
    assert code == 0 and len(dns) == N
    assert decode_sort_response(ctrls[SORT_RESP]) == (16, "noSuchAttr")
    # Critical: unavailableCriticalExtension, no entries, the reason in the control.
    code, dns, ctrls = sorted_search(pando, [("noSuchAttr", None, False)], critical=True)
    assert code == 12 and dns == []
    assert decode_sort_response(ctrls[SORT_RESP])[0] == 16
    # No ordering at all (objectClass: OID equality), or a bad rule:
    # inappropriateMatching itself, as slapd answers (test_hostile_search).
    code, _, ctrls = sorted_search(pando, [("objectClass", None, False)], critical=True)
    assert code == 18 and decode_sort_response(ctrls[SORT_RESP])[0] == 18
    code, _, ctrls = sorted_search(pando, [("sn", "caseIgnoreMatch", False)], critical=True)
    assert code == 18 and decode_sort_response(ctrls[SORT_RESP])[0] == 18


def test_vlv_needs_sort(pando):
    code, entries, _ = raw_search(pando, [(VLV_REQ, False, vlv_value(0, 1, offset=1))])
    assert code == 60 and entries == 0


def test_sort_limit(pando):
    """More matches than limits.max_sort_entries (250 here): refused."""
    rc, _, err = pando.ldap("ldapadd", input="\n".join(
        ldif_entry("cn=extra%02d,%s" % (i, PEOPLE), {"objectClass": ["person"], "cn": ["extra%02d" % i], "sn": ["X"]})
        for i in range(15)))
    assert rc == 0, err
    try:
        code, dns, ctrls = sorted_search(pando, [("sn", None, False)], filt="(objectClass=person)")
        assert code == 11 and dns == []
        assert decode_sort_response(ctrls[SORT_RESP])[0] == 11
    finally:
        for i in range(15):
            pando.ldap("ldapdelete", "cn=extra%02d,%s" % (i, PEOPLE))


def test_unreadable_sort_keys_sort_as_absent(pando):
    """A user who may search but not read employeeNumber gets entries in an
    order that reveals nothing about it: as if every entry lacked it."""
    reader = (reader_dn(), "reader-secret")
    keys = [("employeeNumber", None, False)]
    code, as_reader, _ = sorted_search(pando, keys, user=reader)
    assert code == 0
    code, by_id, _ = search(pando, [], user=reader)
    assert as_reader == by_id  # all keys absent: ties in entry order
    code, as_admin, _ = sorted_search(pando, keys)
    assert as_admin != by_id


def test_sort_with_size_limit(pando):
    keys = [("uid", None, False)]
    whole = sorted_search(pando, keys)[1]
    code, dns, _ = sorted_search(pando, keys, size=7)
    assert code == 4 and dns == whole[:7]


def test_ldapsearch_sss_and_vlv(pando):
    """The ldap-utils spellings work as documented in the README."""
    rc, out, err = pando.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "-s", "one", "-E",
                              "!sss=-sn:caseIgnoreOrderingMatch/uid:caseIgnoreOrderingMatch",
                              "(objectClass=inetOrgPerson)", "sn")
    assert rc == 0, err
    sns = [l[4:] for l in out.splitlines() if l.startswith("sn: ")]
    assert sns == sorted(sns, reverse=True)
    rc, out, err = pando.ldap("ldapsearch", "-b", PEOPLE, "-s", "one", "-E", "sss=uid", "-E", "vlv=1/2/5/0",
                              "(objectClass=inetOrgPerson)", "1.1", input="")
    assert "vlvResult: pos=5 count=%d" % N in out, out + err


@pytest.mark.skipif(not shutil.which("java"), reason="no Java runtime")
def test_jndi_sorted_pages(pando):
    """javax.naming.ldap's SortControl with PagedResultsControl, both
    critical, as Java address books send them: pages in sn order."""
    import subprocess
    src = Path(__file__).parent / "java" / "SortedPages.java"
    r = subprocess.run(["java", str(src), pando.url, pando.admin_dn, pando.admin_pw, PEOPLE,
                        "(objectClass=inetOrgPerson)", "uid", "100"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    dns = [l[4:] for l in r.stdout.splitlines() if l.startswith("dn: ")]
    assert [d.lower() for d in dns] == [d.lower() for d in sorted_search(pando, [("uid", None, False)])[1]]
    assert r.stdout.count("page: ") == 3  # 240 entries, 100 a page
    assert set(l for l in r.stdout.splitlines() if l.startswith("sort: ")) == {"sort: 0"}


def test_scrolling_sees_changes(pando):
    """Sorted lists are reused while the store does not change (a client
    scrolling a VLV): a change in between is seen by the next window."""
    keys = [("uid", None, False)]
    first = vlv_search(pando, keys, 0, 2, offset=1, count=0)
    again = vlv_search(pando, keys, 0, 2, offset=1, count=0)
    assert first[1] == again[1] and first[0] == 0
    new = "uid=a0000," + PEOPLE
    rc, _, err = pando.ldap("ldapadd", input=ldif_entry(new, {
        "objectClass": ["inetOrgPerson"], "uid": ["a0000"], "cn": ["a"], "sn": ["A"]}))
    assert rc == 0, err
    try:
        code, dns, ctrls = vlv_search(pando, keys, 0, 2, offset=1, count=0)
        assert code == 0 and dns[0].lower() == new.lower(), dns
        assert decode_vlv_response(ctrls[VLV_RESP])[1] == N + 1
    finally:
        pando.ldap("ldapdelete", new)
    code, dns, ctrls = vlv_search(pando, keys, 0, 2, offset=1, count=0)
    assert dns == first[1] and decode_vlv_response(ctrls[VLV_RESP])[1] == N
