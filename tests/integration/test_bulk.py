"""pando import / export: round trips, rejects, order problems, and an
interrupted import that must not look like a valid store."""

import gzip
import re
import signal
import subprocess
import time

import ldap3

from conftest import PANDO_BIN, SUFFIX, Pando, small_tmpfs


def assert_served_refused_as_incomplete(data_dir):
    """`pando serve` refuses the store, naming it incomplete."""
    srv = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(data_dir), "--listen", "ldap://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert srv.returncode != 0 and "incomplete" in srv.stderr, srv.stderr


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
    assert_served_refused_as_incomplete(d1)
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


def test_a_bad_record_does_not_take_a_populated_store_out_of_service(tmp_path):
    # A store with entries in it: a problem in a later import's input
    # stops that import, keeps what came before the problem (indexed), and
    # leaves the store complete and served (an empty store, above, is
    # marked incomplete instead).
    d = tmp_path / "d"
    first = tmp_path / "first.ldif"
    first.write_text(BAD.split("dn: cn=nope")[0])
    assert run("import", "--data-dir", str(d), "-f", str(first)).returncode == 0
    # Created by the import, the data directory is the service account's only.
    assert d.stat().st_mode & 0o777 == 0o700, oct(d.stat().st_mode)
    more = tmp_path / "more.ldif"
    more.write_text("dn: cn=early,ou=People,dc=example,dc=com\nobjectClass: person\ncn: early\nsn: one\n\n"
                    "dn: cn=bad,ou=People,dc=example,dc=com\nobjectClass: person\ncn: bad\n\n"
                    "dn: cn=late,ou=People,dc=example,dc=com\nobjectClass: person\ncn: late\nsn: two\n")
    r = run("import", "--data-dir", str(d), "-f", str(more))
    assert r.returncode == 1, r.stderr
    assert "more.ldif:6:" in r.stderr and "requires attribute 'sn'" in r.stderr, r.stderr
    assert "stays complete" in r.stderr and "marked incomplete" not in r.stderr, r.stderr
    v = run("verify", "--data-dir", str(d))
    assert v.returncode == 0, v.stdout + v.stderr
    # The same input's first line again: the suffix exists, nothing is
    # imported, and the store still serves.
    r = run("import", "--data-dir", str(d), "-f", str(first))
    assert r.returncode == 1 and "first.ldif:1:" in r.stderr and "already exists" in r.stderr, r.stderr
    assert "stays complete" in r.stderr, r.stderr
    srv = Pando(tmp_path / "srv")
    srv.data_dir = d
    srv.start()
    rc, entries, err = srv.search(SUFFIX, "(cn=early)", "sn")
    assert rc == 0 and len(entries) == 1, err
    rc, entries, err = srv.search(SUFFIX, "(|(cn=bad)(cn=late))", "cn")
    assert rc == 0 and entries == [], entries
    srv.stop_and_verify()


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


def strip_generated(ldif_text):
    """The lines of an export without the values the import generates anew."""
    generated = ("entryUUID:", "entryCSN:", "createTimestamp:", "modifyTimestamp:")
    return [l for l in ldif_text.splitlines() if not l.startswith(generated)]


