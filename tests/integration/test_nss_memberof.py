"""A real NSS client resolves a user's groups through the memberOf values
Pando's memberof overlay keeps (docs/overlays.md, "memberOf").

The client is SSSD's LDAP provider with `ldap_schema = ipa`. For that schema
SSSD's initgroups (src/providers/ldap/sdap_async_initgroups.c,
sdap_get_initgr_user -> sdap_initgr_nested_send, SSSD 2.8) reads the user's
memberOf (`ldap_user_member_of`, memberOf in the IPA/rfc2307bis maps) and
then reads each group it names with a base search; with rfc2307 it searches
groups by (memberUid=<name>), with rfc2307bis by (member=<user DN>). nslcd
has no memberOf support at all (nslcd/group.c: groups by memberUid or
member), so it cannot prove anything here.

SSSD runs against a Pando holding the memberof overlay (default settings)
and the accesslog overlay logging reads; the system's NSS points at it
(`passwd`/`group: files sss`), and `id` / `getent initgroups` answer:
- with the groups the users' memberOf names, after a member is added and
  after one is removed over LDAP (the cache expired with `sss_cache -E`);
- Pando's access log shows SSSD reading the user with memberOf and each of
  those groups by DN, and never searching groups by member;
- a group that lists a user as member but is missing from the user's
  memberOf (written by an administrator under the relax rules control) is
  not among the user's groups: the list comes from memberOf, not member.

Groups are groupOfNames (what the overlay knows as groups, RFC 2307's
posixGroup being a second structural class) with extensibleObject for
gidNumber; SSSD is told `ldap_group_object_class = groupOfNames`.

The test runs as root: it rewrites /etc/nsswitch.conf and runs sssd with its
databases in /var/lib/sss. Everything below the paths in SYSTEM_PATHS is
put back as it was (files created there removed) even when a test fails.
"""

import re
import time

import pytest

from conftest import SUFFIX, server_with
from sssd_env import NSSWITCH, SSSD_PATHS, Sssd, run, why_not_here, with_sss
from system_files import SystemFiles

PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
SERVICES = "ou=Services," + SUFFIX
SSSD_DN = "cn=sssd," + SERVICES
SSSD_PW = "nss-reader-secret"
DOMAIN = "pandotest"

# Everything sssd or this test writes outside the test's temporary directory.
SYSTEM_PATHS = SSSD_PATHS

# Names no local account is likely to have: `files` is asked first.
USERS = {"mo-nina": 70001, "mo-omar": 70002}
GIDS = {"mo-users": 70000, "mo-dev": 70101, "mo-ops": 70102, "mo-qa": 70103}
MEMBERS = {"mo-users": ["mo-nina", "mo-omar"], "mo-dev": ["mo-nina"],
           "mo-ops": ["mo-nina", "mo-omar"], "mo-qa": ["mo-omar"]}
# Each user's groups as the directory starts (the primary group, mo-users, is
# also a group they are members of).
START = {u: {g for g, ms in MEMBERS.items() if u in ms} for u in USERS}


def user_dn(u):
    return "uid=%s,%s" % (u, PEOPLE)


def group_dn(g):
    return "cn=%s,%s" % (g, GROUPS)


