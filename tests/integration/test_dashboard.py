"""The live dashboard in a real headless browser (Debian's chromium): it
loads with no network (its assets are in the binary), its charts move
while `pando bench` runs, and a slow second injected on purpose (the error
injection overlay's delay on one modify) is marked as an outlier, lined up
with its cause: the operation's access log line and what else happened.
"""

import base64
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from browser import Browser
from conftest import ADMIN_DN, PANDO_BIN, PEOPLE, Pando, free_port

SHOTS = os.environ.get("PANDO_DASHBOARD_SHOTS")  # a directory: keep the screenshots there


def config(port, access_log, extra=""):
    return ('[metrics]\nlisten = "127.0.0.1:%d"\ndashboard = true\n'
            '[logs]\naccess = "%s"\n'
            '[[overlay]]\ntype = "errors"\nrules = [\'ops=modify dn="uid=carol,%s" delay=1500\']\n%s'
            % (port, access_log, PEOPLE, extra))


def bench(srv, secs):
    return subprocess.Popen(
        [PANDO_BIN, "bench", "-H", srv.url, "-D", ADMIN_DN, "-w", srv.admin_pw,
         "--workload", "search", "-b", "uid=alice," + PEOPLE, "-s", "base", "-f", "(objectClass=*)",
         "-c", "4", "--duration", "%ds" % secs, "--warmup", "0s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(b, expression, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = b.eval(expression)
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError("never true: %s" % expression)


def test_the_dashboard_moves_and_marks_a_slow_second_with_its_cause(tmp_path):
    port = free_port()
    srv = Pando(tmp_path / "srv", demo=True, config=config(port, tmp_path / "access.log")).start()
    b = Browser(tmp_path / "profile")
    load = None
    try:
        origin = "http://127.0.0.1:%d" % port
        b.open(origin + "/dashboard")
        # Everything the page loaded came from the server itself.
        assert b.eval("typeof uPlot") == "function"
        resources = b.eval("performance.getEntriesByType('resource').map(e => e.name)")
        assert resources and all(r.startswith(origin + "/dashboard/") for r in resources), resources
        # And the browser reaches nothing else (the check above is not empty-handed).
        assert b.eval("fetch('http://example.com/').then(() => 'reached', () => 'failed')", wait=True) == "failed"
        load = bench(srv, 16)
        # Ordinary modifies beside the searches, a few a second.
        stop = threading.Event()

        def modifies():
            c = srv.conn()
            n = 0
            while not stop.is_set() and n < 200:
                c.modify("uid=alice," + PEOPLE, {"description": [("MODIFY_REPLACE", ["n%d" % n])]})
                n += 1
                time.sleep(0.2)
            c.unbind()

        writer = threading.Thread(target=modifies, daemon=True)
        writer.start()
        wait_for(b, "pandoDashboard.seconds.filter(s => s.ops.search && s.ops.search.count > 100"
                    " && s.ops.modify).length >= 3")
        # The charts move: the newest second drawn advances, with searches in it.
        first = b.eval("pandoDashboard.charts[0].plot.data[0].slice(-1)[0]")
        time.sleep(2.5)
        last = b.eval("pandoDashboard.charts[0].plot.data[0].slice(-1)[0]")
        assert last >= first + 2, (first, last)
        drawn = b.eval("pandoDashboard.charts[0].plot.data[1].filter(v => v > 100).length")
        assert drawn >= 2, drawn
        # No second-long operation yet. A loaded machine may already have
        # marked a second of its own (a modify's sync taking 30 ms against
        # a usual 3 ms is an outlier too), never one near the injected delay.
        noise = b.eval("pandoDashboard.seconds.flatMap(s => s.outliers)")
        slowest = [float(m) for o in noise for m in re.findall(r"max ([0-9.]+) ms", o)]
        assert all(ms < 1000 for ms in slowest), noise
        assert not b.eval("[...document.querySelectorAll('#outliers tr.outlier')]"
                          ".some(r => r.innerText.includes('uid=carol'))")
        # One modify held 1.5 s by the error injection overlay.
        rc, out, err = srv.ldap("ldapmodify", input="dn: uid=carol,%s\nchangetype: modify\nreplace: description\ndescription: slow\n" % PEOPLE)
        assert rc == 0, err
        carol = "[...document.querySelectorAll('#outliers tr.outlier')].find(r => r.innerText.includes('uid=carol'))"
        row = wait_for(b, "(() => { const r = %s; return r && r.innerText; })()" % carol)
        assert "modify: max 15" in row, row
        assert 'MOD dn="uid=carol,ou=People,dc=example,dc=com"' in row, row
        assert "etime=1.5" in row, row
        # The second is shaded on the charts and its operations shown when picked.
        b.eval(carol + ".click()")
        picked = b.eval("document.getElementById('second').innerText")
        assert "uid=carol" in picked, picked
        if SHOTS:
            b.screenshot(os.path.join(SHOTS, "dashboard.png"))
        stop.set()
        writer.join(10)
        assert load.wait(30) == 0
    finally:
        if load and load.poll() is None:
            load.kill()
        b.close()
        srv.stop_and_verify()


def test_each_second_carries_what_else_the_server_did(tmp_path):
    """Beside the operations: a connection storm is named as the second's
    event, writes show the writer's batches and commit time."""
    import json
    import socket
    port = free_port()
    srv = Pando(tmp_path / "srv", demo=True, config=config(port, tmp_path / "access.log")).start()
    try:
        c = srv.conn()
        for i in range(300):
            assert c.add("cn=x%d,%s" % (i, PEOPLE), ["person"], {"cn": "x%d" % i, "sn": "y"}), c.result
        time.sleep(3)
        socks = []
        for _ in range(150):
            socks.append(socket.create_connection(("127.0.0.1", srv.port)))
        time.sleep(2.5)
        for s in socks:
            s.close()
        data = json.load(urllib.request.urlopen("http://127.0.0.1:%d/dashboard/data" % port, timeout=10))
        seconds = data["seconds"]
        writes = [s for s in seconds if s["ops"].get("add", {}).get("count", 0) > 0]
        assert writes and all(s["batches"] > 0 and s["commit_ms"] > 0 for s in writes), writes[-2:]
        storms = [e for s in seconds for e in s["events"] if e.startswith("connection storm")]
        assert storms, [s["conns_opened"] for s in seconds]
        assert max(s["conns"] for s in seconds) >= 150
        # Only the last seconds, when asked for.
        newer = json.load(urllib.request.urlopen(
            "http://127.0.0.1:%d/dashboard/data?since=%d" % (port, seconds[-2]["t"]), timeout=10))["seconds"]
        assert 1 <= len(newer) <= 3 and newer[0]["t"] > seconds[-2]["t"]
        c.unbind()

        # Switched off and on over cn=config, on the same listener.
        def switch(value):
            r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url], text=True,
                               capture_output=True, timeout=30, input=(
                                   "dn: cn=config\nchangetype: modify\nreplace: pandoMetricsDashboard\n"
                                   "pandoMetricsDashboard: %s\n" % value))
            assert r.returncode == 0, r.stderr

        def status(path):
            try:
                return urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code

        switch("FALSE")
        assert status("/dashboard") == 404 and status("/metrics") == 200
        switch("TRUE")
        assert status("/dashboard") == 200
    finally:
        srv.stop_and_verify()


