#!/usr/bin/env python3
"""Durable write throughput of a three-server Pando multi-provider ring
against one server, on loopback.

    scripts/bench-multi-provider.py [--users 10000] [--secs 10] [--connections 16]

1. One server (no replication) holding USERS entries from `pando gen`:
   `pando bench --workload modify` (durable, replace description) for SECS.
2. Three providers (each a consumer of the two others, multi_provider on),
   the first imported with the same entries, the others loaded from it:
   the same modify load split over the three servers at once (the same
   total number of connections), then the time until all three hold the
   same contextCSN per server ID (the ring has caught up).

Prints RESULT lines (ops/s) and the ratio. All processes share this
machine's cores, so the ring's servers compete with each other and with
the load generators.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PANDO = os.environ.get("PANDO_BIN", str(REPO / "target" / "release" / "pando"))
SUFFIX = "dc=example,dc=com"
ADMIN = "cn=admin," + SUFFIX
PW = "bench-ring-secret"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("server on port %d did not start" % port)


def config(sid, peers):
    """A server's configuration; peers: [(sid, port)] (empty: no replication)."""
    h = subprocess.run([PANDO, "passwd"], input=PW, capture_output=True, text=True, check=True).stdout.strip()
    text = 'root_password_hash = "%s"\n' % h
    if peers:
        text += "\n[replication]\nserver_id = %d\nmulti_provider = true\n" % sid
        for psid, port in peers:
            text += ('\n[[replication.consumer]]\nrid = %d\nprovider = "ldap://127.0.0.1:%d"\n'
                     'search_base = "%s"\nbind_dn = "%s"\ncredentials = "%s"\nretry = "1 +"\n'
                     % (psid, port, SUFFIX, ADMIN, PW))
    return text


def start(base, port, cfg):
    base.mkdir(parents=True, exist_ok=True)
    (base / "pando.toml").write_text(cfg)
    log = open(base / "log", "ab")
    p = subprocess.Popen([PANDO, "serve", "--data-dir", str(base / "data"), "--config", str(base / "pando.toml"),
                          "--listen", "ldap://127.0.0.1:%d" % port], stdout=log, stderr=log)
    wait_port(port)
    return p


def stop(procs):
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def bench(port, users, secs, conns):
    return subprocess.Popen([PANDO, "bench", "-H", "ldap://127.0.0.1:%d" % port, "-D", ADMIN, "-w", PW,
                             "--workload", "modify", "--range", "0-%d" % (users - 1), "-c", str(conns),
                             "--duration", "%ds" % secs, "--warmup", "1s", "--seed", str(port), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def ops(proc):
    out, _ = proc.communicate(timeout=600)
    m = re.search(r"\"ops_per_s\"\s*:\s*([0-9.]+)", out)
    if not m:
        sys.exit("pando bench printed no rate:\n" + out[-2000:])
    return float(m.group(1))


def context_csn(port):
    r = subprocess.run(["ldapsearch", "-x", "-H", "ldap://127.0.0.1:%d" % port, "-D", ADMIN, "-w", PW,
                        "-b", SUFFIX, "-s", "base", "-LLL", "contextCSN"], capture_output=True, text=True)
    return sorted(l for l in r.stdout.splitlines() if l.startswith("contextCSN"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=10000)
    ap.add_argument("--secs", type=int, default=10)
    ap.add_argument("--connections", type=int, default=15)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-mp-"))
    try:
        ldif = work / "users.ldif"
        subprocess.run([PANDO, "gen", "-D", "numusers=%d" % a.users, "-o", str(ldif)], check=True)

        # 1. One server.
        port = free_port()
        one = work / "one"
        one.mkdir()
        (one / "pando.toml").write_text(config(1, []))
        subprocess.run([PANDO, "import", "--config", str(one / "pando.toml"), "--data-dir", str(one / "data"),
                        "-f", str(ldif)], check=True, capture_output=True)
        p = start(one, port, config(1, []))
        single = ops(bench(port, a.users, a.secs, a.connections))
        stop([p])
        print("RESULT one server: %.0f modify/s (%d connections)" % (single, a.connections))

        # 2. The ring.
        ports = [free_port() for _ in range(3)]
        bases = [work / ("ring%d" % i) for i in (1, 2, 3)]
        cfgs = [config(i + 1, [(j + 1, ports[j]) for j in range(3) if j != i]) for i in range(3)]
        bases[0].mkdir()
        (bases[0] / "pando.toml").write_text(cfgs[0])
        subprocess.run([PANDO, "import", "--config", str(bases[0] / "pando.toml"), "--data-dir",
                        str(bases[0] / "data"), "-f", str(ldif)], check=True, capture_output=True)
        procs = [start(bases[i], ports[i], cfgs[i]) for i in range(3)]
        deadline = time.monotonic() + 600
        while len({tuple(context_csn(p)) for p in ports}) != 1 or not context_csn(ports[0]):
            if time.monotonic() > deadline:
                sys.exit("the ring did not load within 10 minutes")
            time.sleep(0.5)
        per = max(1, a.connections // 3)
        loads = [bench(p, a.users, a.secs, per) for p in ports]
        rates = [ops(l) for l in loads]
        ended = time.monotonic()
        while len({tuple(context_csn(p)) for p in ports}) != 1:
            if time.monotonic() > ended + 600:
                sys.exit("the ring did not converge within 10 minutes")
            time.sleep(0.1)
        caught_up = time.monotonic() - ended
        stop(procs)
        total = sum(rates)
        print("RESULT ring of 3: %.0f modify/s (%s; %d connections each)"
              % (total, " + ".join("%.0f" % r for r in rates), per))
        print("RESULT ring caught up %.1f s after the load ended" % caught_up)
        print("RESULT ring / one server: %.2f" % (total / single))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
