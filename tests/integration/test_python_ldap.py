"""python-ldap (the `ldap` module, a binding of OpenLDAP's libldap) against
Pando: the python-ldap entry of the real-client matrix.

Proved here, with the requests libldap encodes and python-ldap's decoding
of the answers: simple binds (INVALID_CREDENTIALS for a wrong password,
an unknown DN or a user without a password; UNWILLING_TO_PERFORM for a DN
with an empty password), whoami_s, search_s with filters and attribute
lists, search_ext with SimplePagedResultsControl through every page,
size limits, add_s, modify_s (MOD_ADD, MOD_REPLACE, MOD_DELETE of values
and of whole attributes, atomic failure), rename_s (in place, keeping the
old RDN value, to a new superior), delete_s, compare_s, passwd_s with a
generated password, error results mapped to python-ldap's exceptions with
the matched DN, server-side sorting (ldap.controls.sss) alone and with
paging, the read-entry and assertion controls, several operations
outstanding on one connection, and StartTLS and ldaps:// with the CA
checked (binds refused before StartTLS where the server requires it).
test_passwd_modify.py has passwd_s('', old, new) against slapd."""

import hashlib
import ssl
from pathlib import Path

import pytest

from conftest import PUBLIC_READ, SUFFIX, have, make_server

ldap = pytest.importorskip("ldap", reason="python-ldap (import ldap) is not installed")
import ldap.modlist  # noqa: E402
from ldap.controls import SimplePagedResultsControl  # noqa: E402
from ldap.controls.libldap import AssertionControl  # noqa: E402
from ldap.controls.readentry import PostReadControl, PreReadControl  # noqa: E402

try:
    from ldap.controls.sss import SSSRequestControl, SSSResponseControl
except ImportError:  # python-ldap built without pyasn1 support for it
    SSSRequestControl = SSSResponseControl = None

PY = "ou=PyLdap," + SUFFIX
WRITES = "ou=PyWrites," + SUFFIX
ARCHIVE = "ou=PyArchive," + SUFFIX
SNS = ["Nguyen", "adams", "Baker", "Adams", "clark", "Diaz", "evans", "Baker", "Foster", "garcia",
       "Hill", "irwin", "Jones", "kim", "Lopez", "moore", "Nash"]
PASSWORDS = {"p00": "p00-secret", "p02": "p02-secret", "p03": "p03-secret"}
PERSON = [b"top", b"person", b"organizationalPerson", b"inetOrgPerson"]


def pdn(uid, parent=PY):
    return "uid=%s,%s" % (uid, parent)


def entries():
    out = [(PY, {"objectClass": ["top", "organizationalUnit"], "ou": ["PyLdap"]})]
    for i, sn in enumerate(SNS):
        uid = "p%02d" % i
        a = {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
             "uid": [uid], "cn": ["Py " + uid], "sn": [sn], "mail": [uid + "@example.com"],
             "employeeNumber": [str(2 ** i)]}  # lexical and numeric orders differ
        if uid in PASSWORDS:
            a["userPassword"] = [PASSWORDS[uid]]
        out.append((pdn(uid), a))
    for ou in (WRITES, ARCHIVE):
        out.append((ou, {"objectClass": ["top", "organizationalUnit"], "ou": [ou[3:].split(",")[0]]}))
    return out


@pytest.fixture(scope="module")
def srv(demo_server):
    demo_server.bulk_add(entries())
    return demo_server


def connect(url, bind=None):
    """A python-ldap connection with every wait bounded; bind: (dn, password) or None."""
    c = ldap.initialize(url)
    c.set_option(ldap.OPT_PROTOCOL_VERSION, 3)
    c.set_option(ldap.OPT_NETWORK_TIMEOUT, 10)
    c.set_option(ldap.OPT_TIMEOUT, 30)
    c.set_option(ldap.OPT_REFERRALS, 0)
    if bind:
        c.simple_bind_s(*bind)
    return c


@pytest.fixture(scope="module")
def admin(srv):
    c = connect(srv.url, (srv.admin_dn, srv.admin_pw))
    yield c
    c.unbind_s()


