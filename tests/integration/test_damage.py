"""Damaged and unrecognised stores: `serve` refuses them with an error that
names the file and what to do, never initialises over them and never
rewrites admin-password; `verify`, `export`, `backup` and `salvage` report
damage with a non-zero exit and never crash; salvage writes what survived."""

import shutil
import signal
import subprocess

import pytest

from conftest import PANDO_BIN, SUFFIX, Pando

PAGE = 4096


def run(*args, timeout=60):
    r = subprocess.run([PANDO_BIN, *args], capture_output=True, text=True, timeout=timeout)
    # A signal (crash) shows as a negative return code.
    assert r.returncode >= 0, "pando %s died by signal %d:\n%s" % (args[0], -r.returncode, r.stderr)
    return r.returncode, r.stdout + r.stderr


def serve_once(data_dir, timeout=20):
    """Start serve; it must exit by itself (refusing) within the timeout."""
    p = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(data_dir), "--listen", "ldap://127.0.0.1:0"],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode >= 0, "serve died by signal %d:\n%s" % (-p.returncode, p.stderr)
    return p.returncode, p.stdout + p.stderr


def made_store(tmp_path, n=300):
    """A stopped server's data directory holding the demo tree and n more entries."""
    srv = Pando(tmp_path / "orig", demo=True).start()
    ldif = "".join(
        "dn: cn=d%d,ou=People,%s\nobjectClass: person\ncn: d%d\nsn: %s\ndescription: %s\n\n"
        % (i, SUFFIX, i, "x" * (1 + i % 50), "y" * (3000 if i % 10 == 0 else 100))
        for i in range(n))
    try:
        rc, out, err = srv.ldap("ldapadd", input=ldif)
        assert rc == 0, err
    finally:
        srv.stop_and_verify()
    return srv.data_dir


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    (dst / "pando.lock").unlink(missing_ok=True)
    return dst


def main_root(b):
    """The main database's root page in the newer of the two meta pages
    (LMDB 0.9, 64-bit: the transaction ID at byte 144 of a meta page, the
    main database's root at byte 128)."""
    word = lambda at: int.from_bytes(b[at:at + 8], "little")
    slot = max((0, 1), key=lambda s: word(s * PAGE + 144))
    return word(slot * PAGE + 128)


