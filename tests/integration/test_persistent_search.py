"""Persistent search (draft-ietf-ldapext-psearch-03) with entry change
notification, on the change feed: changes arrive in commit order while
writes run; base, scope, filter, change types and access decide what a
client sees; a client that stops reading cannot stall writes and is ended
with adminLimitExceeded; Abandon and Cancel end it; the change log keeps
each change and survives a restart. OpenLDAP has no persistent search
(its replacement is RFC 4533), so there is no differential case: clients
are ldapsearch (`-E ps=`), raw BER and Java JNDI's event listeners."""

import base64
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import ber
from conftest import SUFFIX, server_with

pytestmark = pytest.mark.skipif(not shutil.which("ldapsearch"), reason="ldap-utils not installed")

PEOPLE = "ou=People," + SUFFIX
SECRET = "ou=Secret," + SUFFIX
ALICE = "uid=alice," + PEOPLE
PS_OID = "2.16.840.1.113730.3.4.3"
ECN_OID = "2.16.840.1.113730.3.4.7"
CANCEL_OID = "1.3.6.1.1.8"
ADD, DELETE, MODIFY, MODDN = 1, 2, 4, 8

CONFIG = """
[limits]
max_persistent_searches = 4
persistent_search_reserve = 0
persistent_search_backlog = 16

[[access]]
dn = "ou=Secret,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }]

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""


def person(uid, sn="Person", **extra):
    a = {"objectClass": ["inetOrgPerson"], "uid": [uid], "cn": [uid.title()], "sn": [sn]}
    a.update(extra)
    return a


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    entries = [
        (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
        (SECRET, {"objectClass": ["organizationalUnit"], "ou": ["Secret"]}),
        (ALICE, person("alice", userPassword=["alice-pw"])),
    ] + [("uid=p%d,%s" % (i, PEOPLE), person("p%d" % i)) for i in range(8)]
    s = server_with(tmp_path_factory.mktemp("psearch"), "psearch", CONFIG, entries)
    yield s
    s.stop_and_verify()


def ps_control(types=ADD | DELETE | MODIFY | MODDN, changes_only=True, ecs=True, critical=True):
    value = ber.seq(ber.integer(types), ber.boolean(changes_only), ber.boolean(ecs))
    return ber.control(PS_OID, critical=critical, value=value)


def controls_of(msg):
    """{oid: value bytes or None} of a message's controls."""
    raw = msg.get("controls")
    out = {}
    if not raw:
        return out
    for _, c in ber.children(raw, 0, len(raw)):
        parts = ber.children(c, 0, len(c))
        oid = parts[0][1].decode()
        value = next((v for t, v in parts[1:] if t == 0x04), None)
        out[oid] = value
    return out


def entry_change(value):
    """(changeType, previousDN or None) of an entry change notification."""
    _, s, e = ber.read_tlv(value, 0)
    parts = ber.children(value, s, e)
    kind = int.from_bytes(parts[0][1], "big")
    previous = next((v.decode() for t, v in parts[1:] if t == 0x04), None)
    return kind, previous


def open_psearch(s, base=SUFFIX, scope=ber.SCOPE_SUB, filt=None, attrs=(), who=None, msgid=2,
                 rcvbuf=None, **ps):
    """A raw connection bound as `who` ((dn, password); admin by default)
    with a persistent search outstanding as `msgid`."""
    c = s.raw(timeout=30, rcvbuf=rcvbuf)
    dn, pw = who or (s.admin_dn, s.admin_pw)
    assert ber.simple_bind(c, dn, pw) == 0
    c.send(ber.message(msgid, ber.search_op(base, scope=scope, filt=filt, attrs=attrs),
                       controls=[ps_control(**ps)]))
    return c


def open_searches(s):
    rc, entries, err = s.search("cn=Changes,cn=Monitor", "(objectClass=*)",
                                "pandoPersistentSearches", scope="base")
    assert rc == 0, err
    return int(entries[0][1]["pandoPersistentSearches"][0])


def wait_open(s, n, timeout=10.0):
    """Wait until exactly `n` persistent searches are open (the server
    subscribes them on their own task)."""
    deadline = time.monotonic() + timeout
    while open_searches(s) != n:
        assert time.monotonic() < deadline, "persistent searches open: %d, wanted %d" % (open_searches(s), n)
        time.sleep(0.05)


