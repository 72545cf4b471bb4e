"""cn=Monitor shaped as slapd's back-monitor where tools read it (issue 43).

slapd with `database monitor` runs beside Pando; every entry of slapd's
monitor that LDAP Account Manager's server information page or
phpLDAPadmin reads, and every subsystem container, exists in Pando under
the same DN with slapd's object class and attribute names (values differ),
except the differences docs/operations.md names ("slapd's shapes").
LAM's reads are replayed and every attribute it indexes is checked.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import PUBLIC_READ, Pando, free_port, wait_port

SLAPD = "/usr/sbin/slapd"
SCHEMA_DIR = "/etc/ldap/schema"
MODULE_DIR = "/usr/lib/ldap"
SLAPD_ADMIN = "cn=admin,dc=example,dc=com"
SLAPD_PW = "monitor-shapes-secret"

pytestmark = pytest.mark.skipif(not os.path.exists(SLAPD) or not shutil.which("ldapsearch"),
                                reason="slapd and ldap-utils needed")

PANDO_CONFIG = PUBLIC_READ + """
[[overlay]]
type = "refint"
attributes = ["member"]
nothing = "cn=nobody"
"""

# What LAM 8.x's tools/serverInfo.php indexes in each cn=Monitor entry
# (lower-cased DN -> attributes); an entry it finds without one of them
# stops the page with a PHP TypeError.
LAM_READS = {
    "cn=monitor": ["monitoredinfo"],
    "cn=listener 0,cn=listeners,cn=monitor": ["monitorconnectionlocaladdress"],
    "cn=backends,cn=monitor": ["monitoredinfo"],
    "cn=overlays,cn=monitor": ["monitoredinfo"],
    "cn=max file descriptors,cn=connections,cn=monitor": ["monitorcounter"],
    "cn=entries,cn=statistics,cn=monitor": ["monitorcounter"],
    "cn=start,cn=time,cn=monitor": ["monitortimestamp"],
    "cn=current,cn=time,cn=monitor": ["monitortimestamp"],
    "cn=uptime,cn=time,cn=monitor": ["monitoredinfo"],
    "cn=current,cn=connections,cn=monitor": ["monitorcounter"],
    "cn=total,cn=connections,cn=monitor": ["monitorcounter"],
    "cn=bytes,cn=statistics,cn=monitor": ["monitorcounter"],
    "cn=pdu,cn=statistics,cn=monitor": ["monitorcounter"],
    "cn=operations,cn=monitor": ["monitoropinitiated", "monitoropcompleted"],
}
for op in ("bind", "unbind", "search", "add", "modify", "delete", "modrdn", "compare",
           "abandon", "extended"):
    LAM_READS["cn=%s,cn=operations,cn=monitor" % op] = ["monitoropinitiated", "monitoropcompleted"]

# Entries of slapd's monitor Pando leaves out (docs/operations.md): no
# figure to fill them with.
ABSENT = {
    "cn=referrals,cn=statistics,cn=monitor",  # referrals sent are not counted
    "cn=read,cn=waiters,cn=monitor",  # connections are async tasks: no waiters
    "cn=write,cn=waiters,cn=monitor",
}
# Attributes slapd has and Pando leaves out, per lower-cased DN.
MISSING_ATTRS = {
    "cn=databases,cn=monitor": {"readonly"},  # said per database, not for the frontend
}
# Operational attributes every entry has on either server; not the shape.
COMMON_OPERATIONAL = {"entrydn", "subschemasubentry", "hassubordinates", "structuralobjectclass",
                      "creatorsname", "modifiersname", "createtimestamp", "modifytimestamp",
                      "entryuuid", "entrycsn", "numsubordinates"}


class MonitorSlapd:
    def __init__(self, base):
        self.base = base
        self.port = free_port()
        self.pid = None

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    def start(self):
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        lines = ["include %s/%s.schema" % (SCHEMA_DIR, s) for s in ("core", "cosine", "inetorgperson")]
        lines += [
            "modulepath " + MODULE_DIR,
            "moduleload back_mdb",
            "moduleload back_monitor",
            "moduleload refint",
            "pidfile %s/slapd.pid" % self.base,
            "argsfile %s/slapd.args" % self.base,
            "loglevel 0",
            "threads 2",
            "database mdb",
            'suffix "dc=example,dc=com"',
            'rootdn "%s"' % SLAPD_ADMIN,
            "rootpw %s" % SLAPD_PW,
            "directory %s/db" % self.base,
            "maxsize 67108864",
            "overlay refint",
            "refint_attributes member",
            "database monitor",
            'rootdn "%s"' % SLAPD_ADMIN,
        ]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")
        r = subprocess.run([SLAPD, "-f", str(self.base / "slapd.conf"), "-h", self.url + "/"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "slapd failed to start: %s %s" % (r.stdout, r.stderr)
        assert wait_port(self.port, timeout=30), "slapd not listening"
        pf = self.base / "slapd.pid"
        for _ in range(100):
            if pf.exists() and pf.read_text().strip():
                self.pid = int(pf.read_text().strip())
                break
            time.sleep(0.05)
        return self

    def stop(self):
        if not self.pid:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(self.pid, 0)
                time.sleep(0.1)
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.pid = None


def search(url, dn, pw, base, *args, scope="sub"):
    from conftest import parse_ldif
    r = subprocess.run(["ldapsearch", "-x", "-H", url, "-D", dn, "-w", pw, "-LLL", "-o", "ldif-wrap=no",
                        "-b", base, "-s", scope, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {d.lower(): {k.lower(): v for k, v in a.items()} for d, a in parse_ldif(r.stdout)}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    slapd = MonitorSlapd(tmp_path_factory.mktemp("slapd-monitor")).start()
    pando = Pando(tmp_path_factory.mktemp("pando-monitor"), demo=True, config=PANDO_CONFIG,
                  name="monitor-shapes").start()
    yield slapd, pando
    slapd.stop()
    pando.stop_and_verify()


def monitors(servers):
    slapd, pando = servers
    s = search(slapd.url, SLAPD_ADMIN, SLAPD_PW, "cn=Monitor", "*", "+")
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "cn=Monitor", "*", "+")
    return s, p


def read_by_tools(dn):
    """The DNs compared: what LAM reads, and every subsystem container."""
    return dn in LAM_READS or dn.count(",") == 1 or dn == "cn=monitor"


def test_root_dse_names_the_monitor(servers):
    slapd, pando = servers
    s = search(slapd.url, SLAPD_ADMIN, SLAPD_PW, "", "+", scope="base")[""]
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "", "+", scope="base")[""]
    assert s["monitorcontext"] == ["cn=Monitor"]
    assert p.get("monitorcontext") == ["cn=Monitor"], p
    # Anonymous readers see it too, as phpLDAPadmin asks before login.
    r = subprocess.run(["ldapsearch", "-x", "-H", pando.url, "-LLL", "-b", "", "-s", "base",
                        "monitorContext"], capture_output=True, text=True, timeout=30)
    assert "monitorContext: cn=Monitor" in r.stdout, r.stdout


def test_entries_tools_read_have_slapds_shape(servers):
    s, p = monitors(servers)
    compared = [dn for dn in s if read_by_tools(dn) and dn not in ABSENT]
    assert len(compared) >= 25, sorted(s)
    problems = []
    for dn in compared:
        if dn not in p:
            problems.append("%s: missing" % dn)
            continue
        s_oc = {v.lower() for v in s[dn]["objectclass"]}
        p_oc = {v.lower() for v in p[dn]["objectclass"]}
        if not s_oc <= p_oc or p_oc - s_oc - {"top", "pandomonitor"}:
            problems.append("%s: objectClass %s, slapd %s" % (dn, sorted(p_oc), sorted(s_oc)))
        want = set(s[dn]) - COMMON_OPERATIONAL - MISSING_ATTRS.get(dn, set())
        lacking = want - set(p[dn])
        if lacking:
            problems.append("%s: lacks %s" % (dn, sorted(lacking)))
    assert not problems, "\n".join(problems)


def test_lam_server_information_reads(servers):
    """Replays serverInfo.php: the root DSE with `+ * subschemasubentry`,
    then cn=monitor subtree with `* +`; every attribute it indexes in an
    entry it found is there, and the page's sections all have an entry."""
    _, pando = servers
    dse = search(pando.url, pando.admin_dn, pando.admin_pw, "", "+", "*", "subschemasubentry",
                 scope="base")[""]
    for a in ("namingcontexts", "supportedldapversion", "subschemasubentry", "vendorname"):
        assert a in dse, a
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "cn=monitor", "*", "+")
    for dn, attrs in LAM_READS.items():
        assert dn in p, "LAM finds no %s" % dn
        for a in attrs:
            assert p[dn].get(a), "%s has no %s" % (dn, a)
    # Listener N counts up from 0 until one is missing: every one has an address.
    n = 0
    while "cn=listener %d,cn=listeners,cn=monitor" % n in p:
        assert p["cn=listener %d,cn=listeners,cn=monitor" % n]["monitorconnectionlocaladdress"]
        n += 1
    assert n >= 1
    # Figures are Pando's own: the bind LAM made counted, the overlay listed.
    assert int(p["cn=bind,cn=operations,cn=monitor"]["monitoropinitiated"][0]) >= 1
    assert int(p["cn=total,cn=connections,cn=monitor"]["monitorcounter"][0]) >= 1
    assert "refint" in [v.lower() for v in p["cn=overlays,cn=monitor"]["monitoredinfo"]]
    assert p["cn=start,cn=time,cn=monitor"]["monitortimestamp"][0].endswith("Z")
    assert int(p["cn=uptime,cn=time,cn=monitor"]["monitoredinfo"][0]) >= 0


