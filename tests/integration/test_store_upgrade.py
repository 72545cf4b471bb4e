"""A store written by an earlier store format is upgraded in place.

fixtures/store-format-2.mdb.gz is the data file of a store made by the
release before chunked posting lists (commit 810ab12, store format 2: one
serialised posting list per index key in `idx:` databases), holding 60
users from `../shared/bench/gen_ldif.py -n 60 --password-scheme ssha`.
fixtures/store-format-4.mdb.gz holds the same users imported by the
release before short index records (commit b8ccdb3, store format 4: every
index record ending in a 6-byte chunk number, UUIDs keyed by their text),
with the default indexes.
fixtures/store-format-7.mdb.gz holds them imported by the release before
short dn2id keys (commit 80478a5, store format 7: each dn2id key begins
with its parent's ID in 8 bytes), with ou=Staff added over LDAP and
uid=user.3 moved below it (that server generated the administrator's
password the test writes back to admin-password).
"""

import gzip
import re
import shutil
import subprocess

from conftest import PANDO_BIN, SUFFIX, Pando


def unpack(tmp_path, fixture="store-format-2.mdb.gz"):
    srv = Pando(tmp_path)
    db = srv.data_dir / "db"
    db.mkdir(parents=True)
    srv.data_dir.chmod(0o700)
    db.chmod(0o700)
    fixture = __file__.rsplit("/", 1)[0] + "/fixtures/" + fixture
    with gzip.open(fixture, "rb") as src, open(db / "data.mdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (db / "data.mdb").chmod(0o600)
    return srv


def verify(srv):
    r = subprocess.run([PANDO_BIN, "verify", "--data-dir", str(srv.data_dir)],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_a_format_2_store_is_upgraded_and_answers_as_before(tmp_path):
    srv = unpack(tmp_path)
    rc, out = verify(srv)
    assert rc == 0, out
    assert "store format 2" in out and "62 entries, consistent" in out, out
    srv.start()
    assert "store format upgrade: the indexes" in srv.logs(tail=100000)
    # Every kind of index lookup the default indexes answer.
    for flt, want in [("(uid=user.7)", 1), ("(mail=user.1*)", 11),
                      ("(objectClass=inetOrgPerson)", 60), ("(cn=*)", 60)]:
        rc, entries, err = srv.search(SUFFIX, flt, "uid")
        assert rc == 0 and len(entries) == want, (flt, len(entries), err)
    # Changes after the upgrade keep the new lists right.
    rc, _, err = srv.ldap("ldapdelete", "uid=user.12,ou=People," + SUFFIX)
    assert rc == 0, err
    rc, entries, err = srv.search(SUFFIX, "(uid=user.12)", "uid")
    assert rc == 0 and entries == [], err
    assert srv.stop() == 0
    rc, out = verify(srv)
    assert rc == 0 and "61 entries, consistent" in out and "store format" not in out, out
    # A second start does not rebuild again.
    srv.start()
    rc, entries, err = srv.search(SUFFIX, "(mail=user.1*)", "uid")
    assert rc == 0 and len(entries) == 10, err
    assert srv.logs(tail=100000).count("store format upgrade: the indexes") == 1
    srv.stop_and_verify()


def test_a_format_4_store_gets_short_index_records_and_answers_as_before(tmp_path):
    srv = unpack(tmp_path, "store-format-4.mdb.gz")
    rc, out = verify(srv)
    assert rc == 0, out
    assert "store format 4" in out and "62 entries, consistent" in out, out
    srv.start()
    assert srv.logs(tail=100000).count("store format upgrade: the indexes") == 1
    rc, entries, err = srv.search(SUFFIX, "(uid=user.7)", "entryUUID")
    assert rc == 0 and len(entries) == 1, err
    uuid = entries[0][1]["entryUUID"][0]
    # The UUID index is keyed by the 16 bytes now: any case of the text finds it.
    for flt, want in [("(uid=user.7)", 1), ("(mail=user.1*)", 11),
                      ("(objectClass=inetOrgPerson)", 60), ("(cn=*)", 60),
                      (f"(entryUUID={uuid.upper()})", 1), (f"(entryUUID={uuid})", 1),
                      ("(entryUUID=00000000-0000-0000-0000-000000000000)", 0)]:
        rc, entries, err = srv.search(SUFFIX, flt, "uid")
        assert rc == 0 and len(entries) == want, (flt, len(entries), err)
    rc, _, err = srv.ldap("ldapdelete", "uid=user.7,ou=People," + SUFFIX)
    assert rc == 0, err
    rc, entries, err = srv.search(SUFFIX, f"(entryUUID={uuid})", "uid")
    assert rc == 0 and entries == [], err
    assert srv.stop() == 0
    rc, out = verify(srv)
    assert rc == 0 and "61 entries, consistent" in out and "store format" not in out, out
    srv.start()
    assert srv.logs(tail=100000).count("store format upgrade: the indexes") == 1
    srv.stop_and_verify()


def test_a_format_7_store_gets_short_dn2id_keys_and_answers_as_before(tmp_path):
    srv = unpack(tmp_path, "store-format-7.mdb.gz")
    # That server kept the hash of the password it generated in the store.
    pw = srv.data_dir / "admin-password"
    pw.write_text("Ut6zyhDiPC5TdkNd8zZak7vU")
    pw.chmod(0o600)
    # Read-only, in its own layout: verify resolves every entry's DN.
    rc, out = verify(srv)
    assert rc == 0 and "63 entries, consistent" in out, out
    r = subprocess.run([PANDO_BIN, "export", "--data-dir", str(srv.data_dir), "--wrap", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "dn: uid=user.3,ou=Staff," + SUFFIX in r.stdout, r.stderr
    srv.start()
    logs = re.sub(r"\x1b\[[0-9;]*m", "", srv.logs(tail=100000))
    assert "dn2id keys rewritten" in logs and "keys=63" in logs, logs
    assert "the indexes are rebuilt" not in logs
    # DNs resolve as before: bases, one-level and subtree scopes, the moved entry.
    rc, entries, err = srv.search("uid=user.3,ou=Staff," + SUFFIX, "(objectClass=*)", "uid", scope="base")
    assert rc == 0 and len(entries) == 1, err
    rc, entries, err = srv.search("ou=People," + SUFFIX, "(objectClass=*)", "1.1", scope="one")
    assert rc == 0 and len(entries) == 59, err
    rc, entries, err = srv.search(SUFFIX, "(objectClass=*)", "1.1")
    assert rc == 0 and len(entries) == 63, err
    rc, _, err = srv.search("uid=user.3,ou=People," + SUFFIX, "(objectClass=*)", scope="base")
    assert rc == 32, err
    # Changes after the upgrade: a rename back, a delete, an add.
    rc, _, err = srv.ldap("ldapmodrdn", "-s", "ou=People," + SUFFIX,
                          "uid=user.3,ou=Staff," + SUFFIX, "uid=user.3")
    assert rc == 0, err
    rc, _, err = srv.ldap("ldapdelete", "ou=Staff," + SUFFIX)
    assert rc == 0, err
    rc, _, err = srv.ldap("ldapadd", input="dn: ou=Devices,%s\nobjectClass: organizationalUnit\nou: Devices\n" % SUFFIX)
    assert rc == 0, err
    rc, entries, err = srv.search("ou=People," + SUFFIX, "(objectClass=*)", "1.1", scope="one")
    assert rc == 0 and len(entries) == 60, err
    assert srv.stop() == 0
    rc, out = verify(srv)
    assert rc == 0 and "63 entries, consistent" in out, out
    # A second start rewrites nothing.
    srv.start()
    assert srv.logs(tail=100000).count("dn2id keys rewritten") == 1
    rc, entries, err = srv.search("ou=Devices," + SUFFIX, "(objectClass=*)", "ou", scope="base")
    assert rc == 0 and len(entries) == 1, err
    srv.stop_and_verify()
