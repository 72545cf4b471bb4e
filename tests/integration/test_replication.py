"""Replication (RFC 4533 with OpenLDAP's conventions): server IDs in CSNs,
contextCSN per server ID on suffix entries, the change log."""

import time

import pytest

from conftest import PEOPLE, PUBLIC_READ, SUFFIX, Pando


def attrs_of(srv, dn, *names):
    rc, entries, err = srv.search(dn, "(objectClass=*)", *names, scope="base")
    assert rc == 0, err
    return entries[0][1]


@pytest.fixture
def sid42(tmp_path):
    s = Pando(tmp_path, demo=True, config=PUBLIC_READ + "\n[replication]\nserver_id = 42\n").start()
    yield s
    s.stop_and_verify()


def test_context_csn_follows_writes_per_server_id_and_survives_a_restart(sid42):
    srv = sid42
    dn = "uid=alice," + PEOPLE
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: description\ndescription: x\n" % dn)
    assert rc == 0, err
    csn = attrs_of(srv, dn, "entryCSN")["entryCSN"][0]
    assert csn.split("#")[2] == "02a", csn
    ctx = attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"]
    # The demo tree was created before: its CSNs are this server's too.
    assert ctx == [csn], ctx
    # Only on suffix entries, and only when asked for (operational).
    assert "contextCSN" not in attrs_of(srv, PEOPLE, "+")
    assert "contextCSN" not in attrs_of(srv, SUFFIX)
    assert srv.stop() == 0
    srv.start()
    assert attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"] == [csn]
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: description\ndescription: y\n" % dn)
    assert rc == 0, err
    after = attrs_of(srv, SUFFIX, "contextCSN")["contextCSN"]
    assert len(after) == 1 and after[0] > csn
    # A filter on it works like any operational attribute's.
    rc, entries, err = srv.search(SUFFIX, "(contextCSN=%s)" % after[0], "1.1", scope="base")
    assert rc == 0 and len(entries) == 1, (rc, entries, err)


def test_a_server_id_out_of_range_is_refused(tmp_path):
    cfg = tmp_path / "pando.toml"
    cfg.write_text("[replication]\nserver_id = 4096\n")
    import subprocess
    from conftest import PANDO_BIN
    r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(tmp_path / "d"), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "replication.server_id" in r.stderr + r.stdout and "4095" in r.stderr + r.stdout
