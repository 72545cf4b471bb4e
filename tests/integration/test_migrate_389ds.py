"""`pando migrate` from a real 389 Directory Server (Debian's 389-ds-base):
an instance made by `dscreate` under a temporary prefix (no systemd, only
127.0.0.1), users whose passwords 389-DS hashed itself ({SSHA} and
{PBKDF2-SHA512}), groups, ACIs on ou=People and indexes added over LDAP;
then its dse.ldif and a `db2ldif` export migrated, the export imported
into Pando, and `pando migrate --verify-against` run against the live
389-DS as anonymous, ordinary users, a group member and the Directory
Manager: binds, searches (entries and values) and compares must agree.

389-DS has no No-Op control, so `--verify-against` leaves its write
probes out (and says so); the writes the ACIs decide are made here for
real on both servers instead, with the same outcome expected.

Every difference is printed in full in the assertion message."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PANDO_BIN, Pando, free_port, ldif_entry, parse_ldif, terminate, wait_port

NS_SLAPD = "/usr/sbin/ns-slapd"
DSCREATE = "/usr/sbin/dscreate"
DEFAULTS_INF = Path("/usr/share/dirsrv/inf/defaults.inf")
ETC_DIRSRV = Path("/etc/dirsrv")

pytestmark = pytest.mark.skipif(
    not all(Path(p).exists() for p in (NS_SLAPD, DSCREATE, DEFAULTS_INF)),
    reason="389 Directory Server not installed (Debian package 389-ds-base: ns-slapd, dscreate)")

INSTANCE = "pandotest"
SUFFIX = "dc=example,dc=com"
PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
HELPDESK = "cn=helpdesk," + GROUPS
DM = "cn=Directory Manager"
DM_PW = "dm-secret-389-pw"

# uid → (password, the scheme 389-DS is set to hash it with)
USERS = {"alice": ("alice-pw-1", "SSHA"), "bob": ("bob-pw-22", "SSHA"),
         "carol": ("carol-pw-333", "PBKDF2-SHA512"), "dave": ("dave-pw-4444", "PBKDF2-SHA512")}

# ACIs on ou=People: anyone (anonymous too) reads names; users read
# phones; each user reads and changes their own phone, description and
# password; the helpdesk group reads and changes everything but passwords
# of people; dave may not change descriptions, not even his own.
PEOPLE_ACIS = [
    '(targetattr="objectClass || cn || sn || uid || ou")(version 3.0; acl "anyone reads names"; '
    'allow (read, search, compare)(userdn="ldap:///anyone");)',
    '(targetattr="telephoneNumber")(targetfilter="(objectClass=person)")(version 3.0; acl "users read phones"; '
    'allow (read, search, compare)(userdn="ldap:///all");)',
    '(targetattr="telephoneNumber || description || userPassword")(version 3.0; acl "self edits own"; '
    'allow (read, search, compare, write)(userdn="ldap:///self");)',
    '(targetattr="cn || sn || telephoneNumber || description || mail || employeeNumber")(version 3.0; '
    'acl "helpdesk"; allow (read, search, compare, write)(groupdn="ldap:///%s");)' % HELPDESK,
    '(targetattr="description")(version 3.0; acl "no descriptions for dave"; deny (write)'
    '(userdn="ldap:///uid=dave,%s");)' % PEOPLE,
]

VERIFY_SUMMARY = re.compile(r"^(\d+) checks as (\d+) identities over (\d+) entries: (\d+) difference\(s\)$", re.M)


def dn(uid):
    return "uid=%s,%s" % (uid, PEOPLE)


def who(uid):
    return (dn(uid), USERS[uid][0])


def pando(*args, timeout=120):
    return subprocess.run([PANDO_BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def ldap_tool(url, tool, *args, auth=None, input=None):
    """An ldap-utils tool against `url`; auth None (anonymous) or (dn, pw)."""
    cmd = [tool, "-x", "-H", url]
    if auth:
        cmd += ["-D", auth[0], "-w", auth[1]]
    r = subprocess.run(cmd + list(args), input=input, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def search(url, base, *args, scope="sub", auth=None):
    rc, out, err = ldap_tool(url, "ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", base, "-s", scope, *args,
                             auth=auth)
    return rc, parse_ldif(out), err


class DirSrv:
    """A throwaway 389-DS instance: `dscreate` with every writable path under
    `base/prefix` (lib389 finds an instance's dse.ldif under $PREFIX/etc),
    started with `ns-slapd -D <config dir> -i <pid file>`, on 127.0.0.1."""

    def __init__(self, base):
        self.base = Path(base)
        self.prefix = self.base / "prefix"
        self.conf_dir = self.prefix / "etc" / "dirsrv" / ("slapd-" + INSTANCE)
        self.pidfile = self.base / "ns-slapd.pid"
        self.port = free_port()
        self.pid = None

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    @property
    def dse(self):
        return self.conf_dir / "dse.ldif"

    def create(self):
        # defaults.inf with the host's paths (/etc, /var, /run, /dev/shm)
        # moved under the prefix; the server's own files (/usr) stay.
        inf_dir = self.prefix / "share" / "dirsrv" / "inf"
        inf_dir.mkdir(parents=True)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
        lines = []
        for l in DEFAULTS_INF.read_text().splitlines():
            k, sep, v = l.partition(" = ")
            if sep and v.startswith(("/etc", "/var", "/run", "/dev/shm")):
                l = "%s = %s%s" % (k, self.prefix, v)
            elif sep and k in ("user", "group"):
                l = "%s = %s" % (k, user if k == "user" else group)
            elif sep and k == "with_systemd":
                l = "with_systemd = 0"
            lines.append(l)
        (inf_dir / "defaults.inf").write_text("\n".join(lines) + "\n")
        for d in ("schema", "config"):
            if (ETC_DIRSRV / d).is_dir():
                shutil.copytree(ETC_DIRSRV / d, self.prefix / "etc" / "dirsrv" / d)
            else:
                (self.prefix / "etc" / "dirsrv" / d).mkdir(parents=True)
        inf = self.base / "instance.inf"
        inf.write_text("\n".join([
            "[general]", "config_version = 2", "full_machine_name = localhost", "selinux = False",
            "systemd = False", "start = False", "strict_host_checking = False",
            "[slapd]", "instance_name = " + INSTANCE, "user = " + user, "group = " + group,
            "port = %d" % self.port, "self_sign_cert = False", "root_password = " + DM_PW,
            "[backend-userroot]", "suffix = " + SUFFIX, "create_suffix_entry = True", ""]))
        env = dict(os.environ, PREFIX=str(self.prefix))
        r = subprocess.run([DSCREATE, "from-file", str(inf)], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0 and self.dse.exists(), "dscreate failed:\n%s\n%s" % (r.stdout, r.stderr)
        # dscreate leaves the instance stopped (start = False): listen on
        # 127.0.0.1 only from now on.
        text = self.dse.read_text()
        assert "\nnsslapd-port: %d\n" % self.port in text, "no nsslapd-port in %s" % self.dse
        self.dse.write_text(text.replace("\nnsslapd-port: %d\n" % self.port,
                                         "\nnsslapd-port: %d\nnsslapd-listenhost: 127.0.0.1\n" % self.port, 1))
        return self

    def start(self):
        self.pidfile.unlink(missing_ok=True)
        r = subprocess.run([NS_SLAPD, "-D", str(self.conf_dir), "-i", str(self.pidfile)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "ns-slapd failed to start: %s %s" % (r.stdout, r.stderr)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self.pid:
            if self.pidfile.exists() and self.pidfile.read_text().strip():
                self.pid = int(self.pidfile.read_text().strip())
            time.sleep(0.05)
        assert self.pid, "ns-slapd wrote no pid file at %s" % self.pidfile
        assert wait_port(self.port, timeout=20), "ns-slapd not listening on %s:\n%s" % (self.url, self.errors())
        return self

    def stop(self):
        if not self.pid:
            return
        terminate(self.pid, 30)
        self.pid = None

    def errors(self):
        logs = list(self.prefix.glob("var/log/dirsrv/slapd-*/errors"))
        return logs[0].read_text(errors="replace")[-3000:] if logs else "(no error log)"

    def db2ldif(self, out):
        """The backend's export, as an administrator makes it (server stopped)."""
        r = subprocess.run([NS_SLAPD, "db2ldif", "-D", str(self.conf_dir), "-n", "userRoot", "-a", str(out)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and Path(out).exists(), "db2ldif failed: %s %s" % (r.stdout, r.stderr)
        return Path(out)

    def modify(self, ldif, auth=(DM, DM_PW), tool="ldapmodify"):
        rc, out, err = ldap_tool(self.url, tool, auth=auth, input=ldif)
        assert rc == 0, "%s on 389-DS failed (rc=%d): %s\n%s" % (tool, rc, err, ldif)


def person(uid, i):
    pw, _ = USERS[uid]
    return ldif_entry(dn(uid), {
        "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
        "uid": [uid], "cn": [uid.title() + " Example"], "sn": ["Example"], "mail": [uid + "@example.com"],
        "telephoneNumber": ["+1 555 010%d" % i], "description": ["%s's desk" % uid],
        "employeeNumber": [str(100 + i)], "userPassword": [pw]})


def load(ds):
    ds.modify(ldif_entry(PEOPLE, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"],
                                  "aci": PEOPLE_ACIS})
              + "\n" + ldif_entry(GROUPS, {"objectClass": ["top", "organizationalUnit"], "ou": ["Groups"]}),
              tool="ldapadd")
    # 389-DS hashes each clear-text password in the scheme set at the time.
    for i, (uid, (_, scheme)) in enumerate(USERS.items()):
        ds.modify("dn: cn=config\nchangetype: modify\nreplace: passwordStorageScheme\n"
                  "passwordStorageScheme: %s\n" % scheme)
        ds.modify(person(uid, i), tool="ldapadd")
    ds.modify(ldif_entry(HELPDESK, {"objectClass": ["top", "groupOfNames"], "cn": ["helpdesk"],
                                    "member": [dn("carol")]}), tool="ldapadd")
    # Indexes of the backend, as `dsconf … backend index add` writes them.
    for attr, kinds in (("description", ["eq", "sub"]), ("employeeNumber", ["eq"])):
        ds.modify(ldif_entry("cn=%s,cn=index,cn=userRoot,cn=ldbm database,cn=plugins,cn=config" % attr, {
            "objectClass": ["top", "nsIndex"], "cn": [attr], "nsSystemIndex": ["false"], "nsIndexType": kinds}),
            tool="ldapadd")


# Attributes of 389-DS's own schema in a db2ldif export, which Pando's
# schema does not define (docs/migrating.md: remove them before import).
DS_ONLY = {"aci", "nsuniqueid", "dsentrydn", "entryid", "parentid", "entrydn", "numsubordinates"}


def without_389_attributes(export, out):
    ents = parse_ldif(export.read_text())
    out.write_text("\n".join(ldif_entry(d, {k: v for k, v in a.items() if k.lower() not in DS_ONLY})
                             for d, a in ents))
    return out, ents


@pytest.fixture(scope="module")
def ds389(tmp_path_factory):
    base = tmp_path_factory.mktemp("migrate-389ds")
    ds = DirSrv(base / "389ds")
    ds.base.mkdir()
    srv = None
    try:
        ds.create().start()
        load(ds)
        ds.stop()
        export = ds.db2ldif(base / "userRoot.ldif")
        dse = base / "dse.ldif"
        shutil.copy(ds.dse, dse)
        ds.start()
        out = base / "migrated"
        r = pando("migrate", "--from", dse, "--acis-from", export, "--data", export, "--out", out)
        assert r.returncode == 0, "pando migrate failed (rc=%d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
        report, toml = (out / "migration-report.txt").read_text(), (out / "pando.toml").read_text()
        print("---- 389-DS migration-report.txt\n" + report + "\n---- pando.toml\n" + toml)
        data, ents = without_389_attributes(export, base / "data.ldif")
        srv = Pando(base / "pando", demo=False, config=toml, name="pando-389ds")
        r = pando("import", "--config", out / "pando.toml", "--data-dir", srv.data_dir, "-f", data)
        assert r.returncode == 0, "pando import failed:\n%s\n%s" % (r.stdout, r.stderr)
        srv.start()
        yield dict(base=base, ds=ds, srv=srv, dse=dse, export=export, entries=ents, out=out, report=report,
                   toml=toml)
    finally:
        ds.stop()
        if srv is not None:
            srv.stop_and_verify()


def test_389ds_export_and_translation(ds389):
    """The export holds what 389-DS made (its hashes, its ACIs); the
    translation keeps the root DN and its hash, the indexes, and names the
    settings it dropped."""
    ents = {d.lower(): a for d, a in ds389["entries"]}
    stored = {u: ents[dn(u).lower()]["userPassword"][0] for u in USERS}
    for u, (_, scheme) in USERS.items():
        assert stored[u].startswith("{%s}" % scheme), (u, stored[u])
    assert len(ents[PEOPLE.lower()]["aci"]) == len(PEOPLE_ACIS), ents[PEOPLE.lower()]
    toml, report = ds389["toml"], ds389["report"]
    assert 'root_dn = "cn=Directory Manager"' in toml, toml
    rootpw = next(a["nsslapd-rootpw"][0] for d, a in parse_ldif(ds389["dse"].read_text()) if d == "cn=config")
    assert rootpw.startswith("{PBKDF2-SHA512}") and 'root_password_hash = "%s"' % rootpw in toml, (rootpw, toml)
    assert re.search(r'^description = \["eq", "sub"\]$', toml, re.M), toml
    assert re.search(r'^employeeNumber = \["eq"\]$', toml, re.M), toml
    # One index per attribute, whatever case 389-DS wrote its name in.
    keys = re.findall(r"^(\w+) = \[", toml.split("[indexes]", 1)[1].split("\n[", 1)[0], re.M)
    assert len(keys) == len({k.lower() for k in keys}), keys
    # The listener is 389-DS's (host and port).
    assert 'listen = ["ldap://127.0.0.1:%d", "ldapi://"]' % ds389["ds"].port in toml, toml
    # Each ACI is named over the rules made of it.
    for name in ("anyone reads names", "users read phones", "self edits own", "helpdesk",
                 "no descriptions for dave", "Enable anyone domain read"):
        assert '"%s"' % name in toml, (name, toml)
    assert "nsslapd-accesslog" in report and "dropped" in report, report
    # Passwords by scheme: both of 389-DS's, none unverifiable.
    assert "{SSHA} 2" in report and "{PBKDF2-SHA512} 2" in report, report
    assert "cannot be verified" not in report, report


def test_389ds_binds_with_its_hashes(ds389):
    """Passwords hashed by 389-DS ({SSHA}, {PBKDF2-SHA512}, the Directory
    Manager's too) bind on Pando; a wrong one is refused on both."""
    srv, ds = ds389["srv"], ds389["ds"]
    for u in USERS:
        for url in (ds.url, srv.url):
            rc, out, err = ldap_tool(url, "ldapwhoami", auth=who(u))
            assert rc == 0 and dn(u).lower() in out.lower(), (url, u, out, err)
            rc, _, err = ldap_tool(url, "ldapwhoami", auth=(dn(u), "wrong-" + USERS[u][0]))
            assert rc == 49, (url, u, rc, err)
    for url in (ds.url, srv.url):
        rc, out, err = ldap_tool(url, "ldapwhoami", auth=(DM, DM_PW))
        assert rc == 0, (url, out, err)


def test_389ds_reads_agree_on_known_answers(ds389):
    """A few answers held to what the ACIs say, on both servers."""
    for url in (ds389["ds"].url, ds389["srv"].url):
        # Anonymous: names of people, no phones, no groups.
        rc, ents, err = search(url, PEOPLE, "(uid=bob)", "cn", "telephoneNumber", "description")
        assert rc == 0 and len(ents) == 1, (url, ents, err)
        assert ents[0][1] == {"cn": ["Bob Example"]}, (url, ents)
        rc, ents, err = search(url, GROUPS, "(objectClass=*)")
        assert rc == 0 and not ents, (url, ents)
        # alice: bob's name and phone, not his description; her own description.
        rc, ents, err = search(url, dn("bob"), "(objectClass=*)", "cn", "telephoneNumber", "description",
                               scope="base", auth=who("alice"))
        assert rc == 0 and ents and sorted(ents[0][1]) == ["cn", "telephoneNumber"], (url, ents, err)
        rc, ents, err = search(url, dn("alice"), "(objectClass=*)", "description", scope="base",
                               auth=who("alice"))
        assert ents and ents[0][1].get("description") == ["alice's desk"], (url, ents, err)
        # carol (helpdesk): bob's description and mail, not his password.
        rc, ents, err = search(url, dn("bob"), "(objectClass=*)", "description", "mail", "userPassword",
                               scope="base", auth=who("carol"))
        assert ents and sorted(ents[0][1]) == ["description", "mail"], (url, ents, err)
        # The Directory Manager reads everything, passwords too (Pando
        # rewrites a {SSHA} value in its own scheme at the user's first bind).
        rc, ents, err = search(url, dn("bob"), "(objectClass=*)", "userPassword", scope="base", auth=(DM, DM_PW))
        assert ents and len(ents[0][1].get("userPassword", [])) == 1, (url, ents, err)
        # Compares: anonymous on a name yes, on a phone no.
        rc, _, _ = ldap_tool(url, "ldapcompare", dn("bob"), "sn:Example")
        assert rc == 6, (url, rc)
        rc, _, _ = ldap_tool(url, "ldapcompare", dn("bob"), "telephoneNumber:+1 555 0101")
        assert rc == 50, (url, rc)


def test_389ds_verify_against_the_live_389ds(ds389):
    srv, ds, base = ds389["srv"], ds389["ds"], ds389["base"]
    ids = [who("alice"), who("dave"), who("carol"), (DM, DM_PW)]
    f = base / "identities.tsv"
    f.write_text("".join("%s\t%s\n" % i for i in ids))
    f.chmod(0o600)
    r = pando("migrate", "--from", ds389["dse"], "--acis-from", ds389["export"], "--out", base / "migrated-verify",
              "--verify-against", ds.url, "--pando", srv.url, "--identities", f, timeout=180)
    text = r.stdout + r.stderr
    print("---- verify output\n" + text)
    m = VERIFY_SUMMARY.search(text)
    assert m, "no summary line in the verify output:\n" + text
    checks, whos, entries, diffs = map(int, m.groups())
    assert whos == len(ids) + 1, text
    assert entries == len(ds389["entries"]), "verify saw %d entries:\n%s" % (entries, text)
    assert checks > 300, text
    for i, _ in ids:
        assert re.search(r"^as %s: " % re.escape(i), text, re.M), "no line for %s:\n%s" % (i, text)
    # 389-DS has no No-Op control: writes are left out, and said to be.
    assert text.count("writes not checked: %s does not take the No-Op control" % ds.url) == len(ids) + 1, text
    assert diffs == 0 and r.returncode == 0, "verify found %d difference(s) (rc=%d):\n%s" % (diffs, r.returncode, text)


def test_389ds_writes_are_decided_alike(ds389):
    """The writes the ACIs decide, made for real on both servers (389-DS
    has no No-Op control for --verify-against to use): same outcome."""
    srv, ds = ds389["srv"], ds389["ds"]
    change = "dn: %s\nchangetype: modify\nreplace: %s\n%s: %s\n"
    cases = [
        ("alice", "alice", "telephoneNumber", "+1 555 0199", "allowed"),  # self edits own
        ("alice", "bob", "telephoneNumber", "+1 555 0198", "refused"),  # not someone else's
        ("alice", "alice", "mail", "a@example.org", "refused"),  # not an attribute self may write
        ("dave", "dave", "description", "mine", "refused"),  # the deny holds on his own entry
        ("dave", "dave", "telephoneNumber", "+1 555 0197", "allowed"),  # ...and only there
        ("carol", "bob", "description", "helped", "allowed"),  # helpdesk
        ("carol", "bob", "userPassword", "new-bob-pw", "refused"),  # not passwords
        (None, "bob", "sn", "Anon", "refused"),  # anonymous writes nothing
    ]
    # As --verify-against classes answers: Pando asks an anonymous writer
    # to authenticate (8) where 389-DS answers insufficient access (50).
    klass = {0: "allowed", 50: "refused", 8: "refused"}
    for requester, target, attr, value, expected in cases:
        auth = who(requester) if requester else None
        got = []
        for url in (ds.url, srv.url):
            rc, _, err = ldap_tool(url, "ldapmodify", auth=auth, input=change % (dn(target), attr, attr, value))
            got.append(klass.get(rc, "result %d" % rc))
        assert got == [expected, expected], "%s changing %s of %s: 389-DS %s, Pando %s (expected %s)" % (
            requester, attr, target, got[0], got[1], expected)
