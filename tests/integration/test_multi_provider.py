"""Multi-provider replication: three Pando servers, each a provider and a
consumer of the two others, all taking writes. Every link between two
servers goes through a TCP proxy this test controls, so links are cut and
healed at will (loopback only); kill -9 and restarts come on top.
Convergence: every server holds the same entries (with their replication
state) and the same contextCSN per server ID."""

import base64
import hashlib
import os
import random
import re
import signal
import time

import pytest

import ber
from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, free_port
from links import Link
from test_replication import attrs_of, context_csn, dump

PW = "ring-secret"
CSN_RE = re.compile(rb"\d{14}\.\d{6}Z#[0-9a-f]{6}#[0-9a-f]{3}#[0-9a-f]{6}")


def ssha(pw):
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(pw.encode() + salt).digest() + salt).decode()


class Ring:
    """n Pando providers replicating dc=example,dc=com from each other;
    the first starts with the demo tree, the others empty."""

    def __init__(self, base, n=3):
        self.nodes = []
        for i in range(1, n + 1):
            node = Pando(base / ("node%d" % i), demo=(i == 1), name="node%d" % i)
            node.port = free_port()
            node.sid = i
            self.nodes.append(node)
        # links[(i, j)]: node i's consumer of node j.
        self.links = {(a.sid, b.sid): Link(b.port) for a in self.nodes for b in self.nodes if a is not b}
        pw_hash = ssha(PW)
        for node in self.nodes:
            consumers = "".join("""
[[replication.consumer]]
rid = %d
provider = "%s"
search_base = "%s"
retry = "1 1000 1 +"
timeout_secs = 5
bind_dn = "%s"
credentials = "%s"
""" % (peer.sid, self.links[(node.sid, peer.sid)].url, SUFFIX, ADMIN_DN, PW)
                for peer in self.nodes if peer is not node)
            node.config = ('root_password_hash = "%s"\n' % pw_hash + PUBLIC_READ
                           + "\n[replication]\nserver_id = %d\nmulti_provider = true\n" % node.sid
                           + consumers
                           # The change log as cn=accesslog, to read what
                           # each server wrote when a test fails.
                           + '\n[[overlay]]\ntype = "accesslog"\nops = ["writes"]\n')

    def start(self):
        for node in self.nodes:
            node.start(keep_port=True)
            node.admin_pw = PW
        return self

    def cut_all(self):
        for link in self.links.values():
            link.cut()

    def heal_all(self):
        for link in self.links.values():
            link.heal()

    def stop(self, verify=True):
        for link in self.links.values():
            link.close()
        for node in self.nodes:
            if verify:
                node.stop_and_verify()
            else:
                node.stop()

    def logs(self):
        return "\n".join("--- %s\n%s" % (n.name, n.logs(3000)) for n in self.nodes)


def state_dump(node):
    """Entries with their replication state, sorted."""
    import ldap3
    c = node.conn()
    c.search(SUFFIX, "(objectClass=*)", attributes=["*", "entryCSN", "entryUUID", "pandoAttributeCSN"])
    out = sorted((e.entry_dn.lower(), sorted((k.lower(), sorted(str(x) for x in v))
                                             for k, v in e.entry_attributes_as_dict.items()))
                 for e in c.entries)
    c.unbind()
    del ldap3
    return out


