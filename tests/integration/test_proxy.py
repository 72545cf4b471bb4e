"""`pando proxy` in front of a multi-provider ring of four Pando servers
(two providers for writes, two replicas for reads): reads shared between
the replicas, writes to the active provider and moved to the next when it
is killed (every operation answered, no acknowledged write lost), a
lagging or stalled replica taken out of rotation and returned, and every
message in the decode log, credentials masked."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter

import pytest

from conftest import ADMIN_DN, PANDO_BIN, PEOPLE, SUFFIX, free_port, wait_port
from test_multi_provider import PW, Ring, converge, values

pytest.importorskip("ldap3")
import ldap3  # noqa: E402


class Proxy:
    def __init__(self, base, ring, providers, replicas, extra=""):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.decode = base / "decode.jsonl"
        pw_file = base / "pw"
        pw_file.write_text(PW)
        ups = "".join('[[proxy.upstream]]\nurl = "%s"\nrole = "%s"\n' % (ring.nodes[i].url, role)
                      for role, idx in (("provider", providers), ("replica", replicas)) for i in idx)
        self.config = base / "proxy.toml"
        self.config.write_text(
            'log_level = "info"\n[proxy]\nlisten = ["ldap://127.0.0.1:%d"]\nhealth_secs = 1\ntimeout_secs = 1\n'
            'bind_dn = "%s"\ncredentials_file = "%s"\ndecode_log = "%s"\ndecode_format = "json"\n%s\n%s'
            % (self.port, ADMIN_DN, pw_file, self.decode, extra, ups))
        self.proc = None

    def start(self):
        self.out = open(self.base / "proxy.out", "w")
        self.proc = subprocess.Popen([PANDO_BIN, "proxy", "-c", str(self.config)], stdout=self.out,
                                     stderr=subprocess.STDOUT)
        assert wait_port(self.port, self.proc, 20), self.logs()
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self):
        return (self.base / "proxy.out").read_text()[-4000:]

    def lines(self):
        return [json.loads(ln) for ln in self.decode.read_text().splitlines() if ln.strip()]

    def conn(self, user=ADMIN_DN, password=PW):
        server = ldap3.Server("127.0.0.1", port=self.port, get_info=ldap3.NONE, connect_timeout=10)
        c = ldap3.Connection(server, user=user, password=password, raise_exceptions=False,
                             receive_timeout=30)
        if user is None:
            c.open()
        else:
            assert c.bind(), c.result
        return c


@contextlib.contextmanager
def proxied_ring(tmp_path, n, providers, replicas, extra=""):
    """A ring of n providers (see test_multi_provider.Ring), converged, and
    a proxy in front of it (the nodes' indexes as providers and replicas)."""
    ring = Ring(tmp_path, n=n).start()
    proxy = None
    try:
        converge(ring)
        proxy = Proxy(tmp_path / "proxy", ring, providers=providers, replicas=replicas, extra=extra).start()
        yield ring, proxy
    finally:
        if proxy:
            proxy.stop()
        ring.stop(verify=False)


@pytest.fixture
def setup(tmp_path):
    with proxied_ring(tmp_path, 4, [0, 1], [2, 3]) as both:
        yield both


def wait_for(cond, timeout, what, logs=lambda: ""):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("%s not within %ss\n%s" % (what, timeout, logs()))
        time.sleep(0.1)


def reads_by_server(proxy, since=0.0):
    return Counter(ln["to"] for ln in proxy.lines()
                   if ln["dir"] == "request" and ln["op"] == "search" and ln["t"] >= since)


def test_reads_are_shared_by_the_replicas_and_writes_go_to_the_active_provider(setup):
    ring, proxy = setup
    urls = [n.url for n in ring.nodes]
    # Anonymous clients share the proxy's connections; bound ones have
    # their own. Both kinds read from both replicas.
    clients = [proxy.conn(), proxy.conn(user=None)]
    for i in range(200):
        c = clients[i % 2]
        assert c.search(PEOPLE, "(uid=alice)", attributes=["cn"]), c.result
        assert len(c.entries) == 1
    got = reads_by_server(proxy)
    assert set(got) == {urls[2], urls[3]}, got
    assert min(got.values()) >= 40, got
    # Writes (and a password change, an extended operation that writes) go
    # to the first provider; a read on the same bound connection finds them.
    c = clients[0]
    for i in range(10):
        assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["w%d" % i])]}), c.result
    assert c.add("uid=viaproxy," + PEOPLE, ["account"], {"uid": "viaproxy"}), c.result
    assert c.modify_dn("uid=viaproxy," + PEOPLE, "uid=moved"), c.result
    assert c.delete("uid=moved," + PEOPLE), c.result
    assert c.compare("uid=alice," + PEOPLE, "uid", "alice") is True
    writes = [ln for ln in proxy.lines()
              if ln["dir"] == "request" and ln["op"] in ("modify", "add", "modrdn", "delete")]
    assert len(writes) == 13 and {ln["to"] for ln in writes} == {urls[0]}, writes
    converge(ring)
    for node in ring.nodes:
        assert values(node, "uid=alice," + PEOPLE, "description") == ["w9"]
    # Anonymous writes are refused by the server, through the proxy, as direct.
    anon, direct = clients[1], ring.nodes[0].conn(admin=False)
    change = {"description": [(ldap3.MODIFY_REPLACE, ["x"])]}
    assert not anon.modify("uid=alice," + PEOPLE, change)
    assert not direct.modify("uid=alice," + PEOPLE, change)
    assert anon.result["result"] == direct.result["result"] != 0, (anon.result, direct.result)
    assert anon.result["message"] == direct.result["message"]
    direct.unbind()
    for c in clients:
        c.unbind()