def wait_for_text(path, done, timeout, proc=None):
    """Wait until done(the text of path) holds; fail showing the text, also
    when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while not done(path.read_text()):
        assert proc is None or proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)


def modify(s, dn, attr, value, auth="admin"):
    rc, _, err = s.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: %s\n%s: %s\n"
                        % (dn, attr, attr, value), auth=auth)
    assert rc == 0, err


def ldif(s, text):
    rc, out, err = s.ldap("ldapmodify", "-a", input=text)
    assert rc == 0, err
    return out


def entries_until(c, n, timeout=20.0):
    """The next `n` search entries (fails on anything else)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        m = c.recv_msg(timeout=max(0.1, deadline - time.monotonic()))
        assert m is not None, "connection closed after %d entries" % len(got)
        assert m["op"] == "entry", "expected an entry, got %r" % m
        got.append(m)
    return got


def nothing_more(c, wait=1.0):
    try:
        m = c.recv_msg(timeout=wait)
    except socket.timeout:
        return True
    raise AssertionError("unexpected message %r" % m)


def test_ldapsearch_sees_each_kind_of_change_with_its_notification(srv):
    ldif(srv, "dn: uid=z0,%s\nobjectClass: inetOrgPerson\nuid: z0\ncn: Z0\nsn: Zero\n" % PEOPLE)
    out = Path(srv.base) / "ps.out"
    with open(out, "w") as f:
        p = subprocess.Popen(["ldapsearch", "-x", "-H", srv.url, "-D", srv.admin_dn, "-w", srv.admin_pw,
                              "-o", "ldif-wrap=no", "-b", PEOPLE, "-E", "!ps=15/0/1",
                              "(uid=z*)", "cn", "sn"], stdout=f, stderr=subprocess.STDOUT)
    try:
        # The initial results first (changesOnly false).
        wait_for_text(out, lambda t: "uid=z0" in t, 10, p)
        wait_open(srv, 1)
        ldif(srv, "dn: uid=p0,%s\nchangetype: modify\nreplace: sn\nsn: NotShown\n\n"
                  "dn: uid=z1,%s\nobjectClass: inetOrgPerson\nuid: z1\ncn: Z1\nsn: One\n\n"
                  "dn: uid=z1,%s\nchangetype: modify\nreplace: sn\nsn: Uno\n\n"
                  "dn: uid=z1,%s\nchangetype: modrdn\nnewrdn: uid=z2\ndeleteoldrdn: 1\n\n"
                  "dn: uid=z2,%s\nchangetype: delete\n"
                  % (PEOPLE, PEOPLE, PEOPLE, PEOPLE, PEOPLE))
        wait_for_text(out, lambda t: t.count("persistentSearch:") >= 4, 10, p)
    finally:
        p.kill()
        p.wait()
    text = out.read_text()
    # Without -L, ldapsearch prints each entry's controls and change type.
    blocks = [b for b in text.split("\n\n") if re.search("^dn: ", b, re.M)]
    dns = [re.search("^dn: .*", b, re.M).group(0) for b in blocks]
    assert dns == ["dn: uid=z0," + PEOPLE] + ["dn: uid=z1," + PEOPLE] * 2 + ["dn: uid=z2," + PEOPLE] * 2, text
    assert "persistentSearch:" not in blocks[0]
    changes = blocks[1:]
    kinds = [re.search(r"^persistentSearch: (\w+)", b, re.M).group(1) for b in changes]
    assert kinds == ["add", "modify", "moddn", "delete"], text
    assert "sn: Uno" in changes[1] and "sn: Uno" in changes[3], text
    ecn = re.search(r"^control: %s false (\S+)" % re.escape(ECN_OID), changes[2], re.M).group(1)
    assert entry_change(base64.b64decode(ecn)) == (MODDN, "uid=z1," + PEOPLE)
    assert "NotShown" not in text
    wait_open(srv, 0)


def test_concurrent_writes_arrive_once_each_in_commit_order(srv):
    writers, per_writer = 4, 40
    with open_psearch(srv, base=PEOPLE, attrs=["entryCSN", "description"]) as c:
        wait_open(srv, 1)
        errors = []

        # Each writer is an ldapmodify process (its changes in order on one
        # connection): writer threads of this process would hold the
        # interpreter's lock the reader needs, and on a busy machine let it
        # fall the server's backlog (16) behind.
        def write(w):
            dn = "uid=p%d,%s" % (w, PEOPLE)
            text = "".join("dn: %s\nchangetype: modify\nreplace: description\ndescription: w%d-%d\n\n"
                           % (dn, w, i) for i in range(per_writer))
            rc, _, err = srv.ldap("ldapmodify", input=text)
            if rc != 0:
                errors.append(err)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        got = entries_until(c, writers * per_writer, timeout=120)
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]
        csns = [m["attrs"]["entryCSN"][0] for m in got]
        assert csns == sorted(csns) and len(set(csns)) == len(csns), "not in commit order"
        # Each writer's own changes in the order it made them.
        for w in range(writers):
            mine = [m["attrs"]["description"][0].decode() for m in got if m["dn"] == "uid=p%d,%s" % (w, PEOPLE)]
            assert mine == ["w%d-%d" % (w, i) for i in range(per_writer)]
        assert all(entry_change(controls_of(m)[ECN_OID])[0] == MODIFY for m in got)
        assert nothing_more(c, 0.5)


