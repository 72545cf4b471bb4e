"""Durability: kill -9 loses no acknowledged write and half-applies nothing,
a full map fails writes cleanly while reads go on, hot backup and restore,
one server per data directory, durability changed by SIGHUP."""

import base64
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time

import ldap3

from conftest import PANDO_BIN, SUFFIX, Pando, small_tmpfs

BASE = "ou=Crash," + SUFFIX


def _writer(srv, tid, acked, pending, stop, lock):
    """Add entries and rewrite them; sn and description always change
    together, so a half-applied modify would show as sn != description."""
    try:
        c = srv.conn()
    except Exception:
        return
    mine = []
    n = 0
    while not stop.is_set() and n < 10_000:
        n += 1
        token = "t%d-%d" % (tid, n)
        if mine and random.random() < 0.5:
            dn = random.choice(mine)
            with lock:
                pending.setdefault(dn, set()).add(token)
            try:
                ok = c.modify(dn, {"sn": [(ldap3.MODIFY_REPLACE, [token])],
                                   "description": [(ldap3.MODIFY_REPLACE, [token])]})
            except ldap3.core.exceptions.LDAPException:
                return  # the server died mid-operation: the result is unknown

        else:
            cn = "w%d-%d" % (tid, n)
            dn = "cn=%s,%s" % (cn, BASE)
            with lock:
                pending.setdefault(dn, set()).add(token)
            try:
                ok = c.add(dn, ["person"], {"cn": cn, "sn": token, "description": token})
            except ldap3.core.exceptions.LDAPException:
                return
            if ok:
                mine.append(dn)
        if not ok:
            if c.closed:
                return
            continue
        with lock:
            acked[dn] = token
            pending[dn].discard(token)


def test_kill9_loses_no_acknowledged_write(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    c = srv.conn()
    assert c.add(BASE, ["organizationalUnit"], {"ou": "Crash"}), c.result
    c.unbind()
    acked, pending = {}, {}
    lock = threading.Lock()
    rng = random.Random(4533)
    cycles = 8
    for cycle in range(cycles):
        stop = threading.Event()
        threads = [threading.Thread(target=_writer, args=(srv, t, acked, pending, stop, lock), daemon=True)
                   for t in range(4)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.4, 1.5))
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        srv.proc = None
        stop.set()
        for t in threads:
            t.join(30)
        # (a)+(d): the store opens as it is, with no repair step, and verifies.
        rc, out = srv.verify()
        assert rc == 0, "cycle %d: verify after kill -9 failed:\n%s" % (cycle, out)
        srv.start()
        rc, entries, err = srv.search(BASE, "(objectClass=person)", "sn", "description", scope="one")
        assert rc == 0, err
        found = {dn.lower(): attrs for dn, attrs in entries}
        with lock:
            for dn, token in acked.items():
                attrs = found.get(dn.lower())
                # (b): every acknowledged write is there ...
                assert attrs is not None, "cycle %d: acknowledged add of %s lost" % (cycle, dn)
                # ... possibly overtaken by a later write that was in flight.
                allowed = {token} | pending.get(dn, set())
                assert attrs["sn"][0] in allowed, "cycle %d: %s has %s, acked %s" % (cycle, dn, attrs, token)
            for dn, attrs in found.items():
                # (c): nothing half-applied.
                assert attrs["sn"] == attrs["description"], "half-applied change on %s: %s" % (dn, attrs)
    assert len(acked) > 50, "too few writes were acknowledged to mean anything: %d" % len(acked)
    srv.stop_and_verify()


