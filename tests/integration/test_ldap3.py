"""The same operations through the python ldap3 client, plus result codes
for error paths, atomicity, large subtree renames and paging."""

import time

import ldap3
import pytest
from ldap3 import BASE, LEVEL, SUBTREE, MODIFY_ADD, MODIFY_DELETE, MODIFY_REPLACE, MODIFY_INCREMENT

import ber
from conftest import ADMIN_DN, GROUPS, PEOPLE, SUFFIX, person_attrs

N_OLD = 1000
N_PAGED = 1200


@pytest.fixture(scope="module")
def srv(demo_server):
    return demo_server


@pytest.fixture(scope="module")
def admin(srv):
    c = srv.conn()
    yield c
    c.unbind()


def dn_of(uid, parent=PEOPLE):
    return "uid=%s,%s" % (uid, parent)


def rc(conn):
    return conn.result["result"]


def entries(conn):
    return [r for r in conn.response or [] if r.get("type") == "searchResEntry"]


def read(conn, dn, attrs=("*", "+")):
    ok = conn.search(dn, "(objectClass=*)", BASE, attributes=list(attrs))
    es = entries(conn)
    assert ok and len(es) == 1, "read %s failed: %s" % (dn, conn.result)
    return {k.lower(): [v.decode("utf-8") for v in vs] for k, vs in es[0]["raw_attributes"].items()}


def ldap3_attrs(a):
    return {k: v for k, v in a.items() if k != "objectClass"}, a["objectClass"]


def add(conn, dn, attrs):
    other, ocs = ldap3_attrs(attrs)
    conn.add(dn, ocs, other)
    return rc(conn)


# ------------------------------------------------------------------ bind


def test_bind_results(srv):
    c = ldap3.Connection(ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE),
                         user=ADMIN_DN, password="wrong-password", raise_exceptions=False)
    assert not c.bind()
    assert c.result["result"] == 49, "wrong password: %s" % c.result
    c = ldap3.Connection(ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE),
                         user="uid=ghost," + PEOPLE, password="whatever", raise_exceptions=False)
    assert not c.bind()
    assert c.result["result"] == 49, "non-existent DN must also give invalidCredentials: %s" % c.result
    c = ldap3.Connection(ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE),
                         user=dn_of("alice"), password="whatever", raise_exceptions=False)
    assert not c.bind()
    assert c.result["result"] == 49, "entry without userPassword: %s" % c.result
    # unauthenticated bind (DN, empty password): RFC 4513 5.1.2 -> unwillingToPerform
    with srv.raw() as r:
        code = ber.simple_bind(r, dn_of("alice"), "")
        assert code == 53, "DN with empty password: expected unwillingToPerform (53), got %d" % code
        # anonymous bind still fine on the same connection
        assert ber.simple_bind(r, "", "", msgid=2) == 0
    a = srv.conn()
    assert a.extend.standard.who_am_i().lower() == ("dn:" + ADMIN_DN).lower()
    a.unbind()


def test_whoami_and_password_modify(srv, admin):
    dn = dn_of("heidi")
    gen = admin.extend.standard.modify_password(user=dn)
    assert gen and isinstance(gen, str), "no generated password returned: %r %s" % (gen, admin.result)
    u = srv.conn(user=dn, password=gen)
    assert u.extend.standard.who_am_i().lower() == ("dn:" + dn).lower()
    assert u.extend.standard.modify_password(old_password=gen, new_password="HeidiNew1") is True, u.result
    u.unbind()
    u = srv.conn(user=dn, password="HeidiNew1")
    # a user may modify their own userPassword with a plain modify
    u.modify(dn, {"userPassword": [(MODIFY_REPLACE, ["HeidiNew2"])]})
    assert rc(u) == 0, "user changing own userPassword via modify: %s" % u.result
    # ... but not other attributes
    u.modify(dn, {"sn": [(MODIFY_REPLACE, ["X"])]})
    assert rc(u) == 50, "user modifying own sn: %s" % u.result
    u.unbind()
    u = srv.conn(user=dn, password="HeidiNew2")
    vals = read(admin, dn, ["userPassword", "modifiersName"])
    assert vals["userpassword"][0].upper().startswith("{ARGON2"), "clear-text userPassword not hashed: %s" % vals
    assert vals["modifiersname"][0].lower() == dn.lower(), "modifiersName after self-change: %s" % vals
    u.unbind()