def test_base_scope_filter_types_and_access_decide_what_is_sent(srv):
    alice = (ALICE, "alice-pw")
    one = ber.SCOPE_ONE
    filt = ber.f_substr("sn", initial="Keep")
    with open_psearch(srv, who=alice, filt=filt, types=ADD | DELETE, msgid=3) as c, \
            open_psearch(srv, base=SUFFIX, scope=one, msgid=4) as top:
        wait_open(srv, 2)
        ldif(srv, "dn: uid=k1,%s\nobjectClass: inetOrgPerson\nuid: k1\ncn: K1\nsn: Keep\n\n"
                  "dn: uid=k2,%s\nobjectClass: inetOrgPerson\nuid: k2\ncn: K2\nsn: Keep\n\n"
                  "dn: uid=o1,%s\nobjectClass: inetOrgPerson\nuid: o1\ncn: O1\nsn: Other\n\n"
                  "dn: uid=k1,%s\nchangetype: modify\nreplace: description\ndescription: m\n\n"
                  "dn: uid=k1,%s\nchangetype: delete\n\n"
                  "dn: ou=Later,%s\nobjectClass: organizationalUnit\nou: Later\n"
                  % (PEOPLE, SECRET, PEOPLE, PEOPLE, PEOPLE, SUFFIX))
        got = entries_until(c, 2)
        # alice: only adds and deletes, only sn=Keep*, never under ou=Secret.
        assert [(m["dn"], entry_change(controls_of(m)[ECN_OID])[0]) for m in got] == \
            [("uid=k1," + PEOPLE, ADD), ("uid=k1," + PEOPLE, DELETE)]
        assert nothing_more(c)
        # One level below the suffix: only ou=Later.
        [later] = entries_until(top, 1)
        assert later["dn"] == "ou=Later," + SUFFIX
        assert nothing_more(top, 0.3)


def test_entries_leaving_the_result_set_are_reported(srv):
    # A modify that makes an entry stop matching, and a rename out of
    # scope, are sent (as the entry now is) so that a client keeping
    # copies learns they left; later changes to them are not.
    alice = (ALICE, "alice-pw")
    ldif(srv, "dn: ou=Moved,%s\nobjectClass: organizationalUnit\nou: Moved\n\n"
              "dn: uid=l1,%s\nobjectClass: inetOrgPerson\nuid: l1\ncn: L1\nsn: Stay\n\n"
              "dn: uid=l2,%s\nobjectClass: inetOrgPerson\nuid: l2\ncn: L2\nsn: Stay\n"
              % (SUFFIX, PEOPLE, PEOPLE))
    filt = ber.f_eq("sn", "Stay")
    with open_psearch(srv, who=alice, base=PEOPLE, filt=filt, attrs=["sn"]) as c:
        wait_open(srv, 1)
        ldif(srv, "dn: uid=l1,%s\nchangetype: modify\nreplace: sn\nsn: Gone\n\n"
                  "dn: uid=l1,%s\nchangetype: modify\nreplace: sn\nsn: StillGone\n\n"
                  "dn: uid=l2,%s\nchangetype: modrdn\nnewrdn: uid=l2\ndeleteoldrdn: 1\n"
                  "newsuperior: ou=Moved,%s\n\n"
                  "dn: uid=l2,ou=Moved,%s\nchangetype: modify\nreplace: sn\nsn: Elsewhere\n"
                  % (PEOPLE, PEOPLE, PEOPLE, SUFFIX, SUFFIX))
        left, moved = entries_until(c, 2)
        assert left["dn"] == "uid=l1," + PEOPLE and left["attrs"] == {"sn": [b"Gone"]}
        assert entry_change(controls_of(left)[ECN_OID]) == (MODIFY, None)
        assert moved["dn"] == "uid=l2,ou=Moved," + SUFFIX
        assert entry_change(controls_of(moved)[ECN_OID]) == (MODDN, "uid=l2," + PEOPLE)
        assert nothing_more(c)
        # Moved into ou=Secret, which alice may not read: nothing is sent,
        # neither the entry nor where it went.
        ldif(srv, "dn: uid=l3,%s\nobjectClass: inetOrgPerson\nuid: l3\ncn: L3\nsn: Stay\n" % PEOPLE)
        [added] = entries_until(c, 1)
        assert added["dn"] == "uid=l3," + PEOPLE
        ldif(srv, "dn: uid=l3,%s\nchangetype: modrdn\nnewrdn: uid=l3\ndeleteoldrdn: 1\n"
                  "newsuperior: %s\n" % (PEOPLE, SECRET))
        assert nothing_more(c)


