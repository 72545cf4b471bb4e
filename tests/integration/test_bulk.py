"""pando import / export: round trips, rejects, order problems, and an
interrupted import that must not look like a valid store."""

import subprocess

from conftest import PANDO_BIN, SUFFIX, Pando


def run(*args, input=None):
    return subprocess.run([PANDO_BIN, *args], capture_output=True, text=True, timeout=300, input=input)


def test_import_export_round_trip(tmp_path):
    ldif = tmp_path / "users.ldif"
    r = run("gen", "-D", "numusers=500", "--seed", "11", "-o", str(ldif))
    assert r.returncode == 0, r.stderr
    a = tmp_path / "a"
    r = run("import", "--data-dir", str(a), "-f", str(ldif))
    assert r.returncode == 0, r.stderr
    assert "imported 502 entries (0 rejected)" in r.stderr, r.stderr
    out1 = tmp_path / "out1.ldif"
    r = run("export", "--data-dir", str(a), "--operational", "-o", str(out1))
    assert r.returncode == 0 and "exported 502 entries" in r.stderr, r.stderr
    # Re-import the export (operational attributes included) elsewhere.
    b = tmp_path / "b"
    r = run("import", "--data-dir", str(b), "-f", str(out1))
    assert r.returncode == 0, r.stderr
    out2 = tmp_path / "out2.ldif"
    r = run("export", "--data-dir", str(b), "--operational", "-o", str(out2))
    assert r.returncode == 0, r.stderr
    # Same entries, values and operational attributes (entryUUID, CSN, timestamps kept).
    assert out1.read_text() == out2.read_text()
    assert "entryUUID: " in out1.read_text() and "entryCSN: " in out1.read_text()
    # Without --operational, no operational attributes.
    r = run("export", "--data-dir", str(b), "--base", "ou=People," + SUFFIX, "--filter", "(uid=user.7)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dn: uid=user.7,ou=People,dc=example,dc=com\n"), r.stdout[:200]
    assert "entryUUID" not in r.stdout and "userPassword: password" in r.stdout
    for d in (a, b):
        v = run("verify", "--data-dir", str(d))
        assert v.returncode == 0 and "consistent" in v.stdout, v.stdout
    # The import records the newest CSN as the store's state; backups carry it.
    newest = max(l.split(": ", 1)[1] for l in out1.read_text().splitlines() if l.startswith("entryCSN: "))
    r = run("backup", "--data-dir", str(b), str(tmp_path / "bk"))
    assert r.returncode == 0, r.stderr
    assert 'context_csn = "%s"' % newest in (tmp_path / "bk" / "manifest.toml").read_text()
    # The imported store serves.
    srv = Pando(tmp_path / "srv")
    srv.data_dir = b
    srv.start()
    rc, entries, err = srv.search(SUFFIX, "(uid=user.42)", "cn")
    assert rc == 0 and len(entries) == 1, err
    srv.stop_and_verify()


BAD = """dn: dc=example,dc=com
objectClass: domain
dc: example

dn: ou=People,dc=example,dc=com
objectClass: organizationalUnit
ou: People

dn: cn=nope,ou=Missing,dc=example,dc=com
objectClass: person
cn: nope
sn: x

dn: cn=bad,ou=People,dc=example,dc=com
objectClass: person
cn: bad

dn: cn=good,ou=People,dc=example,dc=com
objectClass: person
cn: good
sn: fine
"""


def test_rejects_and_order_problems(tmp_path):
    src = tmp_path / "bad.ldif"
    src.write_text(BAD)
    # Without --continue-on-error the first problem stops the import, naming
    # file:line. (An entry whose parent is missing may still get its parent
    # later in the file, so it is an error only at the end of the input.)
    d1 = tmp_path / "d1"
    r = run("import", "--data-dir", str(d1), "-f", str(src))
    assert r.returncode != 0
    assert "bad.ldif:14" in r.stderr and "requires attribute 'sn'" in r.stderr, r.stderr
    # ... and the store is refused by the server, not silently partial.
    srv = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(d1), "--listen", "ldap://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert srv.returncode != 0 and "incomplete" in srv.stderr, srv.stderr
    # With it, bad records go to the rejects file with line and reason.
    d2 = tmp_path / "d2"
    rej = tmp_path / "rejects.txt"
    r = run("import", "--data-dir", str(d2), "-f", str(src), "--continue-on-error", "--rejects", str(rej))
    assert r.returncode == 2, r.stderr
    assert "imported 3 entries (2 rejected" in r.stderr, r.stderr
    text = rej.read_text()
    assert "bad.ldif:9:" in text and "exists neither in the input nor in the store" in text, text
    assert "bad.ldif:14:" in text and "requires attribute 'sn'" in text, text
    v = run("verify", "--data-dir", str(d2))
    assert v.returncode == 0, v.stdout


def test_import_refuses_a_running_server(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    r = run("import", "--data-dir", str(srv.data_dir), input="dn: cn=x,dc=example,dc=com\nobjectClass: person\ncn: x\nsn: y\n")
    assert r.returncode != 0 and "in use" in r.stderr, r.stderr
    srv.stop_and_verify()


def test_broken_ldif_names_file_and_line(tmp_path):
    src = tmp_path / "broken.ldif"
    src.write_text("dn: dc=example,dc=com\nobjectClass: domain\ndc: example\n\n"
                   "dn: ou=X,dc=example,dc=com\nobjectClass: organizationalUnit\nou:: %%%not-base64\n")
    r = run("import", "--data-dir", str(tmp_path / "d"), "-f", str(src))
    assert r.returncode != 0
    assert "broken.ldif:7:" in r.stderr, r.stderr


def test_index_rebuild(tmp_path):
    ldif = tmp_path / "u.ldif"
    assert run("gen", "-D", "numusers=300", "-o", str(ldif)).returncode == 0
    d = tmp_path / "d"
    assert run("import", "--data-dir", str(d), "-f", str(ldif)).returncode == 0
    r = run("index", "rebuild", "--data-dir", str(d), "cn", "mail")
    assert r.returncode == 0 and "rebuilt cn, mail from 302 entries" in r.stderr, r.stderr
    r = run("index", "rebuild", "--data-dir", str(d))
    assert r.returncode == 0 and "rebuilt every index" in r.stderr, r.stderr
    r = run("index", "rebuild", "--data-dir", str(d), "description")
    assert r.returncode != 0 and "no index" in r.stderr, r.stderr
    v = run("verify", "--data-dir", str(d))
    assert v.returncode == 0, v.stdout