def test_monitor_attributes_are_operational(servers):
    """As on slapd, the figures come with `+` (or by name), not with `*`."""
    _, pando = servers
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "cn=Total,cn=Connections,cn=Monitor", "*",
               scope="base")
    assert "monitorcounter" not in p["cn=total,cn=connections,cn=monitor"]
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "cn=Total,cn=Connections,cn=Monitor",
               "monitorCounter", scope="base")
    assert p["cn=total,cn=connections,cn=monitor"]["monitorcounter"]


def test_database_entry_names_suffix_and_overlay(servers):
    _, pando = servers
    p = search(pando.url, pando.admin_dn, pando.admin_pw, "cn=Databases,cn=Monitor", "*", "+")
    db = p["cn=database 1,cn=databases,cn=monitor"]
    assert db["namingcontexts"] == [pando_suffix(pando)]
    assert db["monitoroverlay"] == ["refint"]
    assert p["cn=databases,cn=monitor"]["monitorcontext"] == ["cn=Monitor"]


def pando_suffix(pando):
    from conftest import SUFFIX
    return SUFFIX


def test_monitor_stays_closed_to_anonymous(servers):
    """The new entries are decided as the rest of cn=Monitor: closed."""
    _, pando = servers
    r = subprocess.run(["ldapsearch", "-x", "-H", pando.url, "-LLL", "-b", "cn=Monitor", "*", "+"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 32, (r.returncode, r.stdout)
