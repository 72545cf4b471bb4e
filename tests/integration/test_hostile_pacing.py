"""Refused work is paced (issue 37, the soak bound): a flood of requests
the server only refuses (here anonymous deletes with 30 KB DNs, answered
invalidDNSyntax, on fresh connections) is read no faster than the
address's budget of refused bytes, while a connection that is served
reads on at once. Before pacing, the same flood was read as fast as the
client could send it and took the server's time from ordinary clients."""

import threading
import time

import ber
from conftest import SUFFIX, Pando

DN = "cn=" + "x" * 30_000 + "," + SUFFIX
ROUNDS, CONNS, PER_CONN = 4, 20, 50  # 4 x 30 MB of refused requests
IP_RATE = 8 << 20  # bytes a second (net/refusals.rs)
IP_BURST = 4 * IP_RATE


def flood(port, out):
    codes = {}
    for _ in range(ROUNDS):
        conns = [ber.Conn("127.0.0.1", port, timeout=60) for _ in range(CONNS)]
        for c in conns:
            c.send(b"".join(ber.message(2 + i, ber.tlv(0x4A, DN.encode())) for i in range(PER_CONN)))
        for c in conns:
            for _ in range(PER_CONN):
                m = c.recv_msg(timeout=60)
                codes[m["code"]] = codes.get(m["code"], 0) + 1
            c.close()
    out["codes"] = codes


def test_a_flood_of_refused_requests_is_paced_and_served_clients_are_not(tmp_path):
    srv = Pando(tmp_path, demo=True, name="pacing").start()
    try:
        served = srv.raw(timeout=30)
        assert ber.simple_bind(served, srv.admin_dn, srv.admin_pw) == 0
        out = {}
        t0 = time.monotonic()
        attacker = threading.Thread(target=flood, args=(srv.port, out))
        attacker.start()
        # The served connection's searches while the flood runs.
        slowest, msgid = 0.0, 10
        while attacker.is_alive() and time.monotonic() - t0 < 60:
            msgid += 1
            t = time.monotonic()
            served.send(ber.message(msgid, ber.search_op(SUFFIX, scope=0)))
            while True:
                m = served.recv_msg(timeout=30)
                if m.get("code") is not None:
                    break
            assert m["code"] == 0, m
            slowest = max(slowest, time.monotonic() - t)
            time.sleep(0.05)
        attacker.join(120)
        took = time.monotonic() - t0
        sent = ROUNDS * CONNS * PER_CONN * len(DN)
        assert out["codes"] == {34: ROUNDS * CONNS * PER_CONN}, out
        # Read no faster than the budget allows (less a margin for timing).
        least = (sent - IP_BURST) / IP_RATE * 0.7
        assert took >= least, "%.1f MB of refused requests read in %.2f s (at least %.1f s expected)" % (
            sent / 1e6, took, least)
        assert slowest < 0.5, "a served connection waited %.2f s for a search" % slowest
        served.close()
    finally:
        srv.stop_and_verify()
