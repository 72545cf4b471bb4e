"""Delta-sync (OpenLDAP's `syncdata=accesslog`): Pando's cn=accesslog
served for content synchronization, checked on the wire with raw BER and
followed by Debian's slapd as a delta-syncrepl consumer (OpenLDAP's
test043, black-box)."""

import re
import subprocess
import time
from pathlib import Path

import pytest

import ber
from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando
from test_replication import (HAVE_SLAPD, SlapdConsumer, SlapdProvider, changes_round, context_csn, converge,
                              converge_nodes, modify, pando_consumer, slapd_changes, sync_control,
                              sync_done, sync_info, sync_state)

LOG = "cn=accesslog"
GROUPS = "ou=Groups," + SUFFIX
LOG_FILTER = "(&(objectClass=auditWriteObject)(reqResult=0))"
# What slapd's consumer asks of each record (syncrepl.c).
LOG_ATTRS = ["reqDN", "reqType", "reqMod", "reqNewRDN", "reqDeleteOldRDN", "reqNewSuperior",
             "reqControls", "entryCSN"]

CONFIG = PUBLIC_READ + """
[[access]]
dn = "cn=accesslog"
by = [{ who = "dn:uid=bob,ou=People,dc=example,dc=com", rights = "read" }]

[[overlay]]
type = "accesslog"
ops = ["writes"]

[[overlay]]
type = "refint"
attributes = ["member"]
"""


def log_sync(srv, mode=1, cookie=None, who=None):
    """A synchronization search of cn=accesslog as slapd's consumer sends
    it: (messages before the end, the end), or the open connection in
    refreshAndPersist mode once the refresh ended."""
    c = srv.raw(timeout=30)
    dn, pw = who or (srv.admin_dn, srv.admin_pw)
    assert ber.simple_bind(c, dn, pw) == 0
    filt = ber.f_and(ber.f_eq("objectClass", "auditWriteObject"), ber.f_eq("reqResult", "0"))
    manage_dsa_it = ber.control("2.16.840.1.113730.3.4.2", True)
    c.send(ber.message(2, ber.search_op(LOG, filt=filt, attrs=LOG_ATTRS),
                       [sync_control(mode, cookie), manage_dsa_it]))
    got = []
    while True:
        m = c.recv_msg(timeout=30)
        assert m is not None, "connection closed: %r" % got
        if m["op"] == "searchDone" or (mode == 3 and m["op"] != "entry"):
            if mode == 3 and m["op"] != "searchDone":
                return got, m, c
            c.close()
            return got, m
        got.append(m)


def ctx_cookie(srv):
    return "rid=001,csn=" + ";".join(context_csn(srv.url, srv.admin_dn, srv.admin_pw))


def records(msgs):
    """(reqType, reqDN, entryCSN, cookie or None, uuid) per record."""
    out = []
    for m in msgs:
        assert m["op"] == "entry", m
        state, uuid, cookie = sync_state(m)
        assert state == 1 and len(uuid) == 16
        a = {k.lower(): v for k, v in m["attrs"].items()}
        out.append((a["reqtype"][0].decode(), a["reqdn"][0].decode(), a["entrycsn"][0].decode(),
                    cookie, uuid, a))
    return out


@pytest.fixture
def logged(tmp_path):
    s = Pando(tmp_path, demo=True, config=CONFIG + "\n[replication]\nserver_id = 1\n").start()
    yield s
    s.stop_and_verify()


