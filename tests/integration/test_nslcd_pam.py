"""nss-pam-ldapd, the system's NSS and PAM client, works against Pando.

nslcd (with libnss-ldapd and libpam-ldapd) talks to a Pando on loopback,
bound as a service account the access rules let read; anonymous clients may
read nothing, so every answer below went through that bind. The system's NSS
asks it after the local files (`passwd`/`group: files ldap`) and a PAM
service of our own, /etc/pam.d/pando-nslcd-test, holds nothing but pam_ldap
(auth, account, password), so the system's common-* files play no part.
Shown with the real tools:

- `getent passwd` / `getent group` by name and by number, and `id`, whose
  groups come from RFC 2307 posixGroup memberUid values;
- enumeration (`getent passwd`, `getent group` with no key) lists every one
  of 300 users and 204 groups exactly once with nslcd's `pagesize 100`, and
  Pando's access log shows nslcd reading them page by page (several searches
  with the same filter, none returning more than a page) as the service
  account;
- `pamtester ... authenticate` (and `acct_mgmt`) succeeds with the user's
  password and fails with a wrong one;
- `pamtester ... chauthtok`, run as the user (uid and gid of the directory
  entry, as `passwd` would be), changes the password from the old to a new
  one: afterwards a simple bind (ldapwhoami) works with the new password and
  fails with the old, the value is stored hashed, and nslcd also updated the
  user's shadowLastChange. nslcd changes the password with the Password
  Modify extended operation (RFC 3062) bound as the user (first without the
  old password, then, if refused, with it), which the rules allow as self
  write of userPassword; the access log shows that operation, and no modify
  of userPassword.
  With a wrong current password, chauthtok fails and nothing changes.

nslcd runs in the foreground (`nslcd -d`, its debug output kept in the
test's temporary directory) as a child of the test and is ended at the end.
Its configuration (/etc/nslcd.conf) and socket directory (/run/nslcd) are
fixed paths, so the test needs root and a machine where no other nslcd runs
and no nscd caches NSS answers; otherwise the module is skipped, saying why.
Every system path it writes (SYSTEM_PATHS) is copied to the test's temporary
directory first and put back (or removed, if it did not exist) when the
module ends, even when a test fails.
"""

import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import SUFFIX, Pando
from system_files import SystemFiles, answers, nsswitch_with, running

PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
SERVICES = "ou=Services," + SUFFIX
NSLCD_DN = "cn=nslcd," + SERVICES
NSLCD_PW = "nslcd-reader-secret"
PAGESIZE = 100

NSLCD = "/usr/sbin/nslcd"
NSLCD_CONF = Path("/etc/nslcd.conf")
NSLCD_SOCKET = "/run/nslcd/socket"
NSSWITCH = Path("/etc/nsswitch.conf")
PAM_SERVICE = "pando-nslcd-test"
PAM_FILE = Path("/etc/pam.d") / PAM_SERVICE
# Everything nslcd or this test writes outside the test's temporary directory.
SYSTEM_PATHS = [NSSWITCH, NSLCD_CONF, PAM_FILE, Path("/run/nslcd")]

PASSWORD_MODIFY = "1.3.6.1.4.1.4203.1.11.1"

# Names no local account is likely to have: `files` is asked first.
N_USERS = 300
USERS = ["pandonss%d" % i for i in range(1, N_USERS + 1)]
UID = {u: 72000 + i for i, u in enumerate(USERS, 1)}
PRIMARY = "pandonss-users"
GIDS = {PRIMARY: 73000, "pandonss-dev": 73001, "pandonss-ops": 73002, "pandonss-qa": 73003}
MEMBERS = {PRIMARY: [], "pandonss-dev": ["pandonss1", "pandonss2"], "pandonss-ops": ["pandonss1"],
           "pandonss-qa": ["pandonss2", "pandonss3"]}
# Filler groups, one member each, so that groups too take more than a page.
for _i in range(1, 201):
    GIDS["pandonssg%03d" % _i] = 73100 + _i
    MEMBERS["pandonssg%03d" % _i] = ["pandonss%d" % (100 + _i)]
# Users with a password: one for authenticate, one for chauthtok, one for a
# chauthtok given a wrong current password. Shadow data lets nslcd record
# the change (shadowLastChange); 19000 is a day in 2022.
PASSWORDS = {"pandonss1": "auth-Pw-1", "pandonss2": "old-Pw-2", "pandonss3": "old-Pw-3"}
OLD_SHADOW_DAY = 19000


