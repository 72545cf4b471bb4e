"""Request controls on writes, compares and searches, through ldap-utils
(`-e`) and ldap3, against Pando and, for the same commands, against a
throwaway slapd holding the same entries: assertion (RFC 4528), pre-read and
post-read (RFC 4527), no-op, permissive modify, tree delete, relax rules,
don't-use-copy, and how unknown, inapplicable, repeated and malformed
controls are refused (RFC 4511 4.1.11)."""

import base64
import re
import time
import shutil
from pathlib import Path

import pytest

import ber
from conftest import SUFFIX, Pando, ldif_entry, parse_ldif, server_with
from test_differential import SLAPD, SLAPADD, Slapd

HAVE_SLAPD = Path(SLAPD).exists() and Path(SLAPADD).exists()
pytestmark = pytest.mark.skipif(not shutil.which("ldapmodify"), reason="ldap-utils not installed")

PEOPLE = "ou=People," + SUFFIX
ALICE = "uid=alice," + PEOPLE
TREE = "ou=Tree," + SUFFIX
DAVE = "uid=dave," + PEOPLE  # only the differential cases change it

NO_OP_CODE = 16654  # OpenLDAP's noOperation
TREE_DELETE = "1.2.840.113556.1.4.805"
PERMISSIVE = "1.2.840.113556.1.4.1413"

CONFIG = """
[limits]
max_tree_delete = 6

[[access]]
dn = "ou=Locked,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }, { who = "users", rights = ["search"] }]

[[access]]
dn = "uid=keep,ou=b1,ou=Tree,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "write" }, { who = "*", rights = "read" }]
"""


def person(uid, sn, **extra):
    a = {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
         "uid": [uid], "cn": [uid.title()], "sn": [sn]}
    a.update(extra)
    return a


