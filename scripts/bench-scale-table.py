#!/usr/bin/env python3
"""Tables of scripts/bench-scale's results: one per size (slapd, Pando,
Pando/slapd) and one of growth (the largest size measured over the
smallest, per server), as markdown.

    scripts/bench-scale-table.py BENCH_DIR SIZE...
"""

import sys
from pathlib import Path


def load(path):
    """{key: {field: value}} from RESULT lines ("RESULT key field=value ...")."""
    out = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != "RESULT":
            continue
        out[parts[1]] = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    return out


def num(r, key, field):
    try:
        return float(r[key][field])
    except (KeyError, ValueError):
        return None


MIB = 1 << 20
# (row label, key template ({s}: slapd or pando), field, unit divisor,
#  format, whether more is better)
ROWS = [
    ("import (entries/s)", "import-{s}", "entries_per_s", 1, "{:,.0f}", True),
    ("import time (s)", "import-{s}", "secs", 1, "{:,.1f}", False),
    ("import peak RSS (MiB)", "import-{s}", "peak_rss_bytes", MIB, "{:,.0f}", False),
    ("store on disk (MiB)", "import-{s}", "db_bytes", MIB, "{:,.0f}", False),
    ("start to first answer (s)", "start-{s}", "first_answer_secs", 1, "{:,.2f}", False),
    ("search-exact-1attr (ops/s)", "search-exact-1attr-{s}", "ops_per_s", 1, "{:,.0f}", True),
    ("search p99 (ms)", "search-exact-1attr-{s}", "p99_ms", 1, "{:.2f}", False),
    ("auth, defaults (ops/s)", "auth-{s}", "ops_per_s", 1, "{:,.0f}", True),
    ("auth p99 (ms)", "auth-{s}", "p99_ms", 1, "{:.2f}", False),
    ("modify, durable (ops/s)", "modify-{s}", "ops_per_s", 1, "{:,.0f}", True),
    ("modify p99 (ms)", "modify-{s}", "p99_ms", 1, "{:.2f}", False),
    ("add+delete, defaults (ops/s)", "add-delete-{s}", "ops_per_s", 1, "{:,.1f}", True),
    ("add+delete p99 (ms)", "add-delete-{s}", "p99_ms", 1, "{:.2f}", False),
    ("add+delete, both hash {SSHA} (ops/s)", "add-delete-{s}-ssha", "ops_per_s", 1, "{:,.1f}", True),
    ("add+delete, both hash {SSHA}, p99 (ms)", "add-delete-{s}-ssha", "p99_ms", 1, "{:.2f}", False),
    ("RSS after warm-up (MiB)", "rss-{s}", "rss_bytes", MIB, "{:,.0f}", False),
    ("verify (s)", "verify-{s}", "secs", 1, "{:,.1f}", False),
    ("backup (s)", "backup-{s}", "secs", 1, "{:,.1f}", False),
    ("refresh of an empty consumer (entries/s)", "refresh-{s}", "entries_per_s", 1, "{:,.0f}", True),
    ("refresh of an empty consumer (s)", "refresh-{s}", "secs", 1, "{:,.1f}", False),
]


def cell(v, fmt):
    return "—" if v is None else fmt.format(v)


def size_table(size, r):
    print(f"\n### {int(size):,} users\n")
    print("| measure | slapd | Pando | Pando/slapd |")
    print("|---|---|---|---|")
    for label, key, field, div, fmt, _ in ROWS:
        o = num(r, key.format(s="slapd"), field)
        p = num(r, key.format(s="pando"), field)
        o = o / div if o is not None else None
        p = p / div if p is not None else None
        ratio = f"{p / o:.2f}×" if o and p is not None else "—"
        print(f"| {label} | {cell(o, fmt)} | {cell(p, fmt)} | {ratio} |")
    a = num(r, "auth-pando-noupgrade", "ops_per_s")
    o = num(r, "auth-slapd", "ops_per_s")
    if a is not None:
        ratio = f"{a / o:.2f}×" if o else "—"
        p99 = num(r, "auth-pando-noupgrade", "p99_ms")
        print(f"| auth, `upgrade_on_bind = false` (ops/s; p99 {cell(p99, '{:.2f}')} ms) "
              f"| {cell(o, '{:,.0f}')} | {a:,.0f} | {ratio} |")
    modify_rounds(r)


def modify_rounds(r):
    """The alternating durable-modify runs: each run's rate, and the
    ratio of each pair (slapd's run then Pando's)."""
    rounds = []
    i = 1
    while f"modify-slapd-r{i}" in r or f"modify-pando-r{i}" in r:
        rounds.append((num(r, f"modify-slapd-r{i}", "ops_per_s"),
                       num(r, f"modify-pando-r{i}", "ops_per_s")))
        i += 1
    if not rounds:
        return
    o = " / ".join(cell(a, "{:,.0f}") for a, _ in rounds)
    p = " / ".join(cell(b, "{:,.0f}") for _, b in rounds)
    ratios = " / ".join(f"{b / a:.2f}×" if a and b is not None else "—" for a, b in rounds)
    print(f"| modify, durable, {len(rounds)} alternating runs (ops/s) | {o} | {p} | {ratios} |")


def growth_table(sizes, results):
    lo, hi = sizes[0], sizes[-1]
    print(f"\n### Growth: {int(hi):,} users over {int(lo):,}\n")
    print("| measure | slapd | Pando |")
    print("|---|---|---|")
    for label, key, field, _div, _fmt, _ in ROWS:
        row = []
        for s in ("slapd", "pando"):
            a = num(results[lo], key.format(s=s), field)
            b = num(results[hi], key.format(s=s), field)
            row.append(f"{b / a:.2f}×" if a and b is not None else "—")
        print(f"| {label} | {row[0]} | {row[1]} |")


def main():
    base = Path(sys.argv[1])
    sizes = sys.argv[2:]
    results = {s: load(base / s / "results.txt") for s in sizes}
    measured = [s for s in sizes if results[s]]
    for s in measured:
        size_table(s, results[s])
    if len(measured) > 1:
        growth_table(sorted(measured, key=int), results)


if __name__ == "__main__":
    main()