def read(c, dn, attrs=("*",)):
    """{lower-case name: [str values]} of one entry."""
    res = c.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", list(attrs))
    assert len(res) == 1, "base search of %s returned %r" % (dn, res)
    return {k.lower(): [v.decode("utf-8") for v in vs] for k, vs in res[0][1].items()}


def failure(exc, f, *args, **kw):
    """Call f expecting the python-ldap exception exc; its result dict."""
    with pytest.raises(exc) as e:
        f(*args, **kw)
    return e.value.args[0]


def person_modlist(uid, sn="Writer", extra=None):
    a = {"objectClass": PERSON, "uid": [uid.encode()], "cn": [("Py " + uid).encode()], "sn": [sn.encode()]}
    a.update(extra or {})
    return ldap.modlist.addModlist(a)


# ------------------------------------------------------------------ bind and whoami


def test_simple_bind_and_whoami(srv):
    c = connect(srv.url)
    assert c.whoami_s() == "", "anonymous whoami"
    c.simple_bind_s(srv.admin_dn, srv.admin_pw)
    assert c.whoami_s().lower() == "dn:" + srv.admin_dn.lower()
    c.simple_bind_s(pdn("p00"), PASSWORDS["p00"])
    assert c.whoami_s().lower() == "dn:" + pdn("p00").lower()
    c.unbind_s()


@pytest.mark.parametrize("who,password", [
    (pdn("p00"), "wrong"),            # wrong password
    (pdn("ghost"), "p00-secret"),     # no such entry
    (pdn("p01"), "anything"),         # an entry without userPassword
    ("uid=p00,ou=Nowhere," + SUFFIX, "p00-secret"),
])
def test_failed_simple_binds_are_invalid_credentials(srv, who, password):
    c = connect(srv.url)
    info = failure(ldap.INVALID_CREDENTIALS, c.simple_bind_s, who, password)
    assert info["result"] == 49 and "matched" not in info, info
    # The connection is anonymous again, and usable.
    assert c.whoami_s() == ""
    c.unbind_s()


def test_dn_with_an_empty_password_is_an_unauthenticated_bind_refused(srv):
    c = connect(srv.url)
    info = failure(ldap.UNWILLING_TO_PERFORM, c.simple_bind_s, pdn("p00"), "")
    assert info["result"] == 53, info
    c.unbind_s()


# ------------------------------------------------------------------ search


def test_search_s_with_filter_and_attribute_list(admin):
    res = admin.search_s(SUFFIX, ldap.SCOPE_SUBTREE, "(&(objectClass=inetOrgPerson)(sn=ADAMS))", ["uid", "sn"])
    got = sorted((dn.lower(), sorted(a.items())) for dn, a in res)
    assert got == [(pdn("p01").lower(), [("sn", [b"adams"]), ("uid", [b"p01"])]),
                   (pdn("p03").lower(), [("sn", [b"Adams"]), ("uid", [b"p03"])])], res
    # attrsonly: names without values.
    res = admin.search_s(pdn("p04"), ldap.SCOPE_BASE, "(objectClass=*)", ["sn", "mail"], attrsonly=1)
    assert [(d.lower(), a) for d, a in res] == [(pdn("p04").lower(), {"sn": [], "mail": []})], res
    # Substring, presence, equality and negation in one filter.
    res = admin.search_s(PY, ldap.SCOPE_ONELEVEL, "(&(cn=py p1*)(mail=*)(!(|(uid=p13)(sn=Hill))))", ["uid"])
    assert sorted(a["uid"][0].decode() for _, a in res) == ["p11", "p12", "p14", "p15", "p16"], res