def tree_entries():
    ents = [
        (PEOPLE, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"]}),
        (ALICE, person("alice", "Liddell", userPassword=["alice-secret"], description=["first"])),
        ("uid=bob," + PEOPLE, person("bob", "Builder", userPassword=["bob-secret"])),
        (DAVE, person("dave", "Davies", title=["Chief"])),
        (TREE, {"objectClass": ["top", "organizationalUnit"], "ou": ["Tree"]}),
        ("ou=Locked," + SUFFIX, {"objectClass": ["top", "organizationalUnit"], "ou": ["Locked"]}),
        ("uid=hidden,ou=Locked," + SUFFIX, person("hidden", "Hidden")),
    ]
    for i in range(3):
        ou = "ou=b%d,%s" % (i, TREE)
        ents.append((ou, {"objectClass": ["top", "organizationalUnit"], "ou": ["b%d" % i]}))
        for j in range(4):
            ents.append(("uid=u%d%d,%s" % (i, j, ou), person("u%d%d" % (i, j), "Leaf")))
    return ents


@pytest.fixture(scope="module")
def pando(tmp_path_factory):
    s = server_with(tmp_path_factory.mktemp("controls"), "pando-controls", CONFIG, tree_entries())
    yield s
    s.stop_and_verify()


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    if not HAVE_SLAPD:
        pytest.skip("slapd not installed")
    base = tmp_path_factory.mktemp("controls-slapd")
    full = base / "full.ldif"
    top = (SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"], "o": ["example"]})
    full.write_text("\n".join(ldif_entry(dn, a) for dn, a in [top] + tree_entries()))
    s = Slapd(base / "slapd")
    s.load(full)
    s.start()
    yield s
    s.stop()


def modify(server, ldif, *controls, auth="admin"):
    args = []
    for c in controls:
        args += ["-e", c]
    kw = {} if auth == "admin" else {"auth": auth}
    if isinstance(server, Pando):
        return server.ldap("ldapmodify", *args, input=ldif, **kw)
    return server.ldap("ldapmodify", *args, input=ldif)


def code(rc, err):
    """The LDAP result code behind an ldap-utils failure (exit codes are
    cut to a byte; the message names the code)."""
    m = re.search(r"\((\d+)\)", err)
    return int(m.group(1)) if m else rc


def read_controls(out):
    """{oid: {attr: [values]}} of the pre/post-read controls ldapmodify prints."""
    found = {}
    for m in re.finditer(r"# ==> (preread|postread)\n(.*?)# <== \1", out, re.S):
        found[m.group(1)] = parse_ldif(m.group(2))
    return found


def attrs_of(server, dn, *attrs):
    rc, out, err = server.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", dn, "-s", "base", *attrs)
    if rc == 32:
        return None
    assert rc == 0, err
    ents = parse_ldif(out)
    return ents[0][1] if ents else None


def replace(dn, attr, value):
    return "dn: %s\nchangetype: modify\nreplace: %s\n%s: %s\n" % (dn, attr, attr, value)


def test_root_dse_lists_the_controls(pando):
    got = attrs_of(pando, "", "supportedControl")["supportedControl"]
    for oid in ["1.2.840.113556.1.4.319", "2.16.840.1.113730.3.4.2", "1.3.6.1.1.12", "1.3.6.1.1.13.1",
                "1.3.6.1.1.13.2", PERMISSIVE, TREE_DELETE, "1.3.6.1.4.1.4203.666.5.2",
                "1.3.6.1.4.1.4203.666.5.12", "1.3.6.1.1.22"]:
        assert oid in got


def test_assertion_decides_each_update(pando):
    # modify: false assertion → 122 and nothing changed; true → done.
    rc, _, err = modify(pando, replace(ALICE, "title", "Boss"), "assert=(sn=Nobody)")
    assert code(rc, err) == 122, err
    assert "title" not in attrs_of(pando, ALICE, "title")
    rc, _, err = modify(pando, replace(ALICE, "title", "Boss"), "assert=(sn=Liddell)")
    assert rc == 0, err
    assert attrs_of(pando, ALICE, "title")["title"] == ["Boss"]
    # add: the assertion is tested against the entry being added.
    new = ("dn: uid=carol,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: carol\ncn: Carol\n"
           "sn: Carroll\n" % PEOPLE)
    rc, _, err = modify(pando, new, "assert=(sn=Other)")
    assert code(rc, err) == 122, err
    rc, _, err = modify(pando, new, "assert=(sn=Carroll)")
    assert rc == 0, err
    # delete and rename.
    rc, _, err = pando.ldap("ldapdelete", "-e", "assert=(sn=Other)", "uid=carol," + PEOPLE)
    assert code(rc, err) == 122, err
    rc, _, err = pando.ldap("ldapmodrdn", "-e", "assert=(sn=Other)", "uid=carol," + PEOPLE, "uid=carla")
    assert code(rc, err) == 122, err
    rc, _, err = pando.ldap("ldapdelete", "-e", "assert=(sn=Carroll)", "uid=carol," + PEOPLE)
    assert rc == 0, err
    # compare and search test it against their target / base entry.
    rc, out, err = pando.ldap("ldapcompare", "-e", "assert=(sn=Other)", ALICE, "sn:Liddell")
    assert "Assertion Failed (122)" in out + err
    rc, out, err = pando.ldap("ldapcompare", "-e", "assert=(sn=Liddell)", ALICE, "sn:Liddell")
    assert rc == 6, out + err  # compareTrue
    rc, out, err = pando.ldap("ldapsearch", "-b", PEOPLE, "-e", "assert=(ou=Nope)", "(uid=alice)")
    assert "result: 122" in out, out + err
    rc, out, err = pando.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "-e", "assert=(ou=People)", "(uid=alice)", "1.1")
    assert rc == 0 and ALICE in out, out + err


def test_assertion_sees_only_what_the_requester_may_search(pando):
    """A user may not search userPassword: an assertion on it is
    Undefined, not a way to test someone's password hash."""
    bob = ("uid=bob," + PEOPLE, "bob-secret")
    rc, _, err = modify(pando, replace(ALICE, "title", "Probe"), "assert=(userPassword=*)", auth=bob)
    assert code(rc, err) == 122, err
    rc, _, err = modify(pando, replace(ALICE, "title", "Probe"), "assert=(!(userPassword=*))", auth=bob)
    assert code(rc, err) == 122, err


def test_pre_and_post_read(pando):
    rc, out, err = modify(pando, replace(ALICE, "description", "second"),
                          "preread=description,sn", "postread=description,modifyTimestamp,entryCSN")
    assert rc == 0, err
    reads = read_controls(out)
    (dn, pre), = reads["preread"]
    (dn2, post), = reads["postread"]
    assert dn == dn2 == ALICE
    assert pre == {"description": ["first"], "sn": ["Liddell"]}
    assert post["description"] == ["second"]
    # The post-read shows the stamps of this very change.
    stored = attrs_of(pando, ALICE, "modifyTimestamp", "entryCSN")
    assert post["entryCSN"] == stored["entryCSN"] and post["modifyTimestamp"] == stored["modifyTimestamp"]
    # Rename: the pre-read has the old DN, the post-read the new one.
    rc, out, err = pando.ldap("ldapmodrdn", "-e", "preread=uid", "-e", "postread=uid", "uid=bob," + PEOPLE, "uid=robert")
    assert rc == 0, err
    reads = read_controls(out)
    assert reads["preread"][0][0] == "uid=bob," + PEOPLE and reads["preread"][0][1]["uid"] == ["bob"]
    assert reads["postread"][0][0] == "uid=robert," + PEOPLE
    assert sorted(reads["postread"][0][1]["uid"]) == ["bob", "robert"]
    rc, out, err = pando.ldap("ldapmodrdn", "-r", "uid=robert," + PEOPLE, "uid=bob")
    assert rc == 0, err


def test_read_controls_need_read_access(pando):
    """Without read access to the entry, a critical read-entry control
    refuses the whole operation (insufficientAccessRights) and nothing
    changes; a non-critical one is just not answered. Values the requester
    may not read are left out."""
    bob = ("uid=bob," + PEOPLE, "bob-secret")
    hidden = "uid=hidden,ou=Locked," + SUFFIX
    # Bob may search but not read under ou=Locked (nor write: refused anyway).
    rc, _, err = modify(pando, replace(hidden, "description", "x"), "!preread=*", auth=bob)
    assert code(rc, err) == 50, err
    # Bob may write alice; her userPassword is not readable to him.
    rc, out, err = modify(pando, replace(ALICE, "title", "Read"), "preread=*", "postread=userPassword,title", auth=bob)
    assert rc == 0, err
    reads = read_controls(out)
    assert "userPassword" not in reads["preread"][0][1]
    assert reads["postread"][0][1] == {"title": ["Read"]}


def test_read_controls_on_unreadable_entries_by_criticality(tmp_path):
    """Write access without read access: the write goes through and the
    non-critical read control is left unanswered; a critical one refuses
    the write."""
    config = """
[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "auth" }]

[[access]]
dn = "ou=Drop,dc=example,dc=com"
scope = "children"
by = [{ who = "admins", rights = "all" }, { who = "users", rights = ["write", "search"] }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""
    s = Pando(tmp_path, demo=False, config=config, name="pando-blind-write").start()
    try:
        ents = [("ou=Drop," + SUFFIX, {"objectClass": ["organizationalUnit"], "ou": ["Drop"]}),
                ("cn=box,ou=Drop," + SUFFIX, {"objectClass": ["person"], "cn": ["box"], "sn": ["a"]}),
                ("uid=w," + SUFFIX, person("w", "W", userPassword=["w-secret"]))]
        rc, _, err = s.ldap("ldapadd", input="\n".join(ldif_entry(d, a) for d, a in ents))
        assert rc == 0, err
        w = ("uid=w," + SUFFIX, "w-secret")
        box = "cn=box,ou=Drop," + SUFFIX
        rc, out, err = modify(s, replace(box, "sn", "b"), "preread=sn", auth=w)
        assert rc == 0 and read_controls(out) == {}, (rc, out, err)
        rc, _, err = modify(s, replace(box, "sn", "c"), "!postread=sn", auth=w)
        assert code(rc, err) == 50, err
        assert attrs_of(s, box, "sn")["sn"] == ["b"]
    finally:
        s.stop_and_verify()


def test_no_op_changes_nothing(pando):
    before = attrs_of(pando, ALICE, "sn", "entryCSN")
    rc, out, err = modify(pando, replace(ALICE, "sn", "Changed"), "noop", "postread=sn")
    assert code(rc, err) == NO_OP_CODE and "No Operation" in err, (rc, err)
    assert attrs_of(pando, ALICE, "sn", "entryCSN") == before
    # A no-op add, delete and rename leave the tree alone too.
    new = "dn: cn=ghost,%s\nchangetype: add\nobjectClass: person\ncn: ghost\nsn: G\n" % PEOPLE
    rc, _, err = modify(pando, new, "!noop")
    assert code(rc, err) == NO_OP_CODE, err
    assert attrs_of(pando, "cn=ghost," + PEOPLE) is None
    rc, _, err = pando.ldap("ldapdelete", "-e", "!noop", "uid=u00,ou=b0," + TREE)
    assert code(rc, err) == NO_OP_CODE, err
    assert attrs_of(pando, "uid=u00,ou=b0," + TREE) is not None


def test_permissive_modify(pando):
    ldif = ("dn: %s\nchangetype: modify\nadd: sn\nsn: Liddell\n-\ndelete: telephoneNumber\n"
            "telephoneNumber: +1 000\n-\ndelete: roomNumber\n-\nadd: mail\nmail: alice@example.com\n" % ALICE)
    rc, _, err = modify(pando, ldif)
    assert code(rc, err) == 20, err  # attributeOrValueExists
    rc, _, err = modify(pando, ldif, "!" + PERMISSIVE)
    assert rc == 0, err
    assert attrs_of(pando, ALICE, "mail")["mail"] == ["alice@example.com"]


def test_tree_delete(pando):
    b0, b1 = "ou=b0," + TREE, "ou=b1," + TREE
    rc, _, err = pando.ldap("ldapdelete", b0)
    assert code(rc, err) == 66, err  # notAllowedOnNonLeaf
    rc, _, err = pando.ldap("ldapdelete", "-e", "!" + TREE_DELETE, b0)
    assert rc == 0, err
    assert attrs_of(pando, b0) is None and attrs_of(pando, "uid=u01," + b0) is None
    # More than limits.max_tree_delete (6 here) entries: refused whole.
    rc, _, err = pando.ldap("ldapdelete", "-e", "!" + TREE_DELETE, TREE)
    assert code(rc, err) == 11, err
    assert attrs_of(pando, "uid=u20,ou=b2," + TREE) is not None
    # Access is checked on every entry: bob may delete under ou=Tree except
    # uid=keep, so deleting b1 with it is refused whole, without saying which.
    keep = "uid=keep," + b1
    rc, _, err = pando.ldap("ldapadd", input=ldif_entry(keep, person("keep", "K")))
    assert rc == 0, err
    bob = ("uid=bob," + PEOPLE, "bob-secret")
    rc, _, err = pando.ldap("ldapdelete", "-e", "!" + TREE_DELETE, b1, auth=bob)
    assert code(rc, err) == 50, err
    assert "keep" not in err
    assert attrs_of(pando, "uid=u10," + b1) is not None
    rc, _, err = pando.ldap("ldapdelete", keep)
    assert rc == 0, err
    rc, _, err = pando.ldap("ldapdelete", "-e", "!" + TREE_DELETE, b1, auth=bob)
    assert rc == 0, err
    assert attrs_of(pando, b1) is None


def test_relax_lets_administrators_set_stamps(pando):
    entry = ("dn: cn=migrated,%s\nchangetype: add\nobjectClass: person\ncn: migrated\nsn: M\n"
             "createTimestamp: 20010101000000Z\ncreatorsName: cn=old admin\n"
             "entryUUID: 9a2eb08b-60c1-4483-9ffb-50ddbbbcb338\n" % PEOPLE)
    rc, _, err = modify(pando, entry)
    assert code(rc, err) == 19, err  # constraintViolation: no user modification
    bob = ("uid=bob," + PEOPLE, "bob-secret")
    rc, _, err = modify(pando, entry, "!relax", auth=bob)
    assert code(rc, err) == 50, err
    rc, _, err = modify(pando, entry, "!relax")
    assert rc == 0, err
    got = attrs_of(pando, "cn=migrated," + PEOPLE, "+")
    assert got["createTimestamp"] == ["20010101000000Z"]
    assert got["creatorsName"] == ["cn=old admin"]
    assert got["entryUUID"] == ["9a2eb08b-60c1-4483-9ffb-50ddbbbcb338"]
    assert got["modifiersName"] == [pando.admin_dn]


def test_refused_controls(pando):
    # Unknown critical: 12; unknown non-critical: ignored.
    rc, _, err = modify(pando, replace(ALICE, "title", "X"), "!1.2.3.4.5")
    assert code(rc, err) == 12, err
    rc, _, err = modify(pando, replace(ALICE, "title", "X"), "1.2.3.4.5")
    assert rc == 0, err
    # Known but not for this operation: 12 when critical.
    rc, _, err = modify(pando, replace(ALICE, "title", "Y"), "!" + TREE_DELETE)
    assert code(rc, err) == 12, err
    rc, out, err = pando.ldap("ldapsearch", "-b", ALICE, "-s", "base", "-e", "!" + PERMISSIVE)
    assert "result: 12" in out, out
    # Malformed value, value where none is allowed, sent twice: protocolError.
    with pando.raw() as c:
        assert ber.simple_bind(c, pando.admin_dn, pando.admin_pw) == 0
        delete = ber.tlv(0x4A, b"uid=u20,ou=b2," + TREE.encode())
        cases = [
            [ber.control("1.3.6.1.1.12", True, b"\x30")],
            [ber.control(TREE_DELETE, True, b"")],
            [ber.control(TREE_DELETE, True), ber.control(TREE_DELETE, True)],
        ]
        for i, ctrls in enumerate(cases):
            c.send(ber.message(10 + i, delete, ctrls))
            r = c.recv_msg()
            assert (r["id"], r["code"]) == (10 + i, 2), r
    assert attrs_of(pando, "uid=u20,ou=b2," + TREE) is not None
    # Don't-use-copy must be critical (RFC 6171); critical, it is honoured.
    rc, out, err = pando.ldap("ldapsearch", "-b", ALICE, "-s", "base", "-E", "!dontUseCopy", "1.1")
    assert "result: 0" in out, out + err
    rc, out, err = pando.ldap("ldapsearch", "-b", ALICE, "-s", "base", "-E", "1.3.6.1.1.22", "1.1")
    assert "result: 2" in out, out + err


def test_ldap3_read_controls(pando):
    """python ldap3 builds its own control values: pre/post-read decode."""
    from ldap3.protocol.rfc4527 import pre_read_control, post_read_control
    c = pando.conn()
    ok = c.modify(ALICE, {"roomNumber": [("MODIFY_REPLACE", ["101"])]},
                  controls=[pre_read_control(["roomNumber"]), post_read_control(["roomNumber"])])
    assert ok, c.result
    ctrls = c.result["controls"]
    assert ctrls["1.3.6.1.1.13.2"]["value"]["result"]["roomNumber"] == ["101"]
    assert ctrls["1.3.6.1.1.13.1"]["value"]["result"].get("roomNumber", []) == []


# ------------------------------------------------------------ differential


CASES = [
    ("assertion false", replace(DAVE, "title", "A"), ["assert=(sn=Nobody)"]),
    ("assertion true", replace(DAVE, "title", "B"), ["assert=(objectClass=person)"]),
    ("no-op", replace(DAVE, "title", "C"), ["noop"]),
    ("unknown critical", replace(DAVE, "title", "D"), ["!1.2.3.4.5"]),
    ("permissive off", "dn: %s\nchangetype: modify\nadd: sn\nsn: Davies\n" % DAVE, []),
    ("permissive on", "dn: %s\nchangetype: modify\nadd: sn\nsn: Davies\n" % DAVE, ["!" + PERMISSIVE]),
    ("read entry", replace(DAVE, "title", "E"), ["preread=title,sn", "postread=title,sn"]),
    ("add assertion", "dn: cn=Dee,%s\nchangetype: add\nobjectClass: person\ncn: Dee\nsn: D\n" % PEOPLE,
     ["assert=(sn=Nope)"]),
]


@pytest.mark.parametrize("name,ldif,controls", CASES, ids=[c[0] for c in CASES])
def test_same_answers_as_slapd(pando, slapd, name, ldif, controls):
    p_rc, p_out, p_err = modify(pando, ldif, *controls)
    s_rc, s_out, s_err = modify(slapd, ldif, *controls)
    assert code(p_rc, p_err) == code(s_rc, s_err), (name, p_err, s_err)
    assert read_controls(p_out) == read_controls(s_out), (name, p_out, s_out)


# ------------------------------------------------------------ proxied authorization

PROXY_CONFIG = """
[auth]
admins = ["ldapi-owner", "uid=boss,ou=People,dc=example,dc=com"]

[logs]
audit = "audit.ldif"

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
dn = "ou=People,dc=example,dc=com"
scope = "children"
attrs = ["entry"]
by = [{ who = "admins", rights = "all" }, { who = "dn:cn=portal,dc=example,dc=com", rights = ["proxy", "read"] }, { who = "users", rights = "read" }]

[[access]]
dn = "ou=People,dc=example,dc=com"
scope = "children"
by = [{ who = "admins", rights = "all" }, { who = "self", rights = "write" }, { who = "users", rights = "read" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    base = tmp_path_factory.mktemp("proxy")
    config = PROXY_CONFIG.replace("audit.ldif", str(base / "audit.ldif"))
    s = Pando(base, demo=False, config=config, name="pando-proxy").start()
    s.audit_path = base / "audit.ldif"
    ents = [
        ("cn=portal," + SUFFIX, {"objectClass": ["person"], "cn": ["portal"], "sn": ["P"], "userPassword": ["portal-secret"]}),
        (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
        (ALICE, person("alice", "Liddell", userPassword=["alice-secret"])),
        ("uid=bob," + PEOPLE, person("bob", "Builder", userPassword=["bob-secret"],
                                     mail=["bob@example.com", "robert@example.com", "bob@example.org"])),
        ("uid=boss," + PEOPLE, person("boss", "Boss")),
        ("cn=policy," + SUFFIX, {"objectClass": ["subentry"], "cn": ["policy"], "subtreeSpecification": ["{}"]}),
    ]
    rc, _, err = s.ldap("ldapadd", input="\n".join(ldif_entry(d, a) for d, a in ents))
    assert rc == 0, err
    yield s
    s.stop_and_verify()


PORTAL = ("cn=portal," + SUFFIX, "portal-secret")


def test_proxied_identity_is_the_one_checked_and_recorded(proxied):
    for authz in ("dn:" + ALICE, "u:alice"):
        rc, out, err = proxied.ldap("ldapwhoami", "-e", "!authzid=" + authz, auth=PORTAL)
        assert rc == 0 and out.strip() == "dn:" + ALICE, (authz, out, err)
    # As alice: her own entry is writable, and modifiersName says alice.
    rc, _, err = modify(proxied, replace(ALICE, "telephoneNumber", "+1 555 0100"), "!authzid=dn:" + ALICE, auth=PORTAL)
    assert rc == 0, err
    assert attrs_of(proxied, ALICE, "modifiersName")["modifiersName"] == [ALICE]
    # ... bob's is not (alice's rights, not the portal's).
    rc, _, err = modify(proxied, replace("uid=bob," + PEOPLE, "title", "x"), "!authzid=u:alice", auth=PORTAL)
    assert code(rc, err) == 50, err
    # The audit log names both.
    want = "%s (proxied by cn=portal,%s)" % (ALICE, SUFFIX)
    for _ in range(100):  # the audit writer is asynchronous
        audit = proxied.audit_path.read_text() if proxied.audit_path.exists() else ""
        if want in audit:
            break
        time.sleep(0.05)
    assert want in audit, audit[-600:]
    # Becoming anonymous escapes rules that deny a DN before granting
    # everyone: only administrators may.
    rc, out, err = proxied.ldap("ldapwhoami", "-e", "!authzid=", auth=PORTAL)
    assert code(rc, err) == 123, out + err
    rc, out, err = proxied.ldap("ldapwhoami", "-e", "!authzid=")
    assert rc == 0 and out.strip() in ("anonymous", ""), out + err


def test_proxying_needs_the_proxy_right(proxied):
    bob = ("uid=bob," + PEOPLE, "bob-secret")
    cases = [
        (PORTAL, "dn:cn=portal," + SUFFIX),   # no proxy right on its own entry
        (PORTAL, "dn:cn=nobody," + PEOPLE),   # no such entry
        (PORTAL, "dn:" + proxied.admin_dn),    # the root DN is not an entry
        (PORTAL, "u:nobody"),
        (PORTAL, "x:alice"),
        (bob, "dn:" + ALICE),                  # bob holds no proxy right
        (PORTAL, "dn:uid=boss," + PEOPLE),     # boss holds the administrator role
    ]
    for who, authz in cases:
        rc, out, err = proxied.ldap("ldapwhoami", "-e", "!authzid=" + authz, auth=who)
        assert code(rc, err) == 123 and "authorization" in err.lower(), (who, authz, out, err)
    # The control must be critical (RFC 4370): protocolError (ldap-utils
    # will not send it otherwise).
    with proxied.raw() as c:
        assert ber.simple_bind(c, *PORTAL) == 0
        lax = ber.control("2.16.840.1.113730.3.4.18", False, ("dn:" + ALICE).encode())
        c.send(ber.message(2, ber.extended_op("1.3.6.1.4.1.4203.1.11.3"), [lax]))
        m = c.recv_msg()
        assert (m["id"], m["code"]) == (2, 2), m


def test_matched_values(proxied):
    """RFC 3876: only matching values go out, and attributes with none are
    left out (as slapd does)."""
    rc, out, err = proxied.ldap("ldapsearch", "-LLL", "-b", "uid=bob," + PEOPLE, "-s", "base",
                                "-E", "mv=(mail=*@example.com)", "mail", "cn")
    assert rc == 0, err
    (dn, attrs), = parse_ldif(out)
    assert attrs == {"mail": ["bob@example.com", "robert@example.com"]}
    rc, out, err = proxied.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "-E", "mv=(mail=nobody*)", "(uid=bob)")
    assert rc == 0 and parse_ldif(out) == [("uid=bob," + PEOPLE, {})], out


def test_subentries(proxied):
    """RFC 3672: subentries show only to base searches of them, unless the
    control asks for them (TRUE: only them) or against them (FALSE)."""
    def dns(*args):
        rc, out, err = proxied.ldap("ldapsearch", "-LLL", "-b", SUFFIX, *args, "1.1")
        assert rc == 0, err
        return sorted(d for d, _ in parse_ldif(out))
    policy = "cn=policy," + SUFFIX
    assert policy not in dns("(objectClass=*)")
    assert dns("-E", "subentries=true", "(objectClass=*)") == [policy]
    rc, out, _ = proxied.ldap("ldapsearch", "-LLL", "-b", policy, "-s", "base", "1.1")
    assert parse_ldif(out) == [(policy, {})]
    rc, out, _ = proxied.ldap("ldapsearch", "-LLL", "-b", policy, "-s", "base", "-E", "subentries=false", "1.1")
    assert parse_ldif(out) == []


def test_cancel_edges(pando):
    """Cancel of an unknown message ID is noSuchOperation; a malformed
    request is protocolError (a running search: test_hostile.py)."""
    with pando.raw() as c:
        assert ber.simple_bind(c, pando.admin_dn, pando.admin_pw) == 0
        c.send(ber.message(2, ber.extended_op("1.3.6.1.1.8", ber.seq(ber.integer(77)))))
        m = c.recv_msg()
        assert (m["id"], m["code"]) == (2, 119), m
        c.send(ber.message(3, ber.extended_op("1.3.6.1.1.8", b"\x30\x00")))
        m = c.recv_msg()
        assert (m["id"], m["code"]) == (3, 2), m
        c.send(ber.message(4, ber.extended_op("1.3.6.1.1.8")))
        m = c.recv_msg()
        assert (m["id"], m["code"]) == (4, 2), m


def test_result_codes_like_slapd(pando, slapd):
    """Edges RFC 4511 and the extension RFCs name, against slapd."""
    def both(fn):
        return fn(pando), fn(slapd)
    # Who am I? with a request value: protocolError (RFC 4532).
    def whoami_with_value(server):
        with ber.Conn("127.0.0.1", server.port) as c:
            assert ber.simple_bind(c, server.admin_dn, server.admin_pw) == 0
            c.send(ber.message(2, ber.extended_op("1.3.6.1.4.1.4203.1.11.3", b"x")))
            return c.recv_msg()["code"]
    assert both(whoami_with_value) == (2, 2)
    # A modify removing the RDN value: notAllowedOnRDN, as RFC 4511 4.6
    # says (slapd answers namingViolation).
    for ldif in ["dn: %s\nchangetype: modify\ndelete: uid\nuid: dave\n" % DAVE,
                 "dn: %s\nchangetype: modify\nadd: uid\nuid: d2\n-\ndelete: uid\nuid: dave\n" % DAVE]:
        p, s = both(lambda srv: modify(srv, ldif))
        assert code(p[0], p[2]) == 67 and code(s[0], s[2]) in (64, 67), (p, s)
    # A move under a missing superior: noSuchObject; Pando also names the
    # deepest existing entry as matchedDN (RFC 4511 4.1.9), slapd none.
    p, s = both(lambda srv: srv.ldap("ldapmodrdn", "-s", "ou=Nowhere," + SUFFIX, DAVE, "uid=dave"))
    assert p[0] == s[0] == 32, (p, s)
    assert "Matched DN: " + SUFFIX in p[1] + p[2], p


def test_sorted_lists_are_not_shared_across_subentry_visibility(proxied):
    """A sorted list kept for reuse belongs to its subentries setting too."""
    def sorted_dns(*extra):
        rc, out, err = proxied.ldap("ldapsearch", "-LLL", "-b", SUFFIX, *extra, "-E", "sss=cn",
                                    "(objectClass=*)", "1.1")
        assert rc == 0, err
        return [d for d, _ in parse_ldif(out)]
    policy = "cn=policy," + SUFFIX
    assert sorted_dns("-E", "subentries=true") == [policy]
    assert policy not in sorted_dns()
    assert sorted_dns("-E", "subentries=true") == [policy]