def test_a_killed_provider_hands_writes_to_the_next_and_loses_no_acknowledged_write(setup):
    ring, proxy = setup
    acked, failed, errors = [], [], []
    stop = threading.Event()

    def writer(k):
        c = proxy.conn()
        i = 0
        while not stop.is_set() and i < 3000:
            i += 1
            dn = "uid=w%d-%d,%s" % (k, i, PEOPLE)
            try:
                ok = c.add(dn, ["account"], {"uid": "w%d-%d" % (k, i)})
            except Exception as e:  # the connection itself must not fail
                errors.append(repr(e))
                return
            (acked if ok else failed).append((time.monotonic(), dn, c.result["result"], c.result["message"]))
        c.unbind()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(2)
    killed_at = time.monotonic()
    ring.nodes[0].proc.send_signal(signal.SIGKILL)
    ring.nodes[0].proc.wait()
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert acked, failed[:5]
    # Every failed write was answered, as unavailable and naming the server.
    assert all(code == 52 for _, _, code, _ in failed), failed[:5]
    assert all(ring.nodes[0].url in msg or "reachable" in msg for _, _, _, msg in failed), failed[:5]
    after = [t for t, *_ in acked if t > killed_at]
    assert after, "no write succeeded after the kill\n%s" % proxy.logs()
    resumed = min(after) - killed_at
    assert resumed < 3.0, resumed
    writes_to = Counter(ln["to"] for ln in proxy.lines() if ln["dir"] == "request" and ln["op"] == "add")
    assert writes_to[ring.nodes[1].url] > 0, writes_to
    # The killed provider comes back (its store kept every write it
    # acknowledged); the ring converges and holds every acknowledged write.
    ring.nodes[0].start(keep_port=True)
    ring.nodes[0].admin_pw = PW
    converge(ring, timeout=90)
    for node in ring.nodes:
        rc, es, err = node.search(PEOPLE, "(uid=w*)", "1.1", scope="one")
        held = {d.lower() for d, _ in es}
        missing = [dn for _, dn, _, _ in acked if dn.lower() not in held]
        assert not missing, (node.name, missing[:5])
    print("writes acknowledged %d, answered unavailable %d, resumed after %.2fs"
          % (len(acked), len(failed), resumed))