def test_the_access_log_is_served_for_content_synchronization(logged):
    srv = logged
    start = ctx_cookie(srv)
    # Nothing newer: no records, the state as it is.
    got, done = log_sync(srv, cookie=start)
    assert got == [] and done["code"] == 0
    assert sync_done(done) == (start.replace("rid=001,", "rid=001,sid=001,"), True)
    # A delete with the refint changes it causes (one operation, one CSN),
    # then a rename.
    modify(srv, "dn: uid=alice,%s\nchangetype: delete\n" % PEOPLE)
    modify(srv, "dn: uid=bob,%s\nchangetype: modrdn\nnewrdn: uid=robert\ndeleteoldrdn: 1\n" % PEOPLE)
    got, done = log_sync(srv, cookie=start)
    recs = records(got)
    # In the order written: the groups' changes before the delete, the
    # refint change of bob's group before his rename.
    assert [(r[0], r[1].lower()) for r in recs] == [
        ("modify", "cn=staff," + GROUPS.lower()),
        ("modify", "cn=engineering," + GROUPS.lower()),
        ("delete", "uid=alice," + PEOPLE.lower()),
        ("modify", "cn=staff," + GROUPS.lower()),
        ("modify", "cn=operations," + GROUPS.lower()),
        ("modrdn", "uid=bob," + PEOPLE.lower()),
    ], recs
    deleted_csn, renamed_csn = recs[0][2], recs[5][2]
    assert [r[2] for r in recs] == [deleted_csn] * 3 + [renamed_csn] * 3 and deleted_csn < renamed_csn
    # Only the last record of an operation carries its cookie (a slapd
    # consumer drops a record whose CSN its state already holds).
    assert [r[3] for r in recs] == [None, None, "rid=001,sid=001,csn=" + deleted_csn,
                                    None, None, "rid=001,sid=001,csn=" + renamed_csn]
    assert len({r[4] for r in recs}) == 6
    assert b"member:- uid=alice,ou=People,dc=example,dc=com" in recs[1][5]["reqmod"]
    assert recs[5][5]["reqnewrdn"] == [b"uid=robert"] and recs[5][5]["reqdeleteoldrdn"] == [b"TRUE"]
    # The same records, the same UUIDs, every time; from a later cookie,
    # only what is newer.
    again = records(log_sync(srv, cookie=start)[0])
    assert [r[4] for r in again] == [r[4] for r in recs]
    later = records(log_sync(srv, cookie="rid=001,csn=" + deleted_csn)[0])
    assert [r[2] for r in later] == [renamed_csn] * 3
    # Persist: the refresh ends with refreshDelete, then each operation's
    # records as it commits.
    got, info, c = log_sync(srv, mode=3, cookie="rid=001,csn=" + renamed_csn)
    assert got == [] and sync_info(info)[0] == "refreshDelete"
    modify(srv, "dn: uid=carol,%s\nchangetype: modify\nreplace: description\ndescription: live\n" % PEOPLE)
    m = c.recv_msg(timeout=30)
    (rec,) = records([m])
    assert rec[0] == "modify" and rec[3] == "rid=001,sid=001,csn=" + rec[2]
    assert b"description:+ live" in rec[5]["reqmod"]
    c.close()


def test_who_may_follow_the_log_and_when_it_no_longer_covers_a_cookie(tmp_path):
    srv = Pando(tmp_path, demo=True, config=CONFIG + "\n[replication]\nchangelog_max_changes = 3\n").start()
    try:
        for user in ("carol", "bob"):
            rc, _, err = srv.ldap("ldappasswd", "-s", user + "-secret", "uid=%s,%s" % (user, PEOPLE))
            assert rc == 0, err
        start = ctx_cookie(srv)
        # Users read the data, not the log; a rule naming cn=accesslog
        # opens it to bob.
        _, done = log_sync(srv, cookie=start, who=("uid=carol," + PEOPLE, "carol-secret"))
        assert done["code"] == 32, done
        got, done = log_sync(srv, cookie=start, who=("uid=bob," + PEOPLE, "bob-secret"))
        assert done["code"] == 0, done
        for i in range(5):
            modify(srv, "dn: uid=dave,%s\nchangetype: modify\nreplace: description\ndescription: %d\n"
                   % (PEOPLE, i))
        # The oldest changes went: the first cookie is stale (4096, never a
        # present phase); a recent one is served.
        _, done = log_sync(srv, cookie=start)
        assert done["code"] == 4096 and "stale" in done["diag"], done
        # The log's root says so, as OpenLDAP's does: minCSN per server ID.
        rc, entries, err = srv.search(LOG, "(objectClass=*)", "contextCSN", "minCSN", scope="base")
        root = entries[0][1]
        assert root["contextCSN"] == context_csn(srv.url, srv.admin_dn, srv.admin_pw), root
        assert start.split("csn=")[1] < root["minCSN"][0] < root["contextCSN"][0], (start, root)
        got, done = log_sync(srv, cookie=ctx_cookie(srv))
        assert done["code"] == 0 and got == []
        # A cookie newer than this server for its own ID: 53.
        _, done = log_sync(srv, cookie="rid=001,csn=29991231000000.000000Z#000000#000#000000")
        assert done["code"] == 53, done
    finally:
        srv.stop_and_verify()


