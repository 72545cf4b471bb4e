"""Hostile clients: each attack an unauthenticated (or merely slow) client
can mount, reproduced against the real binary, with the bound it must hit.

Each test states the attack and what it cost before the defence (from the
issue that reported it), and asserts the bound now.
"""

import socket
import struct
import threading
import time
import urllib.request

import pytest

import ber
from conftest import PEOPLE, SUFFIX, Pando, free_port, person_attrs

PW_OID = "1.3.6.1.4.1.4203.1.11.1"


def rss_kib(proc):
    with open("/proc/%d/status" % proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def metrics(srv):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % srv.metrics_port, timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def modify_op(dn, changes):
    """changes: list of (op, attr, values); op 0 add, 1 delete, 2 replace."""
    items = [ber.seq(ber.enum(op), ber.seq(ber.octets(a), ber.set_(*[ber.octets(v) for v in vals])))
             for op, a, vals in changes]
    return ber.tlv(0x66, ber.octets(dn) + ber.seq(*items))


def reset_close(sock):
    """Close with RST (SO_LINGER 0): no TIME_WAIT left on the client, so
    tens of thousands of cycles do not run out of ephemeral ports."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


HOSTILE_CONFIG = """
[passwords]
max_concurrent_hashes = 2

[limits]
size_limit = 5
write_timeout = 2
min_write_rate = 4096
max_search_threads = 4

[limits.anonymous]
idle_timeout = 2
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    s = Pando(base, demo=True, name="hostile")
    s.metrics_port = free_port()
    s.config = HOSTILE_CONFIG + '\n[metrics]\nlisten = "127.0.0.1:%d"\n' % s.metrics_port
    s.start()
    yield s
    s.stop_and_verify()


PAGED_OID = "1.2.840.113556.1.4.319"


def paged_search(c, msgid, base, size, cookie=b""):
    ctl = ber.control(PAGED_OID, True, ber.seq(ber.integer(size), ber.octets(cookie)))
    c.send(ber.message(msgid, ber.search_op(base, filt=ber.f_eq("objectClass", "person"), attrs=("1.1",)),
                       controls=[ctl]))
    entries = []
    while True:
        m = c.recv_msg()
        if m["op"] == "entry":
            entries.append(m["dn"])
        else:
            return entries, m


def paged_cookie(done):
    """The cookie of a SearchResultDone's paged results control."""
    ctls = done["controls"]
    _, s, e = ber.read_tlv(ctls, 0)  # Control
    parts = ber.children(ctls, s, e)
    value = parts[-1][1]
    _, s, e = ber.read_tlv(value, 0)
    return ber.children(value, s, e)[1][1]


def test_paging_counts_toward_the_size_limit(srv):
    """Before: the non-admin size limit applied to each page, so paging read
    the whole tree past it."""
    dn = "uid=carol," + PEOPLE
    rc, _, err = srv.ldap("ldappasswd", "-s", "carol-pw", dn)
    assert rc == 0, err
    got = []
    with srv.raw() as c:
        assert ber.simple_bind(c, dn, "carol-pw") == 0
        cookie, done = b"", None
        for i in range(20):
            page, done = paged_search(c, 2 + i, PEOPLE, 2, cookie)
            got += page
            if done["code"] != 0:
                break
            cookie = paged_cookie(done)
            if not cookie:
                break
        assert done["code"] == 4, done  # sizeLimitExceeded
        assert len(got) == 5, got  # limits.size_limit = 5, over all pages
        # A cookie the server did not make is refused, not trusted.
        forged = b"\x00" * 8 + b"\x00" * 8 + b"\x00" * 8 + b"\x00" * 16
        _, done = paged_search(c, 40, PEOPLE, 2, forged)
        assert done["code"] == 2 and "cookie" in done["diag"], done
    # Administrators keep paging through everything.
    rc, entries, err = srv.search(PEOPLE, "(objectClass=person)", "1.1", "-E", "pr=2/noprompt")
    assert rc == 0 and len(entries) >= 10, (rc, len(entries), err)


def test_anonymous_connections_have_smaller_limits(srv):
    """Before binding: messages above limits.anonymous.max_pdu_bytes (64 KiB)
    end the connection, and an idle anonymous connection is closed after
    limits.anonymous.idle_timeout."""
    big = ber.message(1, ber.search_op("", scope=0, filt=ber.f_eq("description", "x" * 100000)))
    with srv.raw() as c:
        try:
            c.send(big)
        except (BrokenPipeError, ConnectionResetError):
            pass
        msgs, eof = c.drain(timeout=5)
        assert eof and msgs and msgs[-1].get("name") == ber.NOTICE_OF_DISCONNECTION, msgs
    with srv.raw() as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(big)
        m = c.recv_msg()
        assert m["op"] == "searchDone", m  # a bound client may send it
        time.sleep(3)  # past the anonymous idle timeout: a bound one stays
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw, msgid=3) == 0
    with srv.raw() as c:
        t0 = time.monotonic()
        msgs, eof = c.drain(timeout=10)
        assert eof and time.monotonic() - t0 < 5, msgs
        assert msgs and "idle" in msgs[-1]["diag"], msgs


