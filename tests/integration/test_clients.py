"""OpenLDAP command-line clients (ldap-utils) against Pando."""

import re

import pytest

from conftest import ADMIN_DN, GROUPS, PEOPLE, SUFFIX, have, person_attrs

pytestmark = pytest.mark.skipif(not have("ldapsearch"), reason="ldap-utils not installed")

BULK = "ou=Bulk," + SUFFIX
N_BULK = 1000


@pytest.fixture(scope="module")
def srv(demo_server):
    entries = [(BULK, {"objectClass": ["top", "organizationalUnit"], "ou": ["Bulk"]})]
    entries += [("uid=b%04d,%s" % (i, BULK), person_attrs("b%04d" % i, i)) for i in range(N_BULK)]
    demo_server.bulk_add(entries)
    return demo_server


def dn_of(uid):
    return "uid=%s,%s" % (uid, PEOPLE)


def uids(entries):
    return {v.lower() for _, a in entries for k, vs in a.items() if k.lower() == "uid" for v in vs}


def attr(entry, name):
    """Values of attribute `name` (case-insensitive) of a parsed entry."""
    return [v for k, vs in entry[1].items() if k.lower() == name.lower() for v in vs]


def names(entry):
    return {k.lower() for k in entry[1]}


# ------------------------------------------------------------------ scopes


@pytest.mark.parametrize("scope,expected", [("base", 1), ("one", 10), ("sub", 11), ("children", 10)])
def test_scopes(srv, scope, expected):
    rc, es, err = srv.search(PEOPLE, "(objectClass=*)", "1.1", scope=scope)
    assert rc == 0, "ldapsearch -s %s failed rc=%d: %s" % (scope, rc, err)
    assert len(es) == expected, "scope %s: expected %d entries, got %d: %s" % (
        scope, expected, len(es), [d for d, _ in es])
    if scope == "base":
        assert es[0][0].lower() == PEOPLE.lower()
    if scope in ("one", "children"):
        assert PEOPLE.lower() not in {d.lower() for d, _ in es}


def test_suffix_entry(srv):
    rc, es, err = srv.search(SUFFIX, "(objectClass=*)", scope="base")
    assert rc == 0, err
    assert len(es) == 1
    ocs = {v.lower() for v in attr(es[0], "objectClass")}
    assert {"dcobject", "organization"} <= ocs, ocs
    assert attr(es[0], "o") == ["example"]


# ------------------------------------------------------------------ filters

ALL = {"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"}

FILTERS = [
    ("(uid=alice)", {"alice"}),
    ("(UID=ALICE)", {"alice"}),
    ("(mail=ALICE@EXAMPLE.COM)", {"alice"}),
    ("(telephoneNumber=+15550101)", {"alice"}),
    ("(cn=Al*)", {"alice"}),
    ("(cn=*o*)", {"bob", "carol", "erin", "frank", "grace", "ivan", "judy"}),
    ("(cn=*er)", {"bob", "dave", "grace"}),
    ("(cn=G*a*er)", {"grace"}),
    ("(cn=*IDDEL*)", {"alice"}),
    ("(uidNumber>=1008)", {"heidi", "ivan", "judy"}),
    ("(uidNumber<=1002)", {"alice", "bob"}),
    ("(uidNumber=1003)", {"carol"}),
    ("(telephoneNumber=*)", ALL),
    ("(uid=*)", ALL),
    ("(&(objectClass=posixAccount)(uidNumber>=1005)(!(uid=erin)))", {"frank", "grace", "heidi", "ivan", "judy"}),
    ("(|(uid=alice)(uid=bob)(cn=Judy*))", {"alice", "bob", "judy"}),
    ("(&(objectClass=person)(!(uid=a*)))", ALL - {"alice"}),
    ("(&(uid=alice)(uid=bob))", set()),
    ("(uid=nobody)", set()),
    ("(cn:caseExactMatch:=Alice Liddell)", {"alice"}),
    ("(cn:caseExactMatch:=alice liddell)", set()),
    ("(uidNumber:integerMatch:=1004)", {"dave"}),
    ("(:caseIgnoreMatch:=judy)", {"judy"}),
    ("(|(uid=heidi)(nonexistentAttr=x))", {"heidi"}),
]