def export_text(data_dir, *extra):
    r = run("export", "--data-dir", str(data_dir), "--operational", *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_children_before_parents_are_placed(tmp_path):
    # Users first, then their ou, then the suffix: every entry waits for its
    # parent and is stored once the parent arrives.
    users = "".join(
        "dn: uid=u%d,ou=People,dc=example,dc=com\nobjectClass: inetOrgPerson\nuid: u%d\ncn: U %d\nsn: %d\n\n" % (i, i, i, i)
        for i in range(50))
    src = tmp_path / "reversed.ldif"
    src.write_text(users + "dn: ou=People,dc=example,dc=com\nobjectClass: organizationalUnit\nou: People\n\n"
                   "dn: dc=example,dc=com\nobjectClass: domain\ndc: example\n")
    d = tmp_path / "d"
    r = run("import", "--data-dir", str(d), "-f", str(src))
    assert r.returncode == 0 and "imported 52 entries (0 rejected)" in r.stderr, r.stderr
    assert run("verify", "--data-dir", str(d)).returncode == 0
    out = run("export", "--data-dir", str(d), "--base", "ou=People," + SUFFIX, "--filter", "(uid=u49)")
    assert "dn: uid=u49,ou=People,dc=example,dc=com" in out.stdout, out.stdout


def test_interrupted_import_leaves_a_store_that_says_so(tmp_path):
    ldif = tmp_path / "big.ldif"
    assert run("gen", "-D", "numusers=200000", "-o", str(ldif)).returncode == 0
    d = tmp_path / "d"
    p = subprocess.Popen([PANDO_BIN, "import", "--data-dir", str(d), "-f", str(ldif)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kill it once entries are being written (the store file exists and grows).
    db = d / "db" / "data.mdb"
    deadline = time.time() + 60
    while time.time() < deadline and (not db.exists() or db.stat().st_size < (8 << 20)):
        time.sleep(0.05)
    assert p.poll() is None, "import finished before it could be interrupted"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert_served_refused_as_incomplete(d)
    r = run("import", "--data-dir", str(d), "-f", str(ldif))
    assert r.returncode != 0 and "incomplete" in r.stderr, r.stderr
    r = run("index", "rebuild", "--data-dir", str(d))
    assert r.returncode != 0 and "incomplete" in r.stderr, r.stderr


def test_compressed_input(tmp_path):
    ldif = tmp_path / "users.ldif"
    assert run("gen", "-D", "numusers=300", "--seed", "5", "-o", str(ldif)).returncode == 0
    gz = tmp_path / "users.ldif.gz"
    gz.write_bytes(gzip.compress(ldif.read_bytes()))
    zst = tmp_path / "users.ldif.zst"
    subprocess.run(["zstd", "-q", "-f", str(ldif), "-o", str(zst)], check=True)
    texts = []
    for name, src, fmt in (("plain", ldif, "plain"), ("gz", gz, "gzip"), ("zst", zst, "zstd")):
        d = tmp_path / name
        r = run("import", "--data-dir", str(d), "-f", str(src))
        assert r.returncode == 0 and "imported 302 entries" in r.stderr and "(%s)" % fmt in r.stderr, r.stderr
        texts.append(export_text(d))
    # Standard input works too (a pipe: no size, no bar).
    d = tmp_path / "stdin"
    r = subprocess.run([PANDO_BIN, "import", "--data-dir", str(d)], input=gz.read_bytes(),
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and b"(gzip)" in r.stderr, r.stderr
    assert strip_generated(texts[0]) == strip_generated(texts[1]) == strip_generated(texts[2])
    # A truncated gzip file is an error naming the file, not a partial store.
    cut = tmp_path / "cut.ldif.gz"
    cut.write_bytes(gz.read_bytes()[: len(gz.read_bytes()) // 2])
    r = run("import", "--data-dir", str(tmp_path / "cut"), "-f", str(cut))
    assert r.returncode != 0 and "cut.ldif.gz" in r.stderr and "incomplete" in r.stderr, r.stderr


def test_memory_budget_smaller_than_the_data(tmp_path):
    ldif = tmp_path / "users.ldif"
    assert run("gen", "-D", "numusers=20000", "--seed", "3", "-o", str(ldif)).returncode == 0
    assert ldif.stat().st_size > 8 << 20
    small, big = tmp_path / "small", tmp_path / "big"
    # 1 MiB for index keys: far less than the 11 MiB of LDIF, so keys are
    # spilled as sorted runs and merged once.
    r = run("import", "--data-dir", str(small), "-f", str(ldif), "--memory", "1M")
    assert r.returncode == 0, r.stderr
    m = re.search(r"sorted in (\d+) runs spilled to disk", r.stderr)
    assert m and int(m.group(1)) >= 5, r.stderr
    assert not (small / "db" / "import-runs").exists()
    r = run("import", "--data-dir", str(big), "-f", str(ldif), "--memory", "1G")
    assert r.returncode == 0 and "spilled" not in r.stderr, r.stderr
    for d in (small, big):
        v = run("verify", "--data-dir", str(d))
        assert v.returncode == 0, v.stdout
    assert strip_generated(export_text(small)) == strip_generated(export_text(big))
    # Bad sizes are refused by name.
    r = run("import", "--data-dir", str(tmp_path / "x"), "-f", str(ldif), "--memory", "lots")
    assert r.returncode != 0 and "lots" in r.stderr, r.stderr


def test_entries_are_stored_compressed(tmp_path):
    ldif = tmp_path / "users.ldif"
    assert run("gen", "-D", "numusers=3000", "-o", str(ldif)).returncode == 0
    on, off = tmp_path / "on" / "data", tmp_path / "off"
    r = run("import", "--data-dir", str(on), "-f", str(ldif))
    assert r.returncode == 0 and "compressed with dictionary 1" in r.stderr, r.stderr
    cfg = tmp_path / "off.toml"
    cfg.write_text('data_dir = "%s"\n[store]\ncompression = "off"\n' % off)
    r = run("import", "-c", str(cfg), "-f", str(ldif))
    assert r.returncode == 0 and "dictionary" not in r.stderr, r.stderr
    plain = (off / "db" / "data.mdb").read_bytes()
    packed = (on / "db" / "data.mdb").read_bytes()
    marker = b"This is the description for"
    # Plain: once per entry. Compressed: only inside the dictionary (up to
    # 256 KiB of text the entries share).
    assert plain.count(marker) >= 3000 and packed.count(marker) < 600, packed.count(marker)
    assert len(packed.rstrip(b"\0")) < len(plain.rstrip(b"\0")) * 0.7
    # Both serve the same entries.
    srv = Pando(tmp_path / "on").start()
    rc, entries, err = srv.search(SUFFIX, "(uid=user.2999)", "description")
    assert rc == 0 and len(entries) == 1 and "description" in entries[0][1], err
    srv.stop_and_verify()
    assert strip_generated(export_text(off)) == strip_generated(export_text(on))
    # A server write after the import uses the dictionary too, and reads back.
    srv = Pando(tmp_path / "on").start()
    c = srv.conn()
    assert c.modify("uid=user.1,ou=People," + SUFFIX, {"description": [(ldap3.MODIFY_REPLACE, ["changed after import"])]}), c.result
    c.unbind()
    srv.stop_and_verify()
    assert "description: changed after import" in export_text(on)


def test_the_dictionary_is_trained_on_the_whole_file(tmp_path):
    """From a file, the compression dictionary learns from records all
    over it; from a pipe, from the first ones (held back until trained).
    Here the first 15,000 entries are small devices and the users come
    after them: a dictionary of devices compresses users badly."""
    ldif = tmp_path / "users.ldif"
    assert run("gen", "-D", "numusers=20000", "--seed", "4", "-o", str(ldif)).returncode == 0
    records = ldif.read_text().split("\n\n")
    devices = ["dn: cn=dev%d,%s\nobjectClass: device\ncn: dev%d\nserialNumber: %d"
               % (i, SUFFIX, i, i * 7919 % 100003) for i in range(15000)]
    ldif.write_text("\n\n".join(records[:2] + devices + records[2:]))
    assert ldif.stat().st_size > 10 << 20
    spread, head = tmp_path / "spread", tmp_path / "head"
    r = run("import", "--data-dir", str(spread), "-f", str(ldif))
    assert r.returncode == 0 and "compressed with dictionary 1" in r.stderr, r.stderr
    r = subprocess.run([PANDO_BIN, "import", "--data-dir", str(head)], input=ldif.read_bytes(),
                       capture_output=True, timeout=300)
    assert r.returncode == 0 and b"compressed with dictionary 1" in r.stderr, r.stderr
    sizes = [(d / "db" / "data.mdb").stat().st_size for d in (spread, head)]
    # Measured: 12.3 MB against 18.8 MB.
    assert sizes[0] < sizes[1] * 0.8, sizes
    assert strip_generated(export_text(spread)) == strip_generated(export_text(head))


def test_full_disk_stops_the_import_clearly(tmp_path):
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        ldif = tmp_path / "users.ldif"
        assert run("gen", "-D", "numusers=30000", "-o", str(ldif)).returncode == 0
        r = run("import", "--data-dir", str(mnt / "d"), "-f", str(ldif))
        assert r.returncode != 0, r.stderr
        assert "no space left" in r.stderr and "incomplete" in r.stderr, r.stderr
        assert_served_refused_as_incomplete(mnt / "d")


def test_import_sets_memberof_when_the_overlay_is_configured(tmp_path):
    """With the memberof overlay in the configuration, `pando import`
    gives every member its memberOf as part of the import (groups before
    or after their members), so no rebuild is needed: `pando verify`
    finds the store consistent and a served search sees memberOf."""
    people = "ou=People," + SUFFIX
    groups = "ou=Groups," + SUFFIX

    def user(uid):
        return "dn: uid=%s,%s\nobjectClass: inetOrgPerson\nuid: %s\ncn: %s\nsn: %s\n\n" % (
            uid, people, uid, uid, uid)

    def group(cn, *members):
        return "dn: cn=%s,%s\nobjectClass: groupOfNames\ncn: %s\n%s\n" % (
            cn, groups, cn, "".join("member: uid=%s,%s\n" % (m, people) for m in members))

    ldif = tmp_path / "in.ldif"
    # One group comes before the member it lists, one after.
    ldif.write_text(
        "dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: x\n\n" % SUFFIX
        + "dn: %s\nobjectClass: organizationalUnit\nou: People\n\n" % people
        + "dn: %s\nobjectClass: organizationalUnit\nou: Groups\n\n" % groups
        + group("early", "late") + user("ann") + user("ben") + user("late")
        + group("staff", "ann", "ben") + group("admins", "ann"))
    cfg = tmp_path / "pando.toml"
    cfg.write_text('[[overlay]]\ntype = "memberof"\n')
    data = tmp_path / "d"
    r = run("import", "--data-dir", str(data), "--config", str(cfg), "-f", str(ldif))
    assert r.returncode == 0, r.stderr
    assert "memberOf set on 3 entries" in r.stderr, r.stderr
    r = run("verify", "--data-dir", str(data), "--config", str(cfg))
    assert r.returncode == 0 and "consistent" in r.stdout + r.stderr, r.stdout + r.stderr
    r = run("export", "--data-dir", str(data), "--operational", "-o", str(tmp_path / "out.ldif"))
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "out.ldif").read_text().lower()

    def member_of(uid):
        block = out.split("dn: uid=%s,%s\n" % (uid, people.lower()))[1].split("\n\n")[0]
        return sorted(l.split(": ", 1)[1] for l in block.splitlines() if l.startswith("memberof: "))

    assert member_of("ann") == ["cn=admins,%s" % groups.lower(), "cn=staff,%s" % groups.lower()]
    assert member_of("ben") == ["cn=staff,%s" % groups.lower()]
    assert member_of("late") == ["cn=early,%s" % groups.lower()]
    # Without the overlay configured, nothing is added.
    plain = tmp_path / "plain"
    r = run("import", "--data-dir", str(plain), "-f", str(ldif))
    assert r.returncode == 0 and "memberOf" not in r.stderr, r.stderr
    r = run("export", "--data-dir", str(plain), "--operational", "-o", str(tmp_path / "plain.ldif"))
    assert "memberof:" not in (tmp_path / "plain.ldif").read_text().lower()
