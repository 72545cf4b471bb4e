"""A multi-provider ring of a Pando server and Debian's slapd: each a
provider and a consumer of the other (plain syncrepl, RFC 4533), writes
on both, links cut through TCP proxies this test controls (loopback
only). Convergence: the same entries and the same contextCSN per server
ID on both."""

import subprocess
import time
from pathlib import Path

import pytest

from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, free_port
from links import Link
from test_multi_provider import PW, ssha
from test_replication import (HAVE_SLAPD, Node, SlapdProvider, attrs_of, converge_nodes, modify,
                              pando_consumer)

pytestmark = pytest.mark.skipif(not HAVE_SLAPD or not Path("/usr/lib/ldap/syncprov.la").exists(),
                                reason="slapd or its syncprov overlay not installed")


class MixedRing:
    """Pando (server ID 1, the demo tree) and slapd (server ID 2, empty)."""

    def __init__(self, base):
        self.pando = Pando(base / "pando", demo=True, name="pando")
        self.pando.port = free_port()
        slapd_port = free_port()
        # to_slapd: Pando's consumer of slapd; to_pando: slapd's of Pando.
        self.to_slapd, self.to_pando = Link(slapd_port), Link(self.pando.port)
        self.slapd = SlapdProvider(base / "slapd", server_id=2,
                                   consumer_of=Node(self.to_pando.url, ADMIN_DN, PW))
        self.slapd.port = slapd_port
        conf = self.slapd.base / "slapd.conf"
        lines = [ln for ln in conf.read_text().splitlines() if not ln.startswith("updateref")]
        at = next(i for i, ln in enumerate(lines) if ln.startswith("syncrepl")) + 1
        conf.write_text("\n".join(lines[:at] + ["multiprovider on"] + lines[at:]) + "\n")
        self.pando.config = ('root_password_hash = "%s"\n' % ssha(PW) + PUBLIC_READ
                             + "\n[replication]\nserver_id = 1\nmulti_provider = true\n"
                             + """
[[replication.consumer]]
rid = 2
provider = "%s"
search_base = "%s"
retry = "1 1000 1 +"
timeout_secs = 5
bind_dn = "%s"
credentials = "%s"
""" % (self.to_slapd.url, SUFFIX, ADMIN_DN, self.slapd.admin_pw))
        self.nodes = [self.pando, self.slapd]

    def start(self):
        self.pando.start(keep_port=True)
        self.pando.admin_pw = PW
        self.slapd.start()
        return self

    def cut(self):
        self.to_slapd.cut()
        self.to_pando.cut()

    def heal(self):
        self.to_slapd.heal()
        self.to_pando.heal()

    def logs(self):
        return self.pando.logs(3000) + "\n--- slapd\n" + self.slapd.log()

    def stop(self):
        self.to_slapd.close()
        self.to_pando.close()
        self.slapd.stop()
        self.pando.stop_and_verify()