def entries():
    out = [(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
           (GROUPS, {"objectClass": ["organizationalUnit"], "ou": ["Groups"]}),
           (SERVICES, {"objectClass": ["organizationalUnit"], "ou": ["Services"]}),
           # SSSD binds as an ordinary account: the built-in access rules let
           # authenticated users read the tree, memberOf included.
           (SSSD_DN, {"objectClass": ["organizationalRole", "simpleSecurityObject"], "cn": ["sssd"],
                      "userPassword": [SSSD_PW]})]
    for u, uid in USERS.items():
        out.append((user_dn(u), {
            "objectClass": ["inetOrgPerson", "posixAccount"], "uid": [u], "cn": [u], "sn": [u],
            "uidNumber": [str(uid)], "gidNumber": [str(GIDS["mo-users"])],
            "homeDirectory": ["/home/" + u], "loginShell": ["/bin/sh"]}))
    for g, gid in GIDS.items():
        out.append((group_dn(g), {
            "objectClass": ["groupOfNames", "extensibleObject"], "cn": [g], "gidNumber": [str(gid)],
            "member": [user_dn(m) for m in MEMBERS[g]]}))
    return out


CONFIG = """
[[overlay]]
type = "memberof"

[[overlay]]
type = "accesslog"
ops = ["reads"]
"""


def sssd_conf(port):
    return """[sssd]
services = nss
domains = {domain}

[domain/{domain}]
id_provider = ldap
auth_provider = none
sudo_provider = none
autofs_provider = none
ldap_uri = ldap://127.0.0.1:{port}
ldap_search_base = {suffix}
ldap_schema = ipa
ldap_group_object_class = groupOfNames
ldap_default_bind_dn = {bind_dn}
ldap_default_authtok_type = password
ldap_default_authtok = {bind_pw}
enumerate = false
cache_credentials = false
ldap_network_timeout = 3
ldap_opt_timeout = 5
ldap_search_timeout = 5
debug_level = 3
""".format(domain=DOMAIN, port=port, suffix=SUFFIX, bind_dn=SSSD_DN, bind_pw=SSSD_PW)


# ------------------------------------------------------------------ the machine


WHY_NOT = why_not_here()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """Pando with memberof and an access log of reads, holding the users and
    groups; verified at teardown (memberOf agreeing with member)."""
    base = tmp_path_factory.mktemp("nss-memberof")
    srv = server_with(base, "nss-memberof", CONFIG, entries())
    yield srv
    srv.stop_and_verify()


@pytest.fixture(scope="module")
def sssd(directory, tmp_path_factory):
    system = SystemFiles(SYSTEM_PATHS)
    client = Sssd(tmp_path_factory.mktemp("sssd"), sssd_conf(directory.port), probe="mo-nina")
    try:
        NSSWITCH.write_text(with_sss(NSSWITCH.read_text()))
        client.start()
        yield client
    finally:
        client.stop()
        system.restore()


# ------------------------------------------------------------------ helpers


def ldapmodify(srv, ldif, *args):
    rc, out, err = srv.ldap("ldapmodify", *args, input=ldif)
    assert rc == 0, "ldapmodify failed: %s%s" % (out, err)


def member(srv, op, group, user):
    ldapmodify(srv, "dn: %s\nchangetype: modify\n%s: member\nmember: %s\n" % (group_dn(group), op, user_dn(user)))


def memberof(srv, user):
    """The group names the directory lists in the user's memberOf."""
    rc, found, err = srv.search(user_dn(user), "(objectClass=*)", "memberOf", scope="base")
    assert rc == 0, err
    return {v.split(",")[0].split("=", 1)[1] for v in found[0][1].get("memberOf", [])}


def gentime(t):
    return time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))


def sssd_searches(srv, since, until_seen=(), timeout=10):
    """The searches SSSD's account made since `since` (accesslog records,
    written after each answer), once a base search of every DN in
    `until_seen` is among them or after `timeout` s."""
    deadline = time.monotonic() + timeout
    want = {dn.lower() for dn in until_seen}
    while True:
        rc, found, err = srv.search("cn=accesslog", "(&(reqType=search)(reqStart>=%s))" % since, scope="one")
        assert rc == 0, err
        mine = [a for _, a in found
                if a.get("reqAuthzID", [""])[0].lower().removeprefix("dn:") == SSSD_DN.lower()]
        based = {a["reqDN"][0].lower() for a in mine if a.get("reqScope") == ["base"]}
        if want <= based or time.monotonic() > deadline:
            return mine


def describe(records):
    return "\n".join("%s %s %s attrs=%s" % (a.get("reqScope", ["?"])[0], a.get("reqDN", ["?"])[0],
                                           a.get("reqFilter", ["?"])[0], ",".join(a.get("reqAttr", [])))
                     for a in records)


# ------------------------------------------------------------------ tests


