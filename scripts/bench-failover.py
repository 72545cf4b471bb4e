#!/usr/bin/env python3
"""What a front end does when the active provider is killed:

    scripts/bench-failover.py [--writers 4] [--secs 8] [--kill-at 3] [--rounds 2]

Two Pando providers replicating each other (multi-provider, as in
tests/integration/test_multi_provider.py), and in front of them either
`pando proxy` (both as providers, in order), HAProxy 2.6 from Debian
(`mode tcp`, the second server `backup`, `option ldap-check`, checks every
500 ms, `option redispatch`), or Debian's slapd with back-ldap and both
URIs (`uri "ldap://a/ ldap://b/"`, `network-timeout 1`: it tries them in
order). WRITERS clients add entries through the
front end for SECS seconds; the first provider is killed (SIGKILL) at
KILL_AT. A client whose connection drops reconnects at once (each drop is
counted). Per front end: writes acknowledged, writes answered with an
error (by result code), connections lost, the time from the kill to the
first write acknowledged after it, and whether every acknowledged write
is on the survivor once the killed provider is back and the two agree.

Prints RESULT lines. Traffic stays on 127.0.0.1; every wait is bounded.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from conftest import ADMIN_DN, PANDO_BIN, PEOPLE, free_port, wait_port  # noqa: E402
from test_multi_provider import PW, Ring, converge  # noqa: E402

import ldap3  # noqa: E402


def start_front(kind, ring, base):
    port = free_port()
    if kind == "pando-proxy":
        cfg = base / "proxy.toml"
        (base / "pw").write_text(PW)
        ups = "".join('[[proxy.upstream]]\nurl = "%s"\nrole = "provider"\n' % n.url for n in ring.nodes)
        cfg.write_text('log_level = "warn"\n[proxy]\nlisten = ["ldap://127.0.0.1:%d"]\nhealth_secs = 1\n'
                       'timeout_secs = 1\nbind_dn = "%s"\ncredentials_file = "%s"\n%s'
                       % (port, ADMIN_DN, base / "pw", ups))
        proc = subprocess.Popen([PANDO_BIN, "proxy", "-c", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    elif kind == "back-ldap":
        a, b = (n.port for n in ring.nodes)
        cfg = base / "back-ldap.conf"
        cfg.write_text(back_ldap_conf(base, "ldap://127.0.0.1:%d/ ldap://127.0.0.1:%d/" % (a, b)))
        proc = subprocess.Popen([SLAPD, "-f", str(cfg), "-h", "ldap://127.0.0.1:%d/" % port, "-d", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        a, b = (n.port for n in ring.nodes)
        cfg = base / "haproxy.cfg"
        cfg.write_text("""global
  maxconn 4000
defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
listen ldap
  bind 127.0.0.1:%d
  option ldap-check
  server a 127.0.0.1:%d check inter 500 fall 2 rise 2
  server b 127.0.0.1:%d check inter 500 fall 2 rise 2 backup
""" % (port, a, b))
        proc = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_port(port, proc, 20):
        raise SystemExit("%s did not start" % kind)
    time.sleep(1.5)  # its first health checks
    return proc, port


SLAPD = "/usr/sbin/slapd"


def back_ldap_conf(base, uris):
    """slapd relaying dc=example,dc=com to `uris` (back-ldap tries them in
    order); clients' binds are passed on."""
    lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
    lines += ["modulepath /usr/lib/ldap", "moduleload back_ldap", "pidfile %s/slapd.pid" % base,
              "argsfile %s/slapd.args" % base, "database ldap", 'suffix "dc=example,dc=com"',
              'uri "%s"' % uris, "network-timeout 1", "rebind-as-user yes", "single-conn yes"]
    return "\n".join(lines) + "\n"


def connect(port):
    server = ldap3.Server("127.0.0.1", port=port, get_info=ldap3.NONE, connect_timeout=2)
    c = ldap3.Connection(server, user=ADMIN_DN, password=PW, raise_exceptions=False, receive_timeout=5)
    return c if c.bind() else None


def writer(k, port, stop, out):
    c, i = None, 0
    while not stop.is_set() and i < 100_000:
        if c is None:
            c = connect(port)
            if c is None:
                out["connect_failed"] += 1
                time.sleep(0.01)
                continue
        i += 1
        dn = "uid=f%d-%d,%s" % (k, i, PEOPLE)
        try:
            ok = c.add(dn, ["account"], {"uid": "f%d-%d" % (k, i)})
        except Exception:
            out["lost"].append(time.monotonic())
            c = None
            continue
        if ok:
            out["acked"].append((time.monotonic(), dn))
        else:
            out["errors"][c.result["result"]] += 1


def run(kind, args, base):
    ring = Ring(base, n=2).start()
    proc = None
    try:
        converge(ring)
        proc, port = start_front(kind, ring, base)
        stop = threading.Event()
        outs = [{"acked": [], "errors": Counter(), "lost": [], "connect_failed": 0} for _ in range(args.writers)]
        threads = [threading.Thread(target=writer, args=(k, port, stop, outs[k])) for k in range(args.writers)]
        for t in threads:
            t.start()
        time.sleep(args.kill_at)
        killed = time.monotonic()
        ring.nodes[0].proc.send_signal(signal.SIGKILL)
        ring.nodes[0].proc.wait()
        time.sleep(args.secs - args.kill_at)
        stop.set()
        for t in threads:
            t.join(30)
        acked = [a for o in outs for a in o["acked"]]
        errors = sum((o["errors"] for o in outs), Counter())
        lost = sum(len(o["lost"]) for o in outs)
        refused = sum(o["connect_failed"] for o in outs)
        after = [t for t, _ in acked if t > killed]
        resumed = (min(after) - killed) if after else float("inf")
        # The killed provider back: every acknowledged write on both.
        ring.nodes[0].start(keep_port=True)
        ring.nodes[0].admin_pw = PW
        converge(ring, timeout=120)
        rc, es, err = ring.nodes[1].search(PEOPLE, "(uid=f*)", "1.1", scope="one")
        held = {d.lower() for d, _ in es}
        missing = sum(1 for _, dn in acked if dn.lower() not in held)
        print("RESULT front=%s writers=%d acked=%d errors=%s connections_lost=%d reconnects_refused=%d "
              "resumed_secs=%.3f missing_after_restart=%d"
              % (kind, args.writers, len(acked), dict(errors) or "{}", lost, refused, resumed, missing),
              flush=True)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        ring.stop(verify=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--secs", type=float, default=8)
    ap.add_argument("--kill-at", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    fronts = ["pando-proxy"] + (["haproxy"] if shutil.which("haproxy") else [])
    if "haproxy" not in fronts:
        print("haproxy not installed (apt-get install haproxy): its rows are skipped", file=sys.stderr)
    if os.path.exists("/usr/lib/ldap/back_ldap.so"):
        fronts.append("back-ldap")
    else:
        print("slapd's back_ldap module not installed: its rows are skipped", file=sys.stderr)
    for _ in range(args.rounds):
        for kind in fronts:
            with tempfile.TemporaryDirectory(prefix="pando-failover-") as d:
                run(kind, args, Path(d))


if __name__ == "__main__":
    main()