def test_search_ext_paged_through_every_page(admin):
    ctrl = SimplePagedResultsControl(True, size=5, cookie=b"")
    pages = []
    for _ in range(20):
        msgid = admin.search_ext(PY, ldap.SCOPE_ONELEVEL, "(objectClass=inetOrgPerson)", ["uid"],
                                 serverctrls=[ctrl])
        rtype, data, _, rctrls = admin.result3(msgid, timeout=30)
        assert rtype == ldap.RES_SEARCH_RESULT, rtype
        pages.append([a["uid"][0].decode() for _, a in data])
        paged = [x for x in rctrls if x.controlType == SimplePagedResultsControl.controlType]
        assert len(paged) == 1, "no paged results response control on page %d: %r" % (len(pages), rctrls)
        if not paged[0].cookie:
            break
        ctrl.cookie = paged[0].cookie
    assert [len(p) for p in pages] == [5, 5, 5, 2], pages
    assert sorted(u for p in pages for u in p) == ["p%02d" % i for i in range(len(SNS))], pages


def test_paged_search_abandoned_with_size_zero(admin):
    """RFC 2696: a request of size 0 with the cookie ends the paged search."""
    ctrl = SimplePagedResultsControl(True, size=3, cookie=b"")
    msgid = admin.search_ext(PY, ldap.SCOPE_ONELEVEL, "(objectClass=inetOrgPerson)", ["uid"], serverctrls=[ctrl])
    _, data, _, rctrls = admin.result3(msgid, timeout=30)
    assert len(data) == 3, data
    cookie = rctrls[0].cookie
    assert cookie, rctrls
    msgid = admin.search_ext(PY, ldap.SCOPE_ONELEVEL, "(objectClass=inetOrgPerson)", ["uid"],
                             serverctrls=[SimplePagedResultsControl(True, size=0, cookie=cookie)])
    rtype, data, _, rctrls = admin.result3(msgid, timeout=30)
    assert rtype == ldap.RES_SEARCH_RESULT and data == [], data
    assert [x.cookie for x in rctrls if x.controlType == SimplePagedResultsControl.controlType] == [b""], rctrls


def test_size_limit_returns_the_entries_then_sizelimit_exceeded(admin):
    msgid = admin.search_ext(PY, ldap.SCOPE_ONELEVEL, "(objectClass=inetOrgPerson)", ["uid"], sizelimit=4)
    got = []
    with pytest.raises(ldap.SIZELIMIT_EXCEEDED) as e:
        for _ in range(50):
            rtype, data = admin.result(msgid, all=0, timeout=30)
            assert rtype == ldap.RES_SEARCH_ENTRY, (rtype, data)
            got += data
    assert len(got) == 4 and e.value.args[0]["result"] == 4, (got, e.value.args)


def test_operations_outstanding_together_on_one_connection(admin):
    ids = {uid: admin.search_ext(pdn(uid), ldap.SCOPE_BASE, "(objectClass=*)", ["sn"]) for uid in ("p05", "p06", "p07")}
    cmp_id = admin.compare_ext(pdn("p08"), "sn", b"Foster")
    # Collected in another order than sent.
    with pytest.raises(ldap.COMPARE_TRUE):
        admin.result(cmp_id, timeout=30)
    for uid in ("p07", "p05", "p06"):
        _, data = admin.result(ids[uid], timeout=30)
        assert [a["sn"] for _, a in data] == [[SNS[int(uid[1:])].encode()]], (uid, data)


# ------------------------------------------------------------------ compare


def test_compare_s_true_false_and_errors(admin):
    assert admin.compare_s(pdn("p02"), "sn", b"BAKER") is True
    assert admin.compare_s(pdn("p02"), "sn", b"Bake") is False
    assert admin.compare_s(pdn("p02"), "employeeNumber", b"4") is True
    assert failure(ldap.NO_SUCH_ATTRIBUTE, admin.compare_s, pdn("p02"), "description", b"x")["result"] == 16
    assert failure(ldap.UNDEFINED_TYPE, admin.compare_s, pdn("p02"), "noSuchType", b"x")["result"] == 17
    info = failure(ldap.NO_SUCH_OBJECT, admin.compare_s, pdn("ghost"), "sn", b"x")
    assert info.get("matched", "").lower() == PY.lower(), info


# ------------------------------------------------------------------ writes