@pytest.mark.parametrize("filt,expected", FILTERS, ids=[f for f, _ in FILTERS])
def test_filters(srv, filt, expected):
    rc, es, err = srv.search(PEOPLE, filt, "uid", auth=None)
    assert rc == 0, "filter %s: rc=%d %s" % (filt, rc, err)
    assert uids(es) == expected, "filter %s: expected %s, got %s" % (filt, sorted(expected), sorted(uids(es)))


def test_filter_approx(srv):
    rc, es, err = srv.search(PEOPLE, "(cn~=Alise Liddel)", "uid", auth=None)
    assert rc == 0, err
    assert "alice" in uids(es), "approx match did not find alice: %s" % uids(es)
    assert len(es) <= 3, "approx match much too loose: %s" % uids(es)


def test_filter_dn_attributes(srv):
    rc, es, err = srv.search(SUFFIX, "(ou:dn:=People)", "1.1", auth=None)
    assert rc == 0, err
    got = {d.lower() for d, _ in es}
    want = {PEOPLE.lower()} | {dn_of(u).lower() for u in ALL}
    assert got == want, "(ou:dn:=People): missing %s, extra %s" % (want - got, got - want)


def test_filter_groups(srv):
    rc, es, err = srv.search(SUFFIX, "(objectClass=groupOfNames)", "cn", auth=None)
    assert rc == 0, err
    assert {attr(e, "cn")[0] for e in es} == {"engineering", "operations", "staff"}
    rc, es, err = srv.search(SUFFIX, "(member=UID=ALICE,OU=PEOPLE,DC=EXAMPLE,DC=COM)", "cn")
    assert rc == 0, err
    assert {attr(e, "cn")[0] for e in es} == {"engineering", "staff"}, "member DN match (distinguishedNameMatch)"
    rc, es, err = srv.search(SUFFIX, "(memberUid=bob)", "cn")
    assert {attr(e, "cn")[0] for e in es} == {"operations-posix", "staff-posix"}


def test_bad_filter_syntax_client_side(srv):
    rc, out, err = srv.ldap("ldapsearch", "-b", SUFFIX, "(uid=alice")
    assert rc != 0


# ------------------------------------------------------------------ attribute selection


def test_attrs_star(srv):
    rc, es, err = srv.search(dn_of("alice"), "(objectClass=*)", "*", scope="base")
    assert rc == 0, err
    n = names(es[0])
    assert {"cn", "sn", "uid", "mail", "uidnumber", "objectclass"} <= n, n
    assert not n & {"entryuuid", "createtimestamp", "entrycsn", "modifytimestamp"}, "operational attrs in '*': %s" % n


def test_attrs_plus(srv):
    rc, es, err = srv.search(dn_of("alice"), "(objectClass=*)", "+", scope="base")
    assert rc == 0, err
    n = names(es[0])
    want = {"entryuuid", "entrycsn", "createtimestamp", "modifytimestamp", "creatorsname",
            "modifiersname", "structuralobjectclass", "entrydn", "subschemasubentry", "hassubordinates"}
    assert want <= n, "missing operational attributes with '+': %s" % (want - n)
    assert "cn" not in n and "objectclass" not in n, "user attributes returned with '+': %s" % n
    e = es[0]
    assert attr(e, "structuralObjectClass")[0].lower() == "inetorgperson"
    assert attr(e, "entryDN")[0].lower() == dn_of("alice").lower()
    assert attr(e, "hasSubordinates")[0].upper() == "FALSE"
    assert attr(e, "subschemaSubentry")[0].lower() == "cn=subschema"
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                        attr(e, "entryUUID")[0].lower()), attr(e, "entryUUID")
    assert re.fullmatch(r"\d{14}(\.\d+)?Z", attr(e, "createTimestamp")[0]), attr(e, "createTimestamp")