# ------------------------------------------------------------------ basic ops


def test_crud_roundtrip(srv, admin):
    dn = dn_of("l3a")
    assert add(admin, dn, person_attrs("l3a", 1, {"telephoneNumber": ["1", "2"]})) == 0, admin.result
    assert admin.compare(dn, "cn", "User l3a") is True
    assert admin.compare(dn, "cn", "USER L3A") is True
    assert admin.compare(dn, "cn", "nope") is False
    admin.modify(dn, {"telephoneNumber": [(MODIFY_DELETE, ["1"])], "description": [(MODIFY_ADD, ["d1", "d2"])],
                      "sn": [(MODIFY_REPLACE, ["S1", "S2"])]})
    assert rc(admin) == 0, admin.result
    e = read(admin, dn, ["*"])
    assert e["telephonenumber"] == ["2"] and sorted(e["description"]) == ["d1", "d2"] and sorted(e["sn"]) == ["S1", "S2"]
    for scope, n in ((BASE, 1), (LEVEL, 0), (SUBTREE, 1)):
        admin.search(dn, "(objectClass=*)", scope)
        assert len(entries(admin)) == n, "scope %s" % scope
    admin.search(PEOPLE, "(description=d2)", LEVEL, attributes=["uid"])
    assert [e["dn"].lower() for e in entries(admin)] == [dn.lower()]
    admin.modify_dn(dn, "uid=l3b")
    assert rc(admin) == 0, admin.result
    admin.delete(dn_of("l3b"))
    assert rc(admin) == 0, admin.result
    admin.delete(dn_of("l3b"))
    assert rc(admin) == 32


def test_size_limit(srv, admin):
    admin.search(PEOPLE, "(uid=*)", SUBTREE, attributes=["uid"], size_limit=3)
    assert rc(admin) == 4 and len(entries(admin)) == 3, (admin.result, len(entries(admin)))


def test_modify_increment(srv, admin):
    admin.modify(dn_of("ivan"), {"uidNumber": [(MODIFY_INCREMENT, [100])]})
    assert rc(admin) == 0, admin.result
    assert read(admin, dn_of("ivan"), ["uidNumber"])["uidnumber"] == ["1109"]
    admin.modify(dn_of("ivan"), {"cn": [(MODIFY_INCREMENT, [1])]})
    assert rc(admin) in (18, 19, 21, 53), "increment of a non-integer attribute: %s" % admin.result
    admin.modify(dn_of("ivan"), {"roomNumber": [(MODIFY_INCREMENT, [1])]})
    assert rc(admin) in (16, 18, 19, 53), "increment of an absent attribute (RFC 4525 -> 16 noSuchAttribute?): %s" % admin.result


# ------------------------------------------------------------------ atomicity and schema


def test_modify_is_atomic(srv, admin):
    dn = dn_of("grace")
    before = read(admin, dn, ["*", "+"])
    admin.modify(dn, {"description": [(MODIFY_ADD, ["atomic-1"])],
                      "sn": [(MODIFY_REPLACE, ["Changed"])],
                      "telephoneNumber": [(MODIFY_DELETE, ["+9 999 not there"])]})
    assert rc(admin) == 16, "3rd change deletes a missing value: expected noSuchAttribute (16), got %s" % admin.result
    after = read(admin, dn, ["*", "+"])
    assert after == before, "failed modify changed the entry:\nbefore=%s\nafter=%s" % (before, after)
    admin.search(PEOPLE, "(description=atomic-1)", SUBTREE)
    assert not entries(admin), "index updated by a failed modify"
    admin.search(PEOPLE, "(sn=Changed)", SUBTREE)
    assert not entries(admin), "index updated by a failed modify"