def test_add_s_then_read_back(admin):
    dn = pdn("w-add", WRITES)
    admin.add_s(dn, person_modlist("w-add", extra={"description": ["Zoë and Ünïcode".encode()],
                                                   "telephoneNumber": [b"+1 555 0001", b"+1 555 0002"]}))
    got = read(admin, dn)
    assert got["uid"] == ["w-add"] and got["description"] == ["Zoë and Ünïcode"], got
    assert sorted(got["telephonenumber"]) == ["+1 555 0001", "+1 555 0002"], got
    assert sorted(v.lower() for v in got["objectclass"]) == sorted(v.decode().lower() for v in PERSON), got


def test_add_s_errors(admin):
    dn = pdn("w-dup", WRITES)
    admin.add_s(dn, person_modlist("w-dup"))
    assert failure(ldap.ALREADY_EXISTS, admin.add_s, dn, person_modlist("w-dup"))["result"] == 68
    no_sn = [m for m in person_modlist("w-nosn") if m[0] != "sn"]
    info = failure(ldap.OBJECT_CLASS_VIOLATION, admin.add_s, pdn("w-nosn", WRITES), no_sn)
    assert info["result"] == 65, info
    info = failure(ldap.NO_SUCH_OBJECT, admin.add_s, pdn("w-orphan", "ou=Nowhere," + WRITES),
                   person_modlist("w-orphan"))
    assert info.get("matched", "").lower() == WRITES.lower(), info
    info = failure(ldap.INVALID_DN_SYNTAX, admin.add_s, "uid=w-bad,," + WRITES, person_modlist("w-bad"))
    assert info["result"] == 34, info
    info = failure(ldap.UNDEFINED_TYPE, admin.add_s, pdn("w-undef", WRITES),
                   person_modlist("w-undef", extra={"noSuchType": [b"x"]}))
    assert info["result"] == 17, info
    # Nothing of the refused adds is there.
    res = admin.search_s(WRITES, ldap.SCOPE_SUBTREE, "(uid=w-*)", ["uid"])
    assert not {a["uid"][0] for _, a in res} & {b"w-nosn", b"w-orphan", b"w-bad", b"w-undef"}, res


def test_modify_s_add_replace_delete_and_read_back(admin):
    dn = pdn("w-mod", WRITES)
    admin.add_s(dn, person_modlist("w-mod", extra={"mail": [b"w-mod@example.com"],
                                                   "telephoneNumber": [b"+1 555 0100"]}))
    admin.modify_s(dn, [(ldap.MOD_ADD, "description", [b"one", b"two"])])
    assert sorted(read(admin, dn)["description"]) == ["one", "two"]
    admin.modify_s(dn, [(ldap.MOD_REPLACE, "telephoneNumber", [b"+1 555 0199", b"+1 555 0198"])])
    assert sorted(read(admin, dn)["telephonenumber"]) == ["+1 555 0198", "+1 555 0199"]
    admin.modify_s(dn, [(ldap.MOD_DELETE, "description", [b"one"])])
    assert read(admin, dn)["description"] == ["two"]
    admin.modify_s(dn, [(ldap.MOD_DELETE, "mail", None)])
    got = read(admin, dn)
    assert "mail" not in got, got
    # Several changes in one request, applied in order.
    admin.modify_s(dn, [(ldap.MOD_REPLACE, "sn", [b"Renamed"]), (ldap.MOD_ADD, "mail", [b"new@example.com"]),
                        (ldap.MOD_DELETE, "description", None), (ldap.MOD_ADD, "description", [b"three"])])
    got = read(admin, dn)
    assert (got["sn"], got["mail"], got["description"]) == (["Renamed"], ["new@example.com"], ["three"]), got
    # REPLACE with no values removes the attribute; a no-value replace of an absent one is fine.
    admin.modify_s(dn, [(ldap.MOD_REPLACE, "description", None), (ldap.MOD_REPLACE, "title", None)])
    assert "description" not in read(admin, dn)