def test_attrs_star_plus_and_named_operational(srv):
    rc, es, err = srv.search(dn_of("alice"), "(objectClass=*)", "*", "+", scope="base")
    assert rc == 0, err
    assert {"cn", "entryuuid"} <= names(es[0])
    rc, es, err = srv.search(PEOPLE, "(objectClass=*)", "numSubordinates", "hasSubordinates", scope="base")
    assert rc == 0, err
    assert attr(es[0], "numSubordinates") == ["10"], es[0]
    assert attr(es[0], "hasSubordinates")[0].upper() == "TRUE"


def test_attrs_1_1(srv):
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", dn_of("alice"), "-s", "base", "(objectClass=*)", "1.1")
    assert rc == 0, err
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].lower().startswith("dn:"), "1.1 returned attributes: %r" % out


def test_attrs_objectclass_shorthand(srv):
    rc, es, err = srv.search(dn_of("alice"), "(objectClass=*)", "@inetOrgPerson", scope="base")
    assert rc == 0, err
    n = names(es[0])
    assert {"cn", "sn", "mail", "givenname", "telephonenumber", "uid"} <= n, n
    assert not n & {"uidnumber", "homedirectory", "loginshell"}, "posixAccount attrs in @inetOrgPerson: %s" % n


def test_types_only(srv):
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-A", "-b", dn_of("alice"), "-s", "base", "(objectClass=*)",
                            "cn", "mail")
    assert rc == 0, err
    lines = [l.strip() for l in out.splitlines() if l.strip() and not l.lower().startswith("dn:")]
    assert sorted(l.rstrip(":").lower() for l in lines) == ["cn", "mail"], "typesOnly output: %r" % out
    assert "Alice" not in out


def test_userpassword_hidden(srv):
    rc, _, err = srv.ldap("ldappasswd", "-s", "HiddenPw1", dn_of("erin"))
    assert rc == 0, err
    rc, es, err = srv.search(dn_of("erin"), "(objectClass=*)", "userPassword", scope="base", auth=None)
    assert rc == 0 and len(es) == 1, err
    assert not attr(es[0], "userPassword"), "anonymous can read userPassword"
    rc, es, err = srv.search(dn_of("erin"), "(objectClass=*)", "userPassword", scope="base")
    vals = attr(es[0], "userPassword")
    assert vals and vals[0].upper().startswith("{ARGON2"), "admin sees userPassword hashed: %r" % vals
    rc, es, err = srv.search(PEOPLE, "(userPassword=*)", "uid", auth=None)
    assert "erin" not in uids(es), "anonymous can probe userPassword with a filter"


# ------------------------------------------------------------------ limits and paging


def test_sizelimit_exceeded(srv):
    for auth in (None, "admin"):
        rc, out, err = srv.ldap("ldapsearch", "-LLL", "-z", "5", "-b", PEOPLE, "(uid=*)", "1.1", auth=auth)
        assert rc == 4, "expected sizeLimitExceeded (4), got rc=%d (%s)" % (rc, auth)
        n = sum(1 for l in out.splitlines() if l.lower().startswith("dn:"))
        assert n == 5, "expected 5 entries before the size limit, got %d" % n


def test_server_sizelimit_for_anonymous(srv):
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", BULK, "-s", "one", "(objectClass=*)", "1.1", auth=None)
    n = sum(1 for l in out.splitlines() if l.lower().startswith("dn:"))
    # limits.anonymous.size_limit (100) is below limits.size_limit (500).
    assert rc == 4 and n == 100, "anonymous over 1000 entries: expected rc 4 with 100 entries, got rc=%d n=%d" % (rc, n)
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", BULK, "-s", "one", "(objectClass=*)", "1.1")
    n = sum(1 for l in out.splitlines() if l.lower().startswith("dn:"))
    assert rc == 0 and n == N_BULK, "admin is unlimited: rc=%d n=%d" % (rc, n)


