"""Observability: the access log (every operation type, text and JSON),
the audit log (LDIF that replays into another server to the same state),
no password in any log, cn=Monitor (access control, counters under a
known workload), the Prometheus endpoint, and `pando stat`."""

import json
import re
import subprocess
import time
import urllib.request

import pytest

import ber
from conftest import (ADMIN_DN, PANDO_BIN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, free_port,
                      ldif_entry, parse_ldif, person_attrs)

SECRETS = ["Xyzzy-Secret-1", "Plugh-Secret-2", "Frotz-Secret-3"]

TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
RESULT = r" RESULT tag=(\d+) err=(\d+) nentries=(\d+) etime=\d+\.\d{6} qtime=\d+\.\d{6}$"


def obs_config(base, fmt="text", metrics_port=None, extra=""):
    cfg = PUBLIC_READ + """
[logs]
access = "%s"
audit = "%s"
access_format = "%s"
""" % (base / "access.log", base / "audit.log", fmt)
    if metrics_port:
        cfg += '\n[metrics]\nlisten = "127.0.0.1:%d"\n' % metrics_port
    return cfg + extra


def read_log(path, wait_for=None, timeout=5.0):
    """The log's text, once `wait_for` (a regex) appears (the writer is
    asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if wait_for is None or re.search(wait_for, text, re.M) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


@pytest.fixture(scope="module")
def obs(tmp_path_factory):
    base = tmp_path_factory.mktemp("obs")
    mport = free_port()
    s = Pando(base, demo=True, config=obs_config(base, metrics_port=mport), name="obs")
    s.metrics_port = mport
    s.start()
    yield s
    s.stop_and_verify()


def workload(s):
    """One of every operation type, with passwords in binds, adds,
    modifies and Password Modify."""
    dn = "uid=obsuser,%s" % PEOPLE
    add = ldif_entry(dn, person_attrs("obsuser", 1, {"userPassword": [SECRETS[0]]}))
    rc, out, err = s.ldap("ldapadd", input=add)
    assert rc == 0, err
    rc, _, err = s.ldap("ldapwhoami", auth=(dn, SECRETS[0]))
    assert rc == 0, err
    # A failed bind with a wrong password must not log it either.
    rc, _, _ = s.ldap("ldapwhoami", auth=(dn, SECRETS[1] + "-wrong"))
    assert rc != 0
    mod = "dn: %s\nchangetype: modify\nreplace: userPassword\nuserPassword: %s\n-\nreplace: mail\nmail: obs@example.com\n" % (dn, SECRETS[1])
    rc, _, err = s.ldap("ldapmodify", input=mod)
    assert rc == 0, err
    rc, _, err = s.ldap("ldappasswd", "-s", SECRETS[2], dn)
    assert rc == 0, err
    rc, _, err = s.ldap("ldapcompare", dn, "mail:obs@example.com")
    assert rc in (5, 6), err
    rc, _, err = s.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "(uid=obsuser)", "cn", "mail")
    assert rc == 0, err
    # Escapes in a filter and a DN, logged as sent (once escaped).
    rc, _, err = s.ldap("ldapsearch", "-LLL", "-b", "cn=Comma\\, Person," + SUFFIX, "(uid=ali\\2a)", "cn")
    assert rc == 32, err
    rc, _, err = s.ldap("ldapmodrdn", dn, "uid=obsuser2")
    assert rc == 0, err
    dn2 = "uid=obsuser2,%s" % PEOPLE
    # Abandon (raw: ldap-utils do not send one on request).
    with s.raw() as c:
        assert ber.simple_bind(c, s.admin_dn, s.admin_pw) == 0
        c.send(ber.message(2, ber.search_op(SUFFIX, filt=ber.f_present("objectClass"))) +
               ber.message(3, ber.abandon_op(2)) + ber.message(4, ber.unbind_op()))
        time.sleep(0.3)
    rc, _, err = s.ldap("ldapdelete", dn2)
    assert rc == 0, err
    return dn, dn2


def test_access_log_every_operation(obs):
    workload(obs)
    log = read_log(obs.base / "access.log", r"DEL dn=\"uid=obsuser2")
    lines = log.splitlines()
    assert lines, "empty access log"
    for l in lines:
        assert re.match(TS + r" conn=\d+ ", l), l

    def find(pattern):
        rx = re.compile(TS + r" conn=\d+ op=\d+ msgid=\d+ " + pattern)
        hits = [l for l in lines if rx.search(l)]
        assert hits, "no access-log line matches %r:\n%s" % (pattern, log[-3000:])
        return hits

    find(r'BIND dn="cn=admin,dc=example,dc=com" method=128' + RESULT)
    bad = find(r'BIND dn="uid=obsuser,ou=People,dc=example,dc=com" method=128 RESULT tag=97 err=49 ')
    assert bad
    find(r'SRCH base="dc=example,dc=com" scope=2 filter="\(uid=obsuser\)" attrs="cn mail"'
         + r" RESULT tag=101 err=0 nentries=1 ")
    find(re.escape(r'SRCH base="cn=Comma\, Person,dc=example,dc=com" scope=2 filter="(uid=ali\2a)" attrs="cn"')
         + r" RESULT tag=101 err=32 ")
    find(r'CMP dn="uid=obsuser,ou=People,dc=example,dc=com" attr="mail"' + RESULT)
    find(r'ADD dn="uid=obsuser,ou=People,dc=example,dc=com"' + RESULT)
    find(r'MOD dn="uid=obsuser,ou=People,dc=example,dc=com" attrs="userPassword mail"' + RESULT)
    find(r'MODRDN dn="uid=obsuser,ou=People,dc=example,dc=com" newrdn="uid=obsuser2" deleteoldrdn=[01]'
         + RESULT)
    find(r'DEL dn="uid=obsuser2,ou=People,dc=example,dc=com"' + RESULT)
    find(r'EXT oid="1.3.6.1.4.1.4203.1.11.1"' + RESULT)
    find(r"ABANDON msgid=2$")
    find(r"UNBIND$")
    assert any(re.match(TS + r" conn=\d+ ACCEPT from IP=127\.0\.0\.1:\d+$", l) for l in lines)
    assert any(re.match(TS + r" conn=\d+ closed \(unbind\)$", l) for l in lines)


def test_no_password_in_any_log(obs):
    # Runs after the workload above (module order).
    read_log(obs.base / "access.log", r"DEL dn=\"uid=obsuser2")
    texts = {
        "access": (obs.base / "access.log").read_text(),
        "audit": (obs.base / "audit.log").read_text(),
        "stderr": (obs.base / "stderr.log").read_text(errors="replace"),
        "stdout": (obs.base / "stdout.log").read_text(errors="replace"),
    }
    for name, text in texts.items():
        for secret in SECRETS + [obs.admin_pw.strip()]:
            assert secret not in text, "password found in the %s log" % name
    # The audit log holds the hashes.
    assert re.search(r"^userPassword: \{", texts["audit"], re.M), texts["audit"][-2000:]


def test_log_files_are_0600(obs):
    for n in ("access.log", "audit.log"):
        assert (obs.base / n).stat().st_mode & 0o777 == 0o600


def user_view(s):
    rc, entries, err = s.search(SUFFIX, "(objectClass=*)", "*")
    assert rc == 0, err
    return {dn.lower(): {k.lower(): sorted(v) for k, v in attrs.items()} for dn, attrs in entries}


def test_audit_log_replays_to_the_same_state(obs, tmp_path_factory):
    # More changes: an entry that stays, a subtree move, a multi-valued modify.
    dn = "uid=stays,%s" % PEOPLE
    rc, _, err = obs.ldap("ldapadd", input=ldif_entry(dn, person_attrs("stays", 7, {
        "userPassword": ["stay-secret"], "description": ["café ünïcödé", " leading space"]})))
    assert rc == 0, err
    mod = ("dn: %s\nchangetype: modify\nadd: telephoneNumber\ntelephoneNumber: +1 555 0100\n"
           "telephoneNumber: +1 555 0101\n-\ndelete: description\ndescription:  leading space\n-\n" % dn)
    rc, _, err = obs.ldap("ldapmodify", input=mod)
    assert rc == 0, err
    rc, _, err = obs.ldap("ldapmodrdn", "-r", "uid=bob,%s" % PEOPLE, "uid=robert")
    assert rc == 0, err
    audit = read_log(obs.base / "audit.log", r"newrdn: uid=robert")
    assert re.search(r"^# " + TS + r" cn=admin,dc=example,dc=com conn=\d+ op=\d+$", audit, re.M)
    assert "changetype: add" in audit and "changetype: modrdn" in audit
    assert "entryUUID" not in audit and "createTimestamp" not in audit

    # The demo tree was written through the write pipeline, so the log
    # holds it too: replayed into a fresh server with no demo data, it
    # rebuilds the same state.
    # The first start's suffix entry comes first: a fresh server makes its
    # own, so the replay starts after it.
    assert "dn: uid=alice,%s\nchangetype: add" % PEOPLE in audit
    first, rest = audit.split("\n\n", 1)
    assert "dn: %s\nchangetype: add" % SUFFIX in first, first
    base = tmp_path_factory.mktemp("replay")
    other = Pando(base, demo=False, config=PUBLIC_READ, name="replay").start()
    try:
        rc, out, err = other.ldap("ldapmodify", "-a", input=rest)
        assert rc == 0, "replay failed: %s\n%s" % (err, out)
        a, b = user_view(obs), user_view(other)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == b[k], k
    finally:
        other.stop_and_verify()


def monitor_value(s, dn, attr, auth="admin"):
    rc, entries, err = s.search(dn, "(objectClass=*)", attr, scope="base", auth=auth)
    assert rc == 0, err
    return entries[0][1][attr][0]


def test_monitor_is_admin_only(obs):
    rc, entries, err = obs.search("cn=Monitor", "(objectClass=*)", auth=None)
    assert rc == 32, (rc, entries, err)
    user = ("uid=alice,%s" % PEOPLE, "password")
    rc, entries, err = obs.search("cn=Monitor", "(objectClass=*)", auth=user)
    assert rc in (32, 49), (rc, err)
    rc, entries, err = obs.search("cn=Monitor", "(objectClass=*)")
    assert rc == 0, err
    dns = {dn.lower() for dn, _ in entries}
    for d in ("cn=monitor", "cn=connections,cn=monitor", "cn=operations,cn=monitor",
              "cn=search,cn=operations,cn=monitor", "cn=store,cn=monitor", "cn=writer,cn=monitor"):
        assert d in dns, dns
    top = dict(entries)
    # One level: the children only.
    rc, one, err = obs.search("cn=Operations,cn=Monitor", "(objectClass=*)", "cn", scope="one")
    assert rc == 0 and len(one) == 10, (rc, one)
    # Filters work on the counters.
    rc, hit, err = obs.search("cn=Operations,cn=Monitor", "(pandoCompleted>=1)", "cn", scope="one")
    assert rc == 0 and any(a["cn"] == ["Search"] for _, a in hit), hit
    assert top


def test_monitor_counters_follow_a_known_workload(obs):
    dn = "cn=Search,cn=Operations,cn=Monitor"
    before = int(monitor_value(obs, dn, "pandoCompleted"))
    entries_before = int(monitor_value(obs, "cn=Operations,cn=Monitor", "pandoEntriesSent"))
    n = 25
    with obs.raw() as c:
        assert ber.simple_bind(c, obs.admin_dn, obs.admin_pw) == 0
        for i in range(n):
            c.send(ber.message(10 + i, ber.search_op(PEOPLE, filt=ber.f_eq("uid", "alice"))))
            while True:
                m = c.recv_msg(timeout=10)
                if m["op"] == "searchDone":
                    break
        c.send(ber.message(99, ber.unbind_op()))
    after = int(monitor_value(obs, dn, "pandoCompleted"))
    # + the monitor search that read `before` (it completes after reading)
    # and the one that read `entries_before`.
    assert after - before == n + 2, (before, after)
    entries_after = int(monitor_value(obs, "cn=Operations,cn=Monitor", "pandoEntriesSent"))
    assert entries_after - entries_before >= n
    p99 = int(monitor_value(obs, dn, "pandoLatencyP99"))
    mx = int(monitor_value(obs, dn, "pandoLatencyMax"))
    assert 0 < p99 <= mx
    assert int(monitor_value(obs, "cn=Store,cn=Monitor", "pandoEntries")) > 10
    assert int(monitor_value(obs, "cn=Connections,cn=Monitor", "pandoCurrent")) >= 1
    # The search reading it is in progress itself.
    assert int(monitor_value(obs, "cn=Operations,cn=Monitor", "pandoInProgress")) >= 1
    float(monitor_value(obs, "cn=Writer,cn=Monitor", "pandoMeanBatch"))
    # In the configuration's words, as store.durability says it.
    assert monitor_value(obs, "cn=Writer,cn=Monitor", "pandoDurability") == "durable"
    assert int(monitor_value(obs, "cn=Store,cn=Monitor", "pandoReadersOpen")) >= 0


def scrape(port, path="/metrics"):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*"'
                    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*")*\})? (?P<value>\S+)$')


def parse_metrics(text):
    """Tiny Prometheus text-format parser: checks every line, returns
    {name{labels}: value} and {family: type}."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            assert re.match(r"^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* \S", line), line
        elif line.startswith("# TYPE "):
            m = re.match(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$", line)
            assert m, line
            types[m.group(1)] = m.group(2)
        else:
            m = SAMPLE.match(line)
            assert m, "bad sample line %r" % line
            value = m.group("value")
            float(value.replace("+Inf", "inf"))
            name = m.group("name")
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
            assert fam in types or name in types, "sample %s has no TYPE" % name
            samples[name + (m.group("labels") or "")] = float(value)
    return samples, types


def test_prometheus_endpoint(obs):
    samples, types = parse_metrics(scrape(obs.metrics_port))
    assert types["pando_operations_completed_total"] == "counter"
    assert types["pando_operation_duration_seconds"] == "histogram"
    assert samples['pando_operations_completed_total{op="search"}'] > 0
    assert samples['pando_operation_duration_seconds_bucket{op="search",le="+Inf"}'] == \
        samples['pando_operation_duration_seconds_count{op="search"}']
    assert samples["pando_store_entries"] > 10
    assert samples["pando_connections_total"] >= 1
    assert "process_cpu_seconds_total" in samples
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(obs.metrics_port, "/other")
    assert e.value.code == 404


def run_stat(*args):
    r = subprocess.run([PANDO_BIN, "stat", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_pando_stat_against_metrics_and_ldapi(obs):
    stop = time.monotonic() + 4

    def load():
        with obs.raw() as c:
            assert ber.simple_bind(c, obs.admin_dn, obs.admin_pw) == 0
            i = 10
            while time.monotonic() < stop:
                c.send(ber.message(i, ber.search_op(PEOPLE, filt=ber.f_eq("uid", "bob"))))
                while c.recv_msg(timeout=10)["op"] != "searchDone":
                    pass
                i += 1

    import threading
    t = threading.Thread(target=load)
    t.start()
    try:
        lines = run_stat("--url", "http://127.0.0.1:%d/metrics" % obs.metrics_port,
                         "--count", "3", "--interval", "1")
    finally:
        t.join()
    assert len(lines) == 4, lines
    assert lines[0].split()[:4] == ["time", "TOTAL", "BIND", "SEARCH"]
    for l in lines[1:]:
        f = l.split()
        assert re.match(r"\d\d:\d\d:\d\d$", f[0]), l
        assert len(f) in (22, 23), l  # the time, 21 columns (the last two: replication), a "*" for an outlier
    assert any(float(l.split()[3].rstrip("kM")) > 0 for l in lines[1:]), lines
    csv = run_stat("--url", obs.ldapi_url, "--count", "2", "--interval", "0.5", "--csv")
    assert len(csv) == 3, csv
    header = csv[0].split(",")
    assert header[:3] == ["time", "total", "bind"] and header[-1] == "outlier"
    for l in csv[1:]:
        assert len(l.split(",")) == len(header), l
    # Over ldap:// with a simple bind too.
    pw = obs.base / "pw"
    pw.write_text(obs.admin_pw)
    pw.chmod(0o600)
    lines = run_stat("--url", obs.url, "-D", ADMIN_DN, "-y", str(pw), "--count", "1",
                     "--interval", "0.5")
    assert len(lines) == 2


def test_json_access_log_and_reopen_on_sighup(tmp_path_factory):
    import signal
    base = tmp_path_factory.mktemp("obsjson")
    s = Pando(base, demo=True, config=obs_config(base, fmt="json"), name="obsjson").start()
    try:
        rc, _, err = s.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "(uid=alice)", "cn", auth=None)
        assert rc == 0, err
        text = read_log(base / "access.log", r'"type":"SRCH"')
        objs = [json.loads(l) for l in text.splitlines()]
        srch = [o for o in objs if o["type"] == "SRCH"]
        assert srch and srch[0]["filter"] == "(uid=alice)" and srch[0]["nentries"] == 1
        assert srch[0]["err"] == 0 and isinstance(srch[0]["etime_us"], int)
        # External rotation: rename, SIGHUP, the server writes a new file.
        (base / "access.log").rename(base / "access.log.1")
        s.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        rc, _, err = s.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "(uid=bob)", "cn", auth=None)
        assert rc == 0, err
        text = read_log(base / "access.log", r"uid=bob")
        assert "(uid=bob)" in text and "(uid=alice)" not in text
    finally:
        s.stop_and_verify()


def test_bad_log_config_names_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[logs]\naccess_format = "xml"\n')
    r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(tmp_path / "d"), "--config", str(cfg),
                        "--listen", "ldap://127.0.0.1:%d" % free_port()],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "logs.access_format" in r.stderr


def test_monitor_opened_by_an_access_rule(tmp_path_factory):
    """A rule naming cn=Monitor lets the users it grants read it; a broad
    rule (PUBLIC_READ's "everyone reads") does not open it to anonymous."""
    base = tmp_path_factory.mktemp("obsacl")
    rule = """
[[access]]
dn = "cn=Monitor"
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""
    s = Pando(base, demo=True, config=rule + PUBLIC_READ, name="obsacl").start()
    try:
        rc, _, err = s.ldap("ldappasswd", "-s", "alice-pw", "uid=alice,%s" % PEOPLE)
        assert rc == 0, err
        rc, entries, err = s.search("cn=Monitor", "(objectClass=*)", "pandoCompleted",
                                    auth=("uid=alice,%s" % PEOPLE, "alice-pw"))
        assert rc == 0 and len(entries) >= 10, (rc, err)
        rc, entries, err = s.search("cn=Monitor", "(objectClass=*)", auth=None)
        assert rc == 32, (rc, entries)
    finally:
        s.stop_and_verify()