def test_modify_s_errors_apply_nothing(admin):
    dn = pdn("w-moderr", WRITES)
    admin.add_s(dn, person_modlist("w-moderr", extra={"description": [b"kept"]}))
    before = read(admin, dn)
    cases = [
        (ldap.TYPE_OR_VALUE_EXISTS, 20, [(ldap.MOD_ADD, "description", [b"KEPT"])]),
        (ldap.NO_SUCH_ATTRIBUTE, 16, [(ldap.MOD_DELETE, "description", [b"never there"])]),
        (ldap.OBJECT_CLASS_VIOLATION, 65, [(ldap.MOD_DELETE, "sn", None)]),
        (ldap.UNDEFINED_TYPE, 17, [(ldap.MOD_ADD, "noSuchType", [b"x"])]),
        (ldap.CONSTRAINT_VIOLATION, 19, [(ldap.MOD_REPLACE, "employeeNumber", [b"1", b"2"])]),
        # The first change is fine, the second fails: neither applies.
        (ldap.TYPE_OR_VALUE_EXISTS, 20, [(ldap.MOD_REPLACE, "sn", [b"Changed"]),
                                         (ldap.MOD_ADD, "description", [b"kept"])]),
    ]
    for exc, code, mods in cases:
        info = failure(exc, admin.modify_s, dn, mods)
        assert info["result"] == code, (mods, info)
    assert read(admin, dn) == before
    info = failure(ldap.NO_SUCH_OBJECT, admin.modify_s, pdn("ghost", WRITES), [(ldap.MOD_ADD, "description", [b"x"])])
    assert info.get("matched", "").lower() == WRITES.lower(), info


def test_rename_s_in_place_keeping_the_old_value_and_to_a_new_superior(admin):
    dn = pdn("w-ren", WRITES)
    admin.add_s(dn, person_modlist("w-ren"))
    admin.rename_s(dn, "uid=w-ren2")  # delold=1
    assert read(admin, pdn("w-ren2", WRITES))["uid"] == ["w-ren2"]
    info = failure(ldap.NO_SUCH_OBJECT, admin.search_s, dn, ldap.SCOPE_BASE)
    assert info.get("matched", "").lower() == WRITES.lower(), info
    admin.rename_s(pdn("w-ren2", WRITES), "uid=w-ren3", delold=0)
    assert sorted(read(admin, pdn("w-ren3", WRITES))["uid"]) == ["w-ren2", "w-ren3"]
    admin.rename_s(pdn("w-ren3", WRITES), "uid=w-ren3", newsuperior=ARCHIVE)
    got = read(admin, pdn("w-ren3", ARCHIVE))
    assert sorted(got["uid"]) == ["w-ren2", "w-ren3"] and got["cn"] == ["Py w-ren"], got
    assert admin.search_s(WRITES, ldap.SCOPE_ONELEVEL, "(uid=w-ren*)") == []
    # Errors: onto an existing entry, a missing entry, a missing new superior.
    admin.add_s(pdn("w-ren4", WRITES), person_modlist("w-ren4"))
    assert failure(ldap.ALREADY_EXISTS, admin.rename_s, pdn("w-ren4", WRITES), "uid=w-ren3",
                   newsuperior=ARCHIVE)["result"] == 68
    info = failure(ldap.NO_SUCH_OBJECT, admin.rename_s, pdn("ghost", WRITES), "uid=ghost2")
    assert info.get("matched", "").lower() == WRITES.lower(), info
    assert failure(ldap.NO_SUCH_OBJECT, admin.rename_s, pdn("w-ren4", WRITES), "uid=w-ren4",
                   newsuperior="ou=Nowhere," + SUFFIX)["result"] == 32
    assert read(admin, pdn("w-ren4", WRITES))["uid"] == ["w-ren4"]


def test_delete_s_and_its_errors(admin):
    parent = "ou=PyDel," + WRITES
    admin.add_s(parent, ldap.modlist.addModlist({"objectClass": [b"organizationalUnit"], "ou": [b"PyDel"]}))
    admin.add_s(pdn("w-del", parent), person_modlist("w-del"))
    info = failure(ldap.NOT_ALLOWED_ON_NONLEAF, admin.delete_s, parent)
    assert info["result"] == 66, info
    admin.delete_s(pdn("w-del", parent))
    info = failure(ldap.NO_SUCH_OBJECT, admin.delete_s, pdn("w-del", parent))
    assert info.get("matched", "").lower() == parent.lower(), info
    admin.delete_s(parent)
    assert admin.search_s(WRITES, ldap.SCOPE_SUBTREE, "(|(ou=PyDel)(uid=w-del))") == []