def test_paged_results(srv):
    for auth in ("admin",):
        rc, out, err = srv.ldap("ldapsearch", "-LLL", "-E", "pr=100/noprompt", "-b", BULK, "-s", "one",
                                "(objectClass=inetOrgPerson)", "uid", auth=auth)
        assert rc == 0, "paged search failed rc=%d: %s" % (rc, err)
        got = set(re.findall(r"^uid: (\S+)$", out, re.M))
        assert len(got) == N_BULK, "paged search (%s) returned %d distinct entries, want %d" % (auth, len(got), N_BULK)


# ------------------------------------------------------------------ writes


def test_anonymous_and_user_writes_refused(srv):
    ldif = "dn: uid=anonw,%s\nobjectClass: inetOrgPerson\nuid: anonw\ncn: a\nsn: a\n" % PEOPLE
    rc, _, err = srv.ldap("ldapadd", input=ldif, auth=None)
    assert rc == 8, "anonymous add: expected strongerAuthRequired (8), got %d %s" % (rc, err)
    rc, _, err = srv.ldap("ldappasswd", "-s", "UserPw1", dn_of("frank"))
    assert rc == 0, err
    rc, _, err = srv.ldap("ldapadd", input=ldif, auth=(dn_of("frank"), "UserPw1"))
    assert rc == 50, "user add: expected insufficientAccessRights (50), got %d %s" % (rc, err)
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: sn\nsn: X\n" % dn_of("frank"),
                          auth=(dn_of("frank"), "UserPw1"))
    assert rc == 50, "user modifying own sn: expected 50, got %d %s" % (rc, err)


CLI1 = "uid=cli1," + PEOPLE


def test_ldapadd(srv):
    ldif = ("dn: %s\nobjectClass: top\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            "uid: cli1\ncn: Cli One\nsn: One\nmail: cli1@example.com\nuidNumber: 5000\ngidNumber: 5000\n"
            "homeDirectory: /home/cli1\ndescription:: w4lsw6h2ZSBuYcOvdmU=\n" % CLI1)
    rc, out, err = srv.ldap("ldapadd", input=ldif)
    assert rc == 0, "ldapadd failed rc=%d: %s" % (rc, err)
    rc, es, err = srv.search(CLI1, "(objectClass=*)", scope="base")
    assert rc == 0 and len(es) == 1, err
    assert attr(es[0], "description") == ["\u00c9l\u00e8ve na\u00efve"], attr(es[0], "description")
    rc, out, err = srv.ldap("ldapadd", input=ldif)
    assert rc == 68, "duplicate add: expected entryAlreadyExists (68), got %d" % rc


def test_ldapmodify_add_delete_replace(srv):
    ldif = ("dn: %s\nchangetype: modify\nadd: telephoneNumber\ntelephoneNumber: +1 555 9999\n"
            "telephoneNumber: +1 555 8888\n-\nreplace: sn\nsn: Replaced\n-\ndelete: mail\n-\n"
            "delete: description\n" % CLI1)
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, "ldapmodify failed rc=%d: %s" % (rc, err)
    rc, es, err = srv.search(CLI1, "(objectClass=*)", scope="base")
    e = es[0]
    assert sorted(attr(e, "telephoneNumber")) == ["+1 555 8888", "+1 555 9999"]
    assert attr(e, "sn") == ["Replaced"]
    assert not attr(e, "mail") and not attr(e, "description")
    # delete one specific value
    ldif = "dn: %s\nchangetype: modify\ndelete: telephoneNumber\ntelephoneNumber: +1 555 8888\n" % CLI1
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, err
    rc, es, err = srv.search(CLI1, "(objectClass=*)", "telephoneNumber", scope="base")
    assert attr(es[0], "telephoneNumber") == ["+1 555 9999"]
    # delete a value that is not there -> noSuchAttribute (16)
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 16, "delete of missing value: expected 16, got %d" % rc