def user_dn(u):
    return "uid=%s,%s" % (u, PEOPLE)


def group_dn(g):
    return "cn=%s,%s" % (g, GROUPS)


def groups_of(u):
    return {g for g, ms in MEMBERS.items() if u in ms} | {PRIMARY}


def entries():
    out = [(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
           (GROUPS, {"objectClass": ["organizationalUnit"], "ou": ["Groups"]}),
           (SERVICES, {"objectClass": ["organizationalUnit"], "ou": ["Services"]}),
           (NSLCD_DN, {"objectClass": ["organizationalRole", "simpleSecurityObject"], "cn": ["nslcd"],
                       "userPassword": [NSLCD_PW]})]
    for u in USERS:
        a = {"objectClass": ["inetOrgPerson", "posixAccount"], "uid": [u], "cn": ["Nss User %s" % u[8:]],
             "sn": [u], "uidNumber": [str(UID[u])], "gidNumber": [str(GIDS[PRIMARY])],
             "homeDirectory": ["/home/" + u], "loginShell": ["/bin/sh"]}
        if u in PASSWORDS:
            a["objectClass"].append("shadowAccount")
            a["userPassword"] = [PASSWORDS[u]]
            a["shadowLastChange"] = [str(OLD_SHADOW_DAY)]
        out.append((user_dn(u), a))
    for g, gid in GIDS.items():
        a = {"objectClass": ["posixGroup"], "cn": [g], "gidNumber": [str(gid)]}
        if MEMBERS[g]:
            a["memberUid"] = MEMBERS[g]
        out.append((group_dn(g), a))
    return out


# Anonymous clients read nothing; nslcd's account reads the tree (not the
# password hashes); users read their own entry (nslcd's check after a user's
# bind) and write their own password and shadowLastChange (chauthtok).
CONFIG = """
[logs]
access = "{access_log}"

[[access]]
attrs = ["userPassword"]
by = [
  {{ who = "admins", rights = "all" }},
  {{ who = "self", rights = ["auth", "write"] }},
  {{ who = "*", rights = "auth" }},
]

[[access]]
attrs = ["shadowLastChange"]
by = [
  {{ who = "admins", rights = "all" }},
  {{ who = "self", rights = "write" }},
  {{ who = "dn:{nslcd}", rights = "read" }},
]

[[access]]
by = [
  {{ who = "admins", rights = "all" }},
  {{ who = "dn:{nslcd}", rights = "read" }},
  {{ who = "self", rights = "read" }},
]
"""


def nslcd_conf(port):
    lines = ["# written by Pando's tests/integration/test_nslcd_pam.py, put back when it ends"]
    # Drop root as the packaged daemon does, where the package made its user.
    if have_account("nslcd"):
        lines += ["uid nslcd", "gid nslcd"]
    lines += ["uri ldap://127.0.0.1:%d/" % port,
              "base %s" % SUFFIX,
              "binddn %s" % NSLCD_DN,
              "bindpw %s" % NSLCD_PW,
              "pagesize %d" % PAGESIZE,
              "threads 3",
              "bind_timelimit 5",
              "timelimit 15",
              "reconnect_sleeptime 1",
              "reconnect_retrytime 5"]
    return "\n".join(lines) + "\n"


PAM_TEXT = """# written by Pando's tests/integration/test_nslcd_pam.py, removed when it ends
auth     required  pam_ldap.so
account  required  pam_ldap.so
password required  pam_ldap.so
"""


# ------------------------------------------------------------------ the machine


def have_account(name):
    try:
        pwd.getpwnam(name)
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def found(*patterns):
    return any(Path("/").glob(p.lstrip("/")) for p in patterns)


def why_not_here():
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "needs root: it rewrites /etc/nsswitch.conf and /etc/nslcd.conf and runs nslcd"
    missing = []
    if not Path(NSLCD).exists():
        missing.append("nslcd")
    if not found("/usr/lib/*/libnss_ldap.so.2", "/lib/*/libnss_ldap.so.2", "/usr/lib64/libnss_ldap.so.2"):
        missing.append("libnss_ldap (libnss-ldapd)")
    if not found("/usr/lib/*/security/pam_ldap.so", "/lib/*/security/pam_ldap.so",
                 "/usr/lib64/security/pam_ldap.so"):
        missing.append("pam_ldap (libpam-ldapd)")
    for tool in ("pamtester", "ldapwhoami"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if missing:
        return ("nss-pam-ldapd is not installed (missing %s; Debian: nslcd libnss-ldapd libpam-ldapd "
                "pamtester, which scripts/test installs)" % ", ".join(missing))
    if running("nslcd") or answers(NSLCD_SOCKET):
        return "an nslcd is already running here (systemctl stop nslcd): the test will not take it over"
    if running("nscd") or running("unscd") or answers("/run/nscd/socket"):
        return "nscd is running: it would answer from its own cache"
    return None


WHY_NOT = why_not_here()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def with_ldap(text):
    """nsswitch.conf text with `passwd` and `group` answered by files, then ldap."""
    return nsswitch_with(text, "ldap")


def run(*cmd, input=None, timeout=20, as_user=None):
    """Run a command; as_user: a directory user whose uid and gid (no other
    groups) it runs with. Returns (rc, stdout, stderr)."""
    kw = {}
    if as_user is not None:
        kw = dict(user=UID[as_user], group=GIDS[PRIMARY], extra_groups=[], cwd="/",
                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"})
    r = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=timeout, **kw)
    return r.returncode, r.stdout, r.stderr


# ------------------------------------------------------------------ Pando's access log


LINE = re.compile(r"conn=(\d+) op=\d+ msgid=-?\d+ (\w+)(.*?) RESULT tag=\d+ err=(\d+) nentries=(\d+)")
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def operations(log, since=0):
    """The operations in the access log text `log` whose lines start at or
    after offset `since`, each a dict: conn, tag, fields (name -> value, quotes
    removed), err, nentries, and who (the DN the connection last bound as,
    lower case; "" before any bind)."""
    bound, out, pos = {}, [], 0
    for line in log.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        m = LINE.search(line)
        if not m:
            continue
        conn, tag, rest, err, n = m.group(1), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
        fields = {k: v[1:-1] if v.startswith('"') else v for k, v in FIELD.findall(rest)}
        if tag == "BIND":
            bound[conn] = fields.get("dn", "").lower() if err == 0 else ""
        if start >= since:
            out.append({"conn": conn, "tag": tag, "fields": fields, "err": err, "nentries": n,
                        "who": bound.get(conn, "")})
    return out


def filter_of(op):
    """A search's filter in lower case ("" for other operations)."""
    return op["fields"].get("filter", "").lower()


def describe(ops):
    return "\n".join("conn=%s %s %s err=%d nentries=%d as %r" % (o["conn"], o["tag"], o["fields"], o["err"],
                                                                 o["nentries"], o["who"]) for o in ops)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """Pando with the users and groups, its access log in a file; verified at
    teardown."""
    base = tmp_path_factory.mktemp("nslcd-pando")
    srv = Pando(base, demo=False, name="nslcd-pando",
                config=CONFIG.format(access_log=base / "access.log", nslcd=NSLCD_DN)).start()
    srv.access_log = base / "access.log"
    try:
        srv.bulk_add(entries())
    except BaseException:
        srv.stop()
        raise
    yield srv
    srv.stop_and_verify()


class Nslcd:
    def __init__(self, base):
        self.log = base / "nslcd.log"
        self.proc = None

    def start(self):
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([NSLCD, "-d"], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            rc, _, _ = run("getent", "passwd", "pandonss1", timeout=10)
            if rc == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("nslcd did not answer for pandonss1 (exit code %r):\n%s" % (self.proc.poll(), self.logs()))
            time.sleep(0.2)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def logs(self, tail=6000):
        return "--- nslcd -d ---\n" + (self.log.read_text(errors="replace")[-tail:] if self.log.exists() else "")


@pytest.fixture(scope="module")
def nslcd(directory, tmp_path_factory):
    base = tmp_path_factory.mktemp("nslcd")
    system = SystemFiles(SYSTEM_PATHS)
    daemon = Nslcd(base)
    try:
        NSLCD_CONF.write_text(nslcd_conf(directory.port))
        os.chown(NSLCD_CONF, 0, 0)
        NSLCD_CONF.chmod(0o600)  # it holds bindpw
        NSSWITCH.write_text(with_ldap(NSSWITCH.read_text()))
        PAM_FILE.write_text(PAM_TEXT)
        PAM_FILE.chmod(0o644)
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
        system.restore()


# ------------------------------------------------------------------ helpers


def access_ops(srv, since, until=lambda ops: True, timeout=10):
    """The access-log operations after offset `since`, once until(ops) holds
    or after `timeout` s (lines are written by a thread of their own)."""
    deadline = time.monotonic() + timeout
    while True:
        ops = operations(srv.access_log.read_text(errors="replace"), since)
        if until(ops) or time.monotonic() > deadline:
            return ops
        time.sleep(0.1)


def log_size(srv):
    return srv.access_log.stat().st_size if srv.access_log.exists() else 0


def getent(*args):
    rc, out, err = run("getent", *args)
    return rc, out.splitlines(), err


def passwd_line(u):
    """What getent passwd shows for a directory user: the password field is
    nslcd's "*" (it maps userPassword to it unless told otherwise), the GECOS
    field the cn."""
    return "%s:*:%d:%d:Nss User %s:/home/%s:/bin/sh" % (u, UID[u], GIDS[PRIMARY], u[8:], u)


def group_fields(line):
    """A getent group line as (name, gid, set of members)."""
    name, _, gid, members = line.split(":")
    return name, gid, set(members.split(",")) - {""}


def pamtester(user, *ops, stdin="", as_user=None):
    return run("pamtester", PAM_SERVICE, user, *ops, input=stdin, timeout=60, as_user=as_user)


def whoami(srv, user, password):
    return srv.ldap("ldapwhoami", auth=(user_dn(user), password))


def read_entry(srv, user, *attrs):
    rc, got, err = srv.search(user_dn(user), "(objectClass=*)", *attrs, scope="base")
    assert rc == 0 and len(got) == 1, "reading %s as admin: rc=%d %s %s" % (user, rc, got, err)
    return got[0][1]


# ------------------------------------------------------------------ tests


def test_getent_and_id_answer_from_the_directory_through_nslcd_bound_as_its_account(directory, nslcd):
    # The rules give anonymous clients nothing: what nslcd finds, it found bound.
    rc, anon, err = directory.search(PEOPLE, "(uid=pandonss1)", auth=None)
    assert anon == [], "anonymous search found entries: %s (rc=%d %s)" % (anon, rc, err)
    # Its access-log line is written before what follows is counted.
    access_ops(directory, 0, lambda ops: any(o["who"] == "" and filter_of(o) == "(uid=pandonss1)"
                                             for o in ops))
    since = log_size(directory)

    rc, lines, err = getent("passwd", "pandonss1")
    assert rc == 0 and len(lines) == 1, "getent passwd pandonss1: rc=%d %r %s\n%s" % (rc, lines, err, nslcd.logs())
    assert lines == [passwd_line("pandonss1")], "getent passwd pandonss1: %r" % lines
    rc, lines, err = getent("passwd", "72250")
    assert rc == 0 and [l.split(":")[0] for l in lines] == ["pandonss250"], "getent passwd 72250: %r %s" % (lines, err)
    rc, lines, err = getent("passwd", "pandonss-nobody")
    assert rc == 2 and lines == [], "getent passwd pandonss-nobody: rc=%d %r %s" % (rc, lines, err)

    # Members are a set: their order is not the directory's to keep.
    for key, want in (("pandonss-dev", ("pandonss-dev", "73001", {"pandonss1", "pandonss2"})),
                      ("73002", ("pandonss-ops", "73002", {"pandonss1"})),
                      (PRIMARY, (PRIMARY, "73000", set()))):
        rc, lines, err = getent("group", key)
        assert rc == 0 and [group_fields(l) for l in lines] == [want], \
            "getent group %s: rc=%d %r %s, want %s\n%s" % (key, rc, lines, err, want, nslcd.logs())

    # id: the primary group from gidNumber, the others from memberUid.
    rc, out, err = run("id", "pandonss1")
    want = "uid=72001(pandonss1) gid=73000(pandonss-users) groups=73000(pandonss-users)"
    assert rc == 0 and out.startswith(want), "id pandonss1: %r %s" % (out, err)
    got = set(re.findall(r"\d+\(([^)]+)\)", out.split("groups=", 1)[1]))
    assert got == {PRIMARY, "pandonss-dev", "pandonss-ops"}, "id pandonss1 lists groups %s: %r" % (got, out)
    for u in ("pandonss2", "pandonss3", "pandonss50", "pandonss300"):
        rc, out, err = run("id", "-Gn", u)
        assert rc == 0 and set(out.split()) == groups_of(u), "id -Gn %s: %r %s, want %s" % (u, out, err, groups_of(u))

    # Pando saw all of it from connections bound as nslcd's account.
    ops = access_ops(directory, since, lambda ops: any("memberuid=pandonss300" in filter_of(o) for o in ops))
    searches = [o for o in ops if o["tag"] == "SRCH"]
    assert searches, "no searches in Pando's access log:\n%s" % describe(ops)
    by_uid = [o for o in searches if "(objectclass=posixaccount)(uid=pandonss1)" in filter_of(o)]
    assert by_uid and all(o["who"] == NSLCD_DN.lower() and o["err"] == 0 and o["nentries"] == 1 for o in by_uid), \
        "nslcd's search for pandonss1:\n%s" % describe(searches)
    by_member = [o for o in searches if "memberuid=pandonss300" in filter_of(o)]
    assert by_member and all(o["who"] == NSLCD_DN.lower() and o["err"] == 0 for o in by_member), \
        "nslcd's search for pandonss300's groups:\n%s" % describe(searches)


@pytest.mark.parametrize("db,filter_,want,parse", [
    ("passwd", "(objectclass=posixaccount)", {u: passwd_line(u) for u in USERS}, lambda line: line),
    ("group", "(objectclass=posixgroup)", {g: (g, str(gid), set(MEMBERS[g])) for g, gid in GIDS.items()},
     lambda line: group_fields(line)),
], ids=["passwd", "group"])
def test_enumeration_lists_every_entry_once_over_paged_searches(directory, nslcd, db, filter_, want, parse):
    assert len(want) > 2 * PAGESIZE
    since = log_size(directory)
    rc, lines, err = getent(db)
    assert rc == 0, "getent %s: rc=%d %s\n%s" % (db, rc, err, nslcd.logs())
    mine = [l for l in lines if l.startswith("pandonss")]
    names = [l.split(":")[0] for l in mine]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, "getent %s lists these more than once: %s" % (db, dup[:20])
    missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
    assert not missing and not extra, "getent %s: %d of %d listed; missing %s; unexpected %s\n%s" % (
        db, len(set(names) & set(want)), len(want), missing[:20], extra[:20], nslcd.logs())
    wrong = [(l, want[l.split(":")[0]]) for l in mine if parse(l) != want[l.split(":")[0]]]
    assert not wrong, "getent %s, (line, want) not as in the directory: %s" % (db, wrong[:10])

    # In Pando's access log: the enumeration was read a page at a time.
    def pages(ops):
        return [o for o in ops if o["tag"] == "SRCH" and filter_of(o) == filter_]

    got = pages(access_ops(directory, since, lambda ops: sum(o["nentries"] for o in pages(ops)) >= len(want)))
    log = describe(got)
    assert len(got) >= -(-len(want) // PAGESIZE), "%d searches for %s, not a paged enumeration:\n%s" % (
        len(got), filter_, log)
    assert max(o["nentries"] for o in got) <= PAGESIZE, "a search returned more than a page:\n" + log
    assert sum(o["nentries"] for o in got) == len(want), "the pages do not add up to %d:\n%s" % (len(want), log)
    assert all(o["err"] == 0 and o["who"] == NSLCD_DN.lower() for o in got), log


def test_pam_authenticate_accepts_the_password_and_refuses_a_wrong_one(directory, nslcd):
    user, pw = "pandonss1", PASSWORDS["pandonss1"]
    rc, out, err = pamtester(user, "authenticate", "acct_mgmt", stdin=pw + "\n")
    assert rc == 0 and "successfully authenticated" in out + err, \
        "pamtester authenticate with the password: rc=%d %s%s\n%s" % (rc, out, err, nslcd.logs())
    rc, out, err = pamtester(user, "authenticate", stdin="not-" + pw + "\n")
    assert rc != 0 and "Authentication failure" in out + err, \
        "pamtester authenticate with a wrong password: rc=%d %s%s" % (rc, out, err)
    rc, out, err = pamtester("pandonss-nobody", "authenticate", stdin=pw + "\n")
    assert rc != 0, "pamtester authenticate for an unknown user: rc=%d %s%s" % (rc, out, err)
    # A user without a password cannot authenticate with any.
    rc, out, err = pamtester("pandonss7", "authenticate", stdin=pw + "\n")
    assert rc != 0, "pamtester authenticate for a user without a password: rc=%d %s%s" % (rc, out, err)


def test_pam_chauthtok_as_the_user_changes_the_password_with_password_modify(directory, nslcd):
    user, old, new = "pandonss2", PASSWORDS["pandonss2"], "new-Pw-2-%d" % os.getpid()
    assert whoami(directory, user, old)[0] == 0, "%s cannot bind with the password it starts with" % user
    since = log_size(directory)
    # As `passwd` run by the user: current password, new one, new one again.
    rc, out, err = pamtester(user, "chauthtok", stdin="%s\n%s\n%s\n" % (old, new, new), as_user=user)
    assert rc == 0 and "authentication token altered successfully" in out + err, \
        "pamtester chauthtok as %s: rc=%d %s%s\n%s\n%s" % (user, rc, out, err, nslcd.logs(), directory.logs())
    # pam_ldap took the user's own path (not root's "LDAP administrator password").
    assert "(current) LDAP Password" in out + err, "chauthtok prompts: %r" % (out + err)

    rc, out, err = whoami(directory, user, new)
    assert rc == 0 and out.strip().lower() == "dn:" + user_dn(user).lower(), \
        "ldapwhoami with the new password: rc=%d %s%s" % (rc, out, err)
    rc, out, err = whoami(directory, user, old)
    assert rc == 49, "ldapwhoami with the old password: rc=%d %s%s" % (rc, out, err)
    stored = read_entry(directory, user, "userPassword", "shadowLastChange")
    assert len(stored.get("userPassword", [])) == 1 and stored["userPassword"][0].startswith("{"), \
        "userPassword after the change: %r" % stored.get("userPassword")
    assert new not in stored["userPassword"][0], "the new password is stored in clear: %r" % stored["userPassword"]
    today = int(time.time()) // 86400
    assert stored.get("shadowLastChange", [""])[0] in (str(today - 1), str(today)), \
        "shadowLastChange after the change: %r, today is day %d\n%s" % (stored.get("shadowLastChange"), today,
                                                                        nslcd.logs())

    # How nslcd did it: Password Modify, as the user, and no write of
    # userPassword by modify.
    def done(ops):
        return any(o["tag"] == "EXT" and o["err"] == 0 for o in ops) and \
            any(o["tag"] == "MOD" and o["err"] == 0 and "shadowlastchange" in o["fields"].get("attrs", "").lower()
                for o in ops)

    ops = access_ops(directory, since, done)
    log = describe(ops)
    ext = [o for o in ops if o["tag"] == "EXT" and o["fields"].get("oid") == PASSWORD_MODIFY]
    assert [o for o in ext if o["err"] == 0 and o["who"] == user_dn(user).lower()], \
        "no successful Password Modify by %s in the access log:\n%s" % (user, log)
    mods = [o for o in ops if o["tag"] == "MOD"]
    assert not [o for o in mods if "userpassword" in o["fields"].get("attrs", "").lower()], \
        "userPassword written by a modify:\n" + log
    assert [o for o in mods if o["err"] == 0 and o["fields"].get("attrs", "").lower() == "shadowlastchange"
            and o["who"] == user_dn(user).lower()], "nslcd's shadowLastChange update is not logged:\n%s" % log


def test_pam_chauthtok_with_a_wrong_current_password_changes_nothing(directory, nslcd):
    user, old = "pandonss3", PASSWORDS["pandonss3"]
    new = "new-Pw-3"
    before = read_entry(directory, user, "userPassword", "shadowLastChange")
    rc, out, err = pamtester(user, "chauthtok", stdin="wrong-%s\n%s\n%s\n" % (old, new, new), as_user=user)
    assert rc != 0, "pamtester chauthtok with a wrong current password: rc=%d %s%s" % (rc, out, err)
    assert read_entry(directory, user, "userPassword", "shadowLastChange") == before, \
        "the entry changed after a refused chauthtok"
    assert whoami(directory, user, old)[0] == 0, "%s cannot bind with its unchanged password" % user
    assert whoami(directory, user, new)[0] == 49, "%s binds with the password chauthtok was refused" % user