def test_a_lagging_or_stalled_replica_leaves_the_read_rotation_and_returns(tmp_path):
    with proxied_ring(tmp_path, 3, [0], [1, 2], extra='max_lag_secs = 1\nbase = "%s"\n' % SUFFIX) as (ring, proxy):
        url1, url2 = ring.nodes[1].url, ring.nodes[2].url
        c = proxy.conn()

        answered_unavailable = []

        def share(n=60):
            """Where n reads went. A read in flight on a replica that stops
            answering is answered unavailable, naming it."""
            since = time.time()
            for _ in range(n):
                if not c.search(PEOPLE, "(uid=alice)", attributes=["cn"]):
                    assert c.result["result"] == 52 and url2 in c.result["message"], c.result
                    answered_unavailable.append(c.result["message"])
            return reads_by_server(proxy, since)

        assert set(share()) == {url1, url2}
        # Replica 3 stops receiving changes; a write, then another a few
        # seconds later, put it more than max_lag behind the provider.
        assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["before"])]})
        converge(ring)
        for j in (1, 2):
            ring.links[(3, j)].cut()
        time.sleep(2.5)
        assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["after"])]})
        wait_for(lambda: set(share(10)) == {url1}, 10, "the lagging replica out of rotation", proxy.logs)
        assert set(share()) == {url1}
        for j in (1, 2):
            ring.links[(3, j)].heal()
        wait_for(lambda: url2 in share(20), 20, "the replica back in rotation", proxy.logs)
        # A stalled replica (SIGSTOP): out when a check goes unanswered,
        # reads go on from the other; back after SIGCONT.
        os.kill(ring.nodes[2].proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: set(share(10)) == {url1}, 10, "the stalled replica out of rotation", proxy.logs)
        finally:
            os.kill(ring.nodes[2].proc.pid, signal.SIGCONT)
        wait_for(lambda: url2 in share(20), 20, "the resumed replica back in rotation", proxy.logs)
        assert len(answered_unavailable) <= 1, answered_unavailable
        c.unbind()


def test_every_message_is_decoded_with_credentials_masked_and_garbage_is_shown(setup):
    ring, proxy = setup
    c = proxy.conn()
    c.search(PEOPLE, "(&(uid=alice)(objectClass=person))", attributes=["cn", "mail"], size_limit=5)
    c.add("uid=dec," + PEOPLE, ["account"], {"uid": "dec", "description": "x"})
    c.modify("uid=dec," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["y"])]})
    c.compare("uid=dec," + PEOPLE, "uid", "dec")
    c.modify_dn("uid=dec," + PEOPLE, "uid=dec2")
    c.delete("uid=dec2," + PEOPLE)
    c.extend.standard.who_am_i()
    c.unbind()
    # A client sending garbage is told so and cut; the proxy goes on.
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s.sendall(b"\x31\x05hello")
    reply = s.recv(4096)
    s.close()
    assert b"1.3.6.1.4.1.1466.20036" in reply, reply
    c = proxy.conn()
    assert c.search(PEOPLE, "(uid=alice)", attributes=["cn"]) and len(c.entries) == 1
    c.unbind()
    lines = proxy.lines()
    text = proxy.decode.read_text()
    assert PW not in text
    ops = [(ln["dir"], ln["op"]) for ln in lines if ln.get("conn") == lines[0]["conn"]]
    for op in ("bind", "search", "add", "modify", "compare", "modrdn", "delete", "extended", "unbind"):
        assert ("request", op) in ops, (op, ops)
    search = next(ln for ln in lines if ln["op"] == "search")
    assert search["filter"] == "(&(uid=alice)(objectClass=person))" and search["attrs"] == "cn,mail", search
    assert search["base"] == PEOPLE and search["size_limit"] == 5, search
    done = next(ln for ln in lines if ln["op"] == "search_done")
    assert done["result"] == 0 and done["entries"] == 1 and done["ms"] >= 0, done
    bind = next(ln for ln in lines if ln["op"] == "bind")
    assert bind["dn"] == ADMIN_DN and bind["password"] == "<redacted>", bind
    add = next(ln for ln in lines if ln["op"] == "add")
    assert sorted(add["attrs"].split(",")) == ["description:1", "objectClass:1", "uid:1"], add
    assert any(ln["dir"] == "garbage" and ln["from"] == "client" for ln in lines), lines[-5:]
    assert oct(os.stat(proxy.decode).st_mode & 0o777) == "0o600"