def write(node, ldif):
    r = subprocess.run(["ldapmodify", "-x", "-H", node.url, "-D", node.admin_dn, "-w", node.admin_pw],
                       input=ldif, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def conflicts(pando):
    got = attrs_of(pando, "cn=Conflicts,cn=Replication,cn=Monitor", "pandoReplConflicts")
    return int(got.get("pandoReplConflicts", ["0"])[0])


def conflict_records(pando):
    got = attrs_of(pando, "cn=Conflicts,cn=Replication,cn=Monitor", "pandoReplConflictRecord")
    return got.get("pandoReplConflictRecord", [])


def following(ring, timeout=30):
    """Wait until Pando follows slapd's changes (its consumer past its
    first load): a change made on slapd reaches it."""
    mark = "mark %f" % time.monotonic()
    write(ring.slapd, "dn: %s\nchangetype: modify\nreplace: description\ndescription: %s\n" % (SUFFIX, mark))
    deadline = time.monotonic() + timeout
    while attrs_of(ring.pando, SUFFIX, "description").get("description") != [mark]:
        assert time.monotonic() < deadline, "Pando does not follow slapd\n" + ring.logs()
        time.sleep(0.2)
    converge_nodes(ring.nodes, log=ring.logs)


def slapd_values(slapd, dn, attr, manage=False):
    """`attr`'s values of `dn` on slapd (ManageDsaIT: glue entries too)."""
    r = subprocess.run(["ldapsearch", "-x", "-H", slapd.url, "-D", slapd.admin_dn, "-w", slapd.admin_pw,
                        "-LLL", "-o", "ldif-wrap=no"] + (["-M"] if manage else [])
                       + ["-b", dn, "-s", "base", attr], capture_output=True, text=True, timeout=30)
    prefix = attr.lower() + ": "
    return [ln[len(prefix):] for ln in r.stdout.splitlines() if ln.lower().startswith(prefix)]


def test_pando_and_slapd_in_one_multi_provider_ring(tmp_path):
    ring = MixedRing(tmp_path).start()
    pando, slapd = ring.pando, ring.slapd
    try:
        # slapd starts empty and loads the demo tree from Pando.
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        # Writes on each reach the other.
        modify(pando, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: from pando\n"
               % PEOPLE)
        write(slapd, "dn: uid=sam,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: sam\ncn: Sam\nsn: S\n\n"
              "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: from slapd\n"
              % (PEOPLE, PEOPLE))
        converge_nodes(ring.nodes, log=ring.logs)
        assert attrs_of(pando, "uid=sam," + PEOPLE, "cn")["cn"] == ["Sam"]
        assert attrs_of(pando, "uid=bob," + PEOPLE, "description")["description"] == ["from slapd"]
        # Cut off from each other: adds, deletes and modifies of different
        # entries on each side, and one entry changed on both (one attribute
        # each). slapd resolves by whole entry (the newer copy wins), and so
        # does Pando for a copy without per-attribute state: both end with
        # slapd's newer carol, and Pando records the description it lost.
        ring.cut()
        conflicts_before = conflicts(pando)
        modify(pando, "dn: uid=carol,%s\nchangetype: modify\nreplace: description\ndescription: p\n\n"
               "dn: uid=dave,%s\nchangetype: delete\n\n"
               "dn: uid=pat,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: pat\ncn: Pat\nsn: P\n"
               % (PEOPLE, PEOPLE, PEOPLE))
        write(slapd, "dn: uid=carol,%s\nchangetype: modify\nreplace: telephoneNumber\ntelephoneNumber: 2\n\n"
              "dn: uid=grace,%s\nchangetype: delete\n\n"
              "dn: uid=sue,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: sue\ncn: Sue\nsn: S\n"
              % (PEOPLE, PEOPLE, PEOPLE))
        # Writes on both while apart, then healed: both end the same.
        for i in range(5):
            modify(pando, "dn: uid=erin,%s\nchangetype: modify\nreplace: description\ndescription: p%d\n"
                   % (PEOPLE, i))
            write(slapd, "dn: uid=frank,%s\nchangetype: modify\nreplace: description\ndescription: s%d\n"
                  % (PEOPLE, i))
        ring.heal()
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        assert attrs_of(pando, "uid=erin," + PEOPLE, "description")["description"] == ["p4"]
        assert attrs_of(pando, "uid=frank," + PEOPLE, "description")["description"] == ["s4"]
        carol = attrs_of(pando, "uid=carol," + PEOPLE, "description", "telephoneNumber")
        assert carol.get("telephoneNumber") == ["2"] and "description" not in carol, carol
        assert conflicts(pando) > conflicts_before
        # (The dumps are equal: what holds on Pando holds on slapd.)
        for gone in ("dave", "grace"):
            rc, _, _ = pando.search("uid=%s,%s" % (gone, PEOPLE), "(objectClass=*)", scope="base")
            assert rc == 32, gone
        for added in ("pat", "sue"):
            assert attrs_of(pando, "uid=%s,%s" % (added, PEOPLE), "uid")["uid"] == [added]
    finally:
        ring.stop()


def test_a_delete_on_slapd_reaches_pando_when_its_state_holds_no_slapd_change(tmp_path):
    # Pando's state for its link to slapd names no change of slapd's (slapd
    # only loaded Pando's tree). slapd deletes an entry while that link is
    # cut; healed, slapd answers with a present listing that leaves it out.
    # Its last change (Pando's load) is one slapd's state takes in, so it
    # went there: it goes on Pando too. An entry added on Pando meanwhile,
    # which slapd has not seen yet, is not taken for a delete.
    ring = MixedRing(tmp_path).start()
    pando, slapd = ring.pando, ring.slapd
    sub = "ou=Sub," + SUFFIX
    try:
        write(pando, "dn: %s\nchangetype: add\nobjectClass: organizationalUnit\nou: Sub\n\n"
              "dn: ou=Deeper,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Deeper\n\n"
              "dn: cn=x,ou=Deeper,%s\nchangetype: add\nobjectClass: organizationalRole\ncn: x\n"
              % (sub, sub, sub))
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        ring.to_slapd.cut()
        write(slapd, "dn: uid=grace,%s\nchangetype: delete\n" % PEOPLE)
        # A whole subtree too: it goes in one refresh, no entry kept for
        # the ones below it.
        r = subprocess.run(["ldapdelete", "-x", "-r", "-H", slapd.url, "-D", slapd.admin_dn, "-w", slapd.admin_pw,
                            sub], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        ring.to_pando.cut()
        modify(pando, "dn: uid=pat,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: pat\ncn: Pat\nsn: P\n"
               % PEOPLE)
        ring.to_slapd.heal()
        deadline = time.monotonic() + 30
        while pando.search("uid=grace," + PEOPLE, "(objectClass=*)", scope="base")[0] != 32:
            assert time.monotonic() < deadline, "the delete never reached Pando\n" + ring.logs()
            time.sleep(0.2)
        assert attrs_of(pando, "uid=pat," + PEOPLE, "uid")["uid"] == ["pat"]
        while pando.search(sub, "(objectClass=*)", "1.1", scope="base")[0] != 32:
            assert time.monotonic() < deadline, "the subtree stayed\n" + ring.logs()
            time.sleep(0.2)
        assert not any("Sub" in r for r in conflict_records(pando)), conflict_records(pando)
        ring.to_pando.heal()
        # Equal dumps: pat reached slapd, grace stays deleted on both.
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
    finally:
        ring.stop()


def test_a_glue_entry_made_by_slapd_does_not_stop_pando(tmp_path):
    # While apart, slapd deletes ou=Temp and Pando adds an entry below it.
    # Healed, slapd receives the child with no parent and makes a glue
    # entry for it (objectClass glue, no RDN value, a new entryUUID). A
    # Pando consumer loading from slapd then stopped at it for good
    # (namingViolation at every retry, nothing after it applied): now it
    # takes it in as it comes. The ring's Pando keeps its ou=Temp (kept for
    # the entry below it, on record), and changes keep flowing both ways.
    ring = MixedRing(tmp_path).start()
    pando, slapd = ring.pando, ring.slapd
    replica = None
    try:
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        write(pando, "dn: ou=Temp,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Temp\n" % SUFFIX)
        following(ring)
        ring.cut()
        write(slapd, "dn: ou=Temp,%s\nchangetype: delete\n" % SUFFIX)
        write(pando, "dn: uid=kid,ou=Temp,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: kid\ncn: Kid\n"
              "sn: K\n" % SUFFIX)
        ring.heal()
        deadline = time.monotonic() + 30
        while "glue" not in slapd_values(slapd, "ou=Temp," + SUFFIX, "objectClass", manage=True):
            assert time.monotonic() < deadline, "slapd made no glue entry\n" + ring.logs()
            time.sleep(0.3)
        while not any("ou=Temp" in r and "stays" in r for r in conflict_records(pando)):
            assert time.monotonic() < deadline, "no record of the kept entry\n" + ring.logs()
            time.sleep(0.3)
        assert "organizationalUnit" in attrs_of(pando, "ou=Temp," + SUFFIX, "objectClass")["objectClass"]
        # A plain consumer of slapd loads the glue entry and what is below it.
        replica = pando_consumer(tmp_path / "replica", slapd, name="replica")
        deadline = time.monotonic() + 30
        while replica.search("uid=kid,ou=Temp," + SUFFIX, "(objectClass=*)", "1.1", scope="base")[0] != 0:
            assert time.monotonic() < deadline, "the consumer stopped\n" + replica.logs()
            time.sleep(0.3)
        glue = attrs_of(replica, "ou=Temp," + SUFFIX, "objectClass", "ou")
        assert "glue" in glue["objectClass"] and "ou" not in glue, glue
        # Changes after it still flow: both ways in the ring, and to it.
        write(slapd, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: from slapd\n"
              % PEOPLE)
        modify(pando, "dn: uid=bob,%s\nchangetype: modify\nreplace: description\ndescription: from pando\n"
               % PEOPLE)
        deadline = time.monotonic() + 30
        while (attrs_of(pando, "uid=alice," + PEOPLE, "description").get("description") != ["from slapd"]
               or attrs_of(replica, "uid=bob," + PEOPLE, "description").get("description") != ["from pando"]):
            assert time.monotonic() < deadline, "changes stopped flowing\n" + ring.logs() + replica.logs()
            time.sleep(0.3)
    finally:
        if replica is not None:
            replica.stop_and_verify()
        ring.stop()


def test_a_rename_on_slapd_and_a_modify_on_pando_across_a_stalled_link_end_alike(tmp_path):
    # Both links stalled (connections held open, nothing passing): bob
    # renamed to bob2 on slapd, then his title changed on Pando. slapd,
    # keeping no per-attribute state, takes the newer copy whole (Pando's:
    # uid=bob with the title). Pando kept both (uid=bob2 with the title),
    # and the two stayed different for good with equal contextCSN. Now
    # Pando resolves a copy without state as slapd does, and records the
    # rename it lost.
    ring = MixedRing(tmp_path).start()
    pando, slapd = ring.pando, ring.slapd
    try:
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        following(ring)
        ring.to_slapd.stall()
        ring.to_pando.stall()
        write(slapd, "dn: uid=bob,%s\nchangetype: modrdn\nnewrdn: uid=bob2\ndeleteoldrdn: 1\n" % PEOPLE)
        time.sleep(0.05)
        modify(pando, "dn: uid=bob,%s\nchangetype: modify\nreplace: title\ntitle: Lead\n" % PEOPLE)
        ring.to_slapd.resume()
        ring.to_pando.resume()
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        assert attrs_of(pando, "uid=bob," + PEOPLE, "title")["title"] == ["Lead"]
        assert pando.search("uid=bob2," + PEOPLE, "(objectClass=*)", "1.1", scope="base")[0] == 32
        assert any("lost the name uid=bob2" in r for r in conflict_records(pando)), conflict_records(pando)
    finally:
        ring.stop()