SCHEMA_ADDS = [
    ("missing MUST sn", {"objectClass": ["inetOrgPerson"], "uid": ["sx1"], "cn": ["x"]}, 65),
    ("undefined attribute", {"objectClass": ["inetOrgPerson"], "uid": ["sx1"], "cn": ["x"], "sn": ["x"],
                             "fooBarBaz": ["1"]}, 17),
    ("bad integer syntax", {"objectClass": ["inetOrgPerson", "posixAccount"], "uid": ["sx1"], "cn": ["x"],
                            "sn": ["x"], "uidNumber": ["abc"], "gidNumber": ["1"], "homeDirectory": ["/h"]}, 21),
    ("single-value violation", {"objectClass": ["inetOrgPerson", "posixAccount"], "uid": ["sx1"], "cn": ["x"],
                                "sn": ["x"], "uidNumber": ["1", "2"], "gidNumber": ["1"],
                                "homeDirectory": ["/h"]}, 19),
    ("attribute not allowed by objectClass", {"objectClass": ["person"], "uid": ["sx1"], "cn": ["x"],
                                              "sn": ["x"]}, 65),
    ("unknown objectClass", {"objectClass": ["noSuchClass"], "cn": ["x"]}, (21, 65)),
    ("no structural objectClass", {"objectClass": ["top"], "uid": ["sx1"]}, 65),
]


@pytest.mark.parametrize("name,attrs,code", SCHEMA_ADDS, ids=[n for n, _, _ in SCHEMA_ADDS])
def test_add_schema_violations(srv, admin, name, attrs, code):
    dn = dn_of("sx1") if "uid" in attrs else "cn=x," + PEOPLE
    got = add(admin, dn, attrs)
    codes = code if isinstance(code, tuple) else (code,)
    assert got in codes, "%s: expected %s, got %s" % (name, codes, admin.result)
    admin.search(dn, "(objectClass=*)", BASE)
    assert rc(admin) == 32, "rejected entry exists anyway"


def test_modify_schema_violations(srv, admin):
    dn = dn_of("judy")
    cases = [
        ({"uidNumber": [(MODIFY_REPLACE, ["abc"])]}, 21, "bad syntax"),
        ({"uidNumber": [(MODIFY_ADD, ["7"])]}, 19, "second value of single-valued"),
        ({"sn": [(MODIFY_DELETE, [])]}, 65, "delete MUST attribute"),
        ({"fooBarBaz": [(MODIFY_ADD, ["1"])]}, 17, "undefined attribute"),
        ({"cn": [(MODIFY_ADD, ["Judy Hopps"])]}, 20, "add existing value"),
        ({"cn": [(MODIFY_ADD, ["JUDY HOPPS"])]}, 20, "add value equal under caseIgnoreMatch"),
    ]
    before = read(admin, dn)
    for change, code, what in cases:
        admin.modify(dn, change)
        assert rc(admin) == code, "%s: expected %d, got %s" % (what, code, admin.result)
    assert read(admin, dn) == before, "entry changed by failing modifies"
    admin.modify(dn_of("nobody"), {"sn": [(MODIFY_REPLACE, ["x"])]})
    assert rc(admin) == 32
    # removing the RDN value (uid not required by any class of this entry)
    rdn = dn_of("rdnonly")
    assert add(admin, rdn, person_attrs("rdnonly")) == 0, admin.result
    admin.modify(rdn, {"uid": [(MODIFY_DELETE, ["rdnonly"])]})
    assert rc(admin) in (64, 67), "delete RDN value: expected notAllowedOnRDN (67) (slapd: 64), got %s" % admin.result
    admin.modify(rdn, {"uid": [(MODIFY_REPLACE, ["other"])]})
    assert rc(admin) in (64, 67), "replace RDN value: %s" % admin.result


def test_add_missing_parent_and_duplicate(srv, admin):
    got = add(admin, "uid=x,ou=Missing," + PEOPLE, person_attrs("x"))
    assert got == 32, admin.result
    assert admin.result["dn"].lower() == PEOPLE.lower(), "matchedDN: %r" % admin.result["dn"]
    got = add(admin, dn_of("alice"), person_attrs("alice"))
    assert got == 68, admin.result
    got = add(admin, "uid=ALICE,OU=people,dc=EXAMPLE,dc=com", person_attrs("alice"))
    assert got == 68, "duplicate under DN normalisation: %s" % admin.result
    got = add(admin, "uid=x,dc=other,dc=org", person_attrs("x"))
    assert got in (10, 32, 53), "add outside any suffix: %s" % admin.result


