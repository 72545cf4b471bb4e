"""SSSD, the system's NSS and PAM client, works against Pando with both of
its POSIX schemas: `ldap_schema = rfc2307` against a Pando with the default
NIS schema (posixGroup structural, members by memberUid) and
`ldap_schema = rfc2307bis` against a Pando with `posix_schema = "rfc2307bis"`
(posixGroup auxiliary: a group is groupOfNames + posixGroup naming its
members by DN, and groups may be members of groups).

For each schema, its own Pando (self-signed certificate, --tls-self-signed)
holds users and groups, and SSSD (id_provider, auth_provider and
chpass_provider ldap, `enumerate = true`) reads it bound as a service
account: StartTLS on ldap:// for rfc2307, ldaps:// for rfc2307bis, the
server certificate checked (ldap_tls_reqcert = demand). Pando's [[access]]
rules let nobody but that account read the tree and allow binds (and a
user's change of their own userPassword) only over TLS, so every answer
below came through SSSD's TLS connections. The system's NSS asks SSSD after
the local files (`passwd`/`group: files sss`), and a PAM service of our own,
/etc/pam.d/pando-sssd-test, holds nothing but pam_sss. Shown with the real
tools, for both schemas:

- `getent passwd <user>`, `getent group <group>` (members: memberUid values
  for rfc2307; member DNs, those of nested groups included, for rfc2307bis)
  and `id <user>` (the groups found by (memberUid=<name>) for rfc2307, by
  (member=<DN>) and through nested groups for rfc2307bis);
- enumeration (`getent passwd`, `getent group` without a key) lists every
  user and group of the directory exactly once, including users and a group
  no test ever asks for by name (so they can only come from SSSD's
  enumeration of the directory);
- `pamtester ... authenticate acct_mgmt` succeeds with the user's password
  and fails with a wrong one;
- `pamtester ... chauthtok`, run as the user (uid and gid of the entry, as
  `passwd` would be), fails with a wrong current password and changes
  nothing, then changes the password (SSSD binds as the user and sends the
  Password Modify extended operation): afterwards a simple bind
  (ldapwhoami) and pamtester accept the new password and refuse the old
  one, and the directory stores the new one hashed.

For rfc2307bis, a chain of nested groups (pandobis-top has member
pandobis-outer, which has member pandobis-inner, which has the users) is
resolved: `id` lists the outer groups of a user who is named only in the
inner one, and `getent group pandobis-top` lists users named only in the
groups nested in it.

The test runs as root: it rewrites /etc/nsswitch.conf, writes a PAM service
and runs sssd (in the foreground, as a child of the test) with its
databases in /var/lib/sss. Everything below the paths in SYSTEM_PATHS is put
back as it was (files created there removed) even when a test fails. SSSD's
own log (debug_level 3, more with PANDO_SSSD_DEBUG) is in the test's
temporary directory and printed with any failure.
"""

import os
import time
from pathlib import Path

import pytest

from conftest import SUFFIX, Pando, ldif_entry, parse_ldif
from sssd_env import NSSWITCH, SSSD_PATHS, Sssd, run, why_not_here, with_sss
from system_files import SystemFiles

PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
SERVICES = "ou=Services," + SUFFIX
SSSD_DN = "cn=sssd-reader," + SERVICES
SSSD_PW = "sssd-reader-secret"

PAM_SERVICE = "pando-sssd-test"
PAM_FILE = Path("/etc/pam.d") / PAM_SERVICE
PAM_TEXT = """# Written by Pando's tests/integration/test_sssd_schemas.py while it runs: pam_sss only.
auth     required pam_sss.so
account  required pam_sss.so
password required pam_sss.so
"""
# Everything sssd or this test writes outside the test's temporary directory.
SYSTEM_PATHS = SSSD_PATHS + [str(PAM_FILE)]
DEBUG_LEVEL = int(os.environ.get("PANDO_SSSD_DEBUG", "3"))

WHY_NOT = why_not_here(pam=True)
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