class SlapdDeltaConsumer(SlapdConsumer):
    """slapd following a Pando provider with syncdata=accesslog."""

    def __init__(self, base, provider):
        super().__init__(base, provider)
        conf = self.base / "slapd.conf"
        text = conf.read_text().replace(
            'timeout=5', 'timeout=5 logbase="%s" logfilter="%s" syncdata=accesslog' % (LOG, LOG_FILTER))
        conf.write_text(text)


def delta_applied(consumer):
    """How many log records slapd applied, and whether it fell back to a
    full refresh."""
    log = (consumer.base / "slapd.log").read_text(errors="replace")
    return len(re.findall(r"syncrepl_message_to_op: rid=001 be_", log)), log.count("lost sync")


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_slapd_follows_pando_with_delta_syncrepl(tmp_path):
    srv = Pando(tmp_path / "pando", demo=True,
                config=CONFIG + "\n[replication]\nchangelog_max_changes = 30\n").start()
    consumer = SlapdDeltaConsumer(tmp_path / "slapd", srv).start()
    try:
        # An empty consumer loads the data whole, then follows the log.
        converge(srv, consumer)
        changes_round(srv, 1)
        modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
        converge(srv, consumer)
        applied, lost = delta_applied(consumer)
        assert applied >= 9 and lost == 0, consumer.log()
        # Down while the provider changes: the log covers its cookie.
        consumer.stop()
        changes_round(srv, 2)
        modify(srv, "dn: uid=dave,%s\nchangetype: delete\n" % PEOPLE)
        consumer.start()
        converge(srv, consumer)
        assert delta_applied(consumer)[0] >= applied + 9
        # Down while more changes than the log keeps are made: 4096, a full
        # refresh, then the log again.
        consumer.stop()
        for n in (3, 4, 5, 6, 7):
            changes_round(srv, n)
        consumer.start()
        converge(srv, consumer)
        log = (consumer.base / "slapd.log").read_text(errors="replace")
        assert "4096" in log or "refresh required" in log.lower(), log[-3000:]
        applied = delta_applied(consumer)[0]
        modify(srv, "dn: uid=erin,%s\nchangetype: modify\nreplace: description\ndescription: after\n" % PEOPLE)
        converge(srv, consumer)
        assert delta_applied(consumer)[0] == applied + 1, consumer.log()
    finally:
        consumer.stop()
        srv.stop_and_verify()


# ------------------------------------------------------------ Pando as a delta consumer

DELTA = 'syncdata = "accesslog"\nlogbase = "cn=accesslog"\nlogfilter = "%s"\ncount_behind_secs = 0\n' % LOG_FILTER


def follows_log(con):
    return con.logs(tail=200000).count("following the provider's log")


def lost_step(con):
    logs = con.logs(tail=200000)
    return logs.count("lost step") + logs.count("asked for a reload")


def test_pando_follows_pando_with_delta_sync(tmp_path):
    srv = Pando(tmp_path / "provider", demo=True, config=CONFIG).start()
    con = pando_consumer(tmp_path / "consumer", srv, extra=DELTA)
    nodes = [srv, con]
    try:
        converge_nodes(nodes, log=con.logs)
        changes_round(srv, 1)
        # A delete with the refint changes it causes: one CSN, three records.
        modify(srv, "dn: uid=carol,%s\nchangetype: delete\n" % PEOPLE)
        converge_nodes(nodes, log=con.logs)
        assert follows_log(con) >= 1 and lost_step(con) == 0, con.logs()
        # Down while the provider changes: back from its cookie, on the log.
        assert con.stop() == 0
        changes_round(srv, 2)
        con.start()
        converge_nodes(nodes, log=con.logs)
        assert follows_log(con) >= 1 and lost_step(con) == 0, con.logs()
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