def test_connection_cycles_give_memory_back(srv):
    """Before: every connection ever accepted stayed in a task set until
    shutdown; 20,000 connect-and-close cycles took RSS from 54 to 373 MB."""
    def cycles(n):
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            reset_close(s)

    cycles(2000)  # allocator and runtime warm-up
    time.sleep(0.5)
    before = rss_kib(srv.proc)
    readings = []
    for _ in range(4):
        cycles(12500)
        time.sleep(0.5)
        readings.append(rss_kib(srv.proc))
    # The allocator's arenas make one reading swing by several MB either
    # way (seen: +13 MB after 100,000 cycles, +5 MB after 150,000); a leak
    # only grows. The lower of the last two readings against the start
    # catches 250 bytes kept per connection; the defect kept 16 KB.
    grew = min(readings[-2:]) - before
    assert grew < 12 * 1024, "RSS grew from %d KiB to %s over 50,000 connections" % (before, readings)
    assert metrics(srv)["pando_connections_current"] <= 1


def hashes(srv):
    return metrics(srv)["pando_password_hashes_total"]


def test_anonymous_add_with_many_passwords_is_refused_without_hashing(srv):
    """Before: an anonymous add carrying 200 userPassword values took 3.6 s
    of server CPU (each value argon2-hashed) to be told strongerAuthRequired."""
    before = hashes(srv)
    values = ["guess%05d" % i for i in range(50000)]
    attrs = person_attrs("mallory")
    attrs["userPassword"] = values
    big_add = ber.message(1, ber.add_op("uid=mallory," + PEOPLE, attrs))
    # Anonymous: 50,000 values make a ~600 KB message, over the anonymous
    # message size limit; the connection ends at its header.
    with srv.raw(timeout=30) as c:
        t0 = time.monotonic()
        try:
            c.send(big_add)
        except (BrokenPipeError, ConnectionResetError):
            pass
        msgs, eof = c.drain(timeout=10)
        took = time.monotonic() - t0
        assert eof and msgs and msgs[-1].get("name") == ber.NOTICE_OF_DISCONNECTION, msgs
    assert took < 0.5, "refusing took %.2f s" % took
    # Within the message size limit, anonymous is refused by access control,
    # still before any hash.
    with srv.raw(timeout=30) as c:
        attrs["userPassword"] = values[:2]
        c.send(ber.message(2, ber.add_op("uid=mallory," + PEOPLE, attrs)))
        m = c.recv_msg(timeout=30)
        assert m["op"] == "add" and m["code"] == 8, m  # strongerAuthRequired
    assert hashes(srv) == before
    # Bound, the 50,000 values are refused by count, before any hash.
    with srv.raw(timeout=30) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        before = hashes(srv)
        t0 = time.monotonic()
        c.send(big_add)
        m = c.recv_msg(timeout=30)
        took = time.monotonic() - t0
        assert m["op"] == "add" and m["code"] == 19, m  # constraintViolation
        assert "at most" in m["diag"], m
    assert took < 0.5, "refusing took %.2f s" % took
    assert hashes(srv) == before


def test_anonymous_modify_with_passwords_is_refused_without_hashing(srv):
    before = hashes(srv)
    dn = "uid=alice," + PEOPLE
    many = [(0, "userPassword", ["x%d" % i]) for i in range(1000)]
    with srv.raw(timeout=30) as c:
        c.send(ber.message(1, modify_op(dn, many)))
        m = c.recv_msg(timeout=30)
        assert m["op"] == "modify" and m["code"] == 19, m
        c.send(ber.message(2, modify_op(dn, [(2, "userPassword", ["one"])])))
        m = c.recv_msg(timeout=30)
        assert m["code"] == 8, m
    assert hashes(srv) == before


def test_password_named_by_oid_is_hashed_and_bounded(srv):
    """userPassword named by its OID (2.5.4.35) or with an option is still
    a password: counted against the bound and hashed, never stored clear."""
    dn = "uid=oidpw," + PEOPLE
    attrs = person_attrs("oidpw")
    attrs["2.5.4.35"] = ["p%d" % i for i in range(10)]
    with srv.raw() as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(ber.message(2, ber.add_op(dn, attrs)))
        m = c.recv_msg()
        assert m["code"] == 19, m
        attrs["2.5.4.35"] = ["only-one"]
        c.send(ber.message(3, ber.add_op(dn, attrs)))
        assert c.recv_msg()["code"] == 0
        c.send(ber.message(4, ber.search_op(dn, scope=0, attrs=("userPassword",))))
        e = c.recv_msg()
        assert e["op"] == "entry", e
        (value,) = e["attrs"]["userPassword"]
        assert value.startswith(b"{ARGON2}"), value
        assert c.recv_msg()["code"] == 0
    with srv.raw() as c:
        assert ber.simple_bind(c, dn, "only-one") == 0