# Pando's rules: the administrator does everything; over TLS, the service
# account reads the tree, anyone may bind with a password and users may set
# their own. Nothing else: without TLS nobody but the administrator can bind,
# and anonymous clients read nothing.
ACCESS = """
[[access]]
attrs = ["userPassword"]
by = [
  {{ who = "admins", rights = "all" }},
  {{ who = ["self", "tls"], rights = ["auth", "write"] }},
  {{ who = "tls", rights = "auth" }},
]

[[access]]
by = [
  {{ who = "admins", rights = "all" }},
  {{ who = ["dn:{reader}", "tls"], rights = "read" }},
]
""".format(reader=SSSD_DN)


class Layout:
    """One schema's directory: users {name: uidNumber}, their primary group,
    groups {name: (gidNumber, members)} where a member is a user's or
    another group's name, and the users the tests use."""

    def __init__(self, schema, users, primary, groups, listed, auth_user, chpass_user):
        self.schema = schema
        self.domain = "pando-" + schema
        self.users = users
        self.primary = primary
        self.groups = groups
        # Users and groups no test asks for by name: only an enumeration of
        # the directory can put them in SSSD's cache.
        self.listed = listed
        self.auth_user = auth_user
        self.chpass_user = chpass_user

    def password(self, user):
        return "Initial-%s-9" % user

    def gid(self, user):
        return self.groups[self.primary[user]][0]

    def gecos(self, user):
        return "Test user %s" % user

    def users_in(self, group, seen=()):
        """The users a group has, directly or through nested groups."""
        out = set()
        for m in self.groups[group][1]:
            if m in self.groups:
                if m not in seen:
                    out |= self.users_in(m, set(seen) | {group})
            else:
                out.add(m)
        return out

    def groups_of(self, user):
        """What `id -Gn user` should list."""
        return {g for g in self.groups if user in self.users_in(g)} | {self.primary[user]}

    def entries(self):
        out = [(dn, {"objectClass": ["organizationalUnit"], "ou": [dn.split(",")[0].split("=")[1]]})
               for dn in (PEOPLE, GROUPS, SERVICES)]
        out.append((SSSD_DN, {"objectClass": ["organizationalRole", "simpleSecurityObject"],
                              "cn": ["sssd-reader"], "userPassword": [SSSD_PW]}))
        for u, uid in self.users.items():
            out.append((user_dn(u), {
                "objectClass": ["inetOrgPerson", "posixAccount"], "uid": [u], "cn": [u], "sn": [u],
                "gecos": [self.gecos(u)], "uidNumber": [str(uid)], "gidNumber": [str(self.gid(u))],
                "homeDirectory": ["/home/" + u], "loginShell": ["/bin/sh"],
                "userPassword": [self.password(u)]}))
        for g, (gid, members) in self.groups.items():
            if self.schema == "rfc2307":
                assert not any(m in self.groups for m in members), "RFC 2307 groups cannot nest"
                attrs = {"objectClass": ["posixGroup"], "memberUid": members}
            elif members:
                attrs = {"objectClass": ["groupOfNames", "posixGroup"],
                         "member": [group_dn(m) if m in self.groups else user_dn(m) for m in members]}
            else:  # groupOfNames must have a member: the bis schema's groupOfMembers need not
                attrs = {"objectClass": ["groupOfMembers", "posixGroup"]}
            attrs.update({"cn": [g], "gidNumber": [str(gid)]})
            out.append((group_dn(g), {k: v for k, v in attrs.items() if v}))
        return out


def user_dn(u):
    return "uid=%s,%s" % (u, PEOPLE)


def group_dn(g):
    return "cn=%s,%s" % (g, GROUPS)


# Names no local account is likely to have: `files` is asked first.
RFC2307 = Layout(
    "rfc2307",
    users={"pando2307a": 74001, "pando2307b": 74002, "pando2307c": 74003,
           "pando2307l1": 74011, "pando2307l2": 74012, "pando2307l3": 74013},
    primary={"pando2307a": "pando2307-users", "pando2307b": "pando2307-users", "pando2307c": "pando2307-users",
             "pando2307l1": "pando2307-listed", "pando2307l2": "pando2307-listed", "pando2307l3": "pando2307-listed"},
    groups={"pando2307-users": (74000, ["pando2307a", "pando2307b", "pando2307c"]),
            "pando2307-dev": (74001, ["pando2307a", "pando2307b"]),
            "pando2307-ops": (74002, ["pando2307b", "pando2307c"]),
            "pando2307-none": (74003, []),
            "pando2307-listed": (74010, ["pando2307l1", "pando2307l2", "pando2307l3"])},
    listed={"pando2307l1", "pando2307l2", "pando2307l3", "pando2307-listed"},
    auth_user="pando2307a", chpass_user="pando2307c")