def converge(ring, timeout=60):
    """Wait until every node holds the same entries, states and contextCSN;
    returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    nodes = ring.nodes
    while True:
        try:
            dumps = [state_dump(n) for n in nodes]
            ctx = [context_csn(n.url, n.admin_dn, n.admin_pw) for n in nodes]
        except Exception:  # a node restarting
            dumps, ctx = [None], [None]
        if dumps[0] and all(d == dumps[0] for d in dumps) and all(c == ctx[0] for c in ctx) and ctx[0]:
            return time.monotonic() - start
        if time.monotonic() > deadline:
            if dumps[0] is None:
                pytest.fail("a node did not answer\n%s" % ring.logs())
            diffs = [([e for e in d if e not in dumps[0]][:2], [e for e in dumps[0] if e not in d][:2])
                     for d in dumps[1:]]
            names = {v for d in diffs for side in d for e in side for k, vs in e[1] if k == "entryuuid" for v in vs}
            history = "\n".join("--- %s\n%s" % (n.name, change_log(n, names)) for n in nodes)
            pytest.fail("no convergence: contextCSN %r; differences (extra, missing) %r\n"
                        "their changes on each server:\n%s\n%s" % (ctx, diffs, history, ring.logs()))
        time.sleep(0.3)


def change_log(node, uuids):
    """What `node`'s change log holds for the entries `uuids`."""
    filt = "(|%s)" % "".join("(reqEntryUUID=%s)" % u for u in uuids) if uuids else "(reqDN=*)"
    r = node.search("cn=accesslog", filt, "reqType", "reqDN", "entryCSN", "reqEntryUUID", "reqMod")
    return "\n".join(str(e) for e in r[1]) if r[0] == 0 else "(%r)" % (r,)


def write(node, dn, changes):
    """Modify `dn` on `node` (changes: attr -> values, [] deletes the
    attribute); returns the write's CSN (read with the post-read control)."""
    import ldap3
    c = node.conn()
    mods = {a: [(ldap3.MODIFY_REPLACE, v)] for a, v in changes.items()}
    post_read = ber.seq(ber.octets("entryCSN"))
    ok = c.modify(dn, mods, controls=[("1.3.6.1.1.13.2", True, post_read)])
    assert ok, (node.name, dn, c.result)
    # ldap3 decodes the post-read entry itself (a dict), or leaves bytes.
    raw = c.result["controls"]["1.3.6.1.1.13.2"]["value"]
    c.unbind()
    raw = raw if isinstance(raw, bytes) else str(raw).encode()
    return CSN_RE.search(raw).group().decode()


def conflict_records(ring):
    out = []
    for n in ring.nodes:
        got = attrs_of(n, "cn=Conflicts,cn=Replication,cn=Monitor", "*")
        out += got.get("pandoReplConflictRecord", [])
    return out


def values(node, dn, attr):
    return sorted(attrs_of(node, dn, attr).get(attr, []))


@pytest.fixture
def ring(tmp_path):
    r = Ring(tmp_path).start()
    try:
        yield r
    finally:
        r.stop()


def test_three_providers_take_writes_on_every_node_and_converge(ring):
    converge(ring)
    a, b, c = ring.nodes
    # Writes on every node, no referral.
    for node in ring.nodes:
        rc, out, err = node.ldap("ldapadd", input="dn: uid=n%d,%s\nobjectClass: inetOrgPerson\nuid: n%d\n"
                                 "cn: N\nsn: %d\n" % (node.sid, PEOPLE, node.sid, node.sid))
        assert rc == 0, (node.name, out, err)
    write(b, "uid=alice,%s" % PEOPLE, {"description": ["from node 2"]})
    rc, out, err = c.ldap("ldapmodify", input="dn: uid=n1,%s\nchangetype: delete\n" % PEOPLE)
    assert rc == 0, (out, err)
    converge(ring)
    for node in ring.nodes:
        assert values(node, "uid=alice,%s" % PEOPLE, "description") == ["from node 2"]
        assert values(node, "uid=n2,%s" % PEOPLE, "sn") == ["2"]
        assert node.search("uid=n1,%s" % PEOPLE, "(objectClass=*)", "cn", scope="base")[0] == 32
    # The state is not among the operational attributes a plain "+" asks
    # for (OpenLDAP consumers ask for "+").
    plus = attrs_of(a, "uid=alice,%s" % PEOPLE, "+")
    assert "entryCSN" in plus and "pandoAttributeCSN" not in plus
    assert "pandoAttributeCSN" in attrs_of(a, "uid=alice,%s" % PEOPLE, "pandoAttributeCSN")
    assert conflict_records(ring) == []


