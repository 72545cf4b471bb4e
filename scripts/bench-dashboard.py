#!/usr/bin/env python3
"""What the live dashboard costs the server: the search workload (`pando
bench`, 16 connections, 100k users) with the dashboard off, on with nobody
looking, on with a client polling its data every second as the page does,
and on with the page open in a headless chromium on this same machine;
alternating, ROUNDS rounds, one server (the dashboard switched over
cn=config between runs).

    scripts/bench-dashboard.py [--users 100000] [--secs 10] [--rounds 2]

Prints RESULT lines and a table of throughput against the "off" runs.
Work files go to $BENCH_DIR (default /tmp/pando-bench-dashboard).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
PANDO = os.environ.get("PANDO_BIN", str(REPO / "target" / "release" / "pando"))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=100000)
    ap.add_argument("--secs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    d = Path(os.environ.get("BENCH_DIR", "/tmp/pando-bench-dashboard"))
    d.mkdir(parents=True, exist_ok=True)
    ldif = d / ("users-%d.ldif" % a.users)
    if not ldif.exists():
        subprocess.run([PANDO, "gen", "-D", "numusers=%d" % a.users, "--seed", "0", "-o", str(ldif)], check=True)
    data = d / "p"
    shutil.rmtree(data, ignore_errors=True)
    subprocess.run([PANDO, "import", "--data-dir", str(data), "-f", str(ldif)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mport, lport = free_port(), free_port()
    conf = d / "pando.toml"
    conf.write_text('[metrics]\nlisten = "127.0.0.1:%d"\ndashboard = false\n'
                    '[passwords]\nupgrade_on_bind = false\n' % mport)
    srv = subprocess.Popen([PANDO, "serve", "-c", str(conf), "--data-dir", str(data),
                            "--listen", "ldap://127.0.0.1:%d" % lport, "--listen", "ldapi://"],
                           stdout=open(d / "serve.out", "w"), stderr=subprocess.STDOUT)
    browser = None
    try:
        deadline = time.time() + 60
        while b"is serving:" not in (d / "serve.out").read_bytes():
            if time.time() > deadline or srv.poll() is not None:
                sys.exit("the server did not start: see %s" % (d / "serve.out"))
            time.sleep(0.1)
        ldapi = "ldapi://" + urllib.parse.quote(str(data / "ldapi"), safe="")

        def dashboard(on):
            ldif_text = ("dn: cn=config\nchangetype: modify\nreplace: pandoMetricsDashboard\n"
                         "pandoMetricsDashboard: %s\n" % ("TRUE" if on else "FALSE"))
            subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", ldapi], input=ldif_text,
                           text=True, check=True, stdout=subprocess.DEVNULL)

        from browser import Browser
        browser = Browser(tempfile.mkdtemp(prefix="pando-bench-chromium-"))
        origin = "http://127.0.0.1:%d" % mport
        results = {}
        for r in range(a.rounds):
            for mode in ("off", "on", "poll", "page"):
                dashboard(mode != "off")
                stop = threading.Event()
                poller = None
                if mode == "poll":
                    def poll():
                        since = 0
                        while not stop.is_set():
                            body = urllib.request.urlopen(origin + "/dashboard/data?since=%d" % since).read()
                            m = re.findall(rb'"t":\s*(\d+)', body)
                            since = int(m[-1]) if m else since
                            stop.wait(1)
                    poller = threading.Thread(target=poll, daemon=True)
                    poller.start()
                if mode == "page":
                    browser.open(origin + "/dashboard")
                time.sleep(2)
                out = subprocess.run(
                    [PANDO, "bench", "-H", "ldap://127.0.0.1:%d" % lport, "--workload", "search",
                     "-D", "cn=admin,dc=example,dc=com", "-y", str(data / "admin-password"),
                     "-f", "(uid=user.%d)", "--attrs", "cn", "--range", "0-%d" % (a.users - 1),
                     "-c", "16", "--duration", "%ds" % a.secs, "--warmup", "2s"],
                    capture_output=True, text=True).stdout
                line = [l for l in out.splitlines() if l.startswith("RESULT")]
                ops = float(re.search(r"ops_per_s=([\d.]+)", line[-1]).group(1)) if line else 0.0
                if mode == "page":
                    polls = browser.eval("pandoDashboard.polls")
                    browser.open("about:blank")
                    line = [line[-1] + " page_polls=%s" % polls] if line else line
                stop.set()
                if poller:
                    poller.join(5)
                print("RESULT mode=%s round=%d %s" % (mode, r + 1, line[-1] if line else "no result"), flush=True)
                results.setdefault(mode, []).append(ops)
        # Without load: the server's own CPU in each mode, and the browser's.
        def cpu_secs(pids):
            total = 0
            for pid in pids:
                try:
                    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
                    total += int(f[11]) + int(f[12])
                except (OSError, IndexError):
                    pass
            return total / os.sysconf("SC_CLK_TCK")

        def tree(pid):
            out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            kids = [int(k) for k in out]
            return [pid] + [p for k in kids for p in tree(k)]

        idle = a.secs * 2
        for mode in ("off", "page"):
            dashboard(mode != "off")
            if mode == "page":
                browser.open(origin + "/dashboard")
            time.sleep(2)
            b_pids = tree(browser.proc.pid)
            s0, b0, t0 = cpu_secs([srv.pid]), cpu_secs(b_pids), time.time()
            time.sleep(idle)
            s1, b1, t1 = cpu_secs([srv.pid]), cpu_secs(tree(browser.proc.pid)), time.time()
            print("RESULT idle mode=%s secs=%.1f server_cpu_ms_per_s=%.2f browser_cpu_pct=%.1f"
                  % (mode, t1 - t0, (s1 - s0) * 1000 / (t1 - t0), (b1 - b0) * 100 / (t1 - t0)), flush=True)
            browser.open("about:blank")
        base = sum(results["off"]) / len(results["off"])
        print("\n| dashboard | searches/s (runs) | against off |")
        print("|---|---|---|")
        for mode in ("off", "on", "poll", "page"):
            runs = results[mode]
            mean = sum(runs) / len(runs)
            print("| %s | %s | %+.1f%% |" % (mode, " / ".join("%.0f" % x for x in runs), (mean / base - 1) * 100))
    finally:
        if browser:
            browser.close()
        srv.terminate()
        srv.wait(30)


if __name__ == "__main__":
    main()