RFC2307BIS = Layout(
    "rfc2307bis",
    users={"pandobis1": 75001, "pandobis2": 75002, "pandobis3": 75003,
           "pandobisl1": 75011, "pandobisl2": 75012, "pandobisl3": 75013},
    primary={"pandobis1": "pandobis-users", "pandobis2": "pandobis-users", "pandobis3": "pandobis-users",
             "pandobisl1": "pandobis-listed", "pandobisl2": "pandobis-listed", "pandobisl3": "pandobis-listed"},
    groups={"pandobis-users": (75000, ["pandobis1", "pandobis2", "pandobis3"]),
            "pandobis-inner": (75001, ["pandobis1", "pandobis2"]),
            "pandobis-outer": (75002, ["pandobis-inner", "pandobis3"]),
            "pandobis-top": (75003, ["pandobis-outer"]),
            "pandobis-none": (75004, []),
            "pandobis-listed": (75010, ["pandobisl1", "pandobisl2", "pandobisl3"])},
    listed={"pandobisl1", "pandobisl2", "pandobisl3", "pandobis-listed"},
    auth_user="pandobis1", chpass_user="pandobis3")

LAYOUTS = {"rfc2307": RFC2307, "rfc2307bis": RFC2307BIS}


def sssd_conf(layout, srv, cacert):
    if layout.schema == "rfc2307":
        uri, start_tls = srv.url, "true"  # StartTLS for lookups and binds alike
    else:
        uri, start_tls = srv.ldaps_url, "false"
    return """[sssd]
services = nss, pam
domains = {domain}

[nss]
# The responder keeps an enumeration's answer this many seconds: short, so
# the test sees the first enumeration as soon as it is complete.
enum_cache_timeout = 2

[pam]

[domain/{domain}]
id_provider = ldap
auth_provider = ldap
chpass_provider = ldap
access_provider = permit
sudo_provider = none
autofs_provider = none
ldap_schema = {schema}
ldap_uri = {uri}
ldap_id_use_start_tls = {start_tls}
ldap_tls_cacert = {cacert}
ldap_tls_reqcert = demand
ldap_search_base = {suffix}
ldap_default_bind_dn = {bind_dn}
ldap_default_authtok_type = password
ldap_default_authtok = {bind_pw}
enumerate = true
ldap_enumeration_refresh_offset = 0
cache_credentials = false
ldap_network_timeout = 3
ldap_opt_timeout = 5
ldap_search_timeout = 5
debug_level = {debug}
""".format(domain=layout.domain, schema=layout.schema, uri=uri, start_tls=start_tls, cacert=cacert,
           suffix=SUFFIX, bind_dn=SSSD_DN, bind_pw=SSSD_PW, debug=DEBUG_LEVEL)


# ------------------------------------------------------------------ the machine


class World:
    """One schema's Pando and the SSSD reading it."""

    def __init__(self, layout, srv, sssd):
        self.layout = layout
        self.srv = srv
        self.sssd = sssd
        self.cacert = srv.data_dir / "tls" / "cert.pem"

    def logs(self):
        return "%s\n--- pando ---\n%s" % (self.sssd.logs(), self.srv.logs())