def test_delete_and_moddn_errors(srv, admin):
    admin.delete(GROUPS)
    assert rc(admin) == 66
    admin.modify_dn(dn_of("alice"), "uid=bob")
    assert rc(admin) == 68, admin.result
    admin.modify_dn(PEOPLE, "ou=Inside", new_superior=dn_of("alice"))
    assert rc(admin) in (53, 54, 64), "move a subtree under its own descendant: %s" % admin.result
    admin.search(PEOPLE, "(objectClass=*)", BASE)
    assert len(entries(admin)) == 1


# ------------------------------------------------------------------ big subtree rename


def test_moddn_subtree(srv, admin):
    old = "ou=Old," + SUFFIX
    ents = [(old, {"objectClass": ["organizationalUnit"], "ou": ["Old"]})]
    ents += [("uid=old%04d,%s" % (i, old), person_attrs("old%04d" % i, i)) for i in range(N_OLD)]
    srv.bulk_add(ents)
    assert add(admin, "ou=Moved," + SUFFIX, {"objectClass": ["organizationalUnit"], "ou": ["Moved"]}) == 0
    t0 = time.monotonic()
    admin.modify_dn(old, "ou=New", delete_old_dn=True, new_superior="ou=Moved," + SUFFIX)
    took = time.monotonic() - t0
    assert rc(admin) == 0, "subtree moddn failed: %s" % admin.result
    new = "ou=New,ou=Moved," + SUFFIX
    admin.search(new, "(objectClass=*)", SUBTREE, attributes=["1.1"])
    got = entries(admin)
    assert rc(admin) == 0 and len(got) == N_OLD + 1, "new subtree has %d entries (%s)" % (len(got), admin.result)
    assert all(e["dn"].lower().endswith(new.lower()) for e in got)
    admin.search(old, "(objectClass=*)", BASE)
    assert rc(admin) == 32, "old base still exists: %s" % admin.result
    admin.search(SUFFIX, "(uid=old0500)", SUBTREE, attributes=["entryDN", "uid"])
    es = entries(admin)
    assert [e["dn"].lower() for e in es] == [("uid=old0500," + new).lower()], [e["dn"] for e in es]
    child = read(admin, "uid=old0777," + new, ["*", "+"])
    assert child["entrydn"][0].lower() == ("uid=old0777," + new).lower(), "entryDN not updated: %s" % child["entrydn"]
    ou = read(admin, new, ["ou"])
    assert ou["ou"] == ["New"], "old RDN value not deleted: %s" % ou
    admin.search(new, "(objectClass=*)", LEVEL, attributes=["1.1"])
    assert len(entries(admin)) == N_OLD
    # children keep working: modify and delete one under the new DN
    admin.modify("uid=old0001," + new, {"description": [(MODIFY_ADD, ["moved"])]})
    assert rc(admin) == 0, admin.result
    admin.delete("uid=old0002," + new)
    assert rc(admin) == 0, admin.result
    admin.search(SUFFIX, "(description=moved)", SUBTREE, attributes=["1.1"])
    assert [e["dn"].lower() for e in entries(admin)] == [("uid=old0001," + new).lower()]
    assert took < 60, "subtree rename took %.1fs" % took


def test_paged_search(srv, admin):
    base = "ou=Paged," + SUFFIX
    ents = [(base, {"objectClass": ["organizationalUnit"], "ou": ["Paged"]})]
    ents += [("uid=pg%04d,%s" % (i, base), person_attrs("pg%04d" % i, i)) for i in range(N_PAGED)]
    srv.bulk_add(ents)
    res = admin.extend.standard.paged_search(base, "(objectClass=inetOrgPerson)", LEVEL, attributes=["uid"],
                                             paged_size=100, generator=False)
    es = [r for r in res if r.get("type") == "searchResEntry"]
    got = {e["raw_attributes"]["uid"][0] for e in es}
    assert len(es) == N_PAGED and len(got) == N_PAGED, "paged_search returned %d entries (%d distinct)" % (len(es), len(got))
    # the control comes back with an empty cookie at the end
    ctl = admin.result.get("controls", {}).get("1.2.840.113556.1.4.319")
    assert ctl is not None and ctl["value"]["cookie"] == b"", "last page cookie: %r" % (ctl,)


