"""Push replication (`[[replication.push]]`): this server's changes of a
subtree written, as ordinary LDAP writes, to a server that cannot pull
them. The target here is Debian's slapd with no syncprov overlay (it could
not be a provider, nor pull from Pando); the checks compare both trees
entry by entry, through restarts of each side and a kill -9 of Pando."""

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, parse_ldif
from test_replication import SlapdConsumer

SLAPD = "/usr/sbin/slapd"
HAVE_SLAPD = Path(SLAPD).exists() and shutil.which("ldapsearch") is not None
# The suite pushes this many changes; PANDO_PUSH_CHANGES raises it (the
# closing note's run used 10,000).
CHANGES = int(os.environ.get("PANDO_PUSH_CHANGES", "4000"))


class SlapdTarget:
    """slapd holding dc=example,dc=com, taking writes from its root DN,
    with no replication configured at all."""

    def __init__(self, base):
        self.base = Path(base)
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        self.port, self.proc = None, None
        self.admin_dn, self.admin_pw = ADMIN_DN, "target-secret"
        self.pw = self.admin_pw
        lines = ["include /etc/ldap/schema/%s.schema" % s for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += ["modulepath /usr/lib/ldap", "moduleload back_mdb",
                  "pidfile %s/slapd.pid" % self.base, "argsfile %s/slapd.args" % self.base,
                  "database mdb", 'suffix "%s"' % SUFFIX, 'rootdn "%s"' % ADMIN_DN,
                  "rootpw %s" % self.admin_pw, "directory %s/db" % self.base, "maxsize 268435456",
                  "index objectClass eq", "access to * by * read"]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")

    url = SlapdConsumer.url
    start = SlapdConsumer.start
    stop = SlapdConsumer.stop


def push_config(target, rid=1, base=SUFFIX, extra=""):
    return PUBLIC_READ + """
[[replication.push]]
rid = %d
target = "%s"
search_base = "%s"
bind_dn = "%s"
credentials = "%s"
retry = "1 600"
timeout_secs = 5
%s""" % (rid, target.url, base, target.admin_dn, target.admin_pw, extra)


def user_tree(url, dn, pw, base=SUFFIX):
    """Every entry under `base` with its user attributes, comparable."""
    r = subprocess.run(["ldapsearch", "-x", "-H", url, "-D", dn, "-w", pw, "-b", base, "-LLL",
                        "-o", "ldif-wrap=no", "*"], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 32), r.stderr
    return {d.lower(): sorted((k.lower(), sorted(v)) for k, v in a.items()) for d, a in parse_ldif(r.stdout)}


def wait_equal(srv, target, timeout=180, base=SUFFIX):
    deadline = time.monotonic() + timeout
    while True:
        a = user_tree(srv.url, srv.admin_dn, srv.admin_pw, base)
        b = user_tree(target.url, target.admin_dn, target.admin_pw, base)
        if a == b:
            return len(a)
        if time.monotonic() > deadline:
            only_a = sorted(set(a) - set(b))[:3]
            only_b = sorted(set(b) - set(a))[:3]
            differ = [d for d in a if d in b and a[d] != b[d]][:2]
            pytest.fail("the target never matched: %d vs %d entries; only here %r; only there %r; differ %r\n%s"
                        % (len(a), len(b), only_a, only_b, [(d, a[d], b[d]) for d in differ],
                           srv.logs()))
        time.sleep(0.5)


class Changes:
    """Changes of every kind, as LDIF for ldapmodify: adds, modifies
    (replace, add and delete of values, a group of many members), renames
    keeping and dropping the old RDN, moves between subtrees, deletes and
    password changes."""

    def __init__(self, seed):
        self.rnd = random.Random(seed)
        self.live = {}  # uid -> ou
        self.mails = {}  # uid -> its mail values
        self.members = {ADMIN_DN.lower()}  # cn=staff's
        self.next = 0
        self.ous = ["Dept0", "Dept1", "Dept2"]

    def setup(self):
        out = ["dn: ou=%s,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: %s\n" % (o, SUFFIX, o)
               for o in self.ous]
        out.append("dn: cn=staff,%s\nchangetype: add\nobjectClass: groupOfNames\ncn: staff\nmember: %s\n"
                   % (SUFFIX, ADMIN_DN))
        return out

    def dn(self, uid):
        return "uid=%s,ou=%s,%s" % (uid, self.live[uid], SUFFIX)

    def one(self):
        r = self.rnd.random()
        if len(self.live) < 20 or r < 0.3:
            uid = "p%d" % self.next
            self.next += 1
            self.live[uid] = self.rnd.choice(self.ous)
            self.mails[uid] = ["%s@example.com" % uid, "%s@mail.example.com" % uid]
            return ("dn: %s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: %s\ncn: P %s\nsn: P\n"
                    "mail: %s@example.com\nmail: %s@mail.example.com\ndescription: added\n"
                    % (self.dn(uid), uid, uid, uid, uid))
        uid = self.rnd.choice(sorted(self.live))
        dn = self.dn(uid)
        if r < 0.45:
            return "dn: %s\nchangetype: modify\nreplace: description\ndescription: d%d\n" % (dn, self.next)
        if r < 0.55:
            self.next += 1
            text = "dn: %s\nchangetype: modify\nadd: telephoneNumber\ntelephoneNumber: +1 555 %06d\n" % (
                dn, self.next)
            if self.mails[uid]:
                text += "-\ndelete: mail\nmail: %s\n" % self.mails[uid].pop()
            return text
        if r < 0.62:
            return "dn: %s\nchangetype: modify\nreplace: userPassword\nuserPassword: pw-%d\n" % (dn, self.next)
        if r < 0.70 and dn.lower() not in self.members:
            self.members.add(dn.lower())
            return "dn: cn=staff,%s\nchangetype: modify\nadd: member\nmember: %s\n" % (SUFFIX, dn)
        if r < 0.80:
            new = "r%d" % self.next
            self.next += 1
            self.live[new] = self.live.pop(uid)
            self.mails[new] = self.mails.pop(uid)
            return ("dn: %s\nchangetype: modrdn\nnewrdn: uid=%s\ndeleteoldrdn: %d\n"
                    % (dn, new, self.rnd.randrange(2)))
        if r < 0.88:
            ou = self.rnd.choice([o for o in self.ous if o != self.live[uid]])
            self.live[uid] = ou
            return ("dn: %s\nchangetype: modrdn\nnewrdn: uid=%s\ndeleteoldrdn: 1\nnewsuperior: ou=%s,%s\n"
                    % (dn, uid, ou, SUFFIX))
        del self.live[uid], self.mails[uid]
        return "dn: %s\nchangetype: delete\n" % dn

    def batch(self, n):
        return [self.one() for _ in range(n)]


def apply(srv, changes):
    r = subprocess.run(["ldapmodify", "-x", "-H", srv.url, "-D", srv.admin_dn, "-w", srv.admin_pw],
                       input="\n".join(changes), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def status(srv, rid=1):
    """The push's cn=Monitor entry, as {attribute: [values]}."""
    rc, entries, err = srv.search("cn=Push %03d,cn=Replication,cn=Monitor" % rid, "(objectClass=*)",
                                  "*", scope="base")
    assert rc == 0 and entries, err
    return {k.lower(): v for k, v in entries[0][1].items()}


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_push_to_slapd_through_restarts_of_each_side(tmp_path):
    """The demo tree loaded whole into an empty slapd, then changes of
    every kind pushed as they are made: while slapd runs, while it is
    down (they wait), across a clean restart of Pando and a kill -9 of it
    in the middle of pushing. Both trees equal entry by entry after each."""
    target = SlapdTarget(tmp_path / "slapd").start()
    srv = Pando(tmp_path / "pando", demo=True, config=None)
    srv.config = push_config(target)
    gen = Changes(seed=41)
    quarter = max(CHANGES // 4, 50)
    try:
        srv.start()
        n = wait_equal(srv, target)
        assert n > 10
        apply(srv, gen.setup() + gen.batch(quarter))
        wait_equal(srv, target)
        # slapd down: the changes wait, and go once it is back.
        target.stop()
        apply(srv, gen.batch(quarter))
        time.sleep(2)
        target.start()
        wait_equal(srv, target)
        # A clean restart of Pando: it goes on from its place.
        apply(srv, gen.batch(quarter // 2))
        srv.stop()
        srv.start(keep_port=True)
        apply(srv, gen.batch(quarter // 2))
        wait_equal(srv, target)
        # kill -9 in the middle of pushing: what was pushed after the
        # last place kept is pushed again, changing nothing.
        apply(srv, gen.batch(quarter))
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        srv.start(keep_port=True)
        total = wait_equal(srv, target)
        # A restart of slapd alone (no change waiting) costs nothing.
        target.stop()
        target.start()
        apply(srv, gen.batch(10))
        assert wait_equal(srv, target) >= total - 10
        st = status(srv)
        assert st["pandopushrefused"] == ["0"], st
        assert st["pandopushphase"] == ["idle"] and int(st["pandopushpushed"][0]) > 0, st
        assert target.admin_pw not in srv.logs()
    finally:
        target.stop()
        srv.stop_and_verify()


def ldapadd(node, text):
    r = subprocess.run(["ldapadd", "-x", "-H", node.url, "-D", node.admin_dn, "-w", node.admin_pw],
                       input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_push_of_a_subtree_follows_moves_in_and_out_and_reloads_when_the_log_is_gone(tmp_path):
    """A push of ou=Dept0 only: entries moved into it arrive whole, those
    moved out leave the target, `exattrs` never go. With the change log
    kept short and the target away for longer than it covers, the push
    loads the subtree whole on its return, and the target matches."""
    target = SlapdTarget(tmp_path / "slapd").start()
    ldapadd(target, "dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: x\n" % SUFFIX)
    base = "ou=Dept0," + SUFFIX
    srv = Pando(tmp_path / "pando", demo=False)
    srv.config = push_config(target, rid=7, base=base, extra='exattrs = ["description"]\n') + \
        "\n[replication]\nchangelog_max_changes = 50\n"
    gen = Changes(seed=7)
    try:
        srv.start()
        apply(srv, ["dn: %s\nchangetype: add\nobjectClass: dcObject\nobjectClass: organization\ndc: example\n"
                    "o: x\n" % SUFFIX] if not user_tree(srv.url, srv.admin_dn, srv.admin_pw) else [])
        apply(srv, gen.setup() + gen.batch(300))
        n = wait_equal_without(srv, target, base, "description")
        assert n > 5
        assert not any(k == "description" for attrs in user_tree(target.url, target.admin_dn, target.admin_pw,
                                                                 base).values() for k, _ in attrs)
        # Away for longer than the log covers.
        target.stop()
        apply(srv, gen.batch(400))
        time.sleep(1)
        target.start()
        wait_equal_without(srv, target, base, "description")
        st = status(srv, rid=7)
        assert int(st["pandopushloads"][0]) >= 2, st
        assert "no longer reaches back" in srv.logs(tail=200000)
    finally:
        target.stop()
        srv.stop_and_verify()


def wait_equal_without(srv, target, base, attr, timeout=120):
    """wait_equal for `base`, leaving `attr` out of this server's side."""
    deadline = time.monotonic() + timeout
    while True:
        a = {d: [kv for kv in attrs if kv[0] != attr]
             for d, attrs in user_tree(srv.url, srv.admin_dn, srv.admin_pw, base).items()}
        b = user_tree(target.url, target.admin_dn, target.admin_pw, base)
        if a == b:
            return len(a)
        if time.monotonic() > deadline:
            pytest.fail("the target never matched: only here %r; only there %r\n%s"
                        % (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3], srv.logs()))
        time.sleep(0.5)


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_a_push_added_over_cn_config_starts_and_its_password_never_reads_back(tmp_path):
    target = SlapdTarget(tmp_path / "slapd").start()
    srv = Pando(tmp_path / "pando", demo=True, config=PUBLIC_READ)
    try:
        srv.start()
        value = ('{ rid = 3, target = "%s", search_base = "%s", bind_dn = "%s", credentials = "%s", '
                 'retry = "1 600" }' % (target.url, PEOPLE, target.admin_dn, target.admin_pw))
        ldapadd(target, "dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: x\n"
                % SUFFIX)
        r = subprocess.run(["ldapmodify", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                           input="dn: olcDatabase={1}mdb,cn=config\nchangetype: modify\n"
                                 "add: pandoReplicationPush\npandoReplicationPush: %s\n" % value,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        wait_equal(srv, target, base=PEOPLE)
        r = subprocess.run(["ldapsearch", "-Y", "EXTERNAL", "-H", srv.ldapi_url, "-b", "cn=config", "-LLL",
                            "pandoReplicationPush"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "pandoReplicationPush" in r.stdout, r.stderr
        assert target.admin_pw not in r.stdout and "****" in r.stdout, r.stdout
        # A wrong value is refused, naming the key and the problem.
        r = subprocess.run(["ldapmodify", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                           input="dn: olcDatabase={1}mdb,cn=config\nchangetype: modify\n"
                                 "add: pandoReplicationPush\npandoReplicationPush: { rid = 4, target = "
                                 "\"http://x\", search_base = \"%s\", bind_method = \"none\" }\n" % PEOPLE,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "replication.push[1].target" in r.stderr, r.stderr
        # Removed: its task ends.
        r = subprocess.run(["ldapmodify", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                           input="dn: olcDatabase={1}mdb,cn=config\nchangetype: modify\n"
                                 "delete: pandoReplicationPush\n", capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        rc, entries, err = srv.search("cn=Replication,cn=Monitor", "(objectClass=*)", "pandoReplPushes",
                                      scope="base")
        assert entries[0][1]["pandoReplPushes"] == ["0"], entries
    finally:
        target.stop()
        srv.stop_and_verify()