def test_ldapmodify_increment(srv):
    ldif = "dn: %s\nchangetype: modify\nincrement: uidNumber\nuidNumber: 5\n" % CLI1
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, "increment failed rc=%d: %s" % (rc, err)
    rc, es, err = srv.search(CLI1, "(objectClass=*)", "uidNumber", scope="base")
    assert attr(es[0], "uidNumber") == ["5005"], attr(es[0], "uidNumber")
    ldif = "dn: %s\nchangetype: modify\nincrement: uidNumber\nuidNumber: -10\n" % CLI1
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, err
    rc, es, err = srv.search(PEOPLE, "(uidNumber=4995)", "uid")
    assert uids(es) == {"cli1"}, "index not updated after increment: %s" % uids(es)


def test_ldapmodify_changetype_add_and_delete(srv):
    ldif = ("dn: uid=cli2,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: cli2\ncn: Cli Two\nsn: Two\n\n"
            "dn: uid=cli2,%s\nchangetype: delete\n" % (PEOPLE, PEOPLE))
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, err
    rc, es, err = srv.search("uid=cli2," + PEOPLE, "(objectClass=*)", scope="base")
    assert rc == 32, "deleted entry still found: rc=%d" % rc


def test_ldapdelete(srv):
    rc, out, err = srv.ldap("ldapdelete", PEOPLE)
    assert rc == 66, "delete non-leaf: expected notAllowedOnNonLeaf (66), got %d %s" % (rc, err)
    rc, out, err = srv.ldap("ldapdelete", "uid=missing," + PEOPLE)
    assert rc == 32, "delete missing: expected 32, got %d" % rc
    rc, out, err = srv.ldap("ldapdelete", CLI1)
    assert rc == 0, err
    rc, es, err = srv.search(CLI1, "(objectClass=*)", scope="base")
    assert rc == 32
    rc, es, err = srv.search(PEOPLE, "(uid=cli1)", "uid")
    assert rc == 0 and not es, "deleted entry still matches an index: %s" % es


def test_ldapmodrdn(srv):
    ldif = "dn: uid=mr1,%s\nobjectClass: inetOrgPerson\nuid: mr1\ncn: Mod Rdn\nsn: Rdn\n" % PEOPLE
    assert srv.ldap("ldapadd", input=ldif)[0] == 0
    # keep old RDN value (no -r)
    rc, out, err = srv.ldap("ldapmodrdn", "uid=mr1," + PEOPLE, "uid=mr2")
    assert rc == 0, "ldapmodrdn failed rc=%d: %s" % (rc, err)
    rc, es, err = srv.search("uid=mr2," + PEOPLE, "(objectClass=*)", "uid", scope="base")
    assert rc == 0, err
    assert sorted(attr(es[0], "uid")) == ["mr1", "mr2"], attr(es[0], "uid")
    # -r removes the old RDN value
    rc, out, err = srv.ldap("ldapmodrdn", "-r", "uid=mr2," + PEOPLE, "uid=mr3")
    assert rc == 0, err
    rc, es, err = srv.search("uid=mr3," + PEOPLE, "(objectClass=*)", "uid", scope="base")
    assert sorted(attr(es[0], "uid")) == ["mr1", "mr3"], attr(es[0], "uid")
    # -s new superior
    rc, out, err = srv.ldap("ldapmodrdn", "-r", "-s", GROUPS, "uid=mr3," + PEOPLE, "uid=mr4")
    assert rc == 0, err
    rc, es, err = srv.search("uid=mr4," + GROUPS, "(objectClass=*)", "uid", scope="base")
    assert rc == 0 and len(es) == 1, "moved entry not found: rc=%d" % rc
    assert sorted(attr(es[0], "uid")) == ["mr1", "mr4"]
    assert srv.search("uid=mr3," + PEOPLE, "(objectClass=*)", scope="base")[0] == 32
    rc, es, err = srv.search(SUFFIX, "(uid=mr4)", "1.1")
    assert [d.lower() for d, _ in es] == [("uid=mr4," + GROUPS).lower()]
    # target exists -> 68; missing new superior -> 32
    rc, out, err = srv.ldap("ldapmodrdn", "uid=mr4," + GROUPS, "cn=staff")
    assert rc == 68, "rename onto an existing DN: expected 68, got %d" % rc
    rc, out, err = srv.ldap("ldapmodrdn", "-s", "ou=Nowhere," + SUFFIX, "uid=mr4," + GROUPS, "uid=mr5")
    assert rc == 32, "rename under missing superior: expected 32, got %d" % rc