def test_a_write_then_a_read_always_sees_it_with_a_replica_held_back(tmp_path):
    with proxied_ring(tmp_path, 3, [0], [1, 2]) as (ring, proxy):
        url2 = ring.nodes[2].url
        # Replica 3 receives changes only after a delay (its links stalled).
        for j in (1, 2):
            ring.links[(3, j)].stall()
        c = proxy.conn()
        since = time.time()
        for i in range(40):
            assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["v%d" % i])]}), c.result
            assert c.search(PEOPLE, "(uid=alice)", attributes=["description"]), c.result
            assert c.entries[0].description.value == "v%d" % i, (i, c.entries)
        reads = reads_by_server(proxy, since)
        assert url2 not in reads, reads
        assert sum(reads.values()) == 40
        # Without writes the held-back replica is read again once it has
        # caught up (as the next health check sees).
        for j in (1, 2):
            ring.links[(3, j)].resume()
        converge(ring)
        time.sleep(1.5)
        since = time.time()
        for _ in range(40):
            assert c.search(PEOPLE, "(uid=alice)", attributes=["description"]), c.result
        assert url2 in reads_by_server(proxy, since)
        c.unbind()


def acked_writes(proxy, writers, seconds, kill=None):
    """`writers` clients adding entries through the proxy for `seconds`;
    `kill` called halfway. (acknowledged, failed) as (time, dn, code, message)."""
    acked, failed, errors = [], [], []
    stop = threading.Event()

    def writer(k):
        c = proxy.conn()
        for i in range(1, 5000):
            if stop.is_set():
                break
            dn = "uid=a%d-%d,%s" % (k, i, PEOPLE)
            t = time.monotonic()
            try:
                ok = c.add(dn, ["account"], {"uid": "a%d-%d" % (k, i)})
            except Exception as e:
                errors.append(repr(e))
                return
            (acked if ok else failed).append((t, time.monotonic() - t, dn, c.result["result"], c.result["message"]))
        c.unbind()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    time.sleep(seconds / 2)
    if kill:
        kill()
    time.sleep(seconds / 2)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return acked, failed


def test_with_acknowledge_replicas_1_a_kill_of_the_provider_loses_no_acknowledged_write(tmp_path):
    with proxied_ring(tmp_path, 3, [0, 1], [2], extra='acknowledge = "replicas:1"\n') as (ring, proxy):

        def kill():
            ring.nodes[0].proc.send_signal(signal.SIGKILL)
            ring.nodes[0].proc.wait()

        acked, failed = acked_writes(proxy, 4, 6, kill)
        assert len(acked) > 50, (len(acked), failed[:3])
        assert all(code == 52 for *_, code, _ in failed), failed[:5]
        # The killed provider stays down: the survivors alone hold every
        # write that was acknowledged.
        survivors = ring.nodes[1:]
        deadline = time.monotonic() + 60
        while True:
            missing = {}
            for node in survivors:
                rc, es, err = node.search(PEOPLE, "(uid=a*)", "1.1", scope="one")
                held = {d.lower() for d, _ in es}
                missing[node.name] = [dn for _, _, dn, _, _ in acked if dn.lower() not in held]
            if not any(missing.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not any(missing.values()), {k: v[:5] for k, v in missing.items()}
        mean = sum(d for _, d, *_ in acked) / len(acked)
        print("acknowledged %d (mean %.2f ms), answered unavailable %d" % (len(acked), mean * 1000, len(failed)))


def test_a_write_not_copied_in_time_is_answered_unavailable_saying_so(tmp_path):
    concern = 'acknowledge = "replicas:2"\nacknowledge_timeout_secs = 1\n'
    with proxied_ring(tmp_path, 3, [0], [1, 2], extra=concern) as (ring, proxy):
        c = proxy.conn()
        assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["both"])]}), c.result
        for j in (1, 2):
            ring.links[(3, j)].cut()
        t = time.monotonic()
        assert not c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["one"])]})
        took = time.monotonic() - t
        assert c.result["result"] == 52, c.result
        assert "the change was made on %s but only 1 of the 2" % ring.nodes[0].url in c.result["message"], c.result
        assert 0.9 < took < 3, took
        # It was made (the provider has it).
        assert values(ring.nodes[0], "uid=alice," + PEOPLE, "description") == ["one"]
        c.unbind()