def test_a_client_that_stops_reading_cannot_stall_writes(srv):
    # A small receive buffer, and nothing read while 1,500 changes of 16 KB
    # are made (far more than the socket buffers and the connection's queue
    # hold): the writes go on; once the client reads again it gets what was
    # queued, then adminLimitExceeded (it fell more than the backlog of 16
    # operations behind).
    c = open_psearch(srv, base=PEOPLE, rcvbuf=4096, msgid=5)
    try:
        wait_open(srv, 1)
        big = "x" * 16000
        conn = srv.conn()
        started = time.monotonic()
        for i in range(1500):
            assert conn.modify("uid=p1," + PEOPLE, {"description": [("MODIFY_REPLACE", ["%d %s" % (i, big)])]}), conn.result
        took = time.monotonic() - started
        conn.unbind()
        msgs, _ = c.drain(timeout=30, limit=2000)
        done = [m for m in msgs if m["op"] == "searchDone"]
        assert done, "no SearchResultDone after %d messages" % len(msgs)
        assert done[0]["code"] == 11 and "persistent_search_backlog" in done[0]["diag"], done[0]
        entries = [m for m in msgs if m["op"] == "entry"]
        assert 0 < len(entries) < 1500
        wait_open(srv, 0)
    finally:
        c.close()
    # For comparison (printed with -s, not asserted: timing is noisy here).
    conn = srv.conn()
    started = time.monotonic()
    for i in range(1500):
        assert conn.modify("uid=p1," + PEOPLE, {"description": [("MODIFY_REPLACE", ["%d %s" % (i, big)])]})
    conn.unbind()
    print("1,500 modifies: %.2f s with a stalled persistent search, %.2f s with none"
          % (took, time.monotonic() - started))


def test_abandon_and_cancel_end_it(srv):
    with open_psearch(srv, base=PEOPLE, msgid=2) as c:
        wait_open(srv, 1)
        c.send(ber.message(3, ber.abandon_op(2)))
        wait_open(srv, 0)
        modify(srv, "uid=p2," + PEOPLE, "description", "after abandon")
        assert nothing_more(c, 0.5)
        c.send(ber.message(4, ber.search_op(PEOPLE), controls=[ps_control()]))
        wait_open(srv, 1)
        c.send(ber.message(5, ber.extended_op(CANCEL_OID, ber.seq(ber.integer(4)))))
        first, second = c.recv_msg(), c.recv_msg()
        by_id = {first["id"]: first, second["id"]: second}
        assert by_id[4]["op"] == "searchDone" and by_id[4]["code"] == 118, by_id
        assert by_id[5]["code"] == 0, by_id
        wait_open(srv, 0)


def test_refusals(srv):
    with srv.raw() as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        cases = [
            (2, "cn=Monitor", [ps_control()], 53),
            (3, "ou=Nowhere," + SUFFIX, [ps_control()], 32),
            (4, PEOPLE, [ps_control(), ber.control("1.2.840.113556.1.4.319", value=ber.seq(ber.integer(5), ber.octets("")))], 53),
        ]
        for msgid, base, controls, code in cases:
            c.send(ber.message(msgid, ber.search_op(base), controls=controls))
            m = c.recv_msg()
            assert (m["id"], m["op"], m["code"]) == (msgid, "searchDone", code), m
        # Anonymous clients may not hold one open.
        with srv.raw() as anon:
            anon.send(ber.message(1, ber.search_op(PEOPLE), controls=[ps_control()]))
            m = anon.recv_msg()
            assert (m["op"], m["code"]) == ("searchDone", 53) and "authenticated" in m["diag"], m
        # A malformed value is a protocolError.
        c.send(ber.message(5, ber.search_op(PEOPLE), controls=[ber.control(PS_OID, True, b"\x30\x00")]))
        m = c.recv_msg()
        assert m["code"] == 2, m
    # At most limits.max_persistent_searches (4) at once.
    conns = [open_psearch(srv, base=PEOPLE, msgid=2) for _ in range(4)]
    try:
        wait_open(srv, 4)
        with open_psearch(srv, base=PEOPLE, msgid=7) as extra:
            m = extra.recv_msg()
            assert (m["id"], m["code"]) == (7, 11) and "max_persistent_searches" in m["diag"], m
    finally:
        for c in conns:
            c.close()
    wait_open(srv, 0)