def test_writes_need_authentication_and_rights(srv):
    anon = connect(srv.url)
    info = failure(ldap.STRONG_AUTH_REQUIRED, anon.modify_s, pdn("p04"), [(ldap.MOD_ADD, "description", [b"x"])])
    assert info["result"] == 8, info
    anon.unbind_s()
    user = connect(srv.url, (pdn("p00"), PASSWORDS["p00"]))
    info = failure(ldap.INSUFFICIENT_ACCESS, user.modify_s, pdn("p04"), [(ldap.MOD_ADD, "description", [b"x"])])
    assert info["result"] == 50, info
    info = failure(ldap.INSUFFICIENT_ACCESS, user.add_s, pdn("w-user", WRITES), person_modlist("w-user"))
    assert info["result"] == 50, info
    user.unbind_s()


# ------------------------------------------------------------------ password modify


def test_passwd_s_generates_a_password(srv, admin):
    # The administrator resets another user's password without giving one.
    _, resp = admin.passwd_s(pdn("p02"), None, None, extract_newpw=True)
    generated = getattr(resp, "genPasswd", resp)  # python-ldap 3.4: a PasswordModifyResponse
    assert isinstance(generated, bytes) and len(generated) >= 8, resp
    assert connect(srv.url, (pdn("p02"), generated.decode())).whoami_s().lower() == "dn:" + pdn("p02").lower()
    failure(ldap.INVALID_CREDENTIALS, connect(srv.url).simple_bind_s, pdn("p02"), PASSWORDS["p02"])
    # A user changes their own password (no identity), the server picks it.
    user = connect(srv.url, (pdn("p03"), PASSWORDS["p03"]))
    _, resp = user.passwd_s(None, PASSWORDS["p03"], None, extract_newpw=True)
    mine = getattr(resp, "genPasswd", resp)
    user.unbind_s()
    assert mine and mine != generated, mine
    connect(srv.url, (pdn("p03"), mine.decode())).unbind_s()
    failure(ldap.INVALID_CREDENTIALS, connect(srv.url).simple_bind_s, pdn("p03"), PASSWORDS["p03"])
    # A wrong old password changes nothing.
    user = connect(srv.url, (pdn("p03"), mine.decode()))
    failure(ldap.UNWILLING_TO_PERFORM, user.passwd_s, None, "not-the-old-one", "whatever")
    user.unbind_s()
    connect(srv.url, (pdn("p03"), mine.decode())).unbind_s()


# ------------------------------------------------------------------ controls


def sorted_search(c, ordering, pagesize=0):
    """(uids in the order received, sort result codes, pages) of a sorted
    one-level search of PY, paged when pagesize > 0."""
    sss = SSSRequestControl(criticality=True, ordering_rules=ordering)
    paged = SimplePagedResultsControl(True, size=pagesize, cookie=b"")
    uids, codes, pages = [], [], 0
    for _ in range(30):
        ctrls = [sss] + ([paged] if pagesize else [])
        msgid = c.search_ext(PY, ldap.SCOPE_ONELEVEL, "(objectClass=inetOrgPerson)", ["uid", "sn"],
                             serverctrls=ctrls)
        _, data, _, rctrls = c.result3(msgid, timeout=30)
        pages += 1
        uids += [a["uid"][0].decode() for _, a in data]
        codes += [x.sortResult for x in rctrls if x.controlType == SSSResponseControl.controlType]
        cookies = [x.cookie for x in rctrls if x.controlType == SimplePagedResultsControl.controlType]
        if not pagesize or not cookies or not cookies[0]:
            break
        paged.cookie = cookies[0]
    return uids, codes, pages


