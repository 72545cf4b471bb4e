"""`pando migrate`: an OpenLDAP configuration (Debian's slapd.d, and a
richer slapd.conf written here) translated to a Pando one, Pando started
with it and the same data, and `--verify-against` run against the real
slapd: as anonymous and as each identity, reads, searches, compares and
no-op writes must be decided alike.

Every difference is printed in full in the assertion message: a difference
here is a translation bug (or a check that needs its data adjusted)."""

import base64
import hashlib
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PANDO_BIN, Pando, free_port, ldif_entry, terminate, wait_port

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
SLAPCAT = "/usr/sbin/slapcat"
SCHEMA_DIR = "/etc/ldap/schema"
MODULE_DIR = "/usr/lib/ldap"
DEBIAN_SLAPD_D = Path("/etc/ldap/slapd.d")

pytestmark = pytest.mark.skipif(not all(Path(p).exists() for p in (SLAPD, SLAPADD, SLAPCAT)),
                                reason="slapd/slapadd/slapcat not installed")

VERIFY_SUMMARY = re.compile(r"^(\d+) checks as (\d+) identities over (\d+) entries: (\d+) difference\(s\)$", re.M)


# ------------------------------------------------------------------ helpers


def pando(*args, timeout=120):
    return subprocess.run([PANDO_BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def ssha(pw, salt=b"pandosal"):
    return "{SSHA}" + base64.b64encode(hashlib.sha1(pw.encode() + salt).digest() + salt).decode()


def parse_report(text):
    """migration-report.txt → [(header, severity, why)]: a finding is a
    `file:line: original` (or `(whole configuration): …`) line followed by
    `  <severity>: why`."""
    lines = text.splitlines()
    out = []
    for i, l in enumerate(lines):
        m = re.match(r"^  (note|dropped|stricter|differs): (.*)$", l)
        if m and i > 0:
            out.append((lines[i - 1], m.group(1), m.group(2)))
    return out


def findings(report, header_prefix, severity=None):
    return [f for f in parse_report(report)
            if f[0].startswith(header_prefix) and (severity is None or f[1] == severity)]


def head(text, n=60):
    return "\n".join(text.splitlines()[:n])


class Slapd:
    """A throwaway slapd: `-F <slapd.d>` or `-f <slapd.conf>`, on 127.0.0.1 only."""

    def __init__(self, base, pidfile, conf=None, conf_dir=None):
        self.base = Path(base)
        self.pidfile = Path(pidfile)
        self.conf, self.conf_dir = conf, conf_dir
        self.port = None
        self.pid = None

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    def cfg_args(self):
        return ["-F", str(self.conf_dir)] if self.conf_dir else ["-f", str(self.conf)]

    def slapadd(self, suffix, ldif):
        r = subprocess.run([SLAPADD, "-q", *self.cfg_args(), "-b", suffix, "-l", str(ldif)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "slapadd failed: %s %s" % (r.stdout, r.stderr)

    def slapcat(self, suffix, out):
        r = subprocess.run([SLAPCAT, *self.cfg_args(), "-b", suffix, "-l", str(out)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "slapcat failed: %s %s" % (r.stdout, r.stderr)
        return out

    def start(self):
        self.port = free_port()
        r = subprocess.run([SLAPD, *self.cfg_args(), "-h", self.url + "/"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "slapd failed to start: %s %s" % (r.stdout, r.stderr)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.pidfile.exists() and self.pidfile.read_text().strip():
                self.pid = int(self.pidfile.read_text().strip())
                break
            time.sleep(0.05)
        assert self.pid, "slapd wrote no pid file at %s" % self.pidfile
        assert wait_port(self.port, timeout=15), "slapd not listening on %s" % self.url
        return self

    def stop(self):
        if not self.pid:
            return
        terminate(self.pid, 10)
        self.pid = None


def migrate(src, out):
    r = pando("migrate", "--from", src, "--out", out)
    assert r.returncode == 0, "pando migrate failed (rc=%d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    assert (out / "pando.toml").exists() and (out / "migration-report.txt").exists()
    return (out / "migration-report.txt").read_text(), (out / "pando.toml").read_text()


def pando_with(base, out, ldif, name):
    """A Pando on the migrated configuration, slapd's data (slapcat's LDIF)
    imported offline first, as docs/migrating.md says (the root password
    may be unknown: Debian's is)."""
    srv = Pando(base, demo=False, config=(out / "pando.toml").read_text(), name=name)
    r = pando("import", "--config", out / "pando.toml", "--data-dir", srv.data_dir, "-f", ldif)
    assert r.returncode == 0, "pando import failed:\n%s\n%s" % (r.stdout, r.stderr)
    return srv.start()


def verify(src, out, slapd, srv, identities, tmp):
    ids = tmp / "identities.tsv"
    ids.write_text("".join("%s\t%s\n" % (dn, pw) for dn, pw in identities))
    ids.chmod(0o600)
    r = pando("migrate", "--from", src, "--out", out, "--verify-against", slapd.url,
              "--pando", srv.url, "--identities", ids, timeout=180)
    return r.returncode, r.stdout + r.stderr


def assert_no_difference(rc, text, identities, min_entries):
    m = VERIFY_SUMMARY.search(text)
    assert m, "no summary line in the verify output:\n" + text
    checks, whos, entries, diffs = map(int, m.groups())
    assert whos == len(identities) + 1, text
    assert entries >= min_entries, "verify saw only %d entries:\n%s" % (entries, text)
    for dn, _ in identities:
        assert re.search(r"^as %s: " % re.escape(dn), text, re.M), "no line for %s:\n%s" % (dn, text)
    assert "as anonymous: " in text, text
    assert diffs == 0 and rc == 0, "verify found %d difference(s) (rc=%d):\n%s" % (diffs, rc, text)


# ------------------------------------------------------------------ Debian's default slapd.d


def top_entry(suffix):
    typ, val = suffix.split(",")[0].split("=", 1)
    if typ.lower() == "dc":
        return {"objectClass": ["top", "dcObject", "organization"], "dc": [val], "o": [val]}
    if typ.lower() == "o":
        return {"objectClass": ["top", "organization"], "o": [val]}
    pytest.skip("Debian's suffix %s: no top entry written for it here" % suffix)


DEBIAN_PEOPLE = [("alice", "alice-pw"), ("bob", "bob-pw"), ("carol", "carol-pw")]


def debian_entries(suffix):
    people, groups = "ou=People," + suffix, "ou=Groups," + suffix
    ents = [
        (suffix, top_entry(suffix)),
        (people, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"]}),
        (groups, {"objectClass": ["top", "organizationalUnit"], "ou": ["Groups"]}),
        ("ou=Hosts," + suffix, {"objectClass": ["top", "organizationalUnit"], "ou": ["Hosts"],
                                 "description": ["machines"]}),
    ]
    for i, (uid, pw) in enumerate(DEBIAN_PEOPLE):
        ents.append(("uid=%s,%s" % (uid, people), {
            "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson", "posixAccount",
                            "shadowAccount"],
            "uid": [uid], "cn": [uid.title() + " Example"], "sn": ["Example"], "mail": [uid + "@example.org"],
            "uidNumber": [str(2000 + i)], "gidNumber": ["2000"], "homeDirectory": ["/home/" + uid],
            "loginShell": ["/bin/bash"], "shadowLastChange": [str(19000 + i)], "userPassword": [pw],
        }))
    ents.append(("cn=staff," + groups, {
        "objectClass": ["top", "groupOfNames"], "cn": ["staff"],
        "member": ["uid=%s,%s" % (u, people) for u, _ in DEBIAN_PEOPLE[:2]]}))
    ents.append(("cn=users," + groups, {
        "objectClass": ["top", "posixGroup"], "cn": ["users"], "gidNumber": ["2000"],
        "memberUid": [u for u, _ in DEBIAN_PEOPLE]}))
    return ents


def set_ldif_value(path, attr, value):
    """Replace `attr: …` (and drop the CRC32 comment: slapd accepts files without it)."""
    lines = path.read_text().splitlines()
    out = [l for l in lines if not l.startswith("# CRC32")]
    out = [("%s: %s" % (attr, value)) if l.split(":", 1)[0] == attr else l for l in out]
    assert any(l.startswith(attr + ": ") for l in out), "%s has no %s" % (path, attr)
    path.write_text("\n".join(out) + "\n")


@pytest.fixture(scope="module")
def debian(tmp_path_factory):
    if not (DEBIAN_SLAPD_D / "cn=config.ldif").exists():
        pytest.skip("no Debian slapd.d at %s" % DEBIAN_SLAPD_D)
    base = tmp_path_factory.mktemp("migrate-debian")
    conf = base / "slapd.d"
    shutil.copytree(DEBIAN_SLAPD_D, conf)
    mdb = conf / "cn=config" / "olcDatabase={1}mdb.ldif"
    if not mdb.exists():
        pytest.skip("Debian's slapd.d has no olcDatabase={1}mdb")
    (base / "db").mkdir()
    set_ldif_value(mdb, "olcDbDirectory", base / "db")
    set_ldif_value(conf / "cn=config.ldif", "olcPidFile", base / "slapd.pid")
    set_ldif_value(conf / "cn=config.ldif", "olcArgsFile", base / "slapd.args")
    suffix = next(l.split(":", 1)[1].strip() for l in mdb.read_text().splitlines() if l.startswith("olcSuffix:"))
    ldif = base / "data.ldif"
    ents = debian_entries(suffix)
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents))
    slapd = Slapd(base, base / "slapd.pid", conf_dir=conf)
    slapd.slapadd(suffix, ldif)
    dump = slapd.slapcat(suffix, base / "slapcat.ldif")
    slapd.start()
    srv = None
    try:
        out = base / "migrated"
        report, toml = migrate(conf, out)
        print("---- Debian migration-report.txt\n" + head(report))
        srv = pando_with(base / "pando", out, dump, "pando-migrate-debian")
        yield dict(base=base, conf=conf, out=out, report=report, toml=toml, slapd=slapd, srv=srv,
                   suffix=suffix, entries=ents)
    finally:
        slapd.stop()
        if srv is not None:
            srv.stop_and_verify()


def test_debian_translation(debian):
    report, toml, suffix = debian["report"], debian["toml"], debian["suffix"]
    assert re.match(r"# Migration report: \d+ translated exactly, \d+ notes, \d+ dropped, \d+ stricter, "
                    r"\d+ may differ\n", report), report
    assert 'suffixes = ["%s"]' % suffix in toml, toml
    assert 'root_dn = "cn=admin,%s"' % suffix in toml, toml
    # The three data rules, each under a comment naming its file and line.
    mdb = str(debian["conf"] / "cn=config" / "olcDatabase={1}mdb.ldif")
    for rule in ("to attrs=userPassword by self write by anonymous auth by * none",
                 "to attrs=shadowLastChange by self write by * read", "to * by * read"):
        assert re.search(r"^# from .*%s:\d+: olcAccess: %s$" % (re.escape(mdb), re.escape(rule)), toml, re.M), \
            "no translated rule for %r in pando.toml:\n%s" % (rule, toml)
    # Debian's rules translate without anything stricter or dropped.
    bad = [f for f in parse_report(report) if f[1] in ("stricter",) and "olcAccess" in f[0]]
    assert not bad, "Debian's access rules were not translated exactly: %r\n%s" % (bad, report)
    for key in ("olcPidFile", "olcArgsFile"):
        assert any(h.startswith("%s:" % (debian["conf"] / "cn=config.ldif")) and (": %s: " % key) in h
                   for h, s, _ in parse_report(report) if s == "dropped"), (key, report)


def test_debian_pando_serves_the_data(debian):
    srv, suffix = debian["srv"], debian["suffix"]
    rc, ents, err = srv.search(suffix, "(objectClass=*)", "dn", auth=("uid=alice,ou=People," + suffix, "alice-pw"))
    assert rc == 0, err
    assert len(ents) == len(debian["entries"]), ents
    # Anonymous reads (Debian: `to * by * read`), but not passwords.
    rc, ents, err = srv.search("uid=bob,ou=People," + suffix, "(objectClass=*)", scope="base", auth=None)
    assert rc == 0 and ents and "userPassword" not in ents[0][1] and ents[0][1]["uid"] == ["bob"], (ents, err)


def test_debian_verify_against_slapd(debian):
    suffix = debian["suffix"]
    ids = [("uid=alice,ou=People," + suffix, "alice-pw"), ("uid=bob,ou=People," + suffix, "bob-pw")]
    rc, text = verify(debian["conf"], debian["base"] / "migrated-verify", debian["slapd"], debian["srv"], ids,
                      debian["base"])
    print("---- Debian verify output\n" + text)
    assert_no_difference(rc, text, ids, len(debian["entries"]))


# ------------------------------------------------------------------ a richer slapd.conf

SUFFIX = "dc=example,dc=com"
PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
SERVICES = "ou=Services," + SUFFIX
EDITORS = "cn=editors," + GROUPS
MANAGER = "cn=manager," + SERVICES
READER = "cn=reader," + SERVICES
ROOT_PW = "rich-root-secret"

# (marker, lines): the markers name rules the report assertions find by line.
RICH_RULES = [
    ("break", ['access to *',
               '    by dn.exact="%s" manage' % MANAGER,
               '    by * break']),
    ("password", ['access to attrs=userPassword',
                  '    by self write',
                  '    by anonymous auth',
                  '    by * none']),
    ("shadow", ['access to attrs=shadowLastChange',
                '    by self write',
                '    by users read',
                '    by * none']),
    ("regex", ['access to dn.regex="^uid=[^,]+,ou=People,dc=example,dc=com$" attrs=telephoneNumber,mobile',
               '    by self write',
               '    by group.exact="%s" write' % EDITORS,
               '    by users read',
               '    by * none']),
    ("filter", ['access to dn.subtree="%s" filter=(objectClass=inetOrgPerson) attrs=description,mail' % PEOPLE,
                '    by self read',
                '    by group.exact="%s" write' % EDITORS,
                '    by dn.children="%s" read' % SERVICES,
                '    by dn.regex="^cn=[^,]+,ou=Admins,dc=example,dc=com$" write',
                '    by users read',
                '    by * none']),
    ("people", ['access to dn.subtree="%s"' % PEOPLE,
                '    by self read',
                '    by dn.children="%s" read' % SERVICES,
                '    by users read',
                '    by anonymous search',
                '    by * none']),
    ("groups-children", ['access to dn.base="%s" attrs=children' % GROUPS,
                         '    by group.exact="%s" write' % EDITORS,
                         '    by * break']),
    ("groups", ['access to dn.children="%s"' % GROUPS,
                '    by group.exact="%s" write' % EDITORS,
                '    by users read',
                '    by * none']),
    ("hosts", ['access to dn.subtree="ou=Hosts,%s"' % SUFFIX,
               '    by users read',
               '    by peername.ip=127.0.0.0%255.0.0.0 search',
               '    by * none']),
    ("secret", ['access to dn.subtree="ou=Secret,%s"' % SUFFIX,
                '    by ssf=128 users read',
                '    by * none']),
    ("rest", ['access to *',
              '    by users read',
              '    by anonymous read',
              '    by * none']),
]


def rich_conf(base):
    """slapd.conf text and {marker: line number of its rule}."""
    schemas = ["core", "cosine", "nis", "inetorgperson", "misc"]
    lines = ["# A richer slapd.conf for `pando migrate`"]
    lines += ["include %s/%s.schema" % (SCHEMA_DIR, s) for s in schemas]
    lines += ["modulepath " + MODULE_DIR]
    lines += ["moduleload %s" % m for m in ("back_mdb", "memberof", "refint", "unique", "ppolicy")]
    lines += [
        "pidfile %s/slapd.pid" % base,
        "argsfile %s/slapd.args" % base,
        "loglevel 0",
        "sizelimit 500",
        "timelimit 3600",
        "",
        "database mdb",
        'suffix "%s"' % SUFFIX,
        'rootdn "cn=admin,%s"' % SUFFIX,
        "rootpw %s" % ssha(ROOT_PW),
        "directory %s/db" % base,
        "maxsize 268435456",
        "index objectClass eq",
        "index uid,cn,mail eq,sub",
        "index member,memberUid eq",
        'limits dn.exact="%s" size=unlimited time=unlimited' % READER,
        "limits anonymous size=100",
        "",
    ]
    where = {}
    for marker, rule in RICH_RULES:
        where[marker] = len(lines) + 1
        lines += rule
    lines += [
        "",
        "overlay memberof",
        "memberof-group-oc groupOfNames",
        "memberof-member-ad member",
        "overlay refint",
        "refint_attributes member",
        "overlay unique",
        "unique_uri ldap:///%s?uid,mail?sub" % PEOPLE,
        "overlay ppolicy",
        'ppolicy_default "cn=default,ou=Policies,%s"' % SUFFIX,
    ]
    return "\n".join(lines) + "\n", where


RICH_USERS = [("alice", "alice-pw"), ("bob", "bob-pw"), ("carol", "carol-pw"), ("dave", "dave-pw")]


def rich_entries():
    ou = lambda name, **kw: ("ou=%s,%s" % (name, SUFFIX),
                             dict({"objectClass": ["top", "organizationalUnit"], "ou": [name]}, **kw))
    ents = [
        (SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"], "o": ["Example"]}),
        ou("People"), ou("Groups"), ou("Services"), ou("Admins"), ou("Hosts"), ou("Secret"), ou("Policies"),
    ]
    for i, (uid, pw) in enumerate(RICH_USERS):
        a = {
            "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson", "posixAccount",
                            "shadowAccount"],
            "uid": [uid], "cn": [uid.title() + " Rich"], "sn": ["Rich"], "givenName": [uid.title()],
            "mail": [uid + "@example.com"], "description": ["%s's entry" % uid],
            "telephoneNumber": ["+1 555 010%d" % i], "mobile": ["+1 555 020%d" % i],
            "uidNumber": [str(3000 + i)], "gidNumber": ["3000"], "homeDirectory": ["/home/" + uid],
            "shadowLastChange": [str(19500 + i)], "userPassword": [pw],
        }
        if uid == "carol":  # misc.schema, not built into Pando
            a["objectClass"].append("inetLocalMailRecipient")
            a["mailLocalAddress"] = ["carol@mail.example.com"]
        ents.append(("uid=%s,%s" % (uid, PEOPLE), a))
    # Not an inetOrgPerson: outside the filter= rule.
    ents.append(("cn=legacy," + PEOPLE, {"objectClass": ["top", "person"], "cn": ["legacy"], "sn": ["Old"],
                                          "description": ["pre-inetOrgPerson"]}))
    # Groups: direct members only (Pando's group: also counts nested ones).
    ents.append((EDITORS, {"objectClass": ["top", "groupOfNames"], "cn": ["editors"],
                           "member": ["uid=alice," + PEOPLE, "uid=dave," + PEOPLE]}))
    ents.append(("cn=staff," + GROUPS, {"objectClass": ["top", "groupOfNames"], "cn": ["staff"],
                                         "member": ["uid=%s,%s" % (u, PEOPLE) for u, _ in RICH_USERS]}))
    ents.append(("cn=devs," + GROUPS, {"objectClass": ["top", "posixGroup"], "cn": ["devs"], "gidNumber": ["3000"],
                                        "memberUid": ["alice", "bob"]}))
    for cn, pw in (("reader", "reader-pw"), ("manager", "manager-pw")):
        ents.append(("cn=%s,%s" % (cn, SERVICES), {"objectClass": ["top", "organizationalRole", "simpleSecurityObject"],
                                                   "cn": [cn], "userPassword": [pw],
                                                   "description": ["service account " + cn]}))
    ents.append(("cn=ops,ou=Admins," + SUFFIX, {"objectClass": ["top", "organizationalRole"], "cn": ["ops"]}))
    ents.append(("cn=host1,ou=Hosts," + SUFFIX, {"objectClass": ["top", "device"], "cn": ["host1"],
                                                 "description": ["a machine"]}))
    ents.append(("cn=vault,ou=Secret," + SUFFIX, {"objectClass": ["top", "organizationalRole"], "cn": ["vault"],
                                                  "description": ["the combination"]}))
    ents.append(("cn=default,ou=Policies," + SUFFIX, {"objectClass": ["top", "device", "pwdPolicy"],
                                                      "cn": ["default"],
                                                      # slapd answers a compare with the name
                                                      # 'userPassword' invalidAttributeSyntax (21)
                                                      "pwdAttribute": ["2.5.4.35"]}))
    # memberOf as slapd's memberof overlay keeps it (slapadd runs no
    # overlay); slapcat then carries it to Pando, as in a real migration.
    groups = [(dn, a["member"]) for dn, a in ents if "groupOfNames" in a["objectClass"]]
    for dn, a in ents:
        of = [g for g, members in groups if dn in members]
        if of:
            a["memberOf"] = of
    return ents


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    for m in ("back_mdb", "memberof", "refint", "unique", "ppolicy"):
        if not (Path(MODULE_DIR) / (m + ".la")).exists():
            pytest.skip("slapd module %s not installed in %s" % (m, MODULE_DIR))
    if not (Path(SCHEMA_DIR) / "misc.schema").exists():
        pytest.skip("no %s/misc.schema" % SCHEMA_DIR)
    base = tmp_path_factory.mktemp("migrate-rich")
    (base / "db").mkdir()
    text, where = rich_conf(base)
    conf = base / "slapd.conf"
    conf.write_text(text)
    ents = rich_entries()
    ldif = base / "data.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents))
    slapd = Slapd(base, base / "slapd.pid", conf=conf)
    slapd.slapadd(SUFFIX, ldif)
    dump = slapd.slapcat(SUFFIX, base / "slapcat.ldif")
    slapd.start()
    srv = None
    try:
        out = base / "migrated"
        report, toml = migrate(conf, out)
        print("---- rich migration-report.txt\n" + head(report))
        srv = pando_with(base / "pando", out, dump, "pando-migrate-rich")
        yield dict(base=base, conf=conf, where=where, out=out, report=report, toml=toml, slapd=slapd, srv=srv,
                   entries=ents)
    finally:
        slapd.stop()
        if srv is not None:
            srv.stop_and_verify()


def test_rich_report(rich):
    report, toml, where, conf = rich["report"], rich["toml"], rich["where"], str(rich["conf"])
    at = lambda marker: "%s:%d: access " % (conf, where[marker])
    ctx = "\n--- report ---\n" + report

    # dn.children subject: the DN itself gets none (stricter).
    f = findings(report, at("filter"), "stricter")
    assert any(w.startswith("who dn.children=%s:" % SERVICES) for _, _, w in f), ctx
    assert any(w.startswith("who dn.children=%s:" % SERVICES) for _, _, w in findings(report, at("people"), "stricter")), ctx
    # dn.regex subject with a pattern: a superset gets none (stricter).
    assert any(w.startswith("who dn.regex=^cn=[^,]+,ou=Admins,dc=example,dc=com$: Pando has no regular expression")
               and "ou=Admins,dc=example,dc=com" in w for _, _, w in f), ctx
    # group=: nested membership differs.
    for m in ("regex", "filter", "groups"):
        assert any(w.startswith("who group=%s: " % EDITORS) and "nested" in w
                   for _, _, w in findings(report, at(m), "differs")), (m, ctx)
    # ssf → TLS (a note); attrs=children left out (a note).
    assert any("TLS" in w for _, _, w in findings(report, at("secret"), "note")), ctx
    assert any(w.startswith("attrs children") for _, _, w in findings(report, at("groups-children"), "note")), ctx
    # Rules translated exactly have no finding beyond notes (manage → all).
    for m in ("break", "password", "shadow", "hosts", "rest"):
        assert all(f[1] == "note" for f in findings(report, at(m))), (m, ctx)
    assert [w for _, _, w in findings(report, at("break"))] == [
        "access 'manage': Pando's 'all' (the relax rules control stays with administrators)"], ctx
    # Modules are built in; the pid file means nothing to Pando.
    assert findings(report, "%s:" % conf, "note") and any(
        "moduleload" in h and "modules are built into Pando" in w for h, _, w in parse_report(report)), ctx
    assert any(h.startswith("%s:" % conf) and "pidfile" in h for h, s, _ in parse_report(report) if s == "dropped"), ctx
    # Nothing in the access rules was dropped outright.
    assert not [x for x in parse_report(report) if x[1] == "dropped" and ": access " in x[0]], ctx
    # Overlays.
    for o in ("memberof", "refint", "unique", "ppolicy"):
        assert re.search(r'^type = "%s"$' % o, toml, re.M), (o, toml)
    # misc.schema is not built in: copied beside the configuration.
    assert (rich["out"] / "schema" / "misc.schema").exists(), list((rich["out"]).iterdir())
    assert "misc.schema" in toml, toml
    # The {SSHA} root password is kept as it is.
    assert 'root_password_hash = "%s"' % ssha(ROOT_PW) in toml, toml
    assert 'root_dn = "cn=admin,%s"' % SUFFIX in toml, toml


def test_rich_pando_serves_the_data(rich):
    srv = rich["srv"]
    rc, ents, err = srv.search(SUFFIX, "(objectClass=*)", "dn", auth=("cn=admin," + SUFFIX, ROOT_PW))
    assert rc == 0, err
    assert len(ents) == len(rich["entries"]), ents
    # misc.schema's attribute came in with the data.
    rc, ents, err = srv.search("uid=carol," + PEOPLE, "(objectClass=*)", "mailLocalAddress", scope="base",
                               auth=("uid=carol," + PEOPLE, "carol-pw"))
    assert rc == 0 and ents and ents[0][1].get("mailLocalAddress") == ["carol@mail.example.com"], (ents, err)
    # The secret subtree is closed on a plain connection (ssf=128 → TLS only).
    rc, ents, err = srv.search("ou=Secret," + SUFFIX, "(objectClass=*)", auth=("uid=bob," + PEOPLE, "bob-pw"))
    assert not ents, ents


def test_rich_verify_against_slapd(rich):
    ids = [("uid=alice," + PEOPLE, "alice-pw"),  # member of the editors group
           ("uid=bob," + PEOPLE, "bob-pw"),  # a plain user
           (READER, "reader-pw")]  # a service account (dn.children of ou=Services)
    rc, text = verify(rich["conf"], rich["base"] / "migrated-verify", rich["slapd"], rich["srv"], ids, rich["base"])
    print("---- rich verify output\n" + text)
    # Everything but the secret subtree is readable by some identity.
    assert_no_difference(rc, text, ids, len(rich["entries"]) - 2)


# ------------------------------------------------------------------ broken and unusual input


def test_unreadable_rule_is_reported_with_file_and_line(tmp_path):
    conf = tmp_path / "slapd.conf"
    conf.write_text("include %s/core.schema\n\ndatabase mdb\nsuffix \"dc=example,dc=com\"\n"
                    "access to bogus by * read\naccess to * by users read by * none\n" % SCHEMA_DIR)
    report, toml = migrate(conf, tmp_path / "out")
    f = findings(report, "%s:5: access to bogus by * read" % conf)
    assert f, report
    assert f[0][1] == "stricter" and "not translated" in f[0][2] and "bogus" in f[0][2], f
    # The readable rule after it is still translated.
    assert "# from %s:6: access to * by users read by * none" % conf in toml, toml


def test_data_export_password_schemes_are_reported(tmp_path):
    """`pando migrate --data` looks through the export: userPassword values
    by scheme in the report and on the terminal, naming those no bind can
    verify (issue 43); a broken record names its line."""
    conf = tmp_path / "slapd.conf"
    conf.write_text("include %s/core.schema\n\ndatabase mdb\nsuffix \"dc=example,dc=com\"\n" % SCHEMA_DIR)
    users = [("a", "{SSHA}" + ssha("pw")[6:]), ("b", "{MD5}CY9rzUYh03PK3k6DJie09g=="),
             ("c", "{MD5}CY9rzUYh03PK3k6DJie09g=="), ("d", "{KERBEROS}someone@REALM"), ("e", None)]
    ldif = tmp_path / "export.ldif"
    ldif.write_text("dn: dc=example,dc=com\nobjectClass: domain\ndc: example\n\n" + "".join(
        "dn: cn=%s,dc=example,dc=com\nobjectClass: person\ncn: %s\nsn: s\n%s\n"
        % (u, u, "userPassword: %s\n" % pw if pw else "") for u, pw in users))
    r = pando("migrate", "--from", conf, "--out", tmp_path / "out", "--data", ldif)
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "out" / "migration-report.txt").read_text()
    for text in (report, r.stderr):
        assert "userPassword values by scheme:" in text, text
        assert "{MD5} 2" in text and "{SSHA} 1" in text, text
        assert "1 userPassword value(s) in {KERBEROS} cannot be verified here" in text, text
        assert "note: 3 userPassword value(s) in weak or legacy schemes" in text, text
    assert "## Passwords in %s" % ldif in report, report
    # A broken record: an error naming the file and line, exit non-zero.
    ldif.write_text("dn: dc=example,dc=com\nobjectClass: domain\ndc:: !!not base64!!\n")
    r = pando("migrate", "--from", conf, "--out", tmp_path / "out2", "--data", ldif)
    assert r.returncode != 0 and str(ldif) in r.stderr and "line 3" in r.stderr, r.stderr


def test_missing_from_path_is_an_error(tmp_path):
    missing = tmp_path / "no-such" / "slapd.conf"
    r = pando("migrate", "--from", missing, "--out", tmp_path / "out")
    assert r.returncode != 0, r.stdout
    assert str(missing) in r.stderr, r.stderr
    assert not (tmp_path / "out" / "pando.toml").exists()
    # A directory without cn=config.ldif is named as not a slapd.d.
    (tmp_path / "empty").mkdir()
    r = pando("migrate", "--from", tmp_path / "empty", "--out", tmp_path / "out")
    assert r.returncode != 0 and str(tmp_path / "empty") in r.stderr and "cn=config.ldif" in r.stderr, r.stderr


def test_broken_slapd_d_entry_names_file_and_line(tmp_path):
    d = tmp_path / "slapd.d"
    (d / "cn=config").mkdir(parents=True)
    (d / "cn=config.ldif").write_text("dn: cn=config\nobjectClass: olcGlobal\ncn: config\n")
    bad = d / "cn=config" / "olcDatabase={1}mdb.ldif"
    bad.write_text("dn: olcDatabase={1}mdb,cn=config\nolcDatabase: {1}mdb\nolcSuffix: dc=example,dc=com\n"
                   "olcAccess:: !!not base64!!\n")
    r = pando("migrate", "--from", d, "--out", tmp_path / "out")
    assert r.returncode != 0, r.stdout
    assert "%s:4:" % bad in r.stderr, r.stderr


def test_slapd_conf_frontend_rules_and_database_lines_after_overlays(tmp_path):
    """slapd.conf: `access` lines before the first `database` are the
    frontend's rules (slapd appends them to every database's); directives
    after an `overlay` line that the overlay does not know are the
    database's (slapd hands them on). Neither may be dropped: with no rules
    left, the translation falls back to slapd's default `to * by * read`,
    wider than the configuration says."""
    conf = tmp_path / "slapd.conf"
    lines = [
        "include %s/core.schema" % SCHEMA_DIR,
        'access to dn.base="" by * read',  # 2
        "access to * by users read by * none",  # 3
        "",
        "database mdb",
        'suffix "dc=example,dc=com"',
        "directory %s" % tmp_path,
        "overlay memberof",
        "memberof-group-oc groupOfNames",
        "access to attrs=userPassword by self write by anonymous auth by * none",  # 10
        "index uid eq",  # 11
    ]
    conf.write_text("\n".join(lines) + "\n")
    report, toml = migrate(conf, tmp_path / "out")
    ctx = "\n--- report ---\n%s\n--- pando.toml ---\n%s" % (report, toml)
    for line in (3, 10):
        assert "# from %s:%d: access " % (conf, line) in toml, "rule at line %d not translated%s" % (line, ctx)
        assert not findings(report, "%s:%d:" % (conf, line), "dropped"), ctx
    assert not findings(report, "%s:11: index" % conf, "dropped"), ctx
    assert "slapd's default rule" not in toml, ctx


# ------------------------------------------------------------------ 389 Directory Server

DSE_389 = """dn: cn=config
objectClass: top
objectClass: nsslapdConfig
cn: config
nsslapd-port: 389
nsslapd-sizelimit: 2000
nsslapd-rootdn: cn=Directory Manager
nsslapd-rootpw: {rootpw}
nsslapd-errorlog-level: 0

dn: cn=userRoot,cn=ldbm database,cn=plugins,cn=config
objectClass: nsBackendInstance
cn: userRoot
nsslapd-suffix: dc=example,dc=com

dn: cn=telephoneNumber,cn=index,cn=userRoot,cn=ldbm database,cn=plugins,cn=config
objectClass: nsIndex
cn: telephoneNumber
nsSystemIndex: false
nsIndexType: eq
"""

ACIS_389 = [
    '(targetattr="cn || sn || uid || mail || objectClass")(targetfilter="(objectClass=person)")'
    '(version 3.0; acl "anyone reads names"; allow (read, search, compare)(userdn="ldap:///anyone");)',
    '(targetattr="telephoneNumber")(version 3.0; acl "self phone"; allow (read, search, compare, write)'
    '(userdn="ldap:///self");)',
    '(targetattr="*")(version 3.0; acl "editors"; allow (all) groupdn="ldap:///cn=editors,ou=Groups,dc=example,dc=com";)',
    '(targetattr="telephoneNumber")(version 3.0; acl "no phones for bob"; deny (all)'
    '(userdn="ldap:///uid=bob,ou=People,dc=example,dc=com");)',
]


def test_389_ds_configuration_and_acis_serve_as_389_ds_would(tmp_path):
    """A 389-DS dse.ldif and a data export with ACIs: the migrated Pando
    serves the data with the ACIs' effect (anyone reads names of people, a
    user writes their own phone, a group edits everything, a deny wins over
    the group), binds work (389-DS does not put them under ACIs), and the
    report lists what had no counterpart. No 389-DS runs here (a real one
    does in test_migrate_389ds.py): the expectations are 389-DS's
    documented ACI semantics."""
    dse = tmp_path / "dse.ldif"
    dse.write_text(DSE_389.format(rootpw=ssha(ROOT_PW)))
    people = [("uid=%s,%s" % (u, PEOPLE), {"objectClass": ["inetOrgPerson"], "uid": [u], "cn": [u.title()],
                                           "sn": ["X"], "mail": ["%s@example.com" % u],
                                           "telephoneNumber": ["+1 555 01%02d" % i],
                                           "userPassword": ["%s-pw" % u]})
              for i, u in enumerate(["alice", "bob", "carol"])]
    data = [(SUFFIX, {"objectClass": ["domain"], "dc": ["example"], "aci": ACIS_389}),
            (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
            ("ou=Groups," + SUFFIX, {"objectClass": ["organizationalUnit"], "ou": ["Groups"]}),
            ("cn=editors,ou=Groups," + SUFFIX, {"objectClass": ["groupOfNames"], "cn": ["editors"],
                                                 "member": ["uid=alice,%s" % PEOPLE, "uid=bob,%s" % PEOPLE]})] + people
    export = tmp_path / "userRoot.ldif"
    export.write_text("\n".join(ldif_entry(dn, a) for dn, a in data))
    out = tmp_path / "migrated"
    r = pando("migrate", "--from", dse, "--acis-from", export, "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    report, toml = (out / "migration-report.txt").read_text(), (out / "pando.toml").read_text()
    assert 'root_dn = "cn=Directory Manager"' in toml and 'telephoneNumber = ["eq"]' in toml, toml
    assert "nsslapd-errorlog-level" in report, report
    # The data without the aci values (Pando's schema has no aci type).
    plain = tmp_path / "data.ldif"
    plain.write_text("\n".join(ldif_entry(dn, {k: v for k, v in a.items() if k != "aci"}) for dn, a in data))
    srv = pando_with(tmp_path / "pando", out, plain, "pando-389")
    try:
        dn = lambda u: "uid=%s,%s" % (u, PEOPLE)  # noqa: E731
        who = lambda u: (dn(u), "%s-pw" % u)  # noqa: E731
        # Anyone (anonymous too) reads names of people, not phones.
        rc, ents, err = srv.search(PEOPLE, "(uid=carol)", "cn", "telephoneNumber", auth=None)
        assert rc == 0 and ents and ents[0][1].get("cn") == ["Carol"] and "telephoneNumber" not in ents[0][1], (ents, err)
        # Carol reads and writes her own phone; binds work for everyone.
        rc, ents, err = srv.search(dn("carol"), "(objectClass=*)", "telephoneNumber", scope="base", auth=who("carol"))
        assert ents and ents[0][1].get("telephoneNumber"), (ents, err)
        change = "dn: %s\nchangetype: modify\nreplace: telephoneNumber\ntelephoneNumber: +1 555 9999\n"
        rc, _, err = srv.ldap("ldapmodify", input=change % dn("carol"), auth=who("carol"))
        assert rc == 0, err
        # ...but not alice's.
        rc, _, err = srv.ldap("ldapmodify", input=change % dn("alice"), auth=who("carol"))
        assert rc != 0, "carol changed alice's phone"
        # Editors (alice) change anything; the deny keeps bob, an editor too, off phones.
        rc, _, err = srv.ldap("ldapmodify", input=change % dn("carol"), auth=who("alice"))
        assert rc == 0, err
        rc, _, err = srv.ldap("ldapmodify", input=change % dn("carol"), auth=who("bob"))
        assert rc != 0, "the deny on telephoneNumber did not hold for bob"
        rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: sn\nsn: Y\n" % dn("carol"),
                              auth=who("bob"))
        assert rc == 0, err
    finally:
        srv.stop_and_verify()