def test_concurrent_writes_during_a_partition_merge_per_attribute(ring):
    converge(ring)
    a, b, c = ring.nodes
    bob, carol = "uid=bob,%s" % PEOPLE, "uid=carol,%s" % PEOPLE
    ring.cut_all()
    # Different attributes of one entry on two sides: both kept.
    write(a, bob, {"mail": ["bob@one.example"]})
    write(b, bob, {"telephoneNumber": ["+1 555 0102"]})
    # The same attribute on two sides: the newer change wins, the older is
    # a conflict on record.
    lost = write(a, carol, {"title": ["from one"]})
    time.sleep(0.01)
    won = write(c, carol, {"title": ["from three"]})
    assert won > lost
    # An attribute deleted on one side, another changed on the other.
    write(b, carol, {"description": []})
    ring.heal_all()
    took = converge(ring)
    for node in ring.nodes:
        assert values(node, bob, "mail") == ["bob@one.example"]
        assert values(node, bob, "telephoneNumber") == ["+1 555 0102"]
        assert values(node, carol, "title") == ["from three"]
        assert values(node, carol, "description") == []
    records = [r for r in conflict_records(ring) if "carol" in r.lower()]
    assert records, conflict_records(ring)
    assert all("concurrent changes of title; lost title: from one" in r for r in records), records
    assert all(lost in r and won in r for r in records), records
    # Counted, and logged as warnings naming the entry and both CSNs.
    counts = [int(attrs_of(n, "cn=Conflicts,cn=Replication,cn=Monitor", "pandoReplConflicts")
                  ["pandoReplConflicts"][0]) for n in ring.nodes]
    assert sum(counts) == len(records), (counts, records)
    assert any("replication conflict resolved" in n.logs(100000) and lost in n.logs(100000)
               for n in ring.nodes)
    assert took < 60


def ldif(node, text):
    rc, out, err = node.ldap("ldapmodify", input=text)
    assert rc == 0, (node.name, text, out, err)


def exists(node, dn):
    return node.search(dn, "(objectClass=*)", "1.1", scope="base")[0] == 0


def test_entry_level_conflicts_resolve_alike_on_every_server(ring):
    a, b, c = ring.nodes
    ldif(a, "dn: ou=Projects,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: Projects\n" % SUFFIX)
    converge(ring)
    dave, erin = "uid=dave,%s" % PEOPLE, "uid=erin,%s" % PEOPLE
    ring.cut_all()
    # Delete against modify: the delete stands, the change is on record.
    ldif(a, "dn: %s\nchangetype: delete\n" % dave)
    write(b, dave, {"description": ["changed after the delete"]})
    # One name added on two servers: the first added keeps it.
    ldif(a, "dn: uid=twin,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: twin\ncn: T\nsn: first\n" % PEOPLE)
    time.sleep(0.01)
    ldif(b, "dn: uid=twin,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: twin\ncn: T\nsn: second\n" % PEOPLE)
    # A child added under a parent deleted elsewhere: both stay.
    ldif(a, "dn: ou=Projects,%s\nchangetype: delete\n" % SUFFIX)
    ldif(b, "dn: ou=p1,ou=Projects,%s\nchangetype: add\nobjectClass: organizationalUnit\nou: p1\n" % SUFFIX)
    # A rename and a modify of one entry: both kept.
    ldif(a, "dn: %s\nchangetype: modrdn\nnewrdn: uid=erin2\ndeleteoldrdn: 1\n" % erin)
    write(c, erin, {"title": ["renamed elsewhere"]})
    ring.heal_all()
    converge(ring)
    for node in ring.nodes:
        assert not exists(node, dave), node.name
        assert values(node, "uid=twin,%s" % PEOPLE, "sn") == ["first"], node.name
        assert exists(node, "ou=p1,ou=Projects,%s" % SUFFIX), node.name
        assert values(node, "uid=erin2,%s" % PEOPLE, "title") == ["renamed elsewhere"], node.name
        assert not exists(node, erin)
    records = conflict_records(ring)
    text = "\n".join(records)
    assert any("uid=dave" in r and "the delete stands" in r for r in records), records
    assert "two entries claimed one name" in text and "sn: second" in text, records
    assert "ou=Projects" in text and ("brought back" in text or "it stays" in text), records
    # The twin that lost is gone everywhere: its later changes are dropped.
    assert sum(n.search(PEOPLE, "(uid=twin)", "1.1")[1].__len__() for n in ring.nodes) == 3