def damage(data_dir, how):
    f = data_dir / "db" / "data.mdb"
    b = bytearray(f.read_bytes())
    if how == "zero-pages":
        # Three zeroed pages from the main database's root (which names
        # every database): where the other trees lie depends on the store's
        # layout and history, and `serve` checks the main database's pages
        # before it opens a store (the indexes' only with `verify`).
        root = main_root(b)
        b[root * PAGE:(root + 3) * PAGE] = bytes(3 * PAGE)
    elif how == "truncated":
        del b[len(b) // 3:]
    elif how == "meta-pages":
        b[0:2 * PAGE] = bytes(range(256)) * (2 * PAGE // 256)
    elif how == "not-pando":
        # A sound LMDB file whose 'meta' database is gone (renamed in the
        # main database's leaf page, order kept): an LMDB file of some
        # other program, as far as Pando can tell.
        # Every copy: the current main database page and stale free ones.
        i, renamed = b.find(b"meta", 2 * PAGE), 0
        while i >= 0:
            if b[i - 2:i] == b"\x04\x00":  # preceded by its key size
                b[i:i + 4] = b"mexa"
                renamed += 1
            i = b.find(b"meta", i + 1)
        assert renamed > 0
    f.write_bytes(bytes(b))


def test_serve_refuses_damaged_stores_and_keeps_admin_password(tmp_path):
    orig = made_store(tmp_path)
    password = (orig / "admin-password").read_text()
    for how, says in [("zero-pages", "damaged store"), ("truncated", "damaged store"),
                      ("meta-pages", "not an LMDB meta page"), ("not-pando", "has no 'meta' database")]:
        d = copy_dir(orig, tmp_path / how)
        damage(d, how)
        before = sorted(p.name for p in d.rglob("*"))
        rc, out = serve_once(d)
        assert rc != 0, "%s: serve started on a damaged store:\n%s" % (how, out)
        assert says in out and "data.mdb" in out, (how, out)
        assert "pando salvage" in out and "pando verify" in out and "restore" in out, out
        assert (d / "admin-password").read_text() == password, how
        assert not (d / "admin-password.new").exists(), how
        # Nothing new but the data directory's lock.
        assert sorted(p.name for p in d.rglob("*") if p.name != "pando.lock") == before, how
        rc, out = run("verify", "--data-dir", str(d))
        assert rc == 1 and says in out, (how, out)
        rc, out = run("export", "--data-dir", str(d), "-o", str(tmp_path / (how + ".ldif")))
        assert rc != 0 and says in out, (how, out)
        rc, out = run("backup", "--data-dir", str(d), str(tmp_path / (how + ".bak")))
        assert rc != 0 and says in out, (how, out)
        assert not (tmp_path / (how + ".bak")).exists()


def test_salvage_keeps_what_survived(tmp_path):
    orig = made_store(tmp_path)
    rc, out = run("salvage", "--data-dir", str(orig), "-o", str(tmp_path / "whole.ldif"))
    assert rc == 0 and "nothing was lost" in out, out
    whole = (tmp_path / "whole.ldif").read_text().count("\ndn: ") + 1
    assert whole == 19 + 300
    # Three zeroed pages that held entries. Where entries lie depends on
    # the store's history, so the first such window from page 2 on is
    # taken (each window tried is a fresh copy).
    pages = (orig / "db" / "data.mdb").stat().st_size // PAGE
    out_ldif = tmp_path / "saved.ldif"
    for lo in range(2, pages - 3, 3):
        d = copy_dir(orig, tmp_path / ("zeroed-%d" % lo))
        f = d / "db" / "data.mdb"
        b = bytearray(f.read_bytes())
        b[lo * PAGE:(lo + 3) * PAGE] = bytes(3 * PAGE)
        f.write_bytes(bytes(b))
        rc, out = run("salvage", "--data-dir", str(d), "-o", str(out_ldif))
        saved = out_ldif.read_text().count("\ndn: ") + 1 if out_ldif.exists() else 0
        if rc == 1 and 0 < saved < whole:
            break
        shutil.rmtree(d)
    else:
        pytest.fail("no window of three zeroed pages lost some entries but not all")
    assert "see " in out, out
    report = (tmp_path / "saved.ldif.report").read_text()
    assert "unreadable" in report, report
    assert oct(out_ldif.stat().st_mode & 0o777) == "0o600"
    # What was salvaged imports into a new store as it is.
    rc, out = run("import", "--data-dir", str(tmp_path / "new"), "-f", str(out_ldif), timeout=120)
    assert rc in (0, 2), out
    rc, out = run("verify", "--data-dir", str(tmp_path / "new"))
    assert rc == 0, out


def test_admin_password_is_never_overwritten(tmp_path):
    # A data directory with admin-password but no store (the store was
    # moved away or lost): serve must not make a new store and password.
    orig = made_store(tmp_path)
    d = tmp_path / "nostore"
    d.mkdir()
    shutil.copy(orig / "admin-password", d / "admin-password")
    rc, out = serve_once(d)
    assert rc != 0 and "admin-password" in out and "no administrator password" in out, out
    assert (d / "admin-password").read_text() == (orig / "admin-password").read_text()
    assert not (d / "db" / "data.mdb").exists() or "Nothing was changed" in out
    # A first start cut between writing the password file and renaming it
    # leaves admin-password.new; the next start finishes the job.
    srv = Pando(tmp_path / "first").start()
    pw = srv.admin_pw
    srv.stop_and_verify()
    (srv.data_dir / "admin-password").rename(srv.data_dir / "admin-password.new")
    srv.start()
    assert srv.admin_pw == pw
    assert not (srv.data_dir / "admin-password.new").exists()
    srv.stop_and_verify()


def test_none_mode_crash_is_checked_at_start(tmp_path):
    srv = Pando(tmp_path / "none", demo=True, config='[store]\ndurability = "none"\n').start()
    rc, out, err = srv.ldap("ldapadd", input="dn: cn=n1,ou=People,%s\nobjectClass: person\ncn: n1\nsn: n\n\n" % SUFFIX)
    assert rc == 0, err
    marker = srv.data_dir / "db" / "unsynced-writes"
    assert marker.exists()
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    srv.proc = None
    assert marker.exists()
    # Durable from now on (an edit to the file wins over the stored value).
    srv.config = '[store]\ndurability = "durable"\n'
    srv.start()
    assert "checking every page" in srv.logs() and "it is sound" in srv.logs()
    assert not marker.exists()
    rc, out, err = srv.ldap("ldapsearch", "-b", "cn=n1,ou=People," + SUFFIX, "-s", "base", "dn")
    assert rc == 0 and "cn=n1" in out, (out, err)
    srv.stop_and_verify()