def test_values_sharing_an_index_key_answer_apart(srv, admin):
    """Equality keys of values longer than 3 bytes are 4-byte hashes, so two
    mail values can share one (these two do: the store's unit test
    `equality_keys_are_short_values_or_four_bytes` pins it). Each search
    answers only the entry holding its value, before and after changes."""
    base = "ou=Shared," + SUFFIX
    srv.bulk_add([(base, {"objectClass": ["organizationalUnit"], "ou": ["Shared"]})])
    a, b = "user.773", "user.13670"
    for uid in (a, b):
        assert add(admin, dn_of(uid, base), person_attrs(uid)) == 0, admin.result

    def found(flt):
        assert admin.search(SUFFIX, flt, SUBTREE, attributes=["uid"]) or rc(admin) == 0, admin.result
        return sorted(e["raw_attributes"]["uid"][0].decode() for e in entries(admin))

    assert found("(mail=%s@example.com)" % a) == [a]
    assert found("(mail=%s@EXAMPLE.com)" % b) == [b]
    assert found("(|(mail=%s@example.com)(mail=%s@example.com))" % (a, b)) == sorted([a, b])
    assert found("(&(objectClass=person)(mail=%s@example.com))" % b) == [b]
    assert found("(mail=user.774@example.com)") == []
    # b takes a's address as a second value; a's entry goes: each answer follows.
    admin.modify(dn_of(b, base), {"mail": [(MODIFY_ADD, ["%s@example.com" % a])]})
    assert rc(admin) == 0, admin.result
    assert found("(mail=%s@example.com)" % a) == sorted([a, b])
    admin.delete(dn_of(a, base))
    assert rc(admin) == 0, admin.result
    assert found("(mail=%s@example.com)" % a) == [b]
    admin.modify(dn_of(b, base), {"mail": [(MODIFY_DELETE, ["%s@example.com" % b])]})
    assert found("(mail=%s@example.com)" % b) == []
    assert found("(mail=%s@example.com)" % a) == [b]
    # Two uids sharing a key, each its entry's RDN (confirmed by the RDN,
    # the entry not read), and one held by an entry named otherwise.
    c, d = "user.53498", "user.64960"
    for uid in (c, d):
        assert add(admin, dn_of(uid, base), person_attrs(uid)) == 0, admin.result
    other = "cn=holder,%s" % base
    assert add(admin, other, dict(person_attrs("x"), uid=["holder", c.upper()])) == 0, admin.result

    def dns(flt):
        assert admin.search(base, flt, SUBTREE, attributes=["1.1"]) or rc(admin) == 0, admin.result
        return sorted(e["dn"].lower() for e in entries(admin))

    assert dns("(uid=%s)" % c) == sorted([dn_of(c, base).lower(), other.lower()])
    assert dns("(uid=%s)" % d) == [dn_of(d, base).lower()]
    assert found("(uid=%s)" % d) == [d]
    assert found("(uid=USER.64961)") == []


# ------------------------------------------------------------------ operational attributes


