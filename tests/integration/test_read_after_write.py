"""A write's answer is visible to every read that follows it, on any
connection, while other reads and writes run at once.

The store hands an ended reader's snapshot to the next reader until the
next commit (`store/src/txn_pool.rs`); this drives that with real
clients: each worker changes its own entry on one connection and reads it
back on another, after the answer, while readers keep snapshots busy."""

import threading
import time

import ldap3

from conftest import DEMO_UIDS, PEOPLE

ROUNDS = 120
DEADLINE = 90.0


def test_every_read_after_a_write_sees_it(fresh_server):
    srv = fresh_server
    stop = threading.Event()
    failures = []
    done = []

    def writer(uid):
        dn = "uid=%s,%s" % (uid, PEOPLE)
        w, r = srv.conn(), srv.conn()
        try:
            end = time.monotonic() + DEADLINE
            for i in range(ROUNDS):
                if time.monotonic() > end or failures:
                    break
                value = "%s round %d" % (uid, i)
                assert w.modify(dn, {"description": [(ldap3.MODIFY_REPLACE, [value])]}), w.result
                r.search(dn, "(objectClass=*)", search_scope=ldap3.BASE, attributes=["description"])
                seen = [str(v) for e in r.entries for v in e.description.values]
                if seen != [value]:
                    failures.append((uid, i, value, seen))
                    break
            done.append(uid)
        except Exception as e:  # reported below, with the others
            failures.append((uid, repr(e)))
        finally:
            w.unbind()
            r.unbind()

    def reader():
        c = srv.conn()
        try:
            for _ in range(20000):
                if stop.is_set():
                    break
                c.search(PEOPLE, "(uid=%s)" % DEMO_UIDS[0], attributes=["cn"])
        finally:
            c.unbind()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(u,)) for u in DEMO_UIDS[:6]]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(DEADLINE + 30)
    stop.set()
    for t in readers:
        t.join(30)
    assert not failures, failures
    assert sorted(done) == sorted(DEMO_UIDS[:6])
