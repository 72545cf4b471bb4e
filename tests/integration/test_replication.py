"""Replication (RFC 4533 with OpenLDAP's conventions): server IDs in CSNs,
contextCSN per server ID on suffix entries, the change log, and Pando as a
provider — checked on the wire with raw BER, and against real consumers:
OpenLDAP's slapd (`syncrepl`) and python-ldap's SyncreplConsumer."""

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ber
from conftest import (ADMIN_DN, PANDO_BIN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, free_port,
                      parse_ldif, wait_port)

SYNC_REQUEST = "1.3.6.1.4.1.4203.1.9.1.1"
SYNC_STATE = "1.3.6.1.4.1.4203.1.9.1.2"
SYNC_DONE = "1.3.6.1.4.1.4203.1.9.1.3"
SYNC_INFO = "1.3.6.1.4.1.4203.1.9.1.4"
PAGED = "1.2.840.113556.1.4.319"
GROUPS = "ou=Groups," + SUFFIX
SLAPD = "/usr/sbin/slapd"
HAVE_SLAPD = Path(SLAPD).exists() and shutil.which("ldapsearch") is not None


def attrs_of(srv, dn, *names):
    rc, entries, err = srv.search(dn, "(objectClass=*)", *names, scope="base")
    assert rc == 0, err
    return entries[0][1]


def modify(srv, text, url=None):
    rc, out, err = srv.ldap("ldapmodify", input=text, url=url)
    assert rc == 0, (out, err)


# ------------------------------------------------------------ wire helpers
# Decoders written here from RFC 4533's ASN.1, independent of the server's.


def parts(raw):
    return ber.children(raw, 0, len(raw))


def controls_of(msg):
    """[(oid, value bytes or None)] of a decoded message."""
    raw = msg.get("controls")
    if not raw:
        return []
    out = []
    for _, c in parts(raw):
        p = parts(c)
        oid = p[0][1].decode()
        value = next((v for t, v in p[1:] if t == 0x04), None)
        out.append((oid, value))
    return out


def sync_state(msg):
    states = [v for oid, v in controls_of(msg) if oid == SYNC_STATE]
    assert len(states) == 1, msg
    p = parts(parts(states[0])[0][1])
    state = int.from_bytes(p[0][1], "big")
    uuid = p[1][1]
    cookie = p[2][1].decode() if len(p) > 2 else None
    return state, uuid, cookie


def sync_done(msg):
    done = [v for oid, v in controls_of(msg) if oid == SYNC_DONE]
    assert len(done) == 1, msg
    cookie, deletes = None, False
    for t, v in parts(parts(done[0])[0][1]):
        if t == 0x04:
            cookie = v.decode()
        elif t == 0x01:
            deletes = v != b"\x00"
    return cookie, deletes


def sync_info(msg):
    """(kind, cookie, flag, uuids): kind one of newcookie, refreshDelete,
    refreshPresent, syncIdSet; flag is refreshDone or refreshDeletes."""
    assert msg.get("name") == SYNC_INFO, msg
    tag, body = parts(msg["value"])[0]
    if tag == 0x80:
        return "newcookie", body.decode(), None, []
    cookie, flag, uuids = None, {0xA3: False}.get(tag, True), []
    for t, v in parts(body):
        if t == 0x04:
            cookie = v.decode()
        elif t == 0x01:
            flag = v != b"\x00"
        elif t == 0x31:
            uuids = [u for _, u in parts(v)]
    return {0xA1: "refreshDelete", 0xA2: "refreshPresent", 0xA3: "syncIdSet"}[tag], cookie, flag, uuids


def sync_control(mode, cookie=None, reload_hint=False):
    value = ber.enum(mode)
    if cookie is not None:
        value += ber.octets(cookie)
    if reload_hint:
        value += ber.boolean(True)
    return ber.control(SYNC_REQUEST, False, ber.seq(value))


def uuid_text(raw):
    h = raw.hex()
    return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def uuid_bytes(text):
    return bytes.fromhex(text.replace("-", ""))


def open_sync(srv, mode=1, cookie=None, base=SUFFIX, filt=None, reload_hint=False, auth=True,
              extra_controls=(), deref=0):
    c = srv.raw(timeout=30)
    if auth:
        assert ber.simple_bind(c, srv.admin_dn, srv.admin_pw) == 0
    op = ber.search_op(base, filt=filt, attrs=["*", "+"])
    if deref:
        # derefAliases is the third element of the SearchRequest.
        op = op.replace(ber.enum(0), ber.enum(deref), 1)
    c.send(ber.message(2, op, [sync_control(mode, cookie, reload_hint)] + list(extra_controls)))
    return c


def refresh(srv, cookie=None, **kw):
    """A refreshOnly search to its end: (messages before the done, done)."""
    with open_sync(srv, 1, cookie, **kw) as c:
        got = []
        while True:
            m = c.recv_msg(timeout=30)
            assert m is not None, "connection closed: %r" % got
            if m["op"] == "searchDone":
                return got, m
            got.append(m)


def summarise(msgs):
    """Entries by DN with their state, and UUIDs from syncIdSets."""
    entries, ids = {}, []
    for m in msgs:
        if m["op"] == "entry":
            state, uuid, _ = sync_state(m)
            assert len(uuid) == 16
            entries[m["dn"].lower()] = state
        else:
            kind, _, flag, uuids = sync_info(m)
            assert kind == "syncIdSet", kind
            ids.append((flag, uuids))
    return entries, ids


def uuid_of(srv, dn):
    return uuid_bytes(attrs_of(srv, dn, "entryUUID")["entryUUID"][0])


# ------------------------------------------------------------ server ID, contextCSN


@pytest.fixture
def sid42(tmp_path):
    s = Pando(tmp_path, demo=True, config=PUBLIC_READ + "\n[replication]\nserver_id = 42\n").start()
    yield s
    s.stop_and_verify()


def test_context_csn_follows_writes_per_server_id_and_survives_a_restart(sid42):
    srv = sid42
    dn = "uid=alice," + PEOPLE
    modify(srv, "dn: %s\nchangetype: modify\nreplace: description\ndescription: x\n" % dn)
    csn = attrs_of(srv, dn, "entryCSN")["entryCSN"][0]
    assert csn.split("#")[2] == "02a", csn
    ctx = attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"]
    # The demo tree was created before: its CSNs are this server's too.
    assert ctx == [csn], ctx
    # Only on suffix entries, and only when asked for (operational).
    assert "contextCSN" not in attrs_of(srv, PEOPLE, "+")
    assert "contextCSN" not in attrs_of(srv, SUFFIX)
    assert srv.stop() == 0
    srv.start()
    assert attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"] == [csn]
    modify(srv, "dn: %s\nchangetype: modify\nreplace: description\ndescription: y\n" % dn)
    after = attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"]
    assert len(after) == 1 and after[0] > csn
    # A filter on it works like any operational attribute's.
    rc, entries, err = srv.search(SUFFIX, "(contextCSN=%s)" % after[0], "1.1", scope="base")
    assert rc == 0 and len(entries) == 1, (rc, entries, err)


def test_a_server_id_out_of_range_is_refused(tmp_path):
    cfg = tmp_path / "pando.toml"
    cfg.write_text("[replication]\nserver_id = 4096\n")
    r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(tmp_path / "d"), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "replication.server_id" in r.stderr + r.stdout and "4095" in r.stderr + r.stdout


# ------------------------------------------------------------ provider, on the wire


def test_refresh_initial_then_delete_phase_then_nothing(fresh_server):
    srv = fresh_server
    msgs, done = refresh(srv)
    assert done["code"] == 0, done
    entries, ids = summarise(msgs)
    assert len(entries) == 19 and set(entries.values()) == {1} and not ids
    cookie, deletes = sync_done(done)
    # An initial load ends as OpenLDAP ends it: refreshDeletes TRUE.
    assert deletes and cookie.startswith("csn=") and "#000#" in cookie
    carol, erin = uuid_of(srv, "uid=carol," + PEOPLE), uuid_of(srv, "uid=erin," + PEOPLE)
    frank = uuid_of(srv, "uid=frank," + PEOPLE)
    modify(srv, "\n".join([
        "dn: uid=new1,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: new1\ncn: N\nsn: N\n" % PEOPLE,
        "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: changed\n" % PEOPLE,
        "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE,
        "dn: uid=bob,%s\nchangetype: modrdn\nnewrdn: uid=bobby\ndeleteoldrdn: 1\n" % PEOPLE,
        # Out of the search (base ou=People) by a move, and out of its
        # filter by a modify.
        "dn: uid=frank,%s\nchangetype: modrdn\nnewrdn: uid=frank\ndeleteoldrdn: 1\nnewsuperior: %s\n"
        % (PEOPLE, GROUPS),
        "dn: uid=erin,%s\nchangetype: modify\nreplace: description\ndescription: hidden\n" % PEOPLE,
    ]))
    filt = ber.f_not(ber.f_eq("description", "hidden"))
    # The cookie from a search of the whole suffix serves one of People.
    msgs, done = refresh(srv, cookie="rid=007," + cookie, base=PEOPLE, filt=filt)
    assert done["code"] == 0, done
    entries, ids = summarise(msgs)
    assert entries == {"uid=new1," + PEOPLE.lower(): 1, "uid=alice," + PEOPLE.lower(): 1,
                       "uid=bobby," + PEOPLE.lower(): 1}, entries
    assert all(flag for flag, _ in ids), ids
    gone = {u for _, us in ids for u in us}
    assert gone == {carol, erin, frank}, gone
    # Deletes come before the changed entries.
    first_entry = next(i for i, m in enumerate(msgs) if m["op"] == "entry")
    assert all(m["op"] != "intermediate" for m in msgs[first_entry:])
    new_cookie, deletes = sync_done(done)
    assert deletes and new_cookie.startswith("rid=007,csn=") and new_cookie > "rid=007," + cookie
    # Up to date: nothing at all.
    msgs, done = refresh(srv, cookie=new_cookie, base=PEOPLE, filt=filt)
    assert (msgs, done["code"], sync_done(done)) == ([], 0, (new_cookie, True))