def test_binds_on_one_connection_change_who_the_client_is(setup):
    ring, proxy = setup
    c = proxy.conn(user=None)
    server = c.server
    # A wrong password: refused, and the connection is anonymous.
    c = ldap3.Connection(server, user=ADMIN_DN, password="wrong", raise_exceptions=False)
    assert not c.bind() and c.result["result"] == 49, c.result
    assert c.extend.standard.who_am_i() in (None, "")
    # The right one on the same connection, then a write (on the provider,
    # bound there as the same DN), then back to anonymous.
    c.password = PW
    assert c.rebind(user=ADMIN_DN, password=PW), c.result
    assert c.extend.standard.who_am_i() == "dn:" + ADMIN_DN
    assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["rebound"])]}), c.result
    c.user = c.password = None
    assert c.rebind(authentication=ldap3.ANONYMOUS), c.result
    assert c.extend.standard.who_am_i() in (None, "")
    assert not c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["anon"])]})
    # SASL EXTERNAL would be the proxy's identity: refused, saying why.
    ext = ldap3.Connection(server, authentication=ldap3.SASL, sasl_mechanism=ldap3.EXTERNAL,
                           raise_exceptions=False)
    ext.open()
    assert not ext.bind() and ext.result["result"] == 7, ext.result
    assert "proxy" in ext.result["message"], ext.result
    c.unbind()
    ext.unbind()


def answers(sock, want, secs=10):
    """The messages read from a raw connection by message ID (the first
    of each, with "t": seconds from the call to its arrival), until `want`
    are read, the peer closes or `secs` pass."""
    import ber
    got, buf, t0 = {}, b"", time.monotonic()
    while len(got) < want and time.monotonic() - t0 < secs:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while True:
            try:
                end = ber.read_tlv(buf, 0)[2]
            except Exception:
                break
            m = ber.decode_message(buf[:end])
            m["t"] = time.monotonic() - t0
            buf = buf[end:]
            got.setdefault(m["id"], m)
    return got


def test_a_connection_s_running_operations_are_bounded_and_a_stalled_server_s_answered(tmp_path):
    import ber
    with proxied_ring(tmp_path, 2, [0], [1], extra="max_ops_per_connection = 2\n") as (ring, proxy):
        os.kill(ring.nodes[1].proc.pid, signal.SIGSTOP)
        try:
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            for i in (1, 2, 3):
                s.sendall(ber.message(i, ber.search_op(PEOPLE, filt=ber.f_eq("uid", "alice"), attrs=("cn",))))
            got = {i: (m, m["t"]) for i, m in answers(s, 3).items()}
            s.close()
        finally:
            os.kill(ring.nodes[1].proc.pid, signal.SIGCONT)
        assert sorted(got) == [1, 2, 3], got
        # The third is refused at once; the two on the stalled replica are
        # answered unavailable when a health check goes unanswered.
        third, t3 = got[3]
        assert third["code"] == 51 and t3 < 0.5, got[3]
        for i in (1, 2):
            m, t = got[i]
            assert m["code"] == 52 and ring.nodes[1].url in m["diag"], m
            assert t < 6, t


