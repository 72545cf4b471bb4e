#!/usr/bin/env python3
"""Multi-provider replication, Pando beside slapd, on loopback:

    scripts/bench-multi-provider.py [--users 10000] [--secs 10] [--connections 15]
                                    [--partition-secs 60] [--system both|pando|slapd]

For each system (Pando; Debian's slapd with syncprov, `multiprovider on`):
1. One server (no replication) holding USERS entries from `pando gen`:
   durable `pando bench --workload modify` (replace description) for SECS.
2. Three providers, each a consumer of the two others through TCP proxies
   this script controls; the first loaded with the same entries, the others
   loading from it. The same modify load split over the three at once
   (the same total connections); then the time until all three hold the
   same contextCSN per server ID.
3. A partition: the third server cut off from the two others for
   PARTITION_SECS while a modify load runs on the first and on the third
   (different entries: the first and second half of the users); then the
   links are healed and the time until all three hold the same contextCSN
   is measured, and the three are compared entry by entry.

Prints RESULT lines. All processes share this machine's cores: the ring's
servers compete with each other and with the load generators.
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
sys.path.insert(0, str(REPO / "tests" / "integration"))
from links import Link  # noqa: E402

PANDO = os.environ.get("PANDO_BIN", str(REPO / "target" / "release" / "pando"))
SLAPD = "/usr/sbin/slapd"
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


class PandoNode:
    def __init__(self, base, sid, port, providers):
        """providers: [(rid, url)] of the others (empty: no replication)."""
        self.base, self.port = base, port
        base.mkdir(parents=True, exist_ok=True)
        h = subprocess.run([PANDO, "passwd"], input=PW, capture_output=True, text=True, check=True).stdout.strip()
        text = 'root_password_hash = "%s"\n' % h
        if providers:
            text += "\n[replication]\nserver_id = %d\nmulti_provider = true\n" % sid
            for rid, url in providers:
                text += ('\n[[replication.consumer]]\nrid = %d\nprovider = "%s"\nsearch_base = "%s"\n'
                         'bind_dn = "%s"\ncredentials = "%s"\nretry = "1 +"\ntimeout_secs = 5\n'
                         % (rid, url, SUFFIX, ADMIN, PW))
        (base / "pando.toml").write_text(text)

    def load(self, ldif):
        subprocess.run([PANDO, "import", "--config", str(self.base / "pando.toml"), "--data-dir",
                        str(self.base / "data"), "-f", str(ldif)], check=True, capture_output=True)

    def start(self):
        log = open(self.base / "log", "ab")
        self.proc = subprocess.Popen([PANDO, "serve", "--data-dir", str(self.base / "data"), "--config",
                                     str(self.base / "pando.toml"), "--listen", "ldap://127.0.0.1:%d" % self.port],
                                    stdout=log, stderr=log)
        wait_port(self.port)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


class SlapdNode:
    def __init__(self, base, sid, port, providers):
        self.base, self.port = base, port
        (base / "db").mkdir(parents=True, exist_ok=True)
        lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += ["modulepath /usr/lib/ldap", "moduleload back_mdb", "moduleload syncprov",
                  "pidfile %s/slapd.pid" % base, "argsfile %s/slapd.args" % base]
        if providers:
            lines.append("serverID %d" % sid)
        lines += ["database mdb", 'suffix "%s"' % SUFFIX, 'rootdn "%s"' % ADMIN, "rootpw %s" % PW,
                  "directory %s/db" % base, "maxsize 4294967296", "index objectClass eq",
                  "index entryUUID,entryCSN eq"]
        for rid, url in providers:
            lines.append('syncrepl rid=%03d provider=%s bindmethod=simple binddn="%s" credentials=%s '
                         'searchbase="%s" type=refreshAndPersist retry="1 +" timeout=5'
                         % (rid, url, ADMIN, PW, SUFFIX))
        if providers:
            lines += ["multiprovider on", "overlay syncprov", "syncprov-checkpoint 100 1",
                      "syncprov-sessionlog 200000"]
        (base / "slapd.conf").write_text("\n".join(lines) + "\n")

    def load(self, ldif):
        subprocess.run(["/usr/sbin/slapadd", "-q", "-w", "-f", str(self.base / "slapd.conf"), "-l", str(ldif)],
                       check=True, capture_output=True)

    def start(self):
        log = open(self.base / "log", "ab")
        self.proc = subprocess.Popen([SLAPD, "-f", str(self.base / "slapd.conf"), "-h",
                                      "ldap://127.0.0.1:%d/" % self.port, "-d", "0"], stdout=log, stderr=log)
        wait_port(self.port)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def bench(port, lo, hi, secs, conns):
    return subprocess.Popen([PANDO, "bench", "-H", "ldap://127.0.0.1:%d" % port, "-D", ADMIN, "-w", PW,
                             "--workload", "modify", "--range", "%d-%d" % (lo, hi), "-c", str(conns),
                             "--duration", "%ds" % secs, "--warmup", "1s", "--seed", str(port), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def ops(proc):
    out, _ = proc.communicate(timeout=900)
    m = re.search(r"\"ops_per_s\"\s*:\s*([0-9.]+)", out)
    if not m:
        sys.exit("pando bench printed no rate:\n" + out[-2000:])
    return float(m.group(1))


def context_csn(port):
    r = subprocess.run(["ldapsearch", "-x", "-H", "ldap://127.0.0.1:%d" % port, "-D", ADMIN, "-w", PW,
                        "-b", SUFFIX, "-s", "base", "-LLL", "contextCSN"], capture_output=True, text=True)
    return sorted(line for line in r.stdout.splitlines() if line.startswith("contextCSN"))


def digest(port):
    """Every entry's DN, description and entryCSN, sorted (a comparison)."""
    r = subprocess.run(["ldapsearch", "-x", "-H", "ldap://127.0.0.1:%d" % port, "-D", ADMIN, "-w", PW,
                        "-b", SUFFIX, "-LLL", "-o", "ldif-wrap=no", "description", "entryCSN"],
                       capture_output=True, text=True, timeout=300)
    return sorted(r.stdout.split("\n\n"))