def test_provider_refusals(fresh_server):
    srv = fresh_server
    _, done = refresh(srv)
    cookie, _ = sync_done(done)
    newer = cookie.replace("csn=2026", "csn=2099").replace("csn=2027", "csn=2099")
    for kw, code, words in [
        (dict(cookie=newer), 53, "newer"),
        (dict(cookie="rid=1,csn=garbage"), 2, "cookie"),
        (dict(deref=3), 2, "dereference"),
        (dict(extra_controls=[ber.control(PAGED, False, ber.seq(ber.integer(10), ber.octets(b"")))]),
         53, "paged"),
    ]:
        msgs, done = refresh(srv, **kw)
        assert (msgs, done["code"]) == ([], code), (kw, done)
        assert words in done["diag"], done
    # Persist mode needs an authenticated client.
    with open_sync(srv, 3, auth=False) as c:
        m = c.recv_msg()
        assert (m["op"], m["code"]) == ("searchDone", 53), m


@pytest.fixture
def short_log(tmp_path):
    cfg = PUBLIC_READ + "\n[replication]\nchangelog_max_changes = 1\n"
    s = Pando(tmp_path, demo=True, config=cfg).start()
    yield s
    s.stop_and_verify()


def test_present_phase_or_4096_when_the_log_no_longer_covers_the_cookie(short_log):
    srv = short_log
    _, done = refresh(srv)
    cookie, _ = sync_done(done)
    carol = uuid_of(srv, "uid=carol," + PEOPLE)
    modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
    modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: c\n" % PEOPLE)
    modify(srv, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: c\n" % PEOPLE)
    # The log keeps one record: it no longer covers the delete.
    floor = attrs_of(srv, "cn=Changes,cn=Monitor", "+", "*")["pandoChangeLogFloorCSN"][0]
    assert floor > cookie[len("csn="):]
    msgs, done = refresh(srv, cookie=cookie)
    assert done["code"] == 0, done
    entries, ids = summarise(msgs)
    assert entries == {"uid=alice," + PEOPLE.lower(): 1, "uid=bob," + PEOPLE.lower(): 1}, entries
    present = {u for _, us in ids for u in us}
    assert not any(flag for flag, _ in ids) and len(present) == 16 and carol not in present
    assert sync_done(done)[1] is False
    # With refresh_required the consumer is told to reload (4096), unless
    # it asked for a reload itself.
    cfg = srv.base / "pando.toml"
    srv.stop()
    srv.config += "refresh_required = true\n"
    srv.start()
    msgs, done = refresh(srv, cookie=cookie)
    assert (msgs, done["code"]) == ([], 4096), done
    msgs, done = refresh(srv, cookie=cookie, reload_hint=True)
    assert done["code"] == 0 and sync_done(done)[1] is False
    assert cfg.exists()


def test_persist_sends_changes_with_cookies_and_ends_on_abandon(fresh_server):
    srv = fresh_server
    with open_sync(srv, 3, base=PEOPLE) as c:
        msgs = []
        while True:
            m = c.recv_msg()
            if m["op"] != "entry":
                break
            msgs.append(m)
        assert len(msgs) == 11
        kind, cookie, refresh_done, _ = sync_info(m)
        assert (kind, refresh_done) == ("refreshDelete", True) and cookie.startswith("csn=")
        alice = uuid_of(srv, "uid=alice," + PEOPLE)
        modify(srv, "\n".join([
            "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: x\n" % PEOPLE,
            "dn: uid=new2,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: new2\ncn: N\nsn: N\n"
            % PEOPLE,
            "dn: cn=staff,%s\nchangetype: modify\nreplace: description\ndescription: elsewhere\n"
            % GROUPS,
            "dn: uid=alice,%s\nchangetype: delete\n" % PEOPLE,
        ]))
        got = [c.recv_msg() for _ in range(4)]
        state, uuid, c1 = sync_state(got[0])
        assert (got[0]["dn"].lower(), state, uuid) == ("uid=alice," + PEOPLE.lower(), 2, alice)
        assert got[0]["attrs"]["description"] == [b"x"]
        assert sync_state(got[1])[0] == 1 and got[1]["dn"].startswith("uid=new2")
        # A change outside the search still moves the cookie.
        kind, c3, _, _ = sync_info(got[2])
        assert kind == "newcookie"
        state, uuid, c4 = sync_state(got[3])
        assert (state, uuid, got[3]["attrs"]) == (3, alice, {})
        assert cookie < c1 < c3 < c4, (cookie, c1, c3, c4)
        c.send(ber.message(3, ber.abandon_op(2)))
        with pytest.raises(Exception):
            c.recv_msg(timeout=1)


def test_cancel_ends_a_persist_stage_with_canceled_and_the_cancel_with_success(fresh_server):
    """RFC 3909 on a sync search: the search ends with canceled (118), the
    Cancel itself succeeds, and the connection goes on."""
    srv = fresh_server
    with open_sync(srv, 3, base=PEOPLE) as c:
        while c.recv_msg()["op"] == "entry":
            pass
        c.send(ber.message(5, ber.extended_op("1.3.6.1.1.8", ber.seq(ber.integer(2)))))
        got = {m["id"]: m for m in (c.recv_msg(timeout=10), c.recv_msg(timeout=10))}
        assert got[2]["op"] == "searchDone" and got[2]["code"] == 118, got
        assert got[5]["code"] == 0, got
        # Changes no longer come; the connection still answers.
        modify(srv, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: c\n" % PEOPLE)
        c.send(ber.message(6, ber.search_op(PEOPLE, attrs=["1.1"])))
        m = c.recv_msg(timeout=10)
        while m["op"] == "entry":
            assert m["id"] == 6, m  # nothing more of the canceled search
            m = c.recv_msg(timeout=10)
        assert (m["id"], m["op"], m["code"]) == (6, "searchDone", 0), m


def test_changes_from_the_consumer_s_own_server_are_not_sent_back(sid42):
    srv = sid42
    with open_sync(srv, 3, cookie="rid=001,sid=02a", base=PEOPLE) as c:
        while c.recv_msg()["op"] == "entry":
            pass
        modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: x\n"
               % PEOPLE)
        with pytest.raises(Exception):
            c.recv_msg(timeout=1)


# ------------------------------------------------------------ real consumers

DUMP_ATTRS = ["*", "entryCSN", "entryUUID", "createTimestamp", "modifyTimestamp", "creatorsName",
              "modifiersName"]


def dump(url, dn, pw):
    r = subprocess.run(["ldapsearch", "-x", "-H", url, "-D", dn, "-w", pw, "-b", SUFFIX, "-LLL",
                        "-o", "ldif-wrap=no"] + DUMP_ATTRS, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 32), r.stderr
    return sorted((d.lower(), sorted((k.lower(), sorted(v)) for k, v in a.items()))
                  for d, a in parse_ldif(r.stdout))


def context_csn(url, dn, pw):
    r = subprocess.run(["ldapsearch", "-x", "-H", url, "-D", dn, "-w", pw, "-b", SUFFIX, "-s", "base",
                        "-LLL", "contextCSN"], capture_output=True, text=True, timeout=60)
    got = parse_ldif(r.stdout)
    return sorted(got[0][1].get("contextCSN", [])) if got else []


class SlapdConsumer:
    """Debian's slapd replicating dc=example,dc=com from a provider."""

    def __init__(self, base, provider, mode="refreshAndPersist"):
        self.base = Path(base)
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        self.port, self.pid = None, None
        self.pw = "consumer-secret"
        p = provider
        mode_args = ("type=refreshAndPersist" if mode == "refreshAndPersist"
                     else "type=refreshOnly interval=00:00:00:01")
        lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += [
            "modulepath /usr/lib/ldap", "moduleload back_mdb",
            "pidfile %s/slapd.pid" % self.base, "argsfile %s/slapd.args" % self.base,
            "loglevel sync", "database mdb", 'suffix "%s"' % SUFFIX, 'rootdn "%s"' % ADMIN_DN,
            "rootpw %s" % self.pw, "directory %s/db" % self.base, "maxsize 268435456",
            "index objectClass eq", "index entryUUID,entryCSN eq",
            'syncrepl rid=001 provider=%s bindmethod=simple binddn="%s" credentials=%s '
            'searchbase="%s" %s retry="1 30 5 +" timeout=5' % (p.url, p.admin_dn, p.admin_pw, SUFFIX, mode_args),
            "updateref %s" % p.url,
            "access to * by * read",
        ]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    def start(self):
        self.port = self.port or free_port()
        log = open(self.base / "slapd.log", "ab")
        self.proc = subprocess.Popen([SLAPD, "-f", str(self.base / "slapd.conf"), "-h", self.url + "/",
                                      "-d", "sync"], stdout=log, stderr=log)
        assert wait_port(self.port, timeout=30), "slapd not listening"
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        return (self.base / "slapd.log").read_text(errors="replace")[-3000:]


def converge(provider, consumer, timeout=30):
    """Wait until both hold the same entries and contextCSN."""
    deadline = time.monotonic() + timeout
    while True:
        a = dump(provider.url, provider.admin_dn, provider.admin_pw)
        b = dump(consumer.url, ADMIN_DN, consumer.pw)
        ca = context_csn(provider.url, provider.admin_dn, provider.admin_pw)
        cb = context_csn(consumer.url, ADMIN_DN, consumer.pw)
        if a == b and ca == cb:
            return len(a)
        if time.monotonic() > deadline:
            only_a = [d for d in a if d not in b][:3]
            only_b = [d for d in b if d not in a][:3]
            pytest.fail("no convergence: provider %s / consumer %s contextCSN;\nprovider only: %r\n"
                        "consumer only: %r\n%s" % (ca, cb, only_a, only_b, consumer.log()))
        time.sleep(0.3)


def changes_round(srv, n):
    """Adds, modifies (one with many values), renames, a subtree move,
    deletes and a password change."""
    members = "".join("member: uid=m%d,%s\n" % (i, PEOPLE) for i in range(1500))
    modify(srv, "\n".join([
        "dn: ou=Dept%d,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Dept%d\n" % (n, SUFFIX, n),
        "dn: uid=u%d,ou=Dept%d,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: u%d\ncn: U\nsn: U\n"
        % (n, n, SUFFIX, n),
        "dn: cn=big%d,%s\nchangetype: add\nobjectClass: groupOfNames\ncn: big%d\nmember: %s\n"
        % (n, GROUPS, n, ADMIN_DN),
        "dn: cn=big%d,%s\nchangetype: modify\nadd: member\n%s" % (n, GROUPS, members),
        "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: round %d\n" % (PEOPLE, n),
        "dn: ou=Dept%d,%s\nchangetype: modrdn\nnewrdn: ou=Moved%d\ndeleteoldrdn: 1\nnewsuperior: %s\n"
        % (n, SUFFIX, n, PEOPLE),
        "dn: uid=u%d,ou=Moved%d,%s\nchangetype: modrdn\nnewrdn: uid=v%d\ndeleteoldrdn: 0\n" % (n, n, PEOPLE, n),
    ]))
    rc, out, err = srv.ldap("ldappasswd", "-s", "new-secret-%d" % n, "uid=bob," + PEOPLE)
    assert rc == 0, err


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
@pytest.mark.parametrize("mode", ["refreshAndPersist", "refreshOnly"])
def test_slapd_replicates_from_pando(tmp_path, mode):
    srv = Pando(tmp_path / "pando", demo=True, config=PUBLIC_READ).start()
    consumer = SlapdConsumer(tmp_path / "slapd", srv, mode).start()
    try:
        converge(srv, consumer)
        changes_round(srv, 1)
        modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
        converge(srv, consumer)
        # Writes to the consumer are referred to the provider.
        r = subprocess.run(["ldapmodify", "-x", "-H", consumer.url, "-D", ADMIN_DN, "-w", "wrong"],
                           input="dn: uid=dave,%s\nchangetype: delete\n" % PEOPLE, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode != 0
        # The consumer is down while the provider changes; it catches up
        # from its cookie (a delete phase from the change log).
        consumer.stop()
        changes_round(srv, 2)
        modify(srv, "dn: uid=dave,%s\nchangetype: delete\n" % PEOPLE)
        consumer.start()
        n = converge(srv, consumer)
        assert n == 19 + 2 * 3 - 2
        # The provider restarts; the consumer reconnects and follows.
        assert srv.stop() == 0
        srv.start(keep_port=True)
        modify(srv, "dn: uid=erin,%s\nchangetype: delete\n" % PEOPLE)
        converge(srv, consumer)
    finally:
        consumer.stop()
        srv.stop_and_verify()


def test_python_ldap_syncrepl_consumer_follows_pando(fresh_server):
    ldap = pytest.importorskip("ldap")
    import ldap.syncrepl

    class Consumer(ldap.ldapobject.LDAPObject, ldap.syncrepl.SyncreplConsumer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.cookie, self.entries, self.deleted, self.done = None, {}, [], False

        def syncrepl_get_cookie(self):
            return self.cookie

        def syncrepl_set_cookie(self, cookie):
            self.cookie = cookie

        def syncrepl_entry(self, dn, attrs, uuid):
            self.entries[uuid] = dn

        def syncrepl_delete(self, uuids):
            self.deleted += uuids

        def syncrepl_present(self, uuids, refreshDeletes=False):
            pass

        def syncrepl_refreshdone(self):
            self.done = True

    srv = fresh_server
    c = Consumer(srv.url)
    c.simple_bind_s(srv.admin_dn, srv.admin_pw)
    msgid = c.syncrepl_search(SUFFIX, ldap.SCOPE_SUBTREE, mode="refreshAndPersist", attrlist=["*", "+"])
    deadline = time.monotonic() + 20
    while not c.done and time.monotonic() < deadline:
        c.syncrepl_poll(msgid=msgid, timeout=1)
    assert c.done and len(c.entries) == 19
    modify(srv, "dn: uid=judy,%s\nchangetype: delete\n" % PEOPLE)
    modify(srv, "dn: uid=py1,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: py1\ncn: P\nsn: P\n" % PEOPLE)
    while time.monotonic() < deadline and not any(d.startswith("uid=py1") for d in c.entries.values()):
        c.syncrepl_poll(msgid=msgid, timeout=1)
    assert len(c.deleted) == 1 and any(d.startswith("uid=py1") for d in c.entries.values())
    assert c.cookie and "csn=" in c.cookie
    c.unbind_s()


# ------------------------------------------------------------ Pando as a consumer


def consumer_config(provider_url, bind_dn, password, mode="refreshAndPersist", rid=1, extra="",
                    interval=1, search_base=SUFFIX):
    return PUBLIC_READ + """
[[replication.consumer]]
rid = %d
provider = "%s"
search_base = "%s"
type = "%s"
interval = %d
retry = "1 30 5 +"
timeout_secs = 5
bind_dn = "%s"
credentials = "%s"
%s""" % (rid, provider_url, search_base, mode, interval, bind_dn, password, extra)


class Node:
    """What converge() needs of a server: url, bind DN and password."""

    def __init__(self, url, dn, pw):
        self.url, self.admin_dn, self.admin_pw = url, dn, pw


def converge_nodes(nodes, timeout=30, log=lambda: ""):
    """Wait until every node holds the same entries and contextCSN."""
    deadline = time.monotonic() + timeout
    while True:
        dumps = [dump(n.url, n.admin_dn, n.admin_pw) for n in nodes]
        ctx = [context_csn(n.url, n.admin_dn, n.admin_pw) for n in nodes]
        if all(d == dumps[0] for d in dumps) and all(c == ctx[0] for c in ctx) and ctx[0]:
            return len(dumps[0])
        if time.monotonic() > deadline:
            diffs = [([e[0] for e in d if e not in dumps[0]][:3], [e[0] for e in dumps[0] if e not in d][:3])
                     for d in dumps[1:]]
            pytest.fail("no convergence: contextCSN %r; differences (extra, missing) %r\n%s" % (ctx, diffs, log()))
        time.sleep(0.3)


def pando_consumer(base, provider, mode="refreshAndPersist", extra="", interval=1, tail="",
                   search_base=SUFFIX, name="consumer"):
    cfg = consumer_config(provider.url, provider.admin_dn, provider.admin_pw, mode, extra=extra,
                          interval=interval, search_base=search_base) + tail
    return Pando(base, demo=False, config=cfg, name=name).start()


def test_a_demo_consumer_of_a_subtree_leaves_that_subtree_to_its_provider(tmp_path):
    """`--demo` on a consumer of ou=People: the demo entries outside the
    subtree are made here; those inside it are the provider's (the write
    pipeline refers them), and the server starts."""
    srv = Pando(tmp_path / "provider", demo=False, config=PUBLIC_READ).start()
    cfg = consumer_config(srv.url, srv.admin_dn, srv.admin_pw, search_base=PEOPLE)
    con = Pando(tmp_path / "consumer", demo=True, config=cfg, name="demo-consumer")
    try:
        modify(srv, "dn: %s\nchangetype: add\nobjectClass: organizationalUnit\nou: People\n" % PEOPLE)
        modify(srv, "dn: uid=only-here,%s\nchangetype: add\nobjectClass: account\nuid: only-here\n" % PEOPLE)
        con.start()
        deadline = time.monotonic() + 30
        while True:
            rc, es, err = con.search(PEOPLE, "(objectClass=*)", "1.1", scope="one")
            got = sorted(d.split(",")[0].lower() for d, _ in es)
            if got == ["uid=only-here"] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert got == ["uid=only-here"], (got, con.logs())
        # Outside the consumer's subtree, the demo tree is here.
        rc, es, err = con.search("ou=Groups," + SUFFIX, "(objectClass=*)", "1.1", scope="base")
        assert rc == 0 and es, (rc, err)
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


@pytest.mark.parametrize("mode", ["refreshAndPersist", "refreshOnly"])
def test_pando_replicates_from_pando(tmp_path, mode):
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    metrics_port = free_port()
    con = pando_consumer(tmp_path / "consumer", srv, mode,
                         tail='\n[metrics]\nlisten = "127.0.0.1:%d"\n' % metrics_port)
    nodes = [srv, con]
    try:
        converge_nodes(nodes, log=con.logs)
        changes_round(srv, 1)
        modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
        converge_nodes(nodes, log=con.logs)
        # Clients' writes to the replica are referred to the provider.
        rc, out, err = con.ldap("ldapmodify", input="dn: uid=dave,%s\nchangetype: delete\n" % PEOPLE)
        assert rc == 10 and srv.url in out + err, (rc, out, err)
        # Down while the provider changes: catches up from its cookie.
        assert con.stop() == 0
        changes_round(srv, 2)
        modify(srv, "dn: uid=dave,%s\nchangetype: delete\n" % PEOPLE)
        con.start()
        assert converge_nodes(nodes, log=con.logs) == 19 + 2 * 3 - 2
        # The provider restarts: the consumer comes back to it.
        assert srv.stop() == 0
        srv.start(keep_port=True)
        modify(srv, "dn: uid=erin,%s\nchangetype: delete\n" % PEOPLE)
        converge_nodes(nodes, log=con.logs)
        # What cn=Monitor says of the consumer.
        mon = attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor", "*", "+")
        assert mon["olmSRProviderURIList"] == [srv.url]
        assert mon["olmSRSyncPhase"][0] in ("persist", "idle", "refresh")
        assert mon["olmSRLastCookieRcvd"][0].startswith("rid=001,csn=")
        # The same in /metrics and in `pando stat` (after a change in the
        # persist stage, whose delay is measured).
        modify(srv, "dn: uid=frank,%s\nchangetype: modify\nreplace: description\ndescription: m\n" % PEOPLE)
        converge_nodes(nodes, log=con.logs)
        mon = attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor", "*", "+")
        import urllib.request
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read().decode()
        applied = re.search(r'^pando_repl_applied_total\{rid="001"\} (\d+)$', text, re.M)
        assert applied and int(applied.group(1)) == int(mon["pandoReplApplied"][0]), text[-2000:]
        assert re.search(r'^pando_context_csn_timestamp_seconds\{sid="000"\} \d+\.\d+$', text, re.M)
        if mode == "refreshAndPersist":
            assert 'pando_repl_connected{rid="001"} 1' in text
            assert re.search(r'^pando_repl_delay_seconds\{rid="001",sid="000"\} ', text, re.M)
        r = subprocess.run([PANDO_BIN, "stat", "--url", con.ldapi_url, "--count", "1", "--interval", "0.3",
                            "--csv"], capture_output=True, text=True, timeout=30)
        header = r.stdout.splitlines()[0].split(",")
        assert r.returncode == 0 and header[-4:] == ["repl_per_s", "rdelay", "rbehind", "outlier"], r.stdout + r.stderr
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


class SlapdProvider:
    """Debian's slapd with the syncprov overlay, holding the demo-like tree."""

    def __init__(self, base, server_id=0, consumer_of=None):
        self.base = Path(base)
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        self.port, self.proc = None, None
        self.admin_dn, self.admin_pw = ADMIN_DN, "provider-secret"
        lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += ["modulepath /usr/lib/ldap", "moduleload back_mdb", "moduleload syncprov",
                  "pidfile %s/slapd.pid" % self.base, "argsfile %s/slapd.args" % self.base]
        if server_id:
            lines.append("serverID %d" % server_id)
        lines += ["loglevel sync", "database mdb", 'suffix "%s"' % SUFFIX, 'rootdn "%s"' % ADMIN_DN,
                  "rootpw %s" % self.admin_pw, "directory %s/db" % self.base, "maxsize 268435456",
                  "index objectClass eq", "index entryUUID,entryCSN eq"]
        if consumer_of:
            p = consumer_of
            lines += ['syncrepl rid=002 provider=%s bindmethod=simple binddn="%s" credentials=%s '
                      'searchbase="%s" type=refreshAndPersist retry="1 30 5 +" timeout=5'
                      % (p.url, p.admin_dn, p.admin_pw, SUFFIX), "updateref %s" % p.url]
        lines += ["overlay syncprov", "syncprov-checkpoint 100 1", "syncprov-sessionlog 1000",
                  "access to * by * read"]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")

    url = SlapdConsumer.url
    start = SlapdConsumer.start
    stop = SlapdConsumer.stop
    log = SlapdConsumer.log

    def load(self, *slapadd_args):
        ldif = [ldif_text(SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"],
                                   "o": ["example"]}),
                ldif_text(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]})]
        for i in range(10):
            ldif.append(ldif_text("uid=s%d,%s" % (i, PEOPLE), {
                "objectClass": ["inetOrgPerson"], "uid": ["s%d" % i], "cn": ["S %d" % i], "sn": ["S"],
                "userPassword": ["secret%d" % i]}))
        path = self.base / "init.ldif"
        path.write_text("\n".join(ldif))
        r = subprocess.run(["/usr/sbin/slapadd", "-q", "-f", str(self.base / "slapd.conf"), "-l", str(path),
                            *slapadd_args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return self


def ldif_text(dn, attrs):
    return "dn: %s\n%s\n" % (dn, "".join("%s: %s\n" % (k, v) for k, vs in attrs.items() for v in vs))


def slapd_changes(node, n):
    """Changes made on a slapd provider (as its root DN): an add, a modify,
    a modify of 1,500 values, a rename, a subtree move, a delete and a
    password change."""
    members = "".join("member: uid=m%d,%s\n" % (i, PEOPLE) for i in range(1500))
    r = subprocess.run(["ldapmodify", "-x", "-H", node.url, "-D", node.admin_dn, "-w", node.admin_pw],
                       input="\n".join([
                           "dn: uid=x%d,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: x%d\ncn: X\nsn: X\n"
                           % (n, PEOPLE, n),
                           "dn: uid=s1,%s\nchangetype: modify\nreplace: description\ndescription: round %d\n"
                           % (PEOPLE, n),
                           "dn: cn=g%d,%s\nchangetype: add\nobjectClass: groupOfNames\ncn: g%d\nmember: %s\n"
                           % (n, SUFFIX, n, ADMIN_DN),
                           "dn: cn=g%d,%s\nchangetype: modify\nadd: member\n%s" % (n, SUFFIX, members),
                           "dn: uid=s%d,%s\nchangetype: modrdn\nnewrdn: uid=t%d\ndeleteoldrdn: 1\n" % (n + 1, PEOPLE, n),
                           "dn: ou=Dept%d,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Dept%d\n"
                           % (n, SUFFIX, n),
                           "dn: uid=d%d,ou=Dept%d,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: d%d\ncn: D\nsn: D\n"
                           % (n, n, SUFFIX, n),
                           "dn: ou=Dept%d,%s\nchangetype: modrdn\nnewrdn: ou=Dept%d\ndeleteoldrdn: 1\nnewsuperior: %s\n"
                           % (n, SUFFIX, n, PEOPLE),
                           "dn: uid=s%d,%s\nchangetype: delete\n" % (n + 4, PEOPLE),
                       ]), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["ldappasswd", "-x", "-H", node.url, "-D", node.admin_dn, "-w", node.admin_pw,
                        "-s", "changed-%d" % n, "uid=s0," + PEOPLE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not HAVE_SLAPD or not Path("/usr/lib/ldap/syncprov.la").exists(),
                    reason="slapd or its syncprov overlay not installed")
@pytest.mark.parametrize("mode", ["refreshAndPersist", "refreshOnly"])
def test_pando_replicates_from_slapd(tmp_path, mode):
    prov = SlapdProvider(tmp_path / "slapd").load().start()
    con = pando_consumer(tmp_path / "consumer", prov, mode, extra="count_behind_secs = 1\n")
    nodes = [prov, con]
    try:
        converge_nodes(nodes, log=con.logs)
        slapd_changes(prov, 1)
        converge_nodes(nodes, log=con.logs)
        # slapd does not count changes behind: asked once, the consumer
        # says so and goes on with the lag in seconds.
        deadline = time.monotonic() + 10
        while "does not count changes behind" not in con.logs(tail=50000):
            assert time.monotonic() < deadline, con.logs()
            time.sleep(0.3)
        assert "pandoReplChangesBehind" not in attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor")
        assert con.stop() == 0
        slapd_changes(prov, 2)
        con.start()
        assert converge_nodes(nodes, log=con.logs) == 12 + 2 * 4 - 2
    finally:
        con.stop_and_verify()
        prov.stop()


@pytest.mark.skipif(not HAVE_SLAPD or not Path("/usr/lib/ldap/syncprov.la").exists(),
                    reason="slapd or its syncprov overlay not installed")
@pytest.mark.parametrize("mode", ["refreshAndPersist", "refreshOnly"])
def test_cascade_slapd_to_pando_to_slapd(tmp_path, mode):
    top = SlapdProvider(tmp_path / "top").load().start()
    mid = pando_consumer(tmp_path / "mid", top, mode)
    leaf = SlapdConsumer(tmp_path / "leaf", mid, mode).start()
    leaf_node = Node(leaf.url, ADMIN_DN, leaf.pw)
    nodes = [top, mid, leaf_node]
    try:
        converge_nodes(nodes, log=lambda: mid.logs() + leaf.log())
        slapd_changes(top, 1)
        converge_nodes(nodes, log=lambda: mid.logs() + leaf.log())
    finally:
        leaf.stop()
        mid.stop_and_verify()
        top.stop()


# ------------------------------------------------------------ a provider sending garbage


class FakeProvider:
    """A scripted provider on loopback: answers binds, and each search with
    the next scenario's messages (`scenarios[i](msgid, cookie)` returns the
    bytes to send, and whether to close the connection after them)."""

    def __init__(self, scenarios):
        import socket
        import threading
        self.scenarios = scenarios
        self.cookies = []
        self.starttls_then = None
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.url = "ldap://127.0.0.1:%d" % self.port
        self.admin_dn, self.admin_pw = ADMIN_DN, "fake"
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        import socket
        self.sock.settimeout(0.2)
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            try:
                self.session(conn)
            except OSError:
                pass
            finally:
                conn.close()

    def read_msg(self, conn, buf):
        while True:
            try:
                _, _, e = ber.read_tlv(buf, 0)
                return buf[:e], buf[e:]
            except ber.Incomplete:
                pass
            chunk = conn.recv(65536)
            if not chunk:
                return None, b""
            buf += chunk

    def session(self, conn):
        conn.settimeout(10)
        buf = b""
        while True:
            raw, buf = self.read_msg(conn, buf)
            if raw is None:
                return
            p = parts(parts(raw)[0][1])
            msgid = int.from_bytes(p[0][1], "big")
            if p[1][0] == 0x60:
                conn.sendall(ber.message(msgid, ber.tlv(0x61, ber.enum(0) + ber.octets("") + ber.octets(""))))
            elif p[1][0] == 0x63:
                cookie = None
                for _, c in parts(p[2][1]) if len(p) > 2 else []:
                    cp = parts(c)
                    if cp[0][1].decode() == SYNC_REQUEST:
                        value = next(v for t, v in cp[1:] if t == 0x04)
                        vp = parts(parts(value)[0][1])
                        cookie = next((v.decode() for t, v in vp[1:] if t == 0x04), None)
                self.cookies.append(cookie)
                i = min(len(self.cookies), len(self.scenarios)) - 1
                data, close = self.scenarios[i](msgid)
                conn.sendall(data)
                if close:
                    return
            elif p[1][0] == 0x77 and self.starttls_then is not None:
                # StartTLS "accepted", with bytes an attacker on the path
                # slipped in after the answer, in the same segment.
                conn.sendall(ber.message(msgid, ber.tlv(0x78, ber.enum(0) + ber.octets("") + ber.octets("")))
                             + self.starttls_then)
            elif p[1][0] == 0x42:
                return

    def stop(self):
        self.stopping = True
        self.thread.join(5)
        self.sock.close()


FAKE_CSN = "20261125000000.000001Z#000000#000#000000"
FAKE_UUIDS = [bytes([i] * 16) for i in range(1, 4)]


def wait_monitor(con, attr, want, timeout=30):
    """Wait until the consumer's cn=Monitor entry shows `attr` = [want]."""
    mon = "cn=Consumer 001,cn=Replication,cn=Monitor"
    deadline = time.monotonic() + timeout
    while attrs_of(con, mon).get(attr) != [want]:
        assert time.monotonic() < deadline, "%r\n%s" % (attrs_of(con, mon), con.logs()[-3000:])
        time.sleep(0.2)


def fake_entry(msgid, dn, attrs, state=1, uuid=None, cookie=None, control_value=None):
    attr_list = b"".join(ber.seq(ber.octets(k), ber.set_(*[ber.octets(v) for v in vs])) for k, vs in attrs.items())
    value = control_value
    if value is None:
        value = ber.seq(ber.enum(state) + ber.octets(uuid) + (ber.octets(cookie) if cookie else b""))
    return ber.message(msgid, ber.tlv(0x64, ber.octets(dn) + ber.seq(attr_list)),
                       [ber.control(SYNC_STATE, False, value)])


def fake_done(msgid, code=0, cookie=None, diag=""):
    body = ber.enum(code) + ber.octets("") + ber.octets(diag)
    controls = None
    if code == 0:
        controls = [ber.control(SYNC_DONE, False, ber.seq(ber.octets(cookie) if cookie else b""))]
    return ber.message(msgid, ber.tlv(0x65, body), controls)


def good_refresh(msgid):
    top = fake_entry(msgid, SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"],
                                     "o": ["example"], "entryCSN": [FAKE_CSN]}, uuid=FAKE_UUIDS[0])
    person = fake_entry(msgid, "uid=kept," + SUFFIX, {"objectClass": ["inetOrgPerson"], "uid": ["kept"],
                                                        "cn": ["K"], "sn": ["K"], "entryCSN": [FAKE_CSN]},
                        uuid=FAKE_UUIDS[1])
    return top + person + fake_done(msgid, cookie="rid=001,csn=" + FAKE_CSN), False


def test_a_consumer_survives_a_provider_sending_garbage(tmp_path):
    def bad(entry_kw):
        return lambda msgid: (fake_entry(msgid, "uid=bad," + SUFFIX, {"objectClass": ["inetOrgPerson"],
                                                                       "uid": ["bad"], "cn": ["B"], "sn": ["B"]},
                                         **entry_kw) + fake_done(msgid, cookie="rid=001,csn=" + FAKE_CSN),
                              False)

    scenarios = [
        good_refresh,
        bad(dict(control_value=b"\x30\x03\x0a\x01")),                      # malformed control
        bad(dict(uuid=b"12345678-1234-1234-1234-123456789012")),            # 36-byte UUID
        bad(dict(uuid=FAKE_UUIDS[2], cookie="rid=002,csn=" + FAKE_CSN)),    # another rid's cookie
        lambda msgid: (fake_done(msgid, code=4096, diag="reload"), False),  # e-syncRefreshRequired
        lambda msgid: (fake_entry(msgid, "uid=half," + SUFFIX, {"objectClass": ["inetOrgPerson"],
                                                                 "uid": ["half"], "cn": ["H"], "sn": ["H"]},
                                  uuid=FAKE_UUIDS[2]), True),                # dropped mid-refresh
        good_refresh,
    ]
    fake = FakeProvider(scenarios)
    con = pando_consumer(tmp_path / "consumer", fake, mode="refreshOnly")
    try:
        deadline = time.monotonic() + 60
        while len(fake.cookies) < len(scenarios) + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(fake.cookies) >= len(scenarios), (fake.cookies, con.logs())
        logs = con.logs(tail=20000)
        for words in ["malformed Sync State control", "a syncUUID has 16 bytes, this one has 36",
                      "cookie for rid 2, this consumer is rid 1", "closed the connection"]:
            assert words in logs, words
        # The first refresh's data is kept throughout, and its cookie sent.
        assert fake.cookies[0] == "rid=001"
        assert fake.cookies[1] == "rid=001,csn=" + FAKE_CSN
        # After the 4096 the consumer asks again at once, without its CSNs.
        assert fake.cookies[5] == "rid=001", fake.cookies
        rc, entries, _ = con.search(SUFFIX, "(objectClass=*)", "1.1")
        assert rc == 0 and sorted(d for d, _ in entries) == sorted([SUFFIX, "uid=kept," + SUFFIX]), entries
        assert context_csn(con.url, con.admin_dn, con.admin_pw) == [FAKE_CSN]
        mon = attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor")
        assert int(mon["pandoReplFailures"][0]) >= 4 and int(mon["pandoReplReloads"][0]) == 1
    finally:
        con.stop_and_verify()
        fake.stop()


def test_a_consumer_counts_and_logs_conflicts(tmp_path):
    """An entry older than the copy held is kept as held; another entry
    holding the DN of one received is replaced. Both are counted and
    logged with what was on either side."""
    older = "20261124000000.000001Z#000000#000#000000"
    newer = "20261125000000.000002Z#000000#000#000000"

    def kept(msgid, csn, uuid, cookie_csn):
        return fake_entry(msgid, "uid=kept," + SUFFIX, {"objectClass": ["inetOrgPerson"], "uid": ["kept"],
                                                         "cn": ["K"], "sn": ["changed"], "entryCSN": [csn]},
                          uuid=uuid) + fake_done(msgid, cookie="rid=001,csn=" + cookie_csn), False

    scenarios = [good_refresh,
                 lambda msgid: kept(msgid, older, FAKE_UUIDS[1], FAKE_CSN),   # older copy
                 lambda msgid: kept(msgid, newer, FAKE_UUIDS[2], newer)]     # another entry at the DN
    fake = FakeProvider(scenarios)
    con = pando_consumer(tmp_path / "consumer", fake, mode="refreshOnly")
    try:
        wait_monitor(con, "pandoReplConflicts", "2")
        logs = con.logs(tail=20000)
        assert "received at %s is older than the copy here (%s): kept" % (older, FAKE_CSN) in logs, logs[-2000:]
        held = "'uid=kept,%s' was held here by entryUUID %s, the provider's is %s" % (
            SUFFIX, uuid_text(FAKE_UUIDS[1]), uuid_text(FAKE_UUIDS[2]))
        assert held in logs, logs[-2000:]
        got = attrs_of(con, "uid=kept," + SUFFIX, "entryUUID", "sn")
        assert got["sn"] == ["changed"] and got["entryUUID"][0].replace("-", "") == FAKE_UUIDS[2].hex(), got
    finally:
        con.stop_and_verify()
        fake.stop()


def test_a_consumer_refuses_bytes_sent_before_the_tls_handshake(tmp_path):
    """Bytes after the StartTLS answer and before the handshake are not
    protected by TLS: the consumer ends the session instead of reading
    them as the provider's."""
    from test_tls import Pki
    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    fake = FakeProvider([good_refresh])
    fake.starttls_then = fake_done(2, cookie="rid=001,csn=" + FAKE_CSN)
    con = pando_consumer(tmp_path / "consumer", fake,
                         extra='start_tls = true\ntls_ca_file = "%s"\n' % pki.ca)
    try:
        deadline = time.monotonic() + 20
        while "sent data after agreeing to StartTLS" not in con.logs(tail=20000) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "sent data after agreeing to StartTLS" in con.logs(tail=20000)
        assert fake.cookies == []  # no search was ever sent
        rc, entries, _ = con.search(SUFFIX, "(objectClass=*)", "1.1")
        assert rc == 32 and entries == [], (rc, entries)
    finally:
        con.stop_and_verify()
        fake.stop()


# ------------------------------------------------------------ crashes


def _racing_writer(srv, stop, done, rng_seed):
    """Adds, modifies and deletes on the provider until told to stop,
    reconnecting when the provider is down (bounded by `stop`)."""
    import ldap3
    rng = __import__("random").Random(rng_seed)
    i = 0
    conn = None
    while not stop.is_set() and i < 5000:
        try:
            if conn is None:
                conn = srv.conn()
            dn = "uid=w%d,%s" % (i, PEOPLE)
            if conn.add(dn, ["inetOrgPerson"], {"uid": "w%d" % i, "cn": "W", "sn": str(i)}):
                done.append(dn)
            if i % 3 == 0 and done:
                conn.modify(rng.choice(done), {"description": [(ldap3.MODIFY_REPLACE, ["v%d" % i])]})
            if i % 7 == 0 and len(done) > 5:
                victim = done.pop(rng.randrange(len(done)))
                conn.delete(victim)
            i += 1
        except Exception:
            conn = None
            time.sleep(0.1)


def test_kill9_of_either_side_while_writes_race_the_refresh(tmp_path):
    import random
    import threading
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    srv.bulk_add(("uid=pre%d,%s" % (i, PEOPLE), {"objectClass": ["inetOrgPerson"], "uid": ["pre%d" % i],
                                                "cn": ["P"], "sn": ["P"]}) for i in range(2000))
    con = pando_consumer(tmp_path / "consumer", srv)
    stop, done = threading.Event(), []
    writer = threading.Thread(target=_racing_writer, args=(srv, stop, done, 4533), daemon=True)
    writer.start()
    rng = random.Random(4533)
    try:
        for cycle in range(6):
            time.sleep(rng.uniform(0.2, 1.0))
            victim = con if cycle % 3 != 2 else srv
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            victim.proc = None
            rc, out = victim.verify()
            assert rc == 0, "cycle %d: verify after kill -9 failed:\n%s" % (cycle, out)
            victim.start(keep_port=True)
        time.sleep(0.5)
        stop.set()
        writer.join(60)
        n = converge_nodes([srv, con], timeout=90, log=con.logs)
        assert n > 2000
    finally:
        stop.set()
        con.stop_and_verify()
        srv.stop_and_verify()


# ------------------------------------------------------------ TLS and SASL EXTERNAL

REPLICATOR_DN = "cn=replicator,ou=People," + SUFFIX
# The replication identity reads everything, userPassword included, and
# has no size or lookthrough limit (the example docs/replication.md gives).
REPLICATOR_ACCESS = """
[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "dn:%s", rights = "read" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "read" }]

[[limits.by]]
who = "dn:%s"
size_limit = 0
unindexed_search_limit = 100000000
""" % (REPLICATOR_DN, REPLICATOR_DN)


def test_consumers_over_starttls_and_ldaps_with_a_client_certificate(tmp_path):
    from test_tls import Pki
    for d in ("pki", "other-pki"):
        (tmp_path / d).mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("server", "/O=Pando Test/CN=localhost", server=True)
    repl_cert, repl_key = pki.issue("replicator", "/DC=com/DC=example/OU=People/CN=replicator")
    other = Pki(tmp_path / "other-pki")
    tls = '\n[tls]\ncert_file = "%s"\nkey_file = "%s"\nca_file = "%s"\nclient_certs = "request"\n' % (
        cert, key, pki.ca)
    srv = Pando(tmp_path / "provider", demo=True, config=REPLICATOR_ACCESS + tls, ldaps=True).start()
    starttls = pando_consumer(tmp_path / "starttls", srv, extra='start_tls = true\ntls_ca_file = "%s"\n' % pki.ca)
    external_cfg = PUBLIC_READ + """
[[replication.consumer]]
rid = 2
provider = "%s"
search_base = "%s"
retry = "1 30 5 +"
timeout_secs = 5
bind_method = "sasl_external"
tls_ca_file = "%s"
tls_cert_file = "%s"
tls_key_file = "%s"
""" % (srv.ldaps_url, SUFFIX, pki.ca, repl_cert, repl_key)
    external = Pando(tmp_path / "external", config=external_cfg, name="external").start()
    wrong_ca = pando_consumer(tmp_path / "wrong-ca", srv, extra='start_tls = true\ntls_ca_file = "%s"\n' % other.ca)
    try:
        converge_nodes([srv, starttls, external], log=lambda: starttls.logs() + external.logs())
        modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: userPassword\nuserPassword: {SSHA}x\n"
               % PEOPLE)
        converge_nodes([srv, starttls, external], log=lambda: starttls.logs() + external.logs())
        # A provider whose certificate does not chain to the configured CA
        # is not talked to.
        rc, entries, _ = wrong_ca.search(SUFFIX, "(objectClass=*)", "1.1")
        assert rc == 32 or entries == [], entries
        err = attrs_of(wrong_ca, "cn=Consumer 001,cn=Replication,cn=Monitor")["pandoReplLastError"][0]
        assert "TLS" in err and ("certificate" in err.lower() or "issuer" in err.lower()), err
    finally:
        for s in (wrong_ca, external, starttls, srv):
            s.stop_and_verify()


def test_repl_status_says_who_is_behind_and_by_how_much(tmp_path):
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    # refreshOnly once an hour: after its first refresh it stays behind.
    con = pando_consumer(tmp_path / "consumer", srv, "refreshOnly", interval=3600,
                         extra="count_behind_secs = 1\n")
    status = [PANDO_BIN, "repl", "status", srv.ldapi_url, con.ldapi_url]
    try:
        converge_nodes([srv, con], log=con.logs)
        r = subprocess.run(status, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.count("in step") == 2, r.stdout + r.stderr
        modify(srv, "dn: uid=frank,%s\nchangetype: modify\nreplace: description\ndescription: z\n" % PEOPLE)
        time.sleep(1.2)
        modify(srv, "dn: uid=frank,%s\nchangetype: modify\nreplace: description\ndescription: zz\n" % PEOPLE)
        r = subprocess.run(status, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        behind = re.search(r"behind ([0-9.]+)s, 2 changes$", lines[2])
        assert "in step" in lines[1] and behind and float(behind.group(1)) >= 1.2, r.stdout
        # The count comes from the provider's change log, through an
        # extended operation (for identities that may read contextCSN).
        held = context_csn(con.url, con.admin_dn, con.admin_pw)
        exop = "2.25.15972167931155808496075090497880241257.1.2:" + ";".join(held)
        rc, out, err = srv.ldap("ldapexop", exop)
        import base64
        data = re.search(r"^data:: (\S+)$", out, re.M)
        assert rc == 0 and data and base64.b64decode(data.group(1)) == b"sid=000 changes=2\n", (rc, out, err)
        # The consumer asks its provider the same (every count_behind_secs)
        # and shows it in cn=Monitor and `pando stat`.
        wait_monitor(con, "pandoReplChangesBehind", "000 changes=2", timeout=15)
        r = subprocess.run([PANDO_BIN, "stat", "--url", con.ldapi_url, "--count", "1", "--interval", "0.3",
                            "--csv"], capture_output=True, text=True, timeout=30)
        header, row = [line.split(",") for line in r.stdout.splitlines()[:2]]
        assert row[header.index("rbehind")] == "2", r.stdout
        rc, out, err = srv.ldap("ldapexop", exop.split(":")[0] + ":20261125")
        assert rc != 0 and "Protocol error (2)" in err and "is not a CSN" in err, (rc, out, err)
        # A server that cannot be read is said so (exit 2).
        r = subprocess.run(status + ["ldap://127.0.0.1:%d" % free_port()], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 2 and "unreadable" in r.stdout, r.stdout
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


def test_a_consumer_restored_from_the_provider_s_backup_syncs_only_what_changed(tmp_path):
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    srv.bulk_add(("uid=b%d,%s" % (i, PEOPLE), {"objectClass": ["inetOrgPerson"], "uid": ["b%d" % i],
                                              "cn": ["B"], "sn": ["B"]}) for i in range(500))
    backup = tmp_path / "backup"
    r = subprocess.run([PANDO_BIN, "backup", "--data-dir", str(srv.data_dir), str(backup)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # Changes after the backup: the consumer must get these, and only these.
    modify(srv, "dn: uid=b1,%s\nchangetype: modify\nreplace: description\ndescription: after\n" % PEOPLE)
    modify(srv, "dn: uid=b2,%s\nchangetype: delete\n" % PEOPLE)
    modify(srv, "dn: uid=late,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: late\ncn: L\nsn: L\n" % PEOPLE)
    cfg = consumer_config(srv.url, srv.admin_dn, srv.admin_pw)
    con = Pando(tmp_path / "consumer", config=cfg, name="consumer")
    (con.base / "pando.toml").write_text(cfg)
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(con.data_dir), "--config",
                        str(con.base / "pando.toml"), str(backup)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    con.start()
    # The administrator password came with the store (its hash is there).
    con.admin_pw = srv.admin_pw
    try:
        assert converge_nodes([srv, con], log=con.logs) == 19 + 500
        mon = attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor")
        # A delete phase: two changed entries and one delete, not 519 entries.
        assert int(mon["pandoReplApplied"][0]) == 2 and int(mon["pandoReplDeleted"][0]) == 1, mon
        assert "starting from the store's contextCSN" in con.logs(tail=20000)
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


def test_a_filtered_consumer_keeps_glue_for_parents_outside_its_filter_and_only_what_matches(tmp_path):
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    persons = pando_consumer(tmp_path / "persons", srv, extra='filter = "(uid=*)"\n')
    # The second consumer keeps only the children of ou=People.
    one = pando_consumer(tmp_path / "one", srv, extra='scope = "one"\n', search_base=PEOPLE, name="one")

    def dns(node, filt="(objectClass=*)"):
        rc, entries, err = node.search(SUFFIX, filt, "1.1")
        assert rc in (0, 32), err
        return sorted(d.lower() for d, _ in entries)

    try:
        people = [d for d in dns(srv, "(uid=*)")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (dns(persons, "(uid=*)") != people or dns(one, "(uid=*)") != people):
            time.sleep(0.3)
        assert dns(persons, "(uid=*)") == people, persons.logs()
        assert dns(one, "(uid=*)") == people, one.logs()
        # Their parents are glue (the suffix and ou=People), nothing else
        # of the provider's tree is there.
        assert dns(persons, "(objectClass=glue)") == [SUFFIX.lower(), PEOPLE.lower()]
        assert dns(persons) == sorted([SUFFIX.lower(), PEOPLE.lower()] + people)
        assert dns(one, "(objectClass=glue)") == [PEOPLE.lower()]
        for node in (persons, one):
            mon = attrs_of(node, "cn=Consumer 001,cn=Replication,cn=Monitor")
            assert mon["pandoReplConflicts"] == ["0"], mon
        # Changes follow; an entry leaving the filter leaves the consumer.
        modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: x\n" % PEOPLE)
        modify(srv, "dn: uid=bob,%s\nchangetype: delete\n" % PEOPLE)
        people = dns(srv, "(uid=*)")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (dns(persons, "(uid=*)") != people or dns(one, "(uid=*)") != people):
            time.sleep(0.3)
        assert dns(persons, "(uid=*)") == people and dns(one, "(uid=*)") == people
        assert attrs_of(persons, "uid=alice," + PEOPLE, "description")["description"] == ["x"]
        # A restart (a delete phase from the change log) keeps the glue.
        assert persons.stop() == 0
        modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
        persons.start()
        people = dns(srv, "(uid=*)")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and dns(persons, "(uid=*)") != people:
            time.sleep(0.3)
        assert dns(persons) == sorted([SUFFIX.lower(), PEOPLE.lower()] + people)
    finally:
        for s in (one, persons, srv):
            s.stop_and_verify()


def test_a_subtree_moved_into_or_out_of_a_consumer_s_base_brings_or_takes_its_descendants(tmp_path):
    """A moved entry's descendants change DN without a change of their own:
    the provider sends them with it, in the persist stage and in a delete
    phase from the change log."""
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    staging = "ou=Staging," + SUFFIX
    modify(srv, "".join([
        "dn: %s\nchangetype: add\nobjectClass: organizationalUnit\nou: Staging\n\n" % staging,
        "dn: ou=Team,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Team\n\n" % staging,
    ] + ["dn: uid=t%d,ou=Team,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: t%d\ncn: T %d\nsn: T\n\n"
         % (i, staging, i, i) for i in range(3)]))
    people = pando_consumer(tmp_path / "people", srv, search_base=PEOPLE, name="people")
    # This one keeps only persons (uid=*): the OUs moved are not sent.
    persons = pando_consumer(tmp_path / "persons", srv, extra='filter = "(uid=*)"\n')

    def dns(node, base=PEOPLE, filt="(objectClass=*)"):
        rc, entries, err = node.search(base, filt, "1.1")
        assert rc in (0, 32), err
        return sorted(d.lower() for d, _ in entries)

    def same(why):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (dns(people) != dns(srv) or
                                               dns(persons, SUFFIX, "(uid=*)") != dns(srv, SUFFIX, "(uid=*)")):
            time.sleep(0.3)
        assert dns(people) == dns(srv), (why, people.logs())
        assert dns(persons, SUFFIX, "(uid=*)") == dns(srv, SUFFIX, "(uid=*)"), (why, persons.logs())

    team = ["ou=team," + PEOPLE.lower()] + ["uid=t%d,ou=team,%s" % (i, PEOPLE.lower()) for i in range(3)]

    def move(dn, superior):
        modify(srv, "dn: %s\nchangetype: modrdn\nnewrdn: ou=Team\ndeleteoldrdn: 1\nnewsuperior: %s\n"
               % (dn, superior))

    try:
        same("initial")
        # Persist stage: in, then out.
        move("ou=Team," + staging, PEOPLE)
        same("moved in while connected")
        assert set(team) <= set(dns(people))
        # Renamed in place: persons below a renamed OU follow it.
        modify(srv, "dn: ou=Team,%s\nchangetype: modrdn\nnewrdn: ou=Crew\ndeleteoldrdn: 1\n" % PEOPLE)
        same("renamed while connected")
        assert "uid=t0,ou=crew," + PEOPLE.lower() in dns(persons, SUFFIX, "(uid=*)")
        modify(srv, "dn: ou=Crew,%s\nchangetype: modrdn\nnewrdn: ou=Team\ndeleteoldrdn: 1\n" % PEOPLE)
        same("renamed back while connected")
        move("ou=Team," + PEOPLE, staging)
        same("moved out while connected")
        assert not set(team) & set(dns(people))
        # Delete phase from the change log: in, then out, each while the
        # consumer is down.
        assert people.stop() == 0
        move("ou=Team," + staging, PEOPLE)
        people.start()
        same("moved in while down")
        assert set(team) <= set(dns(people))
        assert people.stop() == 0
        move("ou=Team," + PEOPLE, staging)
        people.start()
        same("moved out while down")
        assert not set(team) & set(dns(people))
        # A rename while a filtered consumer is down: its delete phase
        # moves the persons below.
        assert persons.stop() == 0
        modify(srv, "dn: ou=Team,%s\nchangetype: modrdn\nnewrdn: ou=Crew\ndeleteoldrdn: 1\n" % staging)
        persons.start()
        same("renamed while down")
        assert "uid=t0,ou=crew," + staging.lower() in dns(persons, SUFFIX, "(uid=*)")
    finally:
        persons.stop_and_verify()
        people.stop_and_verify()
        srv.stop_and_verify()


def test_a_consumer_keeps_out_what_lies_outside_its_base_and_backs_off_endless_reloads(tmp_path):
    """A provider sending an entry outside the consumer's search base, or
    a UUID the consumer holds outside it, changes nothing there; one that
    asks for a reload on every session is followed three times at once,
    then by the retry schedule."""
    ou = "ou=People," + SUFFIX
    csn2 = "20261125000000.000002Z#000000#000#000000"

    def people_refresh(msgid):
        base = fake_entry(msgid, ou, {"objectClass": ["organizationalUnit"], "ou": ["People"],
                                      "entryCSN": [FAKE_CSN]}, uuid=FAKE_UUIDS[0])
        person = fake_entry(msgid, "uid=in," + ou, {"objectClass": ["inetOrgPerson"], "uid": ["in"],
                                                     "cn": ["I"], "sn": ["I"], "entryCSN": [FAKE_CSN]},
                            uuid=FAKE_UUIDS[1])
        return base + person + fake_done(msgid, cookie="rid=001,csn=" + FAKE_CSN), False

    def outside(msgid):
        return fake_entry(msgid, "uid=out," + SUFFIX, {"objectClass": ["inetOrgPerson"], "uid": ["out"],
                                                        "cn": ["O"], "sn": ["O"], "entryCSN": [csn2]},
                          uuid=FAKE_UUIDS[2]) + fake_done(msgid, cookie="rid=001,csn=" + csn2), False

    def reload(msgid):
        return fake_done(msgid, code=4096, diag="reload"), False

    scenarios = [people_refresh, outside] + [reload] * 6
    fake = FakeProvider(scenarios)
    con = Pando(tmp_path / "consumer", name="consumer")
    con.config = PUBLIC_READ + """
[[replication.consumer]]
rid = 1
provider = "%s"
search_base = "%s"
type = "refreshOnly"
interval = 1
retry = "4 100"
timeout_secs = 5
bind_dn = "%s"
credentials = "fake"
""" % (fake.url, ou, ADMIN_DN)
    con.start()
    try:
        deadline = time.monotonic() + 30
        while len(fake.cookies) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = con.logs(tail=20000)
        assert "'uid=out,%s' is outside this consumer's search base" % SUFFIX in logs, logs[-3000:]
        rc, entries, _ = con.search(SUFFIX, "(uid=*)", "1.1")
        assert rc == 0 and [d for d, _ in entries] == ["uid=in," + ou], entries
        # refresh, refused outside entry, then the 4096s: sessions 3, 4 and
        # 5 reload at once, then the retry schedule waits 4 s.
        started = time.monotonic()
        while len(fake.cookies) < 7 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(fake.cookies) >= 7 and time.monotonic() - started >= 2.5, fake.cookies
        assert "asked for a reload 3 times in a row" in con.logs(tail=20000)
        mon = attrs_of(con, "cn=Consumer 001,cn=Replication,cn=Monitor")
        assert int(mon["pandoReplReloads"][0]) >= 3
    finally:
        con.stop_and_verify()
        fake.stop()


def external_modify(srv, ldif):
    r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url], input=ldif,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_consumers_and_server_id_change_over_ldap(tmp_path):
    """A consumer added, changed and removed under cn=config, and the
    provider's server ID changed, all while serving."""
    srv = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    con = Pando(tmp_path / "consumer", demo=False, config=PUBLIC_READ, name="consumer").start()
    consumer = ('{ rid = 1, provider = "%s", search_base = "%s", type = "%%s", interval = 1, '
                'retry = "1 30 5 +", timeout_secs = 5, bind_dn = "%s", credentials = "%s" }'
                % (srv.url, SUFFIX, srv.admin_dn, srv.admin_pw))
    db = "olcDatabase={1}mdb,cn=config"
    external_modify(con, "dn: %s\nchangetype: modify\nadd: pandoReplicationConsumer\n"
                         "pandoReplicationConsumer: %s\n" % (db, consumer % "refreshAndPersist"))
    # The consumer made its own suffix entry at its first start; that
    # entry alone is not the subtree, so it loads the subtree whole (even
    # when the provider changes something before its first request, which
    # once made it start from its own suffix entry's CSN and skip the
    # provider's older entries).
    modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: first\n" % PEOPLE)
    converge_nodes([srv, con], log=con.logs)
    assert "loading the subtree whole" in con.logs(tail=100000)
    assert "replication consumer started (configuration changed)" in con.logs(tail=100000)
    r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-Y", "EXTERNAL", "-H", con.ldapi_url, "-b",
                        "cn=config", "-s", "base", "pandoAtNextStart"], capture_output=True, text=True)
    assert "pandoAtNextStart" not in r.stdout, r.stdout
    # The provider takes a server ID: its next change carries it.
    external_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcServerID\nolcServerID: 5\n")
    modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: sid 5\n" % PEOPLE)
    assert attrs_of(srv, "uid=alice," + PEOPLE, "entryCSN")["entryCSN"][0].endswith("#005#000000")
    converge_nodes([srv, con], log=con.logs)
    assert any(c.split("#")[2] == "005" for c in context_csn(con.url, con.admin_dn, con.admin_pw))
    # Changed (to refreshOnly): it stops and starts again from its cookie.
    external_modify(con, "dn: %s\nchangetype: modify\nreplace: pandoReplicationConsumer\n"
                         "pandoReplicationConsumer: %s\n" % (db, consumer % "refreshOnly"))
    assert "replication consumer stopped (configuration changed)" in con.logs(tail=100000)
    changes_round(srv, 1)
    converge_nodes([srv, con], log=con.logs)
    # Removed: changes stop arriving, and the subtree takes writes here.
    external_modify(con, "dn: %s\nchangetype: modify\ndelete: pandoReplicationConsumer\n" % db)
    assert attrs_of(con, "cn=Replication,cn=Monitor", "pandoReplConsumers")["pandoReplConsumers"] == ["0"]
    modify(srv, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: after\n" % PEOPLE)
    time.sleep(2.5)
    assert attrs_of(con, "uid=bob," + PEOPLE, "description").get("description") != ["after"]
    modify(con, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: local\n" % PEOPLE)
    con.stop_and_verify()
    srv.stop_and_verify()


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_slapd_follows_a_provider_holding_several_server_ids(tmp_path):
    """A provider whose state holds CSNs of two server IDs (its own ID
    changed while serving; a Pando fed by a slapd multi-provider pair is
    the same): each change goes to a slapd consumer with a cookie naming
    that change's CSN only. slapd judges a change by the first CSN of its
    cookie, so with every server's CSN in it a change of the second ID
    looked already applied and was dropped."""
    srv = Pando(tmp_path / "pando", demo=True,
                config=PUBLIC_READ + "\n[replication]\nserver_id = 1\n").start()
    consumer = SlapdConsumer(tmp_path / "slapd", srv).start()
    try:
        modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: sid 1\n" % PEOPLE)
        converge(srv, consumer)
        external_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcServerID\nolcServerID: 2\n")
        modify(srv, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: sid 2\n" % PEOPLE)
        assert len(context_csn(srv.url, srv.admin_dn, srv.admin_pw)) == 2
        converge(srv, consumer)
        # And again, once each server ID has moved past the other.
        modify(srv, "dn: uid=carol,%s\nchangetype: modify\nreplace: description\ndescription: sid 2 again\n"
               % PEOPLE)
        converge(srv, consumer)
    finally:
        consumer.stop()
        srv.stop_and_verify()


def test_a_consumer_warns_of_changes_dated_in_the_future(tmp_path):
    """A change whose CSN is more than a minute past this server's clock
    is applied as usual (CSNs order changes), counted and logged: the clock
    of the server that made it, or this one's, is off."""
    future = time.strftime("%Y%m%d%H%M%S", time.gmtime(time.time() + 3600)) + ".000001Z#000000#000#000000"

    def ahead(msgid):
        return fake_entry(msgid, "uid=ahead," + SUFFIX, {"objectClass": ["inetOrgPerson"], "uid": ["ahead"],
                                                          "cn": ["A"], "sn": ["A"], "entryCSN": [future]},
                          uuid=FAKE_UUIDS[2]) + fake_done(msgid, cookie="rid=001,csn=" + future), False

    fake = FakeProvider([good_refresh, ahead])
    con = pando_consumer(tmp_path / "consumer", fake, mode="refreshOnly")
    try:
        mon = "cn=Consumer 001,cn=Replication,cn=Monitor"
        wait_monitor(con, "pandoReplFutureChanges", "1")
        logs = con.logs(tail=20000)
        assert "dated in the future" in logs and future in logs, logs[-2000:]
        assert attrs_of(con, "uid=ahead," + SUFFIX, "sn")["sn"] == ["A"]
        # The good refresh's entries carry no such CSN: counted once.
        assert int(attrs_of(con, mon)["pandoReplApplied"][0]) >= 3
    finally:
        con.stop_and_verify()
        fake.stop()