def expected(keys):
    """uids ordered by keys [(attr, reverse)], values compared case-insensitively."""
    rows = [(dn[4:7], a) for dn, a in entries()[1:] if dn.endswith(PY)]
    for attr, reverse in reversed(keys):
        rows.sort(key=lambda r: r[1][attr][0].lower(), reverse=reverse)
    return [uid for uid, _ in rows]


@pytest.mark.skipif(SSSRequestControl is None, reason="this python-ldap has no ldap.controls.sss")
def test_server_side_sort(admin):
    # sn and uid have no ORDERING rule: a critical sort names one (without
    # it the answer is inappropriateMatching, as slapd's).
    uids, codes, _ = sorted_search(admin, ["sn:caseIgnoreOrderingMatch", "-uid:caseIgnoreOrderingMatch"])
    assert codes == [0] and uids == expected([("sn", False), ("uid", True)]), (uids, codes)
    uids, codes, _ = sorted_search(admin, ["-sn:caseIgnoreOrderingMatch", "uid:caseIgnoreOrderingMatch"])
    assert codes == [0] and uids == expected([("sn", True), ("uid", False)]), (uids, codes)
    # An ordering rule named with the key (employeeNumber has none of its own; 2**i as
    # integers, not as strings, gives p16 first).
    uids, codes, _ = sorted_search(admin, ["-employeeNumber:integerOrderingMatch"])
    assert codes == [0] and uids == ["p%02d" % i for i in reversed(range(len(SNS)))], (uids, codes)


@pytest.mark.skipif(SSSRequestControl is None, reason="this python-ldap has no ldap.controls.sss")
def test_server_side_sort_with_paging(admin):
    uids, codes, pages = sorted_search(admin, ["-sn:caseIgnoreOrderingMatch", "uid:caseIgnoreOrderingMatch"],
                                       pagesize=4)
    assert pages == 5 and codes == [0] * 5, (pages, codes)
    assert uids == expected([("sn", True), ("uid", False)]), uids


def test_pre_and_post_read_controls_decode(admin):
    dn = pdn("w-read", WRITES)
    admin.add_s(dn, person_modlist("w-read", extra={"description": [b"before"]}))
    pre, post = PreReadControl(True, ["description"]), PostReadControl(True, ["description", "sn"])
    _, _, _, rctrls = admin.modify_ext_s(dn, [(ldap.MOD_REPLACE, "description", [b"after"])],
                                         serverctrls=[pre, post])
    got = {c.controlType: c for c in rctrls}
    assert got[PreReadControl.controlType].entry == {"description": [b"before"]}, rctrls
    assert got[PostReadControl.controlType].dn.lower() == dn.lower()
    assert got[PostReadControl.controlType].entry == {"description": [b"after"], "sn": [b"Writer"]}, rctrls


def test_assertion_control_decides_the_write(admin):
    dn = pdn("w-assert", WRITES)
    admin.add_s(dn, person_modlist("w-assert", extra={"description": [b"v1"]}))
    mods = [(ldap.MOD_REPLACE, "description", [b"v2"])]
    info = failure(ldap.ASSERTION_FAILED, admin.modify_ext_s, dn, mods,
                   serverctrls=[AssertionControl(True, "(description=v0)")])
    assert info["result"] == 122, info
    assert read(admin, dn)["description"] == ["v1"]
    admin.modify_ext_s(dn, mods, serverctrls=[AssertionControl(True, "(description=v1)")])
    assert read(admin, dn)["description"] == ["v2"]


# ------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def tls_srv(tmp_path_factory):
    """A server with a certificate from a throwaway CA, ldap:// and ldaps://,
    password binds only over TLS."""
    if not have("openssl"):
        pytest.skip("openssl not installed")
    from test_tls import Pki
    pki = Pki(tmp_path_factory.mktemp("pyldap-pki"))
    cert, key = pki.issue("server", "/O=Pando Test/CN=localhost", server=True)
    stranger = pki.issue("stranger", "/O=Pando Test/CN=stranger")[0]
    config = '[tls]\ncert_file = "%s"\nkey_file = "%s"\n\n[auth]\nrequire_secure_binds = true\n' % (cert, key)
    s = make_server(tmp_path_factory, "pyldap-tls", config=config + PUBLIC_READ, ldaps=True)
    s.ca, s.cert, s.stranger = pki.ca, cert, stranger
    yield s
    s.stop_and_verify()


