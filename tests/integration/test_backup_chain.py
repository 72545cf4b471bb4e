"""Incremental backups, chain restore and point-in-time restore.

A running server takes a full backup and incrementals after it while
clients write; the chain restored equals the live server's export at the
last backup, restores to CSNs picked at random equal the exports taken at
those moments, a damaged or missing link is refused (naming it) and
changes nothing, and an incremental that would miss changes (the change
log purged past its parent, entries written around the log) is refused.
"""

import os
import random
import subprocess
import time

import pytest

from conftest import PANDO_BIN, PEOPLE, SUFFIX, Pando, parse_ldif

GROUP = "cn=backup-staff,ou=Groups," + SUFFIX


def pando(*args, timeout=300):
    r = subprocess.run([PANDO_BIN, *[str(a) for a in args]], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def ok(*args):
    rc, out, err = pando(*args)
    assert rc == 0, (args, out, err)
    return out + err


def export(data_dir, *extra):
    """The store's entries with every stored attribute, as a comparable
    value: normalised DN -> sorted (attribute, value) pairs."""
    rc, out, err = pando("export", "--data-dir", data_dir, "--operational", "--wrap", "0", *extra)
    assert rc == 0, err
    return shape(out)


def shape(ldif):
    entries = {}
    for dn, attrs in parse_ldif(ldif):
        entries[dn.lower()] = sorted((k.lower(), v) for k, vs in attrs.items() for v in vs)
    return entries


def context_csn(srv):
    rc, found, err = srv.search(SUFFIX, "(objectClass=*)", "contextCSN", scope="base")
    assert rc == 0, err
    return max(found[0][1]["contextCSN"])


def person(i, ou="People"):
    return ("uid=u%d,ou=%s,%s" % (i, ou, SUFFIX),
            ["inetOrgPerson"], {"uid": "u%d" % i, "cn": "User %d" % i, "sn": "S%d" % i,
                                "mail": ["u%d@example.com" % i, "u%d@mail.example.com" % i],
                                "userPassword": "pw%d" % i})


def writes(c, rnd, live, n):
    """`n` writes of every kind on connection `c`: adds, modifies of each
    sort, group member changes, renames keeping and dropping the old RDN,
    moves between OUs, deletes. `live` is the set of user numbers present."""
    for _ in range(n):
        k = rnd.random()
        if k < 0.35 or len(live) < 5:
            i = max(live | {0}) + 1 + rnd.randrange(3)
            dn, oc, attrs = person(i)
            assert c.add(dn, oc, attrs), c.result
            live.add(i)
            continue
        i = rnd.choice(sorted(live))
        dn = "uid=u%d,ou=People,%s" % (i, SUFFIX)
        if k < 0.55:
            op = rnd.choice(["replace", "add", "delete"])
            if op == "replace":
                ch = {"description": [("MODIFY_REPLACE", ["d%d" % rnd.randrange(1000)])]}
            elif op == "add":
                ch = {"telephoneNumber": [("MODIFY_ADD", ["+1 555 %04d" % rnd.randrange(10000)])]}
            else:
                ch = {"mail": [("MODIFY_DELETE", ["u%d@mail.example.com" % i])]}
            c.modify(dn, ch)
            assert c.result["result"] in (0, 16, 20), c.result
        elif k < 0.68:
            c.modify(GROUP, {"member": [("MODIFY_ADD", [dn])]})
            assert c.result["result"] in (0, 20), c.result
        elif k < 0.75:
            assert c.modify(dn, {"userPassword": [("MODIFY_REPLACE", ["new%d" % rnd.randrange(1000)])]}), c.result
        elif k < 0.85:
            j = max(live) + 1000 + rnd.randrange(1000)
            if j in live:
                continue
            assert c.modify_dn(dn, "uid=u%d" % j, delete_old_dn=rnd.random() < 0.7), c.result
            live.discard(i)
            live.add(j)
            # Renames keep the number space of adds apart.
        elif k < 0.9:
            dest = "ou=Moved," + SUFFIX
            assert c.modify_dn(dn, "uid=u%d" % i, new_superior=dest), c.result
            assert c.modify_dn("uid=u%d,%s" % (i, dest), "uid=u%d" % i, new_superior=PEOPLE), c.result
        else:
            c.modify(GROUP, {"member": [("MODIFY_DELETE", [dn])]})
            assert c.delete(dn), c.result
            live.discard(i)


def setup_tree(c):
    assert c.add("ou=Moved," + SUFFIX, ["organizationalUnit"], {"ou": "Moved"}), c.result
    assert c.add(GROUP, ["groupOfNames"], {"cn": "backup-staff", "member": ["cn=admin," + SUFFIX]}), c.result


@pytest.fixture
def seed():
    s = int(os.environ.get("PANDO_BACKUP_SEED", random.randrange(1 << 30)))
    print("PANDO_BACKUP_SEED=%d" % s)
    return s


def test_full_and_three_incrementals_and_points_in_time(tmp_path, seed):
    rnd = random.Random(seed)
    srv = Pando(tmp_path / "live", demo=True).start()
    c = srv.conn()
    setup_tree(c)
    live = set()
    writes(c, rnd, live, 150)
    full = tmp_path / "bk" / "full"
    (tmp_path / "bk").mkdir()
    ok("backup", "--data-dir", srv.data_dir, full)
    moments = []  # (CSN, export) after groups of writes
    chain = [full]
    for n in (1, 2, 3):
        for _ in range(4):
            writes(c, rnd, live, 40)
            moments.append((context_csn(srv), export(srv.data_dir)))
        inc = tmp_path / "bk" / ("inc%d" % n)
        out = ok("backup", "--data-dir", srv.data_dir, "--incremental-from", chain[-1], inc)
        assert "incremental backup of" in out, out
        chain.append(inc)
    at_last = export(srv.data_dir)
    # The manifest links each incremental to its parent by name and checksum.
    m = (chain[2] / "manifest.toml").read_text()
    assert 'kind = "incremental"' in m and 'path = "inc1"' in m, m
    out = ok("restore", "--check", chain[-1])
    assert "the chain of 4 backup(s) checks" in out, out
    c.unbind()
    srv.stop_and_verify()

    # The whole chain.
    r = Pando(tmp_path / "whole")
    out = ok("restore", "--data-dir", r.data_dir, chain[-1])
    assert "and 3 incremental(s)" in out, out
    got = export(r.data_dir)
    assert got == at_last, diff(got, at_last)
    rc, vout = r.verify()
    assert rc == 0 and "consistent" in vout, vout
    # The restored server serves: a user whose password changed binds.
    (r.data_dir / "admin-password").write_text(srv.admin_pw)
    r.start()
    rc, found, err = r.search(SUFFIX, "(objectClass=inetOrgPerson)", "1.1")
    assert rc == 0 and len(found) == sum(1 for v in at_last.values() if ("objectclass", "inetOrgPerson") in v), err
    r.stop_and_verify()

    # Five points in time, each equal to the export taken then.
    for k, (csn, then) in enumerate(rnd.sample(moments, 5)):
        if k % 2 == 0:
            r = Pando(tmp_path / ("pit%d" % k))
            ok("restore", "--data-dir", r.data_dir, "--to-csn", csn, chain[-1])
            got = export(r.data_dir)
            rc, vout = r.verify()
            assert rc == 0, vout
        else:
            rc, out, err = pando("export", "--backup", chain[-1], "--as-of", csn, "--operational", "--wrap", "0")
            assert rc == 0, err
            got = shape(out)
        assert got == then, (csn, diff(got, then))


def diff(a, b):
    only_a = sorted(set(a) - set(b))[:5]
    only_b = sorted(set(b) - set(a))[:5]
    changed = [(dn, sorted(set(a[dn]) ^ set(b[dn]))[:6]) for dn in sorted(set(a) & set(b)) if a[dn] != b[dn]][:5]
    return {"only restored": only_a, "only live": only_b, "differ": changed}


def live_with_a_full_backup(tmp_path, config=None):
    """A server with the test's tree, a connection to it, and a full backup
    of it in bk/full."""
    srv = Pando(tmp_path / "live", demo=True, config=config).start()
    c = srv.conn()
    setup_tree(c)
    bk = tmp_path / "bk"
    bk.mkdir()
    ok("backup", "--data-dir", srv.data_dir, bk / "full")
    return srv, c, bk


def test_a_broken_chain_is_refused_naming_the_link(tmp_path):
    srv, c, bk = live_with_a_full_backup(tmp_path)
    rnd, live = random.Random(7), set()
    prev = bk / "full"
    for n in (1, 2):
        writes(c, rnd, live, 30)
        ok("backup", "--data-dir", srv.data_dir, "--incremental-from", prev, bk / ("inc%d" % n))
        prev = bk / ("inc%d" % n)
    c.unbind()
    srv.stop_and_verify()
    target = Pando(tmp_path / "target")
    ok("restore", "--data-dir", target.data_dir, bk / "inc2")
    before = export(target.data_dir)

    def refused(expect, *args):
        rc, out, err = pando("restore", "--data-dir", target.data_dir, *args, bk / "inc2")
        assert rc != 0 and expect in err, (expect, out, err)
        assert export(target.data_dir) == before

    # A damaged incremental.
    data = bk / "inc1" / "changes.zst"
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    data.write_bytes(bytes(blob))
    refused("inc1/changes.zst: checksum mismatch")
    blob[len(blob) // 2] ^= 0x40
    data.write_bytes(bytes(blob))
    # A parent replaced by another backup (its manifest changed).
    m = bk / "inc1" / "manifest.toml"
    text = m.read_text()
    n = int(text.split("\nentries = ")[1].split("\n")[0])
    m.write_text(text.replace("\nentries = %d\n" % n, "\nentries = %d\n" % (n + 1)))
    refused("not the backup")
    m.write_text(text)
    # A missing full backup.
    os.rename(bk / "full", bk / "elsewhere")
    refused("its parent backup")
    rc, out, err = pando("restore", "--check", bk / "inc2")
    assert rc != 0 and "full" in err and "missing" in err, err
    os.rename(bk / "elsewhere", bk / "full")
    ok("restore", "--check", bk / "inc2")
    # A point before the full backup, or after the last one.
    refused("already holds changes", "--to-csn", "20000101000000.000000Z#000000#001#000000")
    refused("nothing after it is known", "--to-time", "2999-01-01T00:00:00Z")
    refused("not a UTC time", "--to-time", "yesterday")


def test_an_incremental_that_would_miss_changes_is_refused(tmp_path):
    srv, c, bk = live_with_a_full_backup(tmp_path, "[replication]\nchangelog_max_changes = 50\n")
    rnd, live = random.Random(3), set()
    writes(c, rnd, live, 20)
    ok("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "full", bk / "inc1")
    # The log keeps 50 changes: 400 more purge past the parent.
    writes(c, rnd, live, 400)
    rc, out, err = pando("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "inc1", bk / "inc2")
    assert rc != 0 and "no longer reaches back" in err and "full backup" in err, err
    assert not (bk / "inc2").exists() and not (bk / "inc2.partial").exists()
    ok("backup", "--data-dir", srv.data_dir, bk / "full2")
    c.unbind()
    srv.stop_and_verify()
    # A restore writes the store around the change log: the live store is
    # no longer what inc1 followed, even after new writes.
    ok("restore", "--data-dir", srv.data_dir, bk / "inc1")
    srv.start()
    c = srv.conn()
    rc, found, err = srv.search(PEOPLE, "(uid=u*)", "uid", scope="one")
    live = {int(a["uid"][0][1:]) for _, a in found}
    writes(c, rnd, live, 5)
    rc, out, err = pando("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "inc1", bk / "inc3")
    assert rc != 0 and "around the change log" in err, err
    # A backup made before the restore is no parent either.
    rc, out, err = pando("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "full2", bk / "inc3")
    assert rc != 0, err
    # A full backup starts a chain again.
    ok("backup", "--data-dir", srv.data_dir, bk / "full3")
    writes(c, rnd, live, 5)
    ok("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "full3", bk / "inc4")
    c.unbind()
    srv.stop_and_verify()


def test_export_as_of_brings_back_a_deleted_branch(tmp_path):
    srv = Pando(tmp_path / "live", demo=True).start()
    c = srv.conn()
    dept = "ou=Dept," + SUFFIX
    assert c.add(dept, ["organizationalUnit"], {"ou": "Dept"}), c.result
    for i in range(30):
        dn, oc, attrs = person(i)
        assert c.add(dn.replace("ou=People", "ou=Dept"), oc, attrs), c.result
    bk = tmp_path / "bk"
    bk.mkdir()
    ok("backup", "--data-dir", srv.data_dir, bk / "full")
    for i in range(5):
        assert c.modify("uid=u%d,%s" % (i, dept), {"description": [("MODIFY_REPLACE", ["changed"])]}), c.result
    before = time.time()
    time.sleep(1.1)
    # Someone deletes the wrong branch (children first, as a client must).
    for i in range(30):
        assert c.delete("uid=u%d,%s" % (i, dept)), c.result
    assert c.delete(dept), c.result
    ok("backup", "--data-dir", srv.data_dir, "--incremental-from", bk / "full", bk / "inc1")
    when = time.strftime("%Y%m%d%H%M%SZ", time.gmtime(before))
    rc, out, err = pando("export", "--backup", bk / "inc1", "--as-of", when, "-b", dept, "-o", tmp_path / "dept.ldif")
    assert rc == 0, err
    ldif = (tmp_path / "dept.ldif").read_text()
    got = parse_ldif(ldif)
    assert len(got) == 31 and got[0][0] == dept, ldif[:500]
    assert sum(1 for _, a in got if a.get("description") == ["changed"]) == 5
    # Put back with a plain LDAP client.
    rc, out, err = srv.ldap("ldapadd", "-f", str(tmp_path / "dept.ldif"))
    assert rc == 0, err
    rc, found, err = srv.search(dept, "(uid=*)", "1.1")
    assert rc == 0 and len(found) == 30, err
    c.unbind()
    srv.stop_and_verify()