def test_operational_attributes_change(srv, admin):
    dn = dn_of("opattr")
    assert add(admin, dn, person_attrs("opattr")) == 0, admin.result
    a = read(admin, dn, ["+"])
    for k in ("entryuuid", "entrycsn", "createtimestamp", "modifytimestamp", "creatorsname", "modifiersname",
              "structuralobjectclass", "entrydn", "subschemasubentry", "hassubordinates"):
        assert k in a, "missing operational attribute %s: %s" % (k, sorted(a))
    assert a["creatorsname"][0].lower() == ADMIN_DN.lower()
    assert a["createtimestamp"] == a["modifytimestamp"]
    assert "numsubordinates" not in a, "numSubordinates should be returned by name only"
    time.sleep(1.1)
    admin.modify(dn, {"description": [(MODIFY_ADD, ["x"])]})
    assert rc(admin) == 0
    b = read(admin, dn, ["+"])
    assert b["createtimestamp"] == a["createtimestamp"]
    assert b["entryuuid"] == a["entryuuid"]
    assert b["modifytimestamp"][0] > a["modifytimestamp"][0], (a["modifytimestamp"], b["modifytimestamp"])
    assert b["entrycsn"][0] > a["entrycsn"][0], (a["entrycsn"], b["entrycsn"])
    # operational attributes cannot be written by clients
    admin.modify(dn, {"entryUUID": [(MODIFY_REPLACE, ["00000000-0000-0000-0000-000000000000"])]})
    assert rc(admin) in (19, 50, 53), "modifying entryUUID: %s" % admin.result
    admin.modify(dn, {"createTimestamp": [(MODIFY_REPLACE, ["20000101000000Z"])]})
    assert rc(admin) in (19, 50, 53), "modifying createTimestamp: %s" % admin.result
    # rename keeps the UUID and the creation time, bumps entryCSN
    time.sleep(1.1)
    admin.modify_dn(dn, "uid=opattr2")
    assert rc(admin) == 0
    c = read(admin, dn_of("opattr2"), ["+"])
    assert c["entryuuid"] == a["entryuuid"] and c["createtimestamp"] == a["createtimestamp"]
    assert c["entrycsn"][0] > b["entrycsn"][0]
    assert c["entrydn"][0].lower() == dn_of("opattr2").lower()
    # a failed modify changes nothing
    admin.modify(dn_of("opattr2"), {"sn": [(MODIFY_DELETE, ["not-there"])]})
    assert rc(admin) == 16
    assert read(admin, dn_of("opattr2"), ["+"]) == c
    # parent hasSubordinates / numSubordinates
    p = read(admin, PEOPLE, ["hasSubordinates", "numSubordinates"])
    assert p["hassubordinates"][0].upper() == "TRUE"
    admin.search(PEOPLE, "(objectClass=*)", LEVEL, attributes=["1.1"])
    assert p["numsubordinates"] == [str(len(entries(admin)))]


def test_restart_keeps_data(fresh_server):
    """A fresh store: writes survive a graceful restart, the admin password is kept."""
    s = fresh_server
    c = s.conn()
    assert add(c, dn_of("persist"), person_attrs("persist", 1, {"description": ["kept"]})) == 0, c.result
    c.modify(dn_of("alice"), {"description": [(MODIFY_REPLACE, ["changed before restart"])]})
    assert rc(c) == 0
    c.delete(dn_of("bob"))
    assert rc(c) == 0
    c.unbind()
    pw = s.admin_pw
    assert s.stop() == 0, "SIGTERM exit code:\n" + s.logs()
    vrc, vout = s.verify()
    assert vrc == 0, vout
    s.demo = False  # --demo on a restart would re-add missing demo entries
    s.start()
    assert s.admin_pw == pw, "admin password changed across restart"
    c = s.conn()
    assert read(c, dn_of("persist"), ["description"])["description"] == ["kept"]
    assert read(c, dn_of("alice"), ["description"])["description"] == ["changed before restart"]
    c.search(dn_of("bob"), "(objectClass=*)", BASE)
    assert rc(c) == 32
    c.search(PEOPLE, "(description=kept)", SUBTREE, attributes=["1.1"])
    assert len(entries(c)) == 1, "index lost across restart"
    c.search(SUFFIX, "(objectClass=*)", SUBTREE, attributes=["1.1"])
    n = len(entries(c))
    c.unbind()
    assert n == 1 + 2 + 10 + 6, "entries after restart: %d (suffix, 2 ous, 10 users -1 +1, 6 groups)" % n


def test_concurrent_modifies_of_one_entry_all_apply(tmp_path):
    """Modifies are prepared outside the writer and confirmed in it; racing
    changes to one entry must all land, in some serial order."""
    import threading
    import ldap3
    from conftest import Pando, SUFFIX
    srv = Pando(tmp_path, demo=True).start()
    dn = "uid=alice,ou=People," + SUFFIX
    errors = []

    def bump(n):
        c = srv.conn()
        for _ in range(n):
            if not c.modify(dn, {"uidNumber": [(ldap3.MODIFY_INCREMENT, ["1"])]}):
                errors.append(dict(c.result))
        c.unbind()

    threads = [threading.Thread(target=bump, args=(40,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    rc, entries, err = srv.search(dn, "(objectClass=*)", "uidNumber", scope="base")
    assert entries[0][1]["uidNumber"] == [str(1001 + 8 * 40)], entries
    srv.stop_and_verify()