class Machine:
    """The servers (one per schema, started when first needed, kept to the
    end of the module) and the one SSSD the machine can run at a time,
    restarted when a test needs the other schema."""

    def __init__(self, tmp_path_factory):
        self.tmp = tmp_path_factory
        self.servers = {}
        self.world = None

    def use(self, schema):
        if self.world is not None and self.world.layout.schema == schema:
            return self.world
        if self.world is not None:
            self.world.sssd.stop()
            self.world = None
        layout = LAYOUTS[schema]
        srv = self.servers.get(schema) or self.directory(layout)
        cacert = srv.data_dir / "tls" / "cert.pem"
        sssd = Sssd(self.tmp.mktemp("sssd-" + schema), sssd_conf(layout, srv, cacert), probe=layout.auth_user)
        self.world = World(layout, srv, sssd)
        sssd.start()
        return self.world

    def directory(self, layout):
        config = ('posix_schema = "rfc2307bis"\n' if layout.schema == "rfc2307bis" else "") + ACCESS
        srv = Pando(self.tmp.mktemp("pando-" + layout.schema), demo=False, config=config,
                    name="sssd-" + layout.schema, ldaps=layout.schema == "rfc2307bis",
                    args=["--tls-self-signed"])
        self.servers[layout.schema] = srv.start()
        ldif = "\n".join(ldif_entry(dn, a) for dn, a in layout.entries())
        rc, out, err = srv.ldap("ldapadd", input=ldif)
        assert rc == 0, "loading the %s directory failed: %s%s" % (layout.schema, out, err)
        return srv

    def close(self):
        """Stop SSSD, then every server with its consistency check; the first
        failure is raised once all are stopped."""
        if self.world is not None:
            self.world.sssd.stop()
        failures = []
        for srv in self.servers.values():
            try:
                srv.stop_and_verify()
            except Exception as e:  # noqa: BLE001 - stop the others first
                failures.append(e)
        if failures:
            raise failures[0]


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    system = SystemFiles(SYSTEM_PATHS)
    m = Machine(tmp_path_factory)
    try:
        NSSWITCH.write_text(with_sss(NSSWITCH.read_text()))
        PAM_FILE.write_text(PAM_TEXT)
        yield m
    finally:
        try:
            m.close()
        finally:
            system.restore()


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def schema(request):
    """Module scope: pytest runs the tests schema by schema, so SSSD is
    started once for each."""
    return request.param


@pytest.fixture
def world(machine, schema):
    return machine.use(schema)


@pytest.fixture
def bis(machine):
    return machine.use("rfc2307bis")


# ------------------------------------------------------------------ helpers


def getent(*args):
    rc, out, err = run("getent", *args)
    return rc, out.splitlines(), err


def passwd_line(layout, u):
    return "%s:*:%d:%d:%s:/home/%s:/bin/sh" % (u, layout.users[u], layout.gid(u), layout.gecos(u), u)


def group_members(line):
    """(name, gid, set of members) of a group(5) line."""
    name, _, gid, members = line.split(":", 3)
    return name, int(gid), set(filter(None, members.split(",")))