def test_values_per_operation_are_bounded(srv):
    """limits.max_values_per_operation (10,000) for everyone but
    administrators, checked before access, schema or indexing."""
    dn = "uid=erin," + PEOPLE
    rc, _, err = srv.ldap("ldappasswd", "-s", "erin-pw", dn)
    assert rc == 0, err
    with srv.raw(timeout=30) as c:
        assert ber.simple_bind(c, dn, "erin-pw") == 0
        t0 = time.monotonic()
        c.send(ber.message(2, modify_op(dn, [(0, "description", ["v%d" % i for i in range(10001)])])))
        m = c.recv_msg(timeout=30)
        assert m["code"] == 11 and "at most 10000" in m["diag"], m  # adminLimitExceeded
        assert time.monotonic() - t0 < 0.5


def test_users_cannot_store_costly_prehashed_passwords(srv):
    """A user may not store a value under a key-stretching scheme with
    parameters of their choosing: each bind against it would cost what they
    say (up to a minute and a gigabyte), tying up the hashing queue."""
    dn = "uid=dave," + PEOPLE
    rc, _, err = srv.ldap("ldappasswd", "-s", "dave-pw", dn)
    assert rc == 0, err
    costly = "{ARGON2}$argon2id$v=19$m=1048576,t=64,p=16$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g"
    with srv.raw() as c:
        assert ber.simple_bind(c, dn, "dave-pw") == 0
        c.send(ber.message(2, modify_op(dn, [(2, "userPassword", [costly])])))
        m = c.recv_msg()
        assert m["code"] == 19 and "administrators" in m["diag"], m
    # The administrator may (imports and migrations carry such hashes).
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: userPassword\n"
                          "userPassword: %s\n" % (dn, costly))
    assert rc == 0, err


def test_bind_to_a_missing_dn_costs_a_hash(srv):
    """Before: a bind naming a missing DN skipped the hash and answered
    faster than a wrong password: an oracle for which DNs exist."""
    before = hashes(srv)
    with srv.raw() as c:
        assert ber.simple_bind(c, "uid=nobody," + PEOPLE, "x") == 49
        assert ber.simple_bind(c, "uid=alice," + PEOPLE, "x", msgid=2) == 49  # no password set
    assert hashes(srv) == before + 2


def test_concurrent_wrong_binds_do_not_exceed_the_hash_bound(srv):
    """Before: no global bound on argon2 verifications; a crowd of wrong
    binds started one per blocking thread."""
    dn = "uid=bob," + PEOPLE
    rc, out, err = srv.ldap("ldappasswd", "-s", "right-one", dn)
    assert rc == 0, err
    codes = []

    def guess(i):
        with srv.raw(timeout=60) as c:
            codes.append(ber.simple_bind(c, dn if i % 2 else "uid=u%d,%s" % (i, PEOPLE), "wrong%d" % i))

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [49] * 16
    m = metrics(srv)
    assert m["pando_password_hashes_peak"] <= 2, m["pando_password_hashes_peak"]
    assert m["pando_password_hashes_running"] == 0


def test_pipelined_subschema_requests_do_not_grow_memory(srv):
    """Before: every request already received was answered before the output
    high-water mark was looked at, and the subschema entry (tens of KB) was
    rebuilt per request: a few KB of pipelined requests queued many MB."""
    req = ber.message(1, ber.search_op("cn=Subschema", scope=0, attrs=("*", "+")))
    burst = req * 2000  # ~70 KB of requests, ~100 MB of answers if all were queued
    with srv.raw(timeout=10, rcvbuf=4096) as c:
        c.send(ber.message(1, ber.search_op("cn=Subschema", scope=0, attrs=("*", "+"))))
        one = c.recv_msg()
        assert one["op"] == "entry"
        c.recv_msg()
        before = rss_kib(srv.proc)
        hogs = []
        for _ in range(4):
            h = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            h.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            h.sendall(burst)
            hogs.append(h)
        time.sleep(1.5)
        grown = rss_kib(srv.proc) - before
        # Others are still served meanwhile.
        rc, _, err = srv.ldap("ldapwhoami")
        assert rc == 0, err
        for h in hogs:
            reset_close(h)
    # Unbounded, this grows by ~100 MB. Bounded, each connection holds its
    # output high-water mark (256 KB) plus the answer that crossed it: the
    # subschema entry is ~160 KB since the password policy and access log
    # schema are built in, and the allocator keeps some of what passes
    # through (17.5 MB measured then; 16 MB was the bound before).
    assert grown < 32 * 1024, "RSS grew by %d KiB for 4 connections not reading" % grown