# ------------------------------------------------------------ randomized

USERS = ["alice", "bob", "carol", "erin", "frank", "grace"]
ATTRS = ["description", "title", "telephoneNumber"]
# Written only by the deliberate conflicts, each pair (user, attribute) once.
CONFLICT_ATTRS = ["roomNumber", "l", "postalCode", "st"]


def soak(ring, seed, steps, log=print):
    """Seeded random writes on every server while links are cut and healed
    and servers are killed (-9) and restarted; then heal, converge and
    check the final state against what was acknowledged. Returns a summary."""
    rng = random.Random(seed)
    nodes = ring.nodes
    down = {}            # node -> step it comes back at
    acked = {}           # (dn, attr) -> [(csn, value, node sid)]
    deliberate = []      # (dn, attr, (csn, value) twice)
    used = set()
    added, deleted = {}, set()
    kills = cuts = 0
    started = time.monotonic()
    pause = float(os.environ.get("PANDO_MP_PAUSE", "0"))
    for step in range(steps):
        time.sleep(pause)
        for node, back in list(down.items()):
            if step >= back:
                node.start(keep_port=True)
                node.admin_pw = PW
                del down[node]
        live = [n for n in nodes if n not in down]
        roll = rng.random()
        if roll < 0.12:
            link = rng.choice(list(ring.links.values()))
            if link.up:
                link.cut()
                cuts += 1
            else:
                link.heal()
        elif roll < 0.15 and not down:
            victim = rng.choice(nodes)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            victim.proc = None
            down[victim] = step + rng.randint(2, 10)
            kills += 1
        elif roll < 0.19 and len(live) >= 2:
            # A deliberate conflict: all links cut, one attribute written
            # on two servers; the older write must be on record as lost.
            ring.cut_all()
            cuts += 1
            x, y = rng.sample(live, 2)
            # An attribute written by nothing else, so no later write
            # supersedes the pair.
            free = [(u, at) for u in USERS for at in CONFLICT_ATTRS if (u, at) not in used]
            if not free:
                continue
            user, attr = rng.choice(free)
            used.add((user, attr))
            dn = "uid=%s,%s" % (user, PEOPLE)
            first, second = "c%d-%d" % (step, x.sid), "c%d-%d" % (step, y.sid)
            c1 = write(x, dn, {attr: [first]})
            c2 = write(y, dn, {attr: [second]})
            acked.setdefault((dn, attr), []).extend([(c1, first, x.sid), (c2, second, y.sid)])
            deliberate.append((dn, attr, (c1, first), (c2, second)))
        elif roll < 0.27:
            node = rng.choice(live)
            uid = "r%d-%d" % (node.sid, step)
            ldif(node, "dn: uid=%s,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: %s\ncn: R\nsn: %d\n"
                 % (uid, PEOPLE, uid, step))
            added["uid=%s,%s" % (uid, PEOPLE)] = node
        elif roll < 0.31 and added:
            dn = rng.choice(sorted(added))
            node = added.pop(dn)
            if node in down:
                added[dn] = node
                continue
            ldif(node, "dn: %s\nchangetype: delete\n" % dn)
            deleted.add(dn)
        else:
            node = rng.choice(live)
            dn, attr = "uid=%s,%s" % (rng.choice(USERS), PEOPLE), rng.choice(ATTRS)
            value = "v%d-%d" % (step, node.sid)
            csn = write(node, dn, {attr: [value]})
            acked.setdefault((dn, attr), []).append((csn, value, node.sid))
    for node in list(down):
        node.start(keep_port=True)
        node.admin_pw = PW
    ring.heal_all()
    writing = time.monotonic() - started
    took = converge(ring, timeout=float(os.environ.get("PANDO_MP_CONVERGE_SECS", "180")))
    # The final state: for each attribute, the newest acknowledged write.
    a = nodes[0]
    for (dn, attr), writes in acked.items():
        newest = max(writes)
        assert values(a, dn, attr) == [newest[1]], (dn, attr, sorted(writes))
    for dn in deleted:
        assert not exists(a, dn), dn
    for dn in added:
        assert exists(a, dn), dn
    # Every deliberate conflict is on record (stored with the change that
    # resolved it, so kill -9 keeps it): the older write lost to the newer.
    records = "\n".join(conflict_records(ring))
    for dn, attr, one, two in deliberate:
        older = min(one, two)[1]
        assert "lost %s: %s" % (attr.lower(), older) in records, (dn, attr, one, two)
    summary = dict(seed=seed, steps=steps, writes=sum(len(w) for w in acked.values()) + len(added) + len(deleted),
                   deliberate_conflicts=len(deliberate), link_cuts=cuts, kills=kills,
                   writing_secs=round(writing, 1), converge_secs=round(took, 1))
    log(summary)
    return summary


