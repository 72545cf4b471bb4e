"""Hostile clients against content synchronization, the changes-behind
count and translucency (issue 37, items 5-7): what an ordinary or anonymous
client can make the server read or reveal there is bounded and checked
before the work.

- A multi-provider refresh names deleted entries only within the search's
  base and scope and only those the requester may read.
- A subtree rename followed by content synchronization sessions is walked
  off the async workers: an unrelated search stays prompt.
- The changes-behind count looks at a bounded number of operations.
- A translucent suffix reads its remote only after the base's access check,
  under the search threads, over a bounded pool of connections."""

import threading
import time

import pytest

import ber
from conftest import SUFFIX, Pando, ldif_entry, server_with

SYNC_REQUEST = "1.3.6.1.4.1.4203.1.9.1.1"
SYNC_STATE = "1.3.6.1.4.1.4203.1.9.1.2"
CHANGES_BEHIND = "2.25.15972167931155808496075090497880241257.1.2"
PW = "reader-secret"
OU_A = "ou=A," + SUFFIX
OU_B = "ou=B," + SUFFIX
SECRET = "ou=Secret," + SUFFIX
READER = "uid=reader," + OU_A

RULES = """
[[access]]
dn = "ou=Secret,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }]

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""


def ou(dn):
    return (dn, {"objectClass": ["organizationalUnit"], "ou": [dn.split(",")[0][3:]]})


def device(dn):
    return (dn, {"objectClass": ["device"], "cn": [dn.split(",")[0][3:]]})


def parts(raw):
    return ber.children(raw, 0, len(raw))


def sync_state(msg):
    """(state, uuid) of an entry's Sync State control."""
    for _, c in parts(msg["controls"] or b""):
        p = parts(c)
        if p[0][1].decode() == SYNC_STATE:
            value = next(v for t, v in p[1:] if t == 0x04)
            fields = parts(parts(value)[0][1])
            return int.from_bytes(fields[0][1], "big"), fields[1][1]
    raise AssertionError("no sync state control: %r" % msg)


def sync_refresh(srv, dn, pw, base, timeout=30):
    """A refreshOnly content synchronization without a cookie, bound as
    `dn`: (DNs sent as deletes, DNs sent as adds, the done message)."""
    with srv.raw(timeout=timeout) as c:
        assert ber.simple_bind(c, dn, pw) == 0
        value = ber.seq(ber.enum(1))
        c.send(ber.message(2, ber.search_op(base, attrs=["1.1"]),
                           [ber.control(SYNC_REQUEST, False, value)]))
        deletes, adds = [], []
        while True:
            m = c.recv_msg(timeout=timeout)
            assert m is not None, "connection closed"
            if m["op"] == "searchDone":
                return deletes, adds, m
            if m["op"] == "entry":
                state, _ = sync_state(m)
                (deletes if state == 3 else adds).append(m["dn"].lower())


# ------------------------------------------------------------ item 6: deletes


@pytest.fixture
def multi(tmp_path):
    config = RULES + "\n[replication]\nserver_id = 1\nmulti_provider = true\n"
    entries = [ou(OU_A), ou(OU_B), ou(SECRET),
               (READER, {"objectClass": ["inetOrgPerson"], "uid": ["reader"], "cn": ["R"],
                         "sn": ["R"], "userPassword": [PW]})]
    entries += [device("cn=%s1,%s" % (n, b)) for n, b in (("a", OU_A), ("b", OU_B), ("s", SECRET))]
    s = server_with(tmp_path, "multi", config, entries)
    yield s
    s.stop_and_verify()


def test_multi_provider_refresh_names_only_deletes_in_scope_and_readable(multi):
    for dn in ("cn=a1," + OU_A, "cn=b1," + OU_B, "cn=s1," + SECRET):
        rc, _, err = multi.ldap("ldapdelete", dn)
        assert rc == 0, err
    # The reader, searching ou=A: only the delete below ou=A.
    deletes, adds, done = sync_refresh(multi, READER, PW, OU_A)
    assert done["code"] == 0, done
    assert deletes == ["cn=a1," + OU_A.lower()], deletes
    assert READER.lower() in adds
    # The whole suffix: ou=B's too, never ou=Secret's (the reader may not
    # read it), whose entries are not sent either.
    deletes, adds, done = sync_refresh(multi, READER, PW, SUFFIX)
    assert done["code"] == 0, done
    assert sorted(deletes) == sorted(["cn=a1," + OU_A.lower(), "cn=b1," + OU_B.lower()]), deletes
    assert not any("ou=secret" in d for d in adds), adds
    # The administrator, who may read everything, is named every one.
    deletes, _, done = sync_refresh(multi, multi.admin_dn, multi.admin_pw, SUFFIX)
    assert done["code"] == 0, done
    assert len(deletes) == 3 and any("ou=secret" in d for d in deletes), deletes