def test_the_change_log_is_kept_and_survives_a_restart(srv):
    def log():
        rc, entries, err = srv.search("cn=Changes,cn=Monitor", "(objectClass=*)", scope="base")
        assert rc == 0, err
        a = entries[0][1]
        return int(a["pandoChangeLogRecords"][0]), a.get("pandoChangeLogOldestCSN", [None])[0]

    before, _ = log()
    ldif(srv, "".join("dn: uid=t%d,%s\nobjectClass: inetOrgPerson\nuid: t%d\ncn: T\nsn: T\n\n"
                      % (i, PEOPLE, i) for i in range(3)))
    ldif(srv, "".join("dn: uid=t%d,%s\nchangetype: delete\n\n" % (i, PEOPLE) for i in range(3)))
    count, oldest = log()
    assert count == before + 6 and oldest and "#" in oldest
    # A persistent search open at shutdown is told so at once.
    try:
        with open_psearch(srv, base=PEOPLE) as c:
            wait_open(srv, 1)
            started = time.monotonic()
            srv.stop()
            m = c.recv_msg()
            assert (m["op"], m["code"]) == ("searchDone", 52), m
            assert time.monotonic() - started < 4
    finally:
        if not srv.alive():
            srv.start()
    assert log() == (count, oldest)


JAVA_DIR = Path(__file__).resolve().parent / "java"


@pytest.mark.skipif(not shutil.which("javac"), reason="no JDK")
def test_jndi_event_listener(srv, tmp_path):
    # JNDI's EventDirContext listens with a persistent search (changesOnly,
    # with entry change notifications) and reports typed events.
    subprocess.run(["javac", "-d", str(tmp_path), str(JAVA_DIR / "Listen.java")], check=True, timeout=120)
    out = tmp_path / "events.txt"
    with open(out, "w") as f:
        p = subprocess.Popen(["java", "-cp", str(tmp_path), "Listen", srv.url, srv.admin_dn, srv.admin_pw, PEOPLE],
                             stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while open_searches(srv) < 1:
            assert p.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        ldif(srv, "dn: uid=j1,%s\nobjectClass: inetOrgPerson\nuid: j1\ncn: J1\nsn: J\n\n"
                  "dn: uid=j1,%s\nchangetype: modify\nreplace: sn\nsn: JJ\n\n"
                  "dn: uid=j1,%s\nchangetype: modrdn\nnewrdn: uid=j2\ndeleteoldrdn: 1\n\n"
                  "dn: uid=j2,%s\nchangetype: delete\n" % (PEOPLE, PEOPLE, PEOPLE, PEOPLE))
        wait_for_text(out, lambda t: t.count("\n") >= 4, 20, p)
    finally:
        p.kill()
        p.wait()
    lines = out.read_text().splitlines()
    assert lines[:4] == [
        "added uid=j1,ou=People,dc=example,dc=com",
        "changed uid=j1,ou=People,dc=example,dc=com",
        "renamed uid=j1,ou=People,dc=example,dc=com -> uid=j2,ou=People,dc=example,dc=com",
        "removed uid=j2,ou=People,dc=example,dc=com",
    ], lines


def test_matched_values_apply_to_changes(srv):
    # The search hooks' per-entry steps apply to changes as to stored
    # entries: only description values equal to "keep" go out.
    mv = ber.control("1.2.826.0.1.3344810.2.3", value=ber.seq(ber.f_eq("description", "keep")))
    with srv.raw(timeout=30) as c:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
        c.send(ber.message(2, ber.search_op(PEOPLE, attrs=["description"]), controls=[ps_control(), mv]))
        wait_open(srv, 1)
        ldif(srv, "dn: uid=p3,%s\nchangetype: modify\nreplace: description\ndescription: keep\n"
                  "description: drop\n" % PEOPLE)
        [m] = entries_until(c, 1)
        assert m["attrs"] == {"description": [b"keep"]}, m
        c.send(ber.message(3, ber.abandon_op(2)))
    wait_open(srv, 0)