def test_id_lists_the_groups_memberof_names_and_sssd_read_them_by_dn(directory, sssd):
    for u in USERS:
        assert memberof(directory, u) == START[u], "the overlay did not set %s's memberOf" % u
    since = gentime(time.time() - 1)
    sssd.expire()
    for u in USERS:
        got = sssd.groups(u, START[u])
        assert got == START[u], "id -Gn %s: %s, memberOf says %s\n%s" % (u, got, START[u], sssd.logs())
    rc, out, err = run("getent", "initgroups", "mo-nina")
    assert rc == 0, err
    assert sorted(int(g) for g in out.split()[1:]) == sorted(GIDS[g] for g in START["mo-nina"]), out

    # How SSSD learnt them, in Pando's access log.
    seen = [group_dn(g) for u in USERS for g in START[u]]
    reads = sssd_searches(directory, since, until_seen=seen)
    log = describe(reads)
    for u in USERS:
        asked = [a for a in reads if "(uid=%s)" % u in a.get("reqFilter", [""])[0].lower()
                 and "memberof" in {x.lower() for x in a.get("reqAttr", [])}]
        assert asked, "no search for %s asking for memberOf:\n%s" % (u, log)
    for dn in seen:
        by_dn = [a for a in reads if a.get("reqScope") == ["base"] and a["reqDN"][0].lower() == dn.lower()
                 and a.get("reqResult") == ["0"] and a.get("reqEntries") == ["1"]]
        assert by_dn, "%s was not read by its DN:\n%s" % (dn, log)
    by_member = [a for a in reads
                 if re.search(r"\((member|uniqueMember|memberUid)=", a.get("reqFilter", [""])[0], re.I)]
    assert not by_member, "SSSD searched groups by member:\n%s" % describe(by_member)


def test_a_member_added_then_removed_over_ldap_changes_what_id_lists(directory, sssd):
    try:
        member(directory, "add", "mo-qa", "mo-nina")
        want = START["mo-nina"] | {"mo-qa"}
        assert memberof(directory, "mo-nina") == want
        sssd.expire()
        got = sssd.groups("mo-nina", want)
        assert got == want, "after adding mo-nina to mo-qa, id -Gn: %s\n%s" % (got, sssd.logs())

        member(directory, "delete", "mo-ops", "mo-nina")
        want = want - {"mo-ops"}
        assert memberof(directory, "mo-nina") == want
        sssd.expire()
        got = sssd.groups("mo-nina", want)
        assert got == want, "after removing mo-nina from mo-ops, id -Gn: %s\n%s" % (got, sssd.logs())
        # The other member of those groups keeps them.
        got = sssd.groups("mo-omar", START["mo-omar"])
        assert got == START["mo-omar"], "id -Gn mo-omar: %s\n%s" % (got, sssd.logs())
    finally:
        for op, g in (("delete", "mo-qa"), ("add", "mo-ops")):
            if (g in memberof(directory, "mo-nina")) == (op == "delete"):
                member(directory, op, g, "mo-nina")
        sssd.expire()


def test_the_groups_follow_memberof_not_member(directory, sssd):
    """mo-ops keeps mo-nina as a member while her memberOf, rewritten by an
    administrator under the relax rules control, leaves it out: SSSD must not
    list it. A client searching groups by member would."""
    relax = ("-e", "relax")
    try:
        ldapmodify(directory, "dn: %s\nchangetype: modify\ndelete: memberOf\nmemberOf: %s\n"
                   % (user_dn("mo-nina"), group_dn("mo-ops")), *relax)
        assert memberof(directory, "mo-nina") == START["mo-nina"] - {"mo-ops"}
        rc, found, err = directory.search(group_dn("mo-ops"), "(objectClass=*)", "member", scope="base")
        assert rc == 0 and user_dn("mo-nina").lower() in [m.lower() for m in found[0][1]["member"]], found
        sssd.expire()
        want = START["mo-nina"] - {"mo-ops"}
        got = sssd.groups("mo-nina", want)
        assert got == want, "id -Gn mo-nina: %s, though memberOf lacks mo-ops\n%s" % (got, sssd.logs())
    finally:
        if "mo-ops" not in memberof(directory, "mo-nina"):
            ldapmodify(directory, "dn: %s\nchangetype: modify\nadd: memberOf\nmemberOf: %s\n"
                       % (user_dn("mo-nina"), group_dn("mo-ops")), *relax)
        sssd.expire()
    assert sssd.groups("mo-nina", START["mo-nina"]) == START["mo-nina"]