def test_clients_reach_the_proxy_over_ldaps_and_starttls(tmp_path):
    from test_tls import Pki
    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("proxy", "/O=Pando Test/CN=localhost", server=True)
    ring = Ring(tmp_path, n=2).start()
    proxy = None
    try:
        converge(ring)
        tls_port = free_port()
        proxy = Proxy(tmp_path / "proxy", ring, providers=[0], replicas=[1],
                      extra='tls_cert_file = "%s"\ntls_key_file = "%s"\n' % (cert, key))
        text = proxy.config.read_text().replace(
            'listen = ["ldap://127.0.0.1:%d"]' % proxy.port,
            'listen = ["ldap://127.0.0.1:%d", "ldaps://127.0.0.1:%d"]' % (proxy.port, tls_port))
        proxy.config.write_text(text)
        proxy.start()
        env = dict(os.environ, LDAPTLS_CACERT=str(pki.ca), LDAPTLS_REQCERT="demand")
        for url, extra in (("ldaps://127.0.0.1:%d" % tls_port, []), ("ldap://127.0.0.1:%d" % proxy.port, ["-ZZ"])):
            r = subprocess.run(["ldapsearch", "-x", "-H", url, *extra, "-o", "nettimeout=10", "-D", ADMIN_DN,
                                "-w", PW, "-b", PEOPLE, "-LLL", "(uid=alice)", "uid"],
                               capture_output=True, text=True, timeout=30, env=env)
            assert r.returncode == 0 and "uid: alice" in r.stdout, (url, r.stdout, r.stderr)
        # Plain LDAP still works on the ldap:// listener, and StartTLS after
        # a bind and a search on the same connection turns it to TLS, the
        # client still bound as before.
        import ssl
        tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=str(pki.ca))
        server = ldap3.Server("localhost", port=proxy.port, get_info=ldap3.NONE, tls=tls, connect_timeout=10)
        c = ldap3.Connection(server, user=ADMIN_DN, password=PW, raise_exceptions=False, receive_timeout=30)
        assert c.bind(), c.result
        assert c.search(PEOPLE, "(uid=alice)", attributes=["uid"]) and len(c.entries) == 1
        assert c.start_tls(), c.result
        assert c.tls_started
        assert c.search(PEOPLE, "(uid=bob)", attributes=["uid"]) and len(c.entries) == 1
        assert c.extend.standard.who_am_i() == "dn:" + ADMIN_DN
        # A second StartTLS on the same connection is refused.
        r = c.extended("1.3.6.1.4.1.1466.20037")
        assert not r and c.result["result"] == 1, c.result
        assert c.search(PEOPLE, "(uid=carol)", attributes=["uid"]) and len(c.entries) == 1
        c.unbind()
        r = subprocess.run(["ldapsearch", "-x", "-H", "ldaps://127.0.0.1:%d" % tls_port, "-o", "nettimeout=10",
                            "-b", "", "-s", "base"], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, LDAPTLS_REQCERT="demand", LDAPTLS_CACERT="/dev/null"))
        assert r.returncode != 0  # an untrusted certificate is the client's to refuse
    finally:
        if proxy:
            proxy.stop()
        ring.stop(verify=False)


def user_dump(node):
    """Every entry's DN and user attributes, sorted."""
    c = node.conn()
    c.search(SUFFIX, "(objectClass=*)", attributes=["*"])
    out = sorted((e.entry_dn.lower(), sorted((k.lower(), sorted(str(x) for x in v))
                                             for k, v in e.entry_attributes_as_dict.items()))
                 for e in c.entries)
    c.unbind()
    return out


