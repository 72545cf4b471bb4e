"""Raw-socket protocol tests with hand-built BER: pipelining, abandon,
malformed PDUs (the server must answer or disconnect, never crash), and
controls."""

import os
import socket
import time

import pytest

import ber
from ber import SCOPE_BASE, SCOPE_ONE, SCOPE_SUB, f_eq, f_not, f_or, f_present, message, search_op
from conftest import PEOPLE, SUFFIX, person_attrs

LOAD = "ou=Load," + SUFFIX
N_LOAD = 5000
PAD = "x" * 1600  # 5000 entries ~ 9 MB: more than the kernel socket buffers (4 MB max), so the
                  # abandoned search is still running when the Abandon arrives


@pytest.fixture(scope="module")
def srv(demo_server):
    ents = [(LOAD, {"objectClass": ["organizationalUnit"], "ou": ["Load"]})]
    ents += [("uid=ld%05d,%s" % (i, LOAD), person_attrs("ld%05d" % i, i, {"description": [PAD]}))
             for i in range(N_LOAD)]
    demo_server.bulk_add(ents)
    return demo_server


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def assert_server_ok(srv, what):
    """The server survived: process alive, and a normal search on a new connection works."""
    assert srv.alive(), "server died after %s:\n%s" % (what, srv.logs())
    with srv.raw() as c:
        c.send(message(1, search_op(PEOPLE, SCOPE_ONE, f_eq("uid", "alice"), ["uid"])))
        e = c.recv_msg()
        d = c.recv_msg()
    assert e and e["op"] == "entry" and e["dn"].lower().startswith("uid=alice"), \
        "search after %s: %r" % (what, e)
    assert d and d["op"] == "searchDone" and d["code"] == 0, "search after %s: %r" % (what, d)


def notice(msgs):
    return [m for m in msgs if m["id"] == 0 and m["op"] == "extended"]


def send_quiet(c, data):
    try:
        c.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def expect_disconnect(c, what, want_notice=True, timeout=5):
    msgs, eof = c.drain(timeout=timeout)
    assert eof, "%s: server did not close the connection within %ds (got %r)" % (what, timeout, msgs[:3])
    if want_notice:
        n = notice(msgs)
        assert n, "%s: no Notice of Disconnection before close (RFC 4511 4.1.1 SHOULD); got %r" % (what, msgs)
        assert n[0].get("name") == ber.NOTICE_OF_DISCONNECTION, "%s: notice has OID %r" % (what, n[0].get("name"))
        assert n[0]["code"] == 2, "%s: notice resultCode %d, want protocolError (2)" % (what, n[0]["code"])
    return msgs