# ------------------------------------------------------------ item 7: changes behind


def changes_behind(srv, dn, pw, csns):
    with srv.raw() as c:
        assert ber.simple_bind(c, dn, pw) == 0
        c.send(ber.message(2, ber.extended_op(CHANGES_BEHIND, ";".join(csns).encode())))
        m = c.recv_msg()
        return m["code"], m.get("value", b"").decode(), m["diag"]


def context_csns(srv):
    rc, entries, err = srv.search(SUFFIX, "(objectClass=*)", "contextCSN", scope="base")
    assert rc == 0, err
    return entries[0][1]["contextCSN"]


def test_changes_behind_count_is_bounded_per_call(tmp_path):
    config = RULES + "\n[replication]\nmax_changes_counted = 5\n"
    entries = [ou(OU_A), (READER, {"objectClass": ["inetOrgPerson"], "uid": ["reader"],
                                   "cn": ["R"], "sn": ["R"], "userPassword": [PW]})]
    srv = server_with(tmp_path, "behind", config, entries)
    try:
        start = context_csns(srv)
        adds = "\n".join(ldif_entry(*device("cn=d%d,%s" % (i, OU_A))) for i in range(20))
        rc, _, err = srv.ldap("ldapadd", input=adds)
        assert rc == 0, err
        near = context_csns(srv)
        rc, _, err = srv.ldap("ldapadd", input=ldif_entry(*device("cn=last," + OU_A)))
        assert rc == 0, err
        # Far behind: 20+ operations, counted only up to 5 (a lower bound).
        code, text, diag = changes_behind(srv, READER, PW, start)
        assert code == 0, diag
        assert text == "sid=000 changes>=5\n", text
        # Nearly in step: the count starts at the CSN asked about, and is
        # exact however long the log is.
        code, text, diag = changes_behind(srv, READER, PW, near)
        assert code == 0, diag
        assert text == "sid=000 changes=1\n", text
    finally:
        srv.stop_and_verify()


# ------------------------------------------------------------ item 5: translucency

PEOPLE = "ou=People," + SUFFIX


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A Pando readable anonymously: the translucent suffix's remote."""
    from conftest import PUBLIC_READ
    entries = [ou(PEOPLE)] + [
        ("uid=u%d,%s" % (i, PEOPLE), {"objectClass": ["inetOrgPerson"], "uid": ["u%d" % i],
                                     "cn": ["U%d" % i], "sn": ["U"]}) for i in range(200)]
    config = PUBLIC_READ + "\n[limits.anonymous]\nsize_limit = 0\n"
    s = server_with(tmp_path_factory.mktemp("remote"), "remote", config, entries)
    yield s
    s.stop_and_verify()


def translucent_front(base, remote_port, extra=""):
    """A Pando (the built-in access rules: only authenticated users read)
    serving the suffix from `remote_port` through a counting proxy."""
    from links import Link
    link = Link(remote_port)
    config = """
[[overlay]]
type = "translucent"
suffix = "%s"
uri = "%s"
bind_method = "none"
local_attributes = ["description"]
timeout_secs = 5
%s""" % (SUFFIX, link.url, extra)
    return Pando(base, config=config, name="front").start(), link


def remote_connections(link):
    """Connections the proxy has accepted so far (each adds two sockets)."""
    with link.lock:
        return len(link.open) // 2