def pamtester(world, user, *ops, stdin="", as_user=False):
    """pamtester with our PAM service; as_user: run with the user's uid and
    gid (and no other groups), as `passwd` would be. Returns (rc, output)."""
    kw = {}
    if as_user:
        kw = dict(user=world.layout.users[user], group=world.layout.gid(user), extra_groups=[], cwd="/",
                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"})
    rc, out, err = run("pamtester", "-v", PAM_SERVICE, user, *ops, input=stdin, timeout=60, **kw)
    return rc, out + err


def tls_env(world):
    env = dict(os.environ, LDAPTLS_CACERT=str(world.cacert), LDAPTLS_REQCERT="demand")
    env.pop("LDAPTLS_CERT", None)
    env.pop("LDAPTLS_KEY", None)
    return env


def whoami(world, dn, password, tls=True):
    """ldapwhoami as dn (with StartTLS unless tls=False): (rc, output)."""
    cmd = ["ldapwhoami", "-x", "-H", world.srv.url, "-o", "nettimeout=10", "-D", dn, "-w", password]
    if tls:
        cmd.append("-ZZ")
    rc, out, err = run(*cmd, env=tls_env(world), timeout=30)
    return rc, out + err


# ------------------------------------------------------------------ tests


def test_only_the_service_account_over_tls_reads_the_directory(world):
    """The premise of the tests below: only the service account, and only
    over TLS, can read the users, and users can bind only over TLS; so what
    SSSD answers came over its TLS connections."""
    srv, lay = world.srv, world.layout

    def uids(*bind):
        rc, out, err = run("ldapsearch", "-x", "-H", srv.url, "-ZZ", "-o", "nettimeout=10", *bind, "-LLL",
                           "-b", PEOPLE, "(uid=*)", "uid", env=tls_env(world), timeout=30)
        return rc, {a["uid"][0] for _, a in parse_ldif(out)}, err

    rc, found, err = uids("-D", SSSD_DN, "-w", SSSD_PW)
    assert rc == 0 and found == set(lay.users), "the service account over TLS: rc=%d %s %s" % (rc, found, err)
    rc, found, err = uids()
    assert found == set(), "an anonymous search over TLS found users (rc=%d): %s %s" % (rc, found, err)
    rc, out = whoami(world, SSSD_DN, SSSD_PW, tls=False)
    assert rc == 49, "the service account bound without TLS: rc=%d %s" % (rc, out)
    u = lay.auth_user
    rc, out = whoami(world, user_dn(u), lay.password(u), tls=False)
    assert rc == 49, "%s bound without TLS: rc=%d %s" % (u, rc, out)
    rc, out = whoami(world, user_dn(u), lay.password(u))
    assert rc == 0 and user_dn(u).lower() in out.lower(), "%s over TLS: rc=%d %s" % (u, rc, out)


def test_getent_passwd_and_group_answer_each_name_from_the_directory(world):
    lay = world.layout
    for u in sorted(set(lay.users) - lay.listed):
        rc, lines, err = getent("passwd", u)
        assert rc == 0 and lines == [passwd_line(lay, u)], \
            "getent passwd %s: rc=%d %r %s\n%s" % (u, rc, lines, err, world.logs())
        rc, lines, err = getent("passwd", str(lay.users[u]))
        assert rc == 0 and lines == [passwd_line(lay, u)], "getent passwd %d: rc=%d %r %s" % (
            lay.users[u], rc, lines, err)
    for g in sorted(set(lay.groups) - lay.listed):
        want = (g, lay.groups[g][0], lay.users_in(g))
        rc, lines, err = getent("group", g)
        got = group_members(lines[0]) if rc == 0 and len(lines) == 1 else (rc, lines, err)
        assert got == want, "getent group %s: %r, expected %r\n%s" % (g, got, want, world.logs())
    rc, lines, err = getent("passwd", "pandonobody")
    assert rc == 2 and lines == [], "getent passwd of a name the directory lacks: rc=%d %r %s" % (rc, lines, err)


def test_id_lists_each_users_groups(world):
    lay = world.layout
    for u in sorted(set(lay.users) - lay.listed):
        want = lay.groups_of(u)
        got = world.sssd.groups(u, want)
        assert got == want, "id -Gn %s: %s, expected %s\n%s" % (u, sorted(got), sorted(want), world.logs())
        rc, out, err = run("id", u)
        assert rc == 0 and out.startswith("uid=%d(%s) gid=%d(%s) " % (
            lay.users[u], u, lay.gid(u), lay.primary[u])), "id %s: rc=%d %s %s" % (u, rc, out, err)


def test_enumeration_lists_every_user_and_group_once(world):
    """enumerate = true: SSSD reads all users and groups in the background
    after it starts; `getent passwd` / `getent group` list them once it has
    (bounded wait), the ones no test asked for by name included."""
    lay = world.layout
    want_users = sorted(passwd_line(lay, u) for u in lay.users)
    want_groups = sorted((g, gid, lay.users_in(g)) for g, (gid, _) in lay.groups.items())
    deadline = time.monotonic() + 45
    while True:
        _, plines, perr = getent("passwd")
        _, glines, gerr = getent("group")
        users = sorted(line for line in plines if line.split(":")[0] in lay.users)
        groups = sorted(group_members(line) for line in glines if line.split(":")[0] in lay.groups)
        if (users, groups) == (want_users, want_groups) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert users == want_users, "getent passwd listed:\n%s\nexpected:\n%s\n%s\n%s" % (
        "\n".join(users), "\n".join(want_users), perr, world.logs())
    assert groups == want_groups, "getent group listed:\n%s\nexpected:\n%s\n%s\n%s" % (
        "\n".join(map(repr, groups)), "\n".join(map(repr, want_groups)), gerr, world.logs())


def test_pam_authenticates_with_the_password_and_refuses_a_wrong_one(world):
    lay = world.layout
    u = lay.auth_user
    rc, out = pamtester(world, u, "authenticate", "acct_mgmt", stdin=lay.password(u) + "\n")
    assert rc == 0 and "successfully authenticated" in out, \
        "pamtester authenticate %s with the password: rc=%d %s\n%s" % (u, rc, out, world.logs())
    rc, out = pamtester(world, u, "authenticate", stdin="not-" + lay.password(u) + "\n")
    assert rc != 0 and "Authentication failure" in out, \
        "pamtester authenticate %s with a wrong password: rc=%d %s" % (u, rc, out)


def test_pam_chauthtok_as_the_user_changes_the_password_in_the_directory(world):
    lay, srv = world.layout, world.srv
    u = lay.chpass_user
    old, new = lay.password(u), "Changed-%s-7" % u

    def stored():
        rc, found, err = srv.search(user_dn(u), "(objectClass=*)", "userPassword", scope="base")
        assert rc == 0, err
        return found[0][1]["userPassword"]

    before = stored()
    rc, out = pamtester(world, u, "chauthtok", stdin="wrong-%s\n%s\n%s\n" % (old, new, new), as_user=True)
    assert rc != 0, "chauthtok with a wrong current password succeeded: %s" % out
    assert stored() == before, "a failed chauthtok changed userPassword"
    rc, out = whoami(world, user_dn(u), old)
    assert rc == 0, "after a failed chauthtok, the old password no longer binds: rc=%d %s" % (rc, out)

    rc, out = pamtester(world, u, "chauthtok", stdin="%s\n%s\n%s\n" % (old, new, new), as_user=True)
    assert rc == 0 and "token altered successfully" in out, \
        "pamtester chauthtok as %s: rc=%d %s\n%s" % (u, rc, out, world.logs())
    after = stored()
    assert after != before and len(after) == 1 and after[0].startswith("{") and new not in after[0], \
        "userPassword after the change: %r (before: %r)" % (after, before)
    rc, out = whoami(world, user_dn(u), new)
    assert rc == 0 and user_dn(u).lower() in out.lower(), "bind with the new password: rc=%d %s" % (rc, out)
    rc, out = whoami(world, user_dn(u), old)
    assert rc == 49, "bind with the old password: rc=%d %s" % (rc, out)
    rc, out = pamtester(world, u, "authenticate", stdin=new + "\n")
    assert rc == 0, "pamtester authenticate with the new password: rc=%d %s\n%s" % (rc, out, world.logs())
    rc, out = pamtester(world, u, "authenticate", stdin=old + "\n")
    assert rc != 0, "pamtester authenticate with the old password succeeded: %s" % out


def test_rfc2307bis_nested_groups_reach_the_users_of_the_groups_inside_them(bis):
    """pandobis1 is named only in pandobis-inner, which is a member of
    pandobis-outer, itself a member of pandobis-top: SSSD follows member DNs
    that are groups, both ways."""
    srv = bis.srv
    rc, found, err = srv.search(GROUPS, "(member=%s)" % user_dn("pandobis1"), "cn")
    assert rc == 0, err
    direct = {a["cn"][0] for _, a in found}
    assert direct == {"pandobis-users", "pandobis-inner"}, "groups naming pandobis1 directly: %s" % direct
    bis.sssd.expire()
    want = {"pandobis-users", "pandobis-inner", "pandobis-outer", "pandobis-top"}
    got = bis.sssd.groups("pandobis1", want)
    assert got == want, "id -Gn pandobis1: %s, expected %s\n%s" % (sorted(got), sorted(want), bis.logs())
    for g, users in (("pandobis-outer", {"pandobis1", "pandobis2", "pandobis3"}),
                     ("pandobis-top", {"pandobis1", "pandobis2", "pandobis3"})):
        rc, lines, err = getent("group", g)
        got = group_members(lines[0])[2] if rc == 0 and len(lines) == 1 else (rc, lines, err)
        assert got == users, "getent group %s: %r, expected %s\n%s" % (g, got, sorted(users), bis.logs())