def test_random_partitions_kills_and_conflicting_writes_converge(ring):
    converge(ring)
    seed = int(os.environ.get("PANDO_MP_SEED", "4533"))
    steps = int(os.environ.get("PANDO_MP_STEPS", "150"))
    soak(ring, seed, steps)


def test_deletes_during_a_partition_are_remembered_across_restarts(ring):
    """OpenLDAP's test078, black-box: deletes made while a server is cut
    off reach it after both sides restart (the change log and the
    tombstones are in the store, not in memory)."""
    a, b, c = ring.nodes
    for i in range(5):
        ldif(a, "dn: uid=gone%d,%s\nchangetype: add\nobjectClass: inetOrgPerson\nuid: gone%d\ncn: G\nsn: %d\n"
             % (i, PEOPLE, i, i))
    converge(ring)
    for (x, y), link in ring.links.items():
        if 3 in (x, y):
            link.cut()
    for i in range(5):
        ldif(a if i % 2 else b, "dn: uid=gone%d,%s\nchangetype: delete\n" % (i, PEOPLE))
    # Meanwhile the cut-off server changes one of them (the delete stands).
    write(c, "uid=gone2,%s" % PEOPLE, {"description": ["changed while cut off"]})
    for node in (a, c):
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        node.proc = None
        node.start(keep_port=True)
        node.admin_pw = PW
    ring.heal_all()
    converge(ring)
    for node in ring.nodes:
        assert node.search(PEOPLE, "(uid=gone*)", "1.1")[1] == [], node.name
    # On record where the two met: the server that deleted it (the change
    # came after), or the one that changed it (the delete came after).
    records = conflict_records(ring)
    assert any("uid=gone2" in r and "the delete stands" in r for r in records), records


def test_a_delete_arriving_after_a_change_it_had_not_seen_is_on_record(tmp_path):
    # Two providers. n1 cut off; E modified on n2, then deleted on n1; n2
    # receives n1's changes first, n1 receives n2's 3 s later. The delete
    # stands on both, and n2, where it met the change it had not seen,
    # records the loss (it was recorded nowhere: the change's CSN is older
    # than the delete's, so only the deleting server's state tells).
    ring = Ring(tmp_path, n=2).start()
    try:
        n1, n2 = ring.nodes
        converge(ring)
        ring.links[(1, 2)].cut()
        ring.links[(2, 1)].cut()
        dn = "uid=carol,%s" % PEOPLE
        write(n2, dn, {"description": ["changed on n2"]})
        rc, _, err = n1.ldap("ldapmodify", input="dn: %s\nchangetype: delete\n" % dn)
        assert rc == 0, err
        ring.links[(2, 1)].heal()
        time.sleep(3)
        ring.links[(1, 2)].heal()
        converge(ring)
        for node in ring.nodes:
            assert node.search(dn, "(objectClass=*)", "1.1", scope="base")[0] == 32, node.name
        records = conflict_records(ring)
        assert any("uid=carol" in r and "the delete stands" in r for r in records), records
        assert any("changed on n2" in r for r in records), records
    finally:
        ring.stop()