def test_a_recorded_session_replayed_on_another_server_gives_the_same_data(tmp_path):
    from conftest import Pando
    from test_multi_provider import ssha
    ring = Ring(tmp_path, n=2).start()
    proxy = other = None
    try:
        converge(ring)
        record = tmp_path / "session.record"
        proxy = Proxy(tmp_path / "proxy", ring, providers=[0], replicas=[1],
                      extra='record = "%s"\n' % record).start()
        # A session of every kind of operation, from ldap3 and ldap-utils.
        c = proxy.conn()
        for i in range(20):
            dn = "uid=rec%d,%s" % (i, PEOPLE)
            assert c.add(dn, ["inetOrgPerson"], {"uid": "rec%d" % i, "cn": "R %d" % i, "sn": "R"}), c.result
            assert c.modify(dn, {"description": [(ldap3.MODIFY_REPLACE, ["d%d" % i])]}), c.result
            assert c.search(PEOPLE, "(uid=rec%d)" % i, attributes=["description"]) and c.entries
        assert c.compare("uid=rec1," + PEOPLE, "sn", "R") is True
        assert c.modify_dn("uid=rec2," + PEOPLE, "uid=rec2b"), c.result
        assert c.delete("uid=rec3," + PEOPLE), c.result
        c.extend.standard.who_am_i()
        c.unbind()
        r = subprocess.run(["ldapmodify", "-x", "-H", "ldap://127.0.0.1:%d" % proxy.port, "-D", ADMIN_DN, "-w", PW],
                           input="dn: uid=rec4,%s\nchangetype: modify\nadd: description\ndescription: from ldapmodify\n"
                           % PEOPLE, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        converge(ring)
        assert PW not in record.read_text()
        assert oct(os.stat(record).st_mode & 0o777) == "0o600"
        # Another server, as the first was before the session: the replay
        # (passwords withheld in the record, given here) leaves it the same.
        other = Pando(tmp_path / "other", demo=True, name="other",
                      config='root_password_hash = "%s"\n' % ssha(PW)).start()
        other.admin_pw = PW
        before = user_dump(other)
        r = subprocess.run([PANDO_BIN, "bench", "--replay", str(record), "-H", other.url, "-w", PW, "--speed", "0"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [ln.split() for ln in r.stdout.splitlines()[3:] if ln.strip()]
        assert {row[0] for row in rows} >= {"add", "bind", "compare", "delete", "extended", "modify", "modrdn",
                                            "search"}, r.stdout
        assert all(row[2] == "0" for row in rows), r.stdout
        assert user_dump(other) == user_dump(ring.nodes[0]) != before, r.stdout
        print(r.stdout)
    finally:
        if proxy:
            proxy.stop()
        if other:
            other.stop()
        ring.stop(verify=False)


def test_ldap_read_out_of_a_tcpdump_capture_is_decoded_and_replays(tmp_path):
    import shutil
    from conftest import Pando
    from test_multi_provider import ssha
    if not shutil.which("tcpdump"):
        pytest.skip("tcpdump not installed")
    cfg = 'root_password_hash = "%s"\n' % ssha(PW)
    first = Pando(tmp_path / "first", demo=True, name="first", config=cfg).start()
    first.admin_pw = PW
    second = None
    cap = tmp_path / "ldap.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "-w", str(cap), "tcp port %d" % first.port],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not (cap.exists() and cap.stat().st_size >= 24) and time.monotonic() < deadline:
            time.sleep(0.1)
        if dump.poll() is not None or not cap.exists():
            pytest.skip("tcpdump cannot capture here: %s" % dump.stderr.read().decode()[:200])
        time.sleep(0.5)
        c = first.conn()
        assert c.add("uid=cap1," + PEOPLE, ["inetOrgPerson"], {"uid": "cap1", "cn": "C", "sn": "C"}), c.result
        assert c.modify("uid=cap1," + PEOPLE, {"description": [(ldap3.MODIFY_ADD, ["x"])]}), c.result
        assert c.compare("uid=cap1," + PEOPLE, "sn", "C") is True
        assert c.modify_dn("uid=cap1," + PEOPLE, "uid=cap2"), c.result
        assert c.search(PEOPLE, "(uid=cap2)", attributes=["description"]) and len(c.entries) == 1
        assert c.delete("uid=bob," + PEOPLE), c.result
        c.unbind()
        r = subprocess.run(["ldapsearch", "-x", "-H", first.url, "-D", ADMIN_DN, "-w", PW, "-b", PEOPLE,
                            "(uid=alice)", "cn"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0
        time.sleep(1)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
    try:
        record = tmp_path / "cap.record"
        r = subprocess.run([PANDO_BIN, "proxy", "--read-capture", str(cap), "--ldap-port", str(first.port),
                            "--json", "--record", str(record)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(ln) for ln in r.stdout.splitlines()]
        ops = Counter(ln["op"] for ln in lines if ln["dir"] == "request")
        assert ops == {"bind": 2, "add": 1, "modify": 1, "compare": 1, "modrdn": 1, "search": 2, "delete": 1,
                       "unbind": 2}, ops
        done = [ln for ln in lines if ln["dir"] == "response"]
        assert len(done) == 9 and all(ln["result"] in (0, 6) for ln in done), done
        assert any(ln["op"] == "search" and ln["filter"] == "(uid=cap2)" for ln in lines)
        assert "2 connections" in r.stderr and "0 gaps" in r.stderr, r.stderr
        assert PW not in r.stdout and PW not in record.read_text()
        # Replayed on a server as the first was before: the same data.
        second = Pando(tmp_path / "second", demo=True, name="second", config=cfg).start()
        second.admin_pw = PW
        r = subprocess.run([PANDO_BIN, "bench", "--replay", str(record), "-H", second.url, "-w", PW, "--speed", "0"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert user_dump(second) == user_dump(first), r.stdout
    finally:
        first.stop()
        if second:
            second.stop()


def test_servers_closing_idle_connections_stay_in_rotation(tmp_path):
    """The servers close the proxy's idle anonymous connections (their
    anonymous idle timeout): nothing was lost, so neither leaves the
    rotation, and writes stay on the first provider."""
    ring = Ring(tmp_path, n=2)
    for node in ring.nodes:
        node.config += "\n[limits.anonymous]\nidle_timeout = 1\n"
    ring.start()
    proxy = None
    try:
        converge(ring)
        proxy = Proxy(tmp_path / "proxy", ring, providers=[0, 1], replicas=[]).start()
        anon = proxy.conn(user=None)
        assert anon.search(PEOPLE, "(uid=alice)", attributes=["cn"]) and len(anon.entries) == 1
        time.sleep(3)
        for _ in range(3):
            assert anon.search(PEOPLE, "(uid=alice)", attributes=["cn"]), anon.result
            c = proxy.conn()
            assert c.modify("uid=alice," + PEOPLE, {"description": [(ldap3.MODIFY_REPLACE, ["idle"])]}), c.result
            c.unbind()
            time.sleep(1.5)
        writes = {ln["to"] for ln in proxy.lines() if ln["dir"] == "request" and ln["op"] == "modify"}
        assert writes == {ring.nodes[0].url}, writes
        assert "out of rotation" not in proxy.logs(), proxy.logs()
        anon.unbind()
    finally:
        if proxy:
            proxy.stop()
        ring.stop(verify=False)


def test_a_client_that_stops_reading_holds_up_no_one_and_is_disconnected(tmp_path):
    """A client sending searches and never reading shares the replica
    connection with another client; the other's searches keep being
    answered at once, and the slow one is disconnected once more than
    max_client_queue_bytes of its responses wait."""
    import ber
    extra = "max_pdu_bytes = 65536\nmax_client_queue_bytes = 262144\nmax_ops_per_connection = 100000\n"
    with proxied_ring(tmp_path, 2, [0], [1], extra=extra) as (ring, proxy):
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", proxy.port))
        other = proxy.conn(user=None)
        request = b"".join(ber.message(i, ber.search_op(SUFFIX, attrs=("*",))) for i in range(1, 4001))
        slow.settimeout(30)
        sender = threading.Thread(target=lambda: slow.sendall(request))
        sender.start()
        worst = 0.0
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end and "client disconnected" not in proxy.logs():
            t0 = time.monotonic()
            assert other.search(PEOPLE, "(uid=alice)", attributes=["cn"]), other.result
            worst = max(worst, time.monotonic() - t0)
        sender.join(30)
        assert "client disconnected" in proxy.logs(), proxy.logs()
        assert worst < 1.0, worst
        # The slow client's connection is closed: reading drains to its end.
        slow.settimeout(10)
        got = 0
        while True:
            try:
                chunk = slow.recv(1 << 20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += len(chunk)
        assert got < 64 << 20
        assert other.search(PEOPLE, "(uid=bob)", attributes=["cn"]), other.result


def test_starttls_waits_for_outstanding_operations_and_refuses_data_before_the_handshake(tmp_path):
    import ber
    from test_tls import Pki
    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("proxy", "/O=Pando Test/CN=localhost", server=True)
    extra = 'tls_cert_file = "%s"\ntls_key_file = "%s"\n' % (cert, key)
    start_tls = ber.message(9, ber.tlv(0x77, ber.tlv(0x80, b"1.3.6.1.4.1.1466.20037")))
    search = ber.message(1, ber.search_op(PEOPLE, filt=ber.f_eq("uid", "alice"), attrs=("cn",)))

    with proxied_ring(tmp_path, 2, [0], [1], extra=extra) as (ring, proxy):
        # A search outstanding (its replica stopped): StartTLS is refused,
        # the connection stays plain and the search is answered later.
        os.kill(ring.nodes[1].proc.pid, signal.SIGSTOP)
        try:
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            s.sendall(search + start_tls)
            got = answers(s, 1, secs=3)
            assert got.get(9, {}).get("code") == 1, got
        finally:
            os.kill(ring.nodes[1].proc.pid, signal.SIGCONT)
        got = answers(s, 1)
        assert 1 in got, got
        s.close()
        # Bytes after StartTLS before the handshake: not TLS, the
        # connection ends with a notice of disconnection.
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        s.sendall(start_tls + search)
        got = answers(s, 1)
        assert 0 in got and got[0]["code"] == 2, got
        assert s.recv(65536) == b""
        s.close()