class SlapdLogProvider(SlapdProvider):
    """slapd with an access log database (cn=accesslog, syncprov with
    nopresent and reloadhint) beside the data (syncprov and accesslog), as
    OpenLDAP's test043 configures a delta-syncrepl provider."""

    def __init__(self, base, purge="07+00:00 01+00:00"):
        super().__init__(base)
        (self.base / "log").mkdir(exist_ok=True)
        self.purge = purge
        self.write_conf()

    def write_conf(self):
        lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += ["modulepath /usr/lib/ldap", "moduleload back_mdb", "moduleload syncprov", "moduleload accesslog",
                  "pidfile %s/slapd.pid" % self.base, "argsfile %s/slapd.args" % self.base, "loglevel sync",
                  "database mdb", 'suffix "cn=accesslog"', 'rootdn "%s"' % ADMIN_DN,
                  "directory %s/log" % self.base, "maxsize 268435456",
                  "index entryCSN,objectClass,reqEnd,reqResult,reqStart,reqDN eq",
                  "overlay syncprov", "syncprov-nopresent TRUE", "syncprov-reloadhint TRUE",
                  "database mdb", 'suffix "%s"' % SUFFIX, 'rootdn "%s"' % ADMIN_DN, "rootpw %s" % self.admin_pw,
                  "directory %s/db" % self.base, "maxsize 268435456", "index objectClass eq",
                  "index entryUUID,entryCSN eq", "access to * by * read",
                  "overlay syncprov", "syncprov-checkpoint 100 1",
                  "overlay accesslog", 'logdb "cn=accesslog"', "logops writes", "logsuccess TRUE",
                  "logpurge %s" % self.purge]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")

    def load(self):
        # The data database, by its suffix; -w writes its contextCSN.
        return super().load("-b", SUFFIX, "-w")

    def log_records(self):
        r = subprocess.run(["ldapsearch", "-x", "-H", self.url, "-D", ADMIN_DN, "-w", self.admin_pw, "-b", LOG,
                            "-s", "one", "-LLL", "1.1"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.count("dn: ")


HAVE_ACCESSLOG = HAVE_SLAPD and Path("/usr/lib/ldap/accesslog.la").exists()


@pytest.mark.skipif(not HAVE_ACCESSLOG, reason="slapd or its accesslog overlay not installed")
def test_pando_follows_slapd_with_delta_sync(tmp_path):
    prov = SlapdLogProvider(tmp_path / "slapd").load().start()
    con = pando_consumer(tmp_path / "consumer", prov, extra=DELTA)
    nodes = [prov, con]
    try:
        # Empty: a full refresh, then the log.
        converge_nodes(nodes, log=con.logs)
        slapd_changes(prov, 1)
        converge_nodes(nodes, log=lambda: con.logs() + prov.log())
        assert follows_log(con) >= 1 and lost_step(con) == 0, con.logs()
        assert prov.log_records() >= 10
        # Down while slapd changes: back from its cookie, on the log.
        assert con.stop() == 0
        slapd_changes(prov, 2)
        con.start()
        converge_nodes(nodes, log=lambda: con.logs() + prov.log())
        assert follows_log(con) >= 1 and lost_step(con) == 0, con.logs()
        # Down while slapd changes and purges its log: 4096, a full
        # refresh, then the log again (OpenLDAP's test043 ends so).
        assert con.stop() == 0
        slapd_changes(prov, 3)
        prov.stop()
        prov.purge = "00:00:02 00:00:01"
        prov.write_conf()
        prov.start()
        deadline = time.monotonic() + 60
        while prov.log_records() > 0:
            assert time.monotonic() < deadline, "slapd did not purge its log"
            time.sleep(0.5)
        con.start()
        converge_nodes(nodes, timeout=60, log=lambda: con.logs() + prov.log())
        assert lost_step(con) >= 1, con.logs()
        r = subprocess.run(["ldapmodify", "-x", "-H", prov.url, "-D", ADMIN_DN, "-w", prov.admin_pw],
                           input="dn: uid=s0,%s\nchangetype: modify\nreplace: description\ndescription: after\n"
                           % PEOPLE, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        converge_nodes(nodes, log=lambda: con.logs() + prov.log())
        assert follows_log(con) >= 1
    finally:
        con.stop_and_verify()
        prov.stop()