def test_ldapcompare(srv):
    rc, out, err = srv.ldap("ldapcompare", dn_of("alice"), "cn:Alice Liddell", auth=None)
    assert rc == 6 and "TRUE" in out, "compare TRUE: rc=%d out=%r" % (rc, out)
    rc, out, err = srv.ldap("ldapcompare", dn_of("alice"), "cn:alice liddell", auth=None)
    assert rc == 6, "compare uses the equality rule (caseIgnore): rc=%d" % rc
    rc, out, err = srv.ldap("ldapcompare", dn_of("alice"), "cn:Nobody", auth=None)
    assert rc == 5 and "FALSE" in out, "compare FALSE: rc=%d out=%r" % (rc, out)
    rc, out, err = srv.ldap("ldapcompare", dn_of("alice"), "uidNumber:1001", auth=None)
    assert rc == 6
    rc, out, err = srv.ldap("ldapcompare", "uid=nobody," + PEOPLE, "cn:x", auth=None)
    assert rc == 32, "compare on missing entry: expected 32, got %d" % rc
    rc, out, err = srv.ldap("ldapcompare", dn_of("alice"), "roomNumber:1", auth=None)
    assert rc == 16, "compare on absent attribute: expected noSuchAttribute (16), got %d" % rc


def test_ldapwhoami(srv):
    rc, out, err = srv.ldap("ldapwhoami", auth=None)
    assert rc == 0 and out.strip() == "anonymous", "anonymous whoami: rc=%d %r" % (rc, out)
    rc, out, err = srv.ldap("ldapwhoami")
    assert rc == 0 and out.strip().lower() == ("dn:" + ADMIN_DN).lower(), repr(out)
    assert srv.ldap("ldappasswd", "-s", "WhoPw1", dn_of("dave"))[0] == 0
    rc, out, err = srv.ldap("ldapwhoami", auth=(dn_of("dave"), "WhoPw1"))
    assert rc == 0 and out.strip().lower() == ("dn:" + dn_of("dave")).lower(), repr(out)


def test_ldapwhoami_over_ldapi(srv):
    rc, out, err = srv.ldap("ldapwhoami", url=srv.ldapi_url)
    assert rc == 0 and out.strip().lower() == ("dn:" + ADMIN_DN).lower(), "ldapi: rc=%d %r %s" % (rc, out, err)