def in_step(ports, timeout, what):
    start = time.monotonic()
    while True:
        csns = [tuple(context_csn(p)) for p in ports]
        if len(set(csns)) == 1 and csns[0]:
            return time.monotonic() - start
        if time.monotonic() > start + timeout:
            sys.exit("%s: not in step after %d s: %r" % (what, timeout, csns))
        time.sleep(0.1)


def run(kind, Node, ldif, a, work):
    # 1. One server.
    base = work / kind / "one"
    one = Node(base, 1, free_port(), [])
    one.load(ldif)
    one.start()
    single = ops(bench(one.port, 0, a.users - 1, a.secs, a.connections))
    one.stop()
    print("RESULT %s one server: %.0f modify/s (%d connections)" % (kind, single, a.connections), flush=True)

    # 2. The ring, every link through a proxy.
    ports = [free_port() for _ in range(3)]
    links = {(i, j): Link(ports[j]) for i in range(3) for j in range(3) if i != j}
    nodes = [Node(work / kind / ("ring%d" % (i + 1)), i + 1, ports[i],
                  [(j + 1, links[(i, j)].url) for j in range(3) if j != i]) for i in range(3)]
    nodes[0].load(ldif)
    for n in nodes:
        n.start()
    try:
        loaded = in_step(ports, 900, kind + " ring load")
        print("RESULT %s ring loaded in %.1f s" % (kind, loaded), flush=True)
        per = max(1, a.connections // 3)
        loads = [bench(p, 0, a.users - 1, a.secs, per) for p in ports]
        rates = [ops(x) for x in loads]
        caught_up = in_step(ports, 900, kind + " ring load")
        total = sum(rates)
        print("RESULT %s ring of 3: %.0f modify/s (%s; %d connections each); caught up %.1f s after"
              % (kind, total, " + ".join("%.0f" % r for r in rates), per, caught_up), flush=True)
        print("RESULT %s ring / one server: %.2f" % (kind, total / single), flush=True)

        # 3. The partition: the third server alone, writes on both sides.
        for (i, j), link in links.items():
            if 2 in (i, j):
                link.cut()
        half = a.users // 2
        side_a = bench(ports[0], 0, half - 1, a.partition_secs, 2)
        side_b = bench(ports[2], half, a.users - 1, a.partition_secs, 2)
        made = ops(side_a) * a.partition_secs, ops(side_b) * a.partition_secs
        for link in links.values():
            link.heal()
        healed = in_step(ports, 1800, kind + " after the partition")
        same = len({tuple(digest(p)) for p in ports}) == 1
        print("RESULT %s partition of %d s (about %d + %d modifies on the two sides): in step %.1f s after "
              "healing; entries %s" % (kind, a.partition_secs, made[0], made[1], healed,
                                       "identical" if same else "DIFFERENT"), flush=True)
    finally:
        for n in nodes:
            n.stop()
        for link in links.values():
            link.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=10000)
    ap.add_argument("--secs", type=int, default=10)
    ap.add_argument("--connections", type=int, default=15)
    ap.add_argument("--partition-secs", type=int, default=60)
    ap.add_argument("--system", choices=["both", "pando", "slapd"], default="both")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-mp-"))
    try:
        ldif = work / "users.ldif"
        subprocess.run([PANDO, "gen", "-D", "numusers=%d" % a.users, "-o", str(ldif)], check=True)
        if a.system in ("both", "pando"):
            run("pando", PandoNode, ldif, a, work)
        if a.system in ("both", "slapd"):
            if not Path(SLAPD).exists():
                sys.exit("slapd is not installed")
            run("slapd", SlapdNode, ldif, a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