def test_an_exposed_dashboard_needs_tls_and_the_root_password(tmp_path):
    # Not loopback: without TLS the configuration is refused, naming the key.
    port = free_port()
    bad = tmp_path / "bad.toml"
    bad.write_text('[metrics]\nlisten = "0.0.0.0:%d"\ndashboard = true\n' % port)
    r = subprocess.run([PANDO_BIN, "serve", "-c", str(bad), "--data-dir", str(tmp_path / "bad"),
                        "--listen", "ldap://127.0.0.1:%d" % free_port()],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "metrics.dashboard" in r.stdout + r.stderr, r.stdout + r.stderr
    from test_tls import Pki
    (tmp_path / "pki").mkdir()
    cert, key = Pki(tmp_path / "pki").issue("server", "/O=Pando Test/CN=localhost", server=True)
    srv = Pando(tmp_path / "srv", demo=True,
                config='[metrics]\nlisten = "0.0.0.0:%d"\ndashboard = true\n[tls]\ncert_file = "%s"\nkey_file = "%s"\n'
                % (port, cert, key)).start()
    try:
        import ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        url = "https://127.0.0.2:%d/dashboard/data" % port

        def get(auth=None):
            req = urllib.request.Request(url)
            if auth:
                req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
            try:
                return urllib.request.urlopen(req, context=ctx, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code

        assert get() == 401
        assert get("%s:wrong" % ADMIN_DN) == 401
        assert get("cn=nobody,dc=example,dc=com:%s" % srv.admin_pw) == 401
        assert get("%s:%s" % (ADMIN_DN, srv.admin_pw)) == 200
        # Plain HTTP is not spoken there.
        with pytest.raises(Exception):
            urllib.request.urlopen("http://127.0.0.2:%d/dashboard" % port, timeout=5).read()
    finally:
        srv.stop_and_verify()


def test_the_proxy_dashboard_shows_each_server_and_a_failover(tmp_path):
    """pando proxy's dashboard: operations per server move while clients
    read through it; a provider that stops answering is shown down, the
    writes moved to the next, both listed as the second's events."""
    import signal
    from test_proxy import proxied_ring
    port = free_port()
    with proxied_ring(tmp_path, 3, [0, 1], [2], extra='dashboard_listen = "127.0.0.1:%d"\n' % port) as (ring, proxy):
        banner = "dashboard: http://127.0.0.1:%d/dashboard" % port
        deadline = time.monotonic() + 20
        while banner not in proxy.logs() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert banner in proxy.logs(), proxy.logs()
        b = Browser(tmp_path / "profile")
        stop = threading.Event()

        def reads():
            c = proxy.conn()
            n = 0
            while not stop.is_set() and n < 20000:
                c.search(PEOPLE, "(uid=alice)", attributes=["cn"])
                n += 1
            c.unbind()

        t = threading.Thread(target=reads, daemon=True)
        t.start()
        try:
            origin = "http://127.0.0.1:%d" % port
            b.open(origin + "/dashboard")
            resources = b.eval("performance.getEntriesByType('resource').map(e => e.name)")
            assert resources and all(r.startswith(origin + "/dashboard/") for r in resources), resources
            replica = ring.nodes[2].url
            wait_for(b, "pandoProxyDashboard.seconds.some(s => s.servers.some("
                        "x => x.url === %r && x.ops > 20))" % replica)
            assert b.eval("pandoProxyDashboard.charts.length") == 3
            first = b.eval("pandoProxyDashboard.charts[0].plot.data[0].slice(-1)[0]")
            time.sleep(2.2)
            assert b.eval("pandoProxyDashboard.charts[0].plot.data[0].slice(-1)[0]") >= first + 2
            os.kill(ring.nodes[0].proc.pid, signal.SIGSTOP)
            try:
                events = wait_for(b, "(() => { const t = document.querySelector('#events').innerText;"
                                     " return t.includes('writes moved to') && t; })()", timeout=20)
            finally:
                os.kill(ring.nodes[0].proc.pid, signal.SIGCONT)
            assert "%s: down" % ring.nodes[0].url in events, events
            assert "writes moved to %s" % ring.nodes[1].url in events, events
            wait_for(b, "document.querySelector('#events').innerText.includes('back in rotation')", timeout=20)
            if SHOTS:
                b.screenshot(os.path.join(SHOTS, "dashboard-proxy.png"))
        finally:
            stop.set()
            t.join(20)
            b.close()