def error_or_disconnect(c, msgid, what, timeout=20):
    """Either a non-success SearchResultDone for msgid, or disconnection.
    Returns ("done", code) or ("eof", msgs)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            m = c.recv_msg(timeout=deadline - time.monotonic())
        except socket.timeout:
            break
        if m is None:
            n = notice(seen)
            if n:
                assert n[0].get("name") == ber.NOTICE_OF_DISCONNECTION
            return "eof", seen
        seen.append(m)
        if m["id"] == msgid and m["op"] in ber.RESULT_OPS.values():
            return "done", m["code"]
    pytest.fail("%s: neither a response nor a disconnection within %ds (got %d messages)" % (what, timeout, len(seen)))


# ------------------------------------------------------------------ pipelining


def test_pipelining(srv):
    ids = list(range(100, 120))
    reqs = []
    for n, mid in enumerate(reversed(ids)):
        reqs.append(message(mid, search_op("uid=ld%05d,%s" % (mid * 7, LOAD), SCOPE_BASE, f_present("objectClass"),
                                           ["uid"])))
    with srv.raw() as c:
        c.send(b"".join(reqs))
        got, done = {}, {}
        while len(done) < len(ids):
            m = c.recv_msg(timeout=20)
            assert m is not None, "connection closed with %d/%d responses" % (len(done), len(ids))
            if m["op"] == "entry":
                got.setdefault(m["id"], []).append(m)
            elif m["op"] == "searchDone":
                assert m["id"] not in done, "two SearchResultDone for id %d" % m["id"]
                done[m["id"]] = m["code"]
            else:
                pytest.fail("unexpected %r" % m)
    assert sorted(done) == ids
    for mid in ids:
        assert done[mid] == 0
        es = got.get(mid, [])
        assert len(es) == 1, "id %d: %d entries" % (mid, len(es))
        assert es[0]["attrs"]["uid"] == [b"ld%05d" % (mid * 7)], "id %d got the wrong entry %s" % (mid, es[0]["dn"])


def test_pipelined_mixed_ops(srv):
    """Bind, search, whoami, compare pipelined in one write; responses keep their IDs."""
    data = (message(1, ber.bind_op(srv.admin_dn, srv.admin_pw))
            + message(2, ber.extended_op(ber.WHOAMI_OID))
            + message(3, search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"), ["1.1"]))
            + message(4, ber.tlv(0x6E, ber.octets("uid=bob," + PEOPLE)
                                 + ber.seq(ber.octets("uid"), ber.octets("bob")))))
    with srv.raw() as c:
        c.send(data)
        res = {}
        while len(res) < 4:
            m = c.recv_msg()
            assert m is not None
            if m["op"] != "entry":
                res[m["id"]] = m
    assert res[1]["op"] == "bind" and res[1]["code"] == 0
    assert res[2]["op"] == "extended" and res[2]["code"] == 0
    assert res[2].get("value", b"").lower() == ("dn:" + srv.admin_dn).lower().encode(), \
        "whoami pipelined after bind must see the new identity: %r" % res[2].get("value")
    assert res[3]["code"] == 0
    assert res[4]["op"] == "compare" and res[4]["code"] == 6


# ------------------------------------------------------------------ abandon


def test_abandon(srv):
    with srv.raw(timeout=30, rcvbuf=32768) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(message(2, search_op(LOAD, SCOPE_SUB, f_present("objectClass"), ["*"])))
        first = c.recv_msg(timeout=30)
        assert first is not None and first["id"] == 2 and first["op"] == "entry", first
        time.sleep(0.3)  # let the server fill the socket buffers
        c.send(message(3, ber.abandon_op(2)) + message(4, search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"),
                                                                    ["ou"])))
        n2, done2, done4, entry4 = 1, None, None, 0
        deadline = time.monotonic() + 60
        while done4 is None and time.monotonic() < deadline:
            m = c.recv_msg(timeout=30)
            assert m is not None, "server closed the connection after abandon"
            assert m["id"] != 3, "the server responded to an Abandon: %r" % m
            if m["id"] == 2:
                if m["op"] == "entry":
                    n2 += 1
                else:
                    done2 = m
            elif m["id"] == 4:
                if m["op"] == "entry":
                    entry4 += 1
                else:
                    done4 = m
        assert done4 is not None and done4["code"] == 0 and entry4 == 1, \
            "request after abandon did not complete: done=%r entries=%d" % (done4, entry4)
        # anything still in flight for id 2?
        while done2 is None:
            try:
                m = c.recv_msg(timeout=2)
            except socket.timeout:
                break
            if m is None:
                break
            if m["id"] == 2:
                if m["op"] == "entry":
                    n2 += 1
                else:
                    done2 = m
    total = N_LOAD + 1
    assert n2 < total, "abandoned search returned all %d entries (abandon not honoured)" % n2
    assert done2 is None, "SearchResultDone received for the abandoned search: %r (after %d entries)" % (done2, n2)


def test_bind_behind_a_large_search_the_client_is_not_reading(srv):
    """A bind waits for the operations before it; the connection's task must
    keep writing their output meanwhile, or a large search blocked on a full
    socket would hold the bind forever. The client reads only later."""
    with srv.raw(timeout=30, rcvbuf=32768) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(message(2, search_op(LOAD, SCOPE_SUB, f_present("objectClass"), ["*"])))
        first = c.recv_msg(timeout=30)
        assert first is not None and first["id"] == 2 and first["op"] == "entry", first
        time.sleep(0.5)  # not reading: the socket and the server's buffers fill up
        c.send(message(3, ber.bind_op(srv.admin_dn, srv.admin_pw))
               + message(4, search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"), ["ou"])))
        time.sleep(1.0)
        bound, done4, entries4, n2 = None, None, 0, 1
        deadline = time.monotonic() + 60
        while done4 is None and time.monotonic() < deadline:
            m = c.recv_msg(timeout=30)
            assert m is not None, "server closed the connection"
            if m["id"] == 2:
                assert m["op"] == "entry", "the abandoned search was answered: %r" % m
                n2 += 1
            elif m["id"] == 3:
                bound = m
            elif m["id"] == 4:
                if m["op"] == "entry":
                    entries4 += 1
                else:
                    done4 = m
        assert bound is not None and bound["op"] == "bind" and bound["code"] == 0, bound
        assert done4 is not None and done4["code"] == 0 and entries4 == 1, (done4, entries4)
        # The search before the bind was abandoned by it (RFC 4511 4.2.1):
        # entries up to then, and no SearchResultDone.
        assert n2 <= N_LOAD + 1


def test_abandon_in_same_write(srv):
    """Search and Abandon in one write: at most a few entries, no SearchResultDone."""
    with srv.raw(timeout=30, rcvbuf=32768) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(message(2, search_op(LOAD, SCOPE_SUB, f_present("objectClass"), ["*"]))
               + message(3, ber.abandon_op(2)) + message(4, ber.extended_op(ber.WHOAMI_OID)))
        n2, done2, who = 0, None, None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                m = c.recv_msg(timeout=2)
            except socket.timeout:
                break
            assert m is not None, "server closed the connection"
            if m["id"] == 2:
                if m["op"] == "entry":
                    n2 += 1
                else:
                    done2 = m
            elif m["id"] == 4:
                who = m
    assert who is not None and who["code"] == 0, "WhoAmI after abandon: %r" % who
    assert n2 < N_LOAD + 1 and done2 is None, "abandoned search: %d entries, done=%r" % (n2, done2)


# ------------------------------------------------------------------ malformed input


def test_garbage_bytes(srv):
    with srv.raw() as c:
        send_quiet(c, b"\xde\xad\xbe\xef" * 16 + b"GET / HTTP/1.0\r\n\r\n")
        expect_disconnect(c, "garbage bytes")
    assert_server_ok(srv, "garbage bytes")


def test_http_request(srv):
    with srv.raw() as c:
        send_quiet(c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        expect_disconnect(c, "HTTP request", want_notice=False)
    assert_server_ok(srv, "HTTP request")


def test_indefinite_length(srv):
    body = ber.integer(1) + search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"))
    with srv.raw() as c:
        send_quiet(c, b"\x30\x80" + body + b"\x00\x00")
        expect_disconnect(c, "indefinite length")
    assert_server_ok(srv, "indefinite length")


def test_huge_length_refused_from_header(srv):
    before = rss_kb(srv.proc.pid)
    with srv.raw() as c:
        # LDAPMessage claiming 2 GiB; only a few bytes follow
        send_quiet(c, b"\x30\x84\x80\x00\x00\x00" + ber.integer(1) + b"\x63\x84\x7f\xff\xff\xf0")
        t0 = time.monotonic()
        expect_disconnect(c, "2 GiB length", timeout=10)
        assert time.monotonic() - t0 < 5, "server waited for the 2 GiB body instead of refusing the header"
    after = rss_kb(srv.proc.pid)
    if before and after:
        assert after - before < 200 * 1024, "RSS grew by %d KiB after a 2 GiB length header" % (after - before)
    assert_server_ok(srv, "2 GiB length header")


def test_oversized_inner_length(srv):
    """Outer length fine, an inner length larger than the outer one."""
    inner = b"\x04\x84\x00\x10\x00\x00" + b"abc"
    pdu = ber.tlv(0x30, ber.integer(1) + ber.tlv(0x63, inner))
    with srv.raw() as c:
        send_quiet(c, pdu)
        expect_disconnect(c, "inner length overflow")
    assert_server_ok(srv, "inner length overflow")


def test_truncated_pdu_then_close(srv):
    full = message(1, search_op(PEOPLE, SCOPE_SUB, f_present("objectClass")))
    for cut in (1, 2, 5, len(full) // 2, len(full) - 1):
        c = srv.raw()
        send_quiet(c, full[:cut])
        c.sock.shutdown(socket.SHUT_WR)
        msgs, eof = c.drain(timeout=10)
        c.close()
        assert eof, "server kept a half-closed connection with a truncated PDU open (cut=%d)" % cut
        assert not [m for m in msgs if m["op"] == "entry"], "server executed a truncated request"
    assert_server_ok(srv, "truncated PDUs")


def test_negative_message_id(srv):
    with srv.raw() as c:
        send_quiet(c, message(-5, search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"))))
        kind, info = error_or_disconnect(c, -5, "negative message ID")
        assert kind == "eof" or info != 0, "search with a negative message ID succeeded"
        if kind == "eof":
            assert notice(info), "negative message ID: disconnected without a Notice of Disconnection"
    assert_server_ok(srv, "negative message ID")


def test_bind_version_200(srv):
    with srv.raw() as c:
        send_quiet(c, message(1, ber.bind_op("", "", version=200)))
        m = c.recv_msg()
        assert m is not None and m["op"] == "bind", "no BindResponse to version 200: %r" % m
        assert m["code"] == 2, "bind version 200: expected protocolError (2), got %d" % m["code"]
    with srv.raw() as c:
        send_quiet(c, message(1, ber.bind_op("", "", version=2)))
        m = c.recv_msg()
        assert m is not None and m["code"] == 2, "bind version 2: expected protocolError (2), got %r" % m
    assert_server_ok(srv, "bind version 200")


def test_unknown_protocol_op(srv):
    with srv.raw() as c:
        # APPLICATION 25 (IntermediateResponse) is not a request
        send_quiet(c, message(1, ber.tlv(0x79, ber.octets("1.2.3", tag=0x80))))
        expect_disconnect(c, "response op sent as request")
    assert_server_ok(srv, "unknown protocolOp")


def test_deeply_nested_filter(srv):
    filt = f_eq("uid", "alice")
    for _ in range(10000):
        filt = f_not(filt)
    with srv.raw(timeout=30) as c:
        send_quiet(c, message(7, search_op(PEOPLE, SCOPE_SUB, filt, ["1.1"])))
        kind, info = error_or_disconnect(c, 7, "filter nested 10,000 deep")
        assert kind == "eof" or info != 0, "a filter nested 10,000 deep was accepted (max_filter_depth 64)"
    assert_server_ok(srv, "deeply nested filter")


def test_filter_depth_limit_boundary(srv):
    filt = f_eq("uid", "alice")
    for _ in range(20):  # even count -> same meaning, well under the limit
        filt = f_not(filt)
    with srv.raw() as c:
        c.send(message(1, search_op(PEOPLE, SCOPE_SUB, filt, ["1.1"])))
        msgs = [c.recv_msg(), c.recv_msg()]
    assert msgs[-1]["op"] == "searchDone" and msgs[-1]["code"] == 0, msgs
    assert msgs[0]["op"] == "entry" and msgs[0]["dn"].lower().startswith("uid=alice")


def test_huge_or_filter(srv):
    filt = f_or(*[f_eq("uid", "u%06d" % i) for i in range(100000)])
    with srv.raw(timeout=60) as c:
        send_quiet(c, message(8, search_op(SUFFIX, SCOPE_SUB, filt, ["1.1"])))
        kind, info = error_or_disconnect(c, 8, "100k-term OR filter", timeout=60)
        assert kind == "eof" or info != 0, "a 100,000-term filter was accepted (max_filter_terms 10000)"
    assert_server_ok(srv, "100k-term OR filter")


def test_invalid_utf8_dn(srv):
    bad = b"uid=\xff\xfe\xc3," + PEOPLE.encode()
    with srv.raw() as c:
        send_quiet(c, message(1, search_op(bad, SCOPE_BASE)))
        kind, info = error_or_disconnect(c, 1, "invalid UTF-8 in a search base")
        assert kind == "eof" or info in (2, 32, 34), "invalid UTF-8 base: result %r" % (info,)
    with srv.raw() as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        send_quiet(c, message(2, ber.add_op(bad, {"objectClass": ["inetOrgPerson"], "cn": ["x"], "sn": ["x"],
                                                    "uid": [b"\xff\xfe\xc3"]})))
        kind, info = error_or_disconnect(c, 2, "invalid UTF-8 in an add DN")
        assert kind == "eof" or info in (2, 21, 34), "invalid UTF-8 add: result %r" % (info,)
    with srv.raw() as c:
        send_quiet(c, message(1, ber.bind_op(b"cn=\xc0\xaf", "pw")))
        kind, info = error_or_disconnect(c, 1, "invalid UTF-8 bind DN")
        assert kind == "eof" or info in (2, 34, 49), "invalid UTF-8 bind DN: result %r" % (info,)
    assert_server_ok(srv, "invalid UTF-8 DN")


# ------------------------------------------------------------------ controls


def test_unknown_critical_control(srv):
    ctl = ber.control("1.2.3.4.5.6.7.8.9", critical=True, value=b"\x04\x00")
    with srv.raw() as c:
        c.send(message(1, search_op(PEOPLE, SCOPE_ONE, f_eq("uid", "alice"), ["uid"]), controls=[ctl]))
        m = c.recv_msg()
    assert m["op"] == "searchDone", "unknown critical control: search was executed (%r)" % m
    assert m["code"] == 12, "unknown critical control: expected unavailableCriticalExtension (12), got %d" % m["code"]


def test_unknown_noncritical_control(srv):
    ctl = ber.control("1.2.3.4.5.6.7.8.9", critical=False, value=b"whatever")
    with srv.raw() as c:
        c.send(message(1, search_op(PEOPLE, SCOPE_ONE, f_eq("uid", "alice"), ["uid"]), controls=[ctl]))
        e, d = c.recv_msg(), c.recv_msg()
    assert e["op"] == "entry" and d["op"] == "searchDone" and d["code"] == 0, (e, d)


def test_unknown_critical_control_on_modify(srv):
    ctl = ber.control("1.2.3.4.5.6.7.8.10", critical=True)
    mod = ber.tlv(0x66, ber.octets("uid=alice," + PEOPLE) + ber.seq(ber.seq(
        ber.enum(2), ber.seq(ber.octets("description"), ber.set_(ber.octets("ctl-test"))))))
    with srv.raw() as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(message(2, mod, controls=[ctl]))
        m = c.recv_msg()
        assert m["op"] == "modify" and m["code"] == 12, "critical unknown control on modify: %r" % m
        c.send(message(3, search_op("uid=alice," + PEOPLE, SCOPE_BASE, f_eq("description", "ctl-test"), ["1.1"])))
        m = c.recv_msg()
        assert m["op"] == "searchDone", "modify with a refused critical control was applied anyway"


def test_many_connections_and_unbind(srv):
    conns = [srv.raw() for _ in range(50)]
    try:
        for i, c in enumerate(conns):
            c.send(message(1, search_op(PEOPLE, SCOPE_BASE, f_present("objectClass"), ["1.1"])))
        for c in conns:
            assert c.recv_msg()["op"] == "entry" and c.recv_msg()["code"] == 0
        for c in conns:
            c.send(message(2, ber.unbind_op()))
        for c in conns:
            msgs, eof = c.drain(timeout=10)
            assert eof and not msgs, "server must close without response after Unbind: %r" % msgs
    finally:
        for c in conns:
            c.close()
    assert_server_ok(srv, "50 connections")