def incompressible(n):
    """Printable text that zstd cannot shrink (entries are stored compressed)."""
    return base64.b64encode(os.urandom(n * 3 // 4)).decode()


def test_full_map_fails_writes_cleanly(tmp_path):
    srv = Pando(tmp_path, demo=True, config="[store]\nmap_size_mb = 16\nwarm_start = false\n").start()
    c = srv.conn()
    big = incompressible(8000)
    failure = None
    for i in range(5000):
        ok = c.add("cn=big%d,ou=People,%s" % (i, SUFFIX), ["person"], {"cn": "big%d" % i, "sn": "big", "description": incompressible(8000)})
        if not ok:
            failure = (i, dict(c.result))
            break
    assert failure is not None, "16 MiB never filled up"
    i, res = failure
    assert res["result"] == 53, res
    assert "full" in res["message"], res
    # Reads keep working, and so do other connections.
    rc, entries, err = srv.search("ou=People," + SUFFIX, "(cn=big0)", "cn")
    assert rc == 0 and len(entries) == 1, err
    assert c.search(SUFFIX, "(uid=alice)", attributes=["uid"]) and len(c.entries) == 1
    # A small change may still fit or fail the same clean way; never anything else.
    ok = c.modify("uid=alice,ou=People," + SUFFIX, {"description": [(ldap3.MODIFY_REPLACE, ["still here"])]})
    assert ok or c.result["result"] == 53, c.result
    c.unbind()
    srv.stop_and_verify()
    # Raising the cap lets writes continue on the same store.
    srv.config = "[store]\nmap_size_mb = 64\nwarm_start = false\n"
    srv.start()
    c = srv.conn()
    assert c.add("cn=after,ou=People," + SUFFIX, ["person"], {"cn": "after", "sn": "after", "description": big}), c.result
    c.unbind()
    srv.stop_and_verify()


def test_hot_backup_and_restore(tmp_path):
    srv = Pando(tmp_path / "a", demo=True).start()
    stop = threading.Event()
    added = []

    def load():
        c = srv.conn()
        n = 0
        while not stop.is_set() and n < 5000:
            if c.add("cn=hot%d,ou=People,%s" % (n, SUFFIX), ["person"], {"cn": "hot%d" % n, "sn": "hot"}):
                added.append(n)
            n += 1

    t = threading.Thread(target=load, daemon=True)
    t.start()
    time.sleep(0.5)
    dest = tmp_path / "backup"
    r = subprocess.run([PANDO_BIN, "backup", "--data-dir", str(srv.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=120)
    stop.set()
    t.join(30)
    assert r.returncode == 0, r.stderr
    manifest = (dest / "manifest.toml").read_text()
    entries = int([l for l in manifest.splitlines() if l.startswith("entries")][0].split("=")[1])
    assert entries >= 19, manifest
    # Restoring over a running server is refused.
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(srv.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "in use" in r.stderr, r.stderr
    srv.stop_and_verify()
    # Restore into a new data directory and serve it.
    other = Pando(tmp_path / "b")
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(other.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rc, out = other.verify()
    assert rc == 0 and ("%d entries, consistent" % entries) in out, out
    # The restored store has no generated password file of its own: give it one.
    other.config = None
    (other.data_dir / "admin-password").write_text(srv.admin_pw)
    other.start()
    rc, found, err = other.search(SUFFIX, "(objectClass=*)", "1.1")
    assert rc == 0 and len(found) == entries, (len(found), entries, err)
    other.stop_and_verify()
    # A damaged backup is refused and the store is left alone.
    with open(dest / "data.mdb", "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0xFF]))
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(other.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "checksum mismatch" in r.stderr, r.stderr
    rc, out = other.verify()
    assert rc == 0, out


def test_one_server_per_data_directory(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(srv.data_dir), "--listen", "ldap://127.0.0.1:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "in use by another pando process" in r.stderr, r.stderr
    srv.stop_and_verify()


def test_sighup_changes_durability(tmp_path):
    srv = Pando(tmp_path, demo=True, config="[store]\ndurability = \"durable\"\n").start()
    (tmp_path / "pando.toml").write_text("[store]\ndurability = \"batched\"\nbatched_max_ms = 50\n")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "durability changed" not in srv.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "durability changed" in srv.logs()
    c = srv.conn()
    for i in range(20):
        assert c.add("cn=b%d,ou=People,%s" % (i, SUFFIX), ["person"], {"cn": "b%d" % i, "sn": "b"}), c.result
    c.unbind()
    # A bad value is refused and the running configuration stays.
    (tmp_path / "pando.toml").write_text("[store]\ndurability = \"sometimes\"\n")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "not reloaded" not in srv.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "store.durability" in srv.logs()
    assert srv.alive()
    srv.stop_and_verify()


BACKUP_EXOP = "2.25.15972167931155808496075090497880241257.1.1"


def test_online_backup_through_the_server(tmp_path):
    srv = Pando(tmp_path / "a", demo=True).start()
    dest = tmp_path / "online"
    # Anonymous callers may not start a backup.
    rc, out, err = srv.ldap("ldapexop", "%s:%s" % (BACKUP_EXOP, dest), auth=None)
    assert rc != 0 and "Insufficient access (50)" in err, (rc, out, err)
    assert not dest.exists()
    rc, out, err = srv.ldap("ldapexop", "%s:%s" % (BACKUP_EXOP, dest))
    assert rc == 0, (out, err)
    assert (dest / "manifest.toml").exists() and (dest / "data.mdb").exists()
    # The same destination twice is refused: a backup never overwrites.
    rc, out, err = srv.ldap("ldapexop", "%s:%s" % (BACKUP_EXOP, dest))
    assert rc != 0 and "already exists" in err, (rc, err)
    srv.stop_and_verify()
    other = Pando(tmp_path / "b")
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(other.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rc, out = other.verify()
    assert rc == 0 and "19 entries, consistent" in out, out


def test_full_disk_fails_writes_cleanly(tmp_path):
    """A real full filesystem (an 8 MiB tmpfs): writes fail with a clear
    error, reads go on, the store stays consistent."""
    with small_tmpfs(tmp_path / "small", "8m") as mnt:
        srv = Pando(mnt, demo=True, config="[store]\nwarm_start = false\n").start()
        c = srv.conn()
        big = incompressible(8000)
        failure = None
        for i in range(3000):
            if not c.add("cn=fill%d,ou=People,%s" % (i, SUFFIX), ["person"],
                         {"cn": "fill%d" % i, "sn": "fill", "description": big}):
                failure = dict(c.result)
                break
        assert failure is not None, "8 MiB never filled up"
        assert failure["result"] == 53 and "full" in failure["message"], failure
        rc, entries, err = srv.search(SUFFIX, "(uid=alice)", "uid")
        assert rc == 0 and len(entries) == 1, err
        c.unbind()
        # Shut down and check the store before the filesystem goes away.
        srv.stop_and_verify()


def test_verify_catches_flipped_bytes(tmp_path):
    # Plain records, so the value can be found in the file (the codec's unit
    # tests flip every byte of compressed records too).
    srv = Pando(tmp_path / "a", demo=True, config='[store]\ncompression = "off"\n').start()
    srv.stop_and_verify()
    copy = tmp_path / "copy"
    shutil.copytree(srv.data_dir, copy)
    data = copy / "db" / "data.mdb"
    blob = bytearray(data.read_bytes())
    # Flip a byte inside a stored value (not LMDB's own structure). Copy-on-
    # write leaves old page images in free pages too, so flip every copy.
    at = blob.find(b"Liddell")
    assert at > 0
    while at >= 0:
        blob[at] ^= 0x20
        at = blob.find(b"Liddell", at + 1)
    data.write_bytes(bytes(blob))
    r = subprocess.run([PANDO_BIN, "verify", "--data-dir", str(copy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "checksum mismatch" in r.stdout, r.stdout


def test_restore_refuses_another_format(tmp_path):
    srv = Pando(tmp_path / "a", demo=True).start()
    dest = tmp_path / "bk"
    r = subprocess.run([PANDO_BIN, "backup", "--data-dir", str(srv.data_dir), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    srv.stop_and_verify()
    m = dest / "manifest.toml"
    text = m.read_text()
    found = re.search(r"^store_format = (\d+)$", text, re.M)
    assert found, text
    m.write_text(text.replace(found.group(0), "store_format = 99"))
    r = subprocess.run([PANDO_BIN, "restore", "--data-dir", str(tmp_path / "b"), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "store format 99" in r.stderr, r.stderr