def test_ldappasswd(srv):
    bob = dn_of("bob")
    rc, out, err = srv.ldap("ldappasswd", "-s", "BobPw1", bob)
    assert rc == 0, "admin sets password: rc=%d %s" % (rc, err)
    assert srv.ldap("ldapwhoami", auth=(bob, "BobPw1"))[0] == 0
    assert srv.ldap("ldapwhoami", auth=(bob, "wrong"))[0] == 49
    # user changes own password
    rc, out, err = srv.ldap("ldappasswd", "-a", "BobPw1", "-s", "BobPw2", auth=(bob, "BobPw1"))
    assert rc == 0, "self change: rc=%d %s" % (rc, err)
    assert srv.ldap("ldapwhoami", auth=(bob, "BobPw2"))[0] == 0
    assert srv.ldap("ldapwhoami", auth=(bob, "BobPw1"))[0] == 49
    # wrong old password
    rc, out, err = srv.ldap("ldappasswd", "-a", "nope", "-s", "BobPw3", auth=(bob, "BobPw2"))
    assert rc != 0, "password change with a wrong old password succeeded"
    # user cannot change another user's password
    rc, out, err = srv.ldap("ldappasswd", "-s", "Evil1", dn_of("alice"), auth=(bob, "BobPw2"))
    assert rc != 0 and "(50)" in out, "user changing another's password: expected 50, got rc=%d %r" % (rc, out)
    # generated password
    carol = dn_of("carol")
    rc, out, err = srv.ldap("ldappasswd", carol)
    assert rc == 0, err
    m = re.search(r"New password: (\S+)", out)
    assert m, "no generated password printed: %r" % out
    assert srv.ldap("ldapwhoami", auth=(carol, m.group(1)))[0] == 0, "bind with generated password failed"
    # user without password cannot bind (empty password is unauthenticated bind -> refused)
    rc, out, err = srv.ldap("ldapwhoami", auth=(dn_of("judy"), "anything"))
    assert rc == 49


def test_root_dse(srv):
    rc, es, err = srv.search("", "(objectClass=*)", "+", scope="base", auth=None)
    assert rc == 0 and len(es) == 1, err
    e = es[0]
    assert SUFFIX in [v.lower() for v in attr(e, "namingContexts")], attr(e, "namingContexts")
    assert "3" in attr(e, "supportedLDAPVersion")
    ext = set(attr(e, "supportedExtension"))
    assert {"1.3.6.1.4.1.4203.1.11.3", "1.3.6.1.4.1.4203.1.11.1"} <= ext, ext
    assert "1.2.840.113556.1.4.319" in attr(e, "supportedControl"), attr(e, "supportedControl")
    assert [v.lower() for v in attr(e, "subschemaSubentry")] == ["cn=subschema"]
    rc, es, err = srv.search("", "(objectClass=*)", scope="base", auth=None)
    assert rc == 0 and len(es) == 1


def test_subschema(srv):
    rc, es, err = srv.search("cn=Subschema", "(objectClass=*)", "+", scope="base", auth=None)
    assert rc == 0 and len(es) == 1, "cn=Subschema: rc=%d %s" % (rc, err)
    e = es[0]
    for a in ("attributeTypes", "objectClasses", "ldapSyntaxes", "matchingRules"):
        assert attr(e, a), "cn=Subschema lacks %s" % a
    ocs = " ".join(attr(e, "objectClasses"))
    assert re.search(r"NAME '?inetOrgPerson'?", ocs), "inetOrgPerson not in objectClasses"
    ats = attr(e, "attributeTypes")
    assert any(re.search(r"NAME \(?\s*'uid'", a) for a in ats), "uid not in attributeTypes"
    rc, es, err = srv.search("cn=Subschema", "(objectClass=subschema)", "attributeTypes", scope="base", auth=None)
    assert rc == 0 and attr(es[0], "attributeTypes"), "explicit attributeTypes request"
    # RFC 4512 4.2: timestamps clients compare before reading it again
    # (operational: with "+", not with "*").
    stamps = [attr(e, a) for a in ("createTimestamp", "modifyTimestamp")]
    assert all(len(v) == 1 and re.fullmatch(r"\d{14}Z", v[0]) for v in stamps), stamps
    rc, es, err = srv.search("cn=Subschema", "(objectClass=*)", "*", scope="base", auth=None)
    assert rc == 0 and not attr(es[0], "modifyTimestamp"), es
