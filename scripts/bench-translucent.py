#!/usr/bin/env python3
"""Searches through a translucent suffix: a remote slapd holding USERS users
(simple binds over StartTLS only), read through slapd 2.5's translucent
overlay (back-ldap) and through Pando's, each with a local description on
every tenth user; the remote searched directly for reference. Same load
generator (`pando bench`), alternating, ROUNDS rounds.

  scripts/bench-translucent.py [--users N] [--secs S] [--rounds R] [--conns C]

Needs the release binary (target/release/pando, or PANDO_BIN), slapd and
ldap-utils. Prints one RESULT line per run, then a summary.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from conftest import PANDO_BIN, PEOPLE, SUFFIX, Pando, ldif_entry  # noqa: E402
from test_translucent import READER, READER_PW, start_remote, translucent_config  # noqa: E402
from test_translucent_slapd import RemoteSlapd, TranslucentSlapd  # noqa: E402


class IndexedRemote(RemoteSlapd):
    """The remote with uid indexed, as a real directory would have it."""

    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        conf.write_text(conf.read_text().replace("index objectClass eq\n", "index objectClass eq\nindex uid eq\n"))


def users(n):
    yield SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["remote"]}
    yield READER, {"objectClass": ["person"], "cn": ["reader"], "sn": ["reader"], "userPassword": [READER_PW]}
    yield PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}
    for i in range(n):
        yield "uid=user.%d,%s" % (i, PEOPLE), {
            "objectClass": ["inetOrgPerson"], "uid": ["user.%d" % i], "cn": ["User %d" % i],
            "sn": ["U%d" % i], "mail": ["user.%d@example.com" % i], "description": ["remote"]}


def bench(url, dn, pw, label, a, workload_filter):
    auth = ["-D", dn, "-w", pw] if dn else []
    cmd = [PANDO_BIN, "bench", "-H", url, *auth, "--workload", "search",
           "-b", PEOPLE, "-f", workload_filter, "--range", "0-%d" % (a.users - 1),
           "--attrs", "uid,mail,description", "-c", str(a.conns), "--duration", "%ds" % a.secs,
           "--warmup", "2s", "--json", "--label", label]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.secs + 120)
    if r.returncode != 0:
        raise SystemExit("pando bench against %s failed: %s" % (label, r.stderr[-2000:]))
    return json.loads(r.stdout[r.stdout.index("{"):])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=int(os.environ.get("USERS", 10000)))
    p.add_argument("--secs", type=int, default=int(os.environ.get("SECS", 10)))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 2)))
    p.add_argument("--conns", type=int, default=int(os.environ.get("CONNS", 16)))
    a = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-translucent-"))
    pki, remote = start_remote(base, users(a.users), IndexedRemote)
    servers = []
    try:
        slapd = TranslucentSlapd(base / "slapd-translucent", remote.url, pki.ca)
        slapd.write_conf()
        slapd.start()
        servers.append(slapd)
        (base / "pando").mkdir()
        pando = Pando(base / "pando", config=translucent_config(remote.url, base / "pando", pki.ca),
                      name="pando-translucent").start()
        servers.append(pando)
        # A local description on every tenth user, on both.
        mods = "".join("dn: uid=user.%d,%s\nchangetype: modify\nreplace: description\n"
                       "description: local %d\n\n" % (i, PEOPLE, i) for i in range(0, a.users, 10))
        for srv in (slapd, pando):
            rc, _, err = srv.ldap("ldapmodify", input=mods, timeout=600)
            assert rc == 0, "%s: %s" % (srv, err[-2000:])
        # The remote takes simple binds over TLS only: read anonymously.
        targets = [("remote", remote.url, None, None),
                   ("slapd-translucent", slapd.url, slapd.admin_dn, slapd.admin_pw),
                   ("pando-translucent", pando.url, pando.admin_dn, pando.admin_pw)]
        results = {}
        for workload, filt in (("remote-attr", "(uid=user.%d)"),
                               ("local-attr", "(&(uid=user.%d)(description=local*))")):
            for r in range(a.rounds):
                for label, url, dn, pw in targets:
                    if workload == "local-attr" and label == "remote":
                        continue
                    out = bench(url, dn, pw, label, a, filt)
                    rate = out["ops_per_s"]
                    p99 = out["latency_ms"]["p99"]
                    print("RESULT workload=%s round=%d server=%s ops_per_sec=%s p99_ms=%s errors=%s"
                          % (workload, r + 1, label, rate, p99, out.get("errors")), flush=True)
                    results.setdefault((workload, label), []).append(rate)
        print("# summary (ops/s per round)")
        for (workload, label), rates in results.items():
            print("%-12s %-18s %s" % (workload, label, " / ".join("%.0f" % x for x in rates if x)))
    finally:
        for s in servers:
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                print("stopping %s: %s" % (s, e), file=sys.stderr)
        remote.stop()


if __name__ == "__main__":
    main()