def tls_options(c, ca):
    c.set_option(ldap.OPT_X_TLS_CACERTFILE, str(ca))
    c.set_option(ldap.OPT_X_TLS_REQUIRE_CERT, ldap.OPT_X_TLS_DEMAND)
    c.set_option(ldap.OPT_X_TLS_NEWCTX, 0)  # last: builds the context from the options above


def peer_fingerprint(c):
    return hashlib.sha256(c.get_option(ldap.OPT_X_TLS_PEERCERT)).hexdigest()


def test_start_tls_then_bind(tls_srv):
    want = hashlib.sha256(ssl.PEM_cert_to_DER_cert(Path(tls_srv.cert).read_text())).hexdigest()
    c = connect(tls_srv.url)
    info = failure(ldap.CONFIDENTIALITY_REQUIRED, c.simple_bind_s, tls_srv.admin_dn, tls_srv.admin_pw)
    assert info["result"] == 13, info
    c.unbind_s()
    c = connect(tls_srv.url)
    tls_options(c, tls_srv.ca)
    c.start_tls_s()
    assert peer_fingerprint(c) == want
    c.simple_bind_s(tls_srv.admin_dn, tls_srv.admin_pw)
    assert c.whoami_s().lower() == "dn:" + tls_srv.admin_dn.lower()
    assert [dn.lower() for dn, _ in c.search_s(SUFFIX, ldap.SCOPE_BASE, attrlist=["1.1"])] == [SUFFIX]
    c.unbind_s()


def test_ldaps_then_bind(tls_srv):
    c = connect(tls_srv.ldaps_url)
    tls_options(c, tls_srv.ca)
    c.simple_bind_s(tls_srv.admin_dn, tls_srv.admin_pw)
    assert c.whoami_s().lower() == "dn:" + tls_srv.admin_dn.lower()
    c.unbind_s()


def test_start_tls_checks_the_certificate(tls_srv):
    c = connect(tls_srv.url)
    tls_options(c, tls_srv.stranger)  # not the CA that issued the server's certificate
    with pytest.raises((ldap.CONNECT_ERROR, ldap.SERVER_DOWN)):
        c.start_tls_s()


def test_an_add_takes_its_rdn_values_from_the_dn_as_slapd_does(admin):
    """RFC 4511 4.7: the client may leave the RDN attribute out of the list;
    the entry holds the RDN value (with any other values given)."""
    bare = [m for m in person_modlist("w-rdn1") if m[0] != "uid"]
    admin.add_s(pdn("w-rdn1", WRITES), bare)
    assert read(admin, pdn("w-rdn1", WRITES))["uid"] == ["w-rdn1"]
    other = [m for m in person_modlist("w-rdn2") if m[0] != "uid"] + [("uid", [b"someone-else"])]
    admin.add_s(pdn("w-rdn2", WRITES), other)
    assert sorted(read(admin, pdn("w-rdn2", WRITES))["uid"]) == ["someone-else", "w-rdn2"]


def test_removing_the_structural_class_is_object_class_mods_prohibited(admin):
    """RFC 4512 2.4.2 and slapd: taking inetOrgPerson away from an
    inetOrgPerson leaves organizationalPerson structural: refused (69),
    nothing changed."""
    dn = pdn("w-soc", WRITES)
    admin.add_s(dn, person_modlist("w-soc"))
    info = failure(ldap.NO_OBJECT_CLASS_MODS, admin.modify_s, dn, [(ldap.MOD_DELETE, "objectClass", [b"inetOrgPerson"])])
    assert info["result"] == 69 and "inetOrgPerson" in info.get("info", ""), info
    got = read(admin, dn, ("objectClass", "structuralObjectClass"))
    assert "inetOrgPerson" in got["objectclass"] and got["structuralobjectclass"] == ["inetOrgPerson"], got
