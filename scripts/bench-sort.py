#!/usr/bin/env python3
"""Time server-side sorts and virtual list view windows against one server
(scripts/bench step `sort`). Raw LDAP over a socket, so the client's own
cost is only reading bytes: every entry of a sorted search is counted, not
decoded.

  bench-sort.py --url ldap://127.0.0.1:PORT --dn DN --pw PW --base BASE --label NAME --runs N

Prints RESULT lines:
  workload=sort-all      a search of every user sorted by sn (attributes: 1.1),
                         each on a new connection: median seconds to the last byte
                         (first_s: the first run; later ones may reuse a sorted list
                         the server kept)
  workload=vlv-offset    a 20-entry window at offset 50% of the list (by offset),
                         each on a new connection: median seconds (first_s as above)
  workload=vlv-scroll    10 windows one after the other on one connection
                         (contextID passed back, as address books scroll): median
"""
import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
import ber  # noqa: E402

SORT = "1.2.840.113556.1.4.473"
VLV = "2.16.840.1.113730.3.4.9"
VLV_RESP = "2.16.840.1.113730.3.4.10"


def sort_value():
    return ber.seq(ber.seq(ber.octets("sn") + ber.octets("caseIgnoreOrderingMatch", tag=0x80)))


def vlv_value(before, after, offset, count, context=None):
    v = ber.integer(before) + ber.integer(after) + ber.seq(ber.integer(offset), ber.integer(count), tag=0xA0)
    if context is not None:
        v += ber.octets(context)
    return ber.seq(v)


def connect(a):
    host, port = a.url.split("//")[1].split(":")
    c = ber.Conn(host, int(port), timeout=600)
    assert ber.simple_bind(c, a.dn, a.pw) == 0, "bind failed"
    return c


def search(c, a, msgid, controls):
    """Send one search; (entries, done message)."""
    filt = ber.f_eq("objectClass", "inetOrgPerson")
    c.send(ber.message(msgid, ber.search_op(a.base, filt=filt, attrs=["1.1"]), controls))
    n = 0
    while True:
        m = c.recv_msg(timeout=600)
        if m["op"] == "entry":
            n += 1
        else:
            return n, m


def vlv_response(done):
    ctl = done.get("controls")
    if not ctl:
        return None
    for _, one in ber.children(ctl, 0, len(ctl)):
        parts = ber.children(one, 0, len(one))
        if parts[0][1].decode() == VLV_RESP:
            raw = parts[-1][1]
            _, s, e = ber.read_tlv(raw, 0)
            fields = ber.children(raw, s, e)
            pos, count = (int.from_bytes(f[1], "big") for f in fields[:2])
            context = fields[3][1] if len(fields) > 3 else None
            return pos, count, context
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--dn", required=True)
    p.add_argument("--pw", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    sort_ctl = ber.control(SORT, True, sort_value())

    times, counts = [], set()
    for _ in range(a.runs):
        t = time.monotonic()
        c = connect(a)
        n, done = search(c, a, 2, [sort_ctl])
        times.append(time.monotonic() - t)
        c.close()
        assert done["code"] == 0, done
        counts.add(n)
    total = max(counts)
    print("RESULT workload=sort-all server=%s entries=%d median_s=%.3f min_s=%.3f first_s=%.3f" %
          (a.label, total, statistics.median(times), min(times), times[0]))

    times = []
    for _ in range(a.runs):
        t = time.monotonic()
        c = connect(a)
        n, done = search(c, a, 2, [sort_ctl, ber.control(VLV, True, vlv_value(0, 19, total // 2, 0))])
        times.append(time.monotonic() - t)
        c.close()
        assert done["code"] == 0 and n == 20, (n, done)
        pos, count, _ = vlv_response(done)
        assert pos == total // 2 and count == total, (pos, count)
    print("RESULT workload=vlv-offset server=%s entries=%d offset=%d median_s=%.3f min_s=%.3f first_s=%.3f" %
          (a.label, total, total // 2, statistics.median(times), min(times), times[0]))

    c = connect(a)
    context, times = None, []
    for i in range(10):
        t = time.monotonic()
        n, done = search(c, a, 2 + i, [sort_ctl, ber.control(VLV, True, vlv_value(0, 19, total // 2 + 20 * i, 0, context))])
        times.append(time.monotonic() - t)
        assert done["code"] == 0 and n == 20, (n, done)
        context = vlv_response(done)[2]
    c.close()
    print("RESULT workload=vlv-scroll server=%s entries=%d windows=10 median_s=%.4f max_s=%.3f" %
          (a.label, total, statistics.median(times), max(times)))


if __name__ == "__main__":
    main()