def test_translucent_search_refused_before_any_remote_read(remote, tmp_path):
    front, link = translucent_front(tmp_path, remote.port)
    try:
        # Anonymous, a subtree search filtering on a local attribute: the
        # base's search right is refused before the remote is asked.
        for _ in range(5):
            rc, entries, _ = front.search(PEOPLE, "(description=x)", auth=None)
            assert rc == 32 and entries == [], (rc, entries)
        assert remote_connections(link) == 0
        # The administrator reads through the same remote.
        rc, entries, err = front.search(PEOPLE, "(objectClass=person)", "uid")
        assert rc == 0, err
        assert len(entries) == 200
        assert remote_connections(link) == 1
    finally:
        front.stop_and_verify()
        link.close()


def test_translucent_searches_share_a_bounded_pool_of_remote_connections(remote, tmp_path):
    front, link = translucent_front(tmp_path, remote.port, "max_connections = 2\n")
    results, lock = [], threading.Lock()

    def client():
        with front.raw(timeout=30) as c:
            assert ber.simple_bind(c, front.admin_dn, front.admin_pw) == 0
            for i in range(3):
                c.send(ber.message(2 + i, ber.search_op(PEOPLE, filt=ber.f_present("uid"),
                                                        attrs=["uid"])))
                n = 0
                while True:
                    m = c.recv_msg(timeout=30)
                    assert m is not None
                    if m["op"] == "searchDone":
                        break
                    n += 1
                with lock:
                    results.append((m["code"], n))

    try:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 24, results
        assert all(r == (0, 200) for r in results), results
        assert 1 <= remote_connections(link) <= 2
    finally:
        front.stop_and_verify()
        link.close()


# ------------------------------------------------------------ item 6: the persist walk

BIG = "ou=Big," + SUFFIX
WALKED = 4000
SESSIONS = 16


@pytest.fixture
def big(tmp_path):
    # Not durable: only the loading's speed changes.
    s = Pando(tmp_path, config=RULES + '\n[store]\ndurability = "none"\n', name="big").start()
    s.bulk_add([ou(BIG)] + [device("cn=d%d,%s" % (i, BIG)) for i in range(WALKED)])
    yield s
    s.stop_and_verify()


def open_persist(srv):
    """A refreshAndPersist session of the suffix matching nothing (so the
    walk after a rename sends nothing but its new cookie), past its
    refresh."""
    c = srv.raw(timeout=60)
    assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
    c.send(ber.message(2, ber.search_op(SUFFIX, filt=ber.f_eq("cn", "no-such-device"),
                                        attrs=["1.1"]),
                       [ber.control(SYNC_REQUEST, False, ber.seq(ber.enum(3)))]))
    m = c.recv_msg(timeout=60)
    assert m is not None and m["op"] == "intermediate", m
    return c


def probe_latencies(srv, stop, out):
    """Base searches of the suffix one after another on a connection of
    their own until `stop`: each one's latency."""
    with srv.raw(timeout=30) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        i = 2
        while not stop.is_set():
            t0 = time.monotonic()
            c.send(ber.message(i, ber.search_op(SUFFIX, scope=0, attrs=["1.1"])))
            while True:
                m = c.recv_msg(timeout=30)
                if m["op"] == "searchDone":
                    break
            out.append(time.monotonic() - t0)
            i += 1
            time.sleep(0.002)


def test_a_subtree_rename_walked_for_sync_sessions_does_not_stall_other_clients(big):
    sessions = [open_persist(big) for _ in range(SESSIONS)]
    try:
        stop, latencies = threading.Event(), []
        probe = threading.Thread(target=probe_latencies, args=(big, stop, latencies))
        probe.start()
        time.sleep(0.3)
        before = len(latencies)
        rc, _, err = big.ldap("ldapmodrdn", "-r", BIG, "ou=Big2")
        assert rc == 0, err
        # Each session walks the moved subtree, then sends its new cookie.
        t0 = time.monotonic()
        for c in sessions:
            m = c.recv_msg(timeout=60)
            assert m is not None and m["op"] == "intermediate", m
        walked = time.monotonic() - t0
        time.sleep(0.1)
        stop.set()
        probe.join(30)
        during = latencies[before:]
        assert during, "no probe answered"
        worst = max(during)
        print("walks took %.3fs; probe worst %.3fs over %d" % (walked, worst, len(during)))
        assert worst < 0.4, "an unrelated search waited %.3fs while sessions walked" % worst
    finally:
        for c in sessions:
            c.close()
