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
from test_replication import HAVE_SLAPD, Node, SlapdProvider, attrs_of, converge_nodes, modify

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
    try:
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        ring.to_slapd.cut()
        write(slapd, "dn: uid=grace,%s\nchangetype: delete\n" % PEOPLE)
        ring.to_pando.cut()
        modify(pando, "dn: uid=pat,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: pat\ncn: Pat\nsn: P\n"
               % PEOPLE)
        ring.to_slapd.heal()
        deadline = time.monotonic() + 30
        while pando.search("uid=grace," + PEOPLE, "(objectClass=*)", scope="base")[0] != 32:
            assert time.monotonic() < deadline, "the delete never reached Pando\n" + ring.logs()
            time.sleep(0.2)
        assert attrs_of(pando, "uid=pat," + PEOPLE, "uid")["uid"] == ["pat"]
        ring.to_pando.heal()
        # Equal dumps: pat reached slapd, grace stays deleted on both.
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
    finally:
        ring.stop()