N_BIG = 1500


@pytest.fixture(scope="module")
def big_search(srv):
    """1,500 entries of ~3 KB: a search returning them all is ~4.5 MB, more
    than the connection's response queue, output buffer and socket hold."""
    big = "x" * 3000
    entries = [("uid=slow%d,%s" % (i, PEOPLE), person_attrs("slow%d" % i, i, {"description": [big]}))
               for i in range(N_BIG)]
    srv.bulk_add(entries)
    return ber.search_op(PEOPLE, filt=ber.f_eq("objectClass", "person"))


def test_a_search_waiting_on_its_client_lets_go_of_its_read_transaction(srv, big_search):
    """Before: a search blocked on a client that was not reading held its
    LMDB read transaction as long as the client kept the connection (a
    long-lived reader stops LMDB from reusing pages; the file grows)."""
    with srv.raw(timeout=30, rcvbuf=4096) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(ber.message(2, big_search))
        time.sleep(1.4)  # not reading, within one write window (2 s)
        m = metrics(srv)
        # Paused: its thread, its permit and its read transaction given back.
        assert m["pando_search_threads_busy"] == 0, m["pando_search_threads_busy"]
        assert m["pando_store_oldest_reader_seconds"] < 0.9, m["pando_store_oldest_reader_seconds"]
        # Then it reads, and gets every entry once, in one search.
        dns, done = set(), None
        while done is None:
            msg = c.recv_msg(timeout=30)
            if msg["op"] == "entry":
                assert msg["dn"] not in dns, "sent twice: " + msg["dn"]
                dns.add(msg["dn"])
            else:
                done = msg
        assert done["op"] == "searchDone" and done["code"] == 0, done
        slow = [d for d in dns if d.startswith("uid=slow")]
        assert len(slow) == N_BIG, len(slow)
        assert "uid=alice," + PEOPLE in dns  # and the people from before


def test_cancel_ends_a_running_search(srv, big_search):
    """RFC 3909: Cancel stops a search under way; the search answers
    `canceled` (118), then the Cancel answers success, in that order."""
    with srv.raw(timeout=30, rcvbuf=4096) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(ber.message(2, big_search))
        time.sleep(0.3)  # the search is blocked on this client
        cancel = ber.extended_op("1.3.6.1.1.8", ber.seq(ber.integer(2)))
        c.send(ber.message(3, cancel))
        entries, order = 0, []
        while len(order) < 2:
            msg = c.recv_msg(timeout=30)
            if msg["op"] == "entry":
                entries += 1
            else:
                order.append((msg["id"], msg["op"], msg["code"]))
        assert order == [(2, "searchDone", 118), (3, "extended", 0)], order
        assert entries < N_BIG, entries
        # Cancelling what is no longer running: noSuchOperation.
        c.send(ber.message(4, cancel))
        msg = c.recv_msg(timeout=10)
        assert (msg["id"], msg["code"]) == (4, 119), msg


def test_slow_reader_is_dropped_and_its_search_thread_released(srv, big_search):
    """Before: a client taking a few bytes a minute reset the 60 s stall
    timer forever, keeping its search's thread and LMDB read transaction."""
    with srv.raw(timeout=30, rcvbuf=4096) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(ber.message(2, big_search))
        t0 = time.monotonic()
        busy_seen = 0
        dropped = False
        while time.monotonic() - t0 < 30:
            m = metrics(srv)
            busy_seen = max(busy_seen, m["pando_search_threads_busy"])
            # The server's side of the connection is gone (what it had
            # already handed to the kernel may still trickle out).
            if m["pando_connections_current"] == 0:
                dropped = True
                break
            try:
                c.sock.settimeout(1.0)
                c.sock.recv(16)  # ~16 bytes a second: far below min_write_rate
            except (socket.timeout, ConnectionResetError):
                pass
            time.sleep(1.0)
        took = time.monotonic() - t0
        busy_after = metrics(srv)["pando_search_threads_busy"]
    assert busy_seen >= 1, "the search never held a search thread"
    assert dropped, "a client reading 16 bytes a second was not dropped within 30 s"
    assert took < 15, "dropped only after %.1f s" % took
    assert busy_after == 0, "the search thread was not released"
    # The server still answers the same search for a client that reads.
    rc, entries, err = srv.search(PEOPLE, "(uid=slow1)", "1.1")
    assert rc == 0 and len(entries) == 1, err
