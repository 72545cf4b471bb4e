"""The in-directory access log under hostile clients (issue 37, item 1):
anonymous refused operations are counted, not stored; stored records are
bounded each and in all; the writer is not flooded. And secrets other than
userPassword (sambaNTPassword…) kept out of the logs (item 7)."""

import re
import subprocess
import threading
import time
import urllib.request

import ber
from conftest import PANDO_BIN, PEOPLE, PUBLIC_READ, Pando, free_port, ldif_entry

MiB = 1 << 20


def store_bytes(srv):
    """Disk space the store's files take (allocated blocks, not the map)."""
    d = srv.data_dir / "db"
    return sum(p.stat().st_blocks * 512 for p in d.iterdir() if p.is_file())


def flood_deletes(srv, conns, per_conn, dn_bytes, auth=None):
    """`conns` connections at once, each pipelining `per_conn` Delete
    requests with a DN of about `dn_bytes` bytes; the result codes."""
    codes, errors = [], []

    def one(n):
        try:
            with srv.raw(timeout=60) as c:
                if auth:
                    assert ber.simple_bind(c, *auth) == 0
                payload = b"".join(
                    ber.message(i + 2, ber.tlv(0x4A, ("cn=%d-%d-%s,%s" % (n, i, "x" * dn_bytes, PEOPLE)).encode()))
                    for i in range(per_conn))
                c.send(payload)
                got = []
                deadline = time.monotonic() + 60
                while len(got) < per_conn and time.monotonic() < deadline:
                    m = c.recv_msg(timeout=60)
                    if m is None:
                        break
                    got.append(m["code"])
                codes.extend(got)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    return codes


def monitor_logs(srv):
    rc, entries, err = srv.search("cn=Logs,cn=Monitor", "(objectClass=*)", "+", "*", scope="base")
    assert rc == 0, err
    return dict(entries)["cn=Logs,cn=Monitor"]


def admin_write_secs(srv, value):
    t = time.monotonic()
    rc, _, err = srv.ldap("ldapmodify", input="dn: uid=alice,%s\nchangetype: modify\nreplace: description\n"
                                              "description: %s\n" % (PEOPLE, value))
    assert rc == 0, err
    return time.monotonic() - t


def test_anonymous_refused_deletes_neither_fill_the_store_nor_hold_up_writes(tmp_path):
    """The reported attack, scaled to 30 connections x 100 deletes with
    30 KB DNs (3,000 refusals, 90 MB sent; before: ~95 MiB stored)."""
    srv = Pando(tmp_path, demo=True, config='[[overlay]]\ntype = "accesslog"\n', name="alog-flood").start()
    try:
        admin_write_secs(srv, "before")
        before = store_bytes(srv)
        during = []
        flooding = threading.Event()

        def writes_meanwhile():
            flooding.wait(10)
            for i in range(3):
                during.append(admin_write_secs(srv, "during %d" % i))

        w = threading.Thread(target=writes_meanwhile)
        w.start()
        flooding.set()
        codes = flood_deletes(srv, 30, 100, 30_000)
        w.join(120)
        assert len(codes) == 3000 and 0 not in codes, set(codes)
        # Queued after whatever the flood left for the writer.
        admin_write_secs(srv, "after")
        grown = store_bytes(srv) - before
        assert grown < 20 * MiB, "the store grew by %.1f MiB" % (grown / MiB)
        assert during and max(during) < 5, during
        logs = monitor_logs(srv)
        assert int(logs["pandoAccessLogRefusedAnonymous"][0]) >= 3000, logs
        # Still serving, the change log (what delta-sync reads) intact.
        rc, found, err = srv.search("cn=accesslog", "(reqDN=uid=alice,%s)" % PEOPLE, "reqMod", scope="one")
        assert rc == 0, err
        assert any("description:= after" in v for _, e in found for v in e.get("reqMod", [])), found
    finally:
        srv.stop_and_verify()


CAPPED = """
[[overlay]]
type = "accesslog"
ops = ["writes", "reads"]
max_records = 150
max_bytes = 1048576
max_record_bytes = 1024
"""


def test_stored_records_are_capped_in_number_bytes_and_size(tmp_path):
    """An authenticated client's failures are stored, but each record is cut
    to max_record_bytes and the log kept to max_records/max_bytes, the
    oldest purged first; successful writes (the change log) stay."""
    mport = free_port()
    cfg = CAPPED + '\n[metrics]\nlisten = "127.0.0.1:%d"\n' % mport
    srv = Pando(tmp_path, demo=True, config=cfg, name="alog-cap").start()
    try:
        admin_write_secs(srv, "kept")
        before = store_bytes(srv)
        codes = flood_deletes(srv, 4, 100, 3_000, auth=(srv.admin_dn, srv.admin_pw))
        assert len(codes) == 400 and set(codes) == {32}, set(codes)
        admin_write_secs(srv, "kept too")
        rc, found, err = srv.search("cn=accesslog", "(&(reqType=delete)(reqResult=32))", "reqDN", scope="one")
        assert rc == 0, err
        assert 0 < len(found) <= 150, len(found)
        dns = [e["reqDN"][0] for _, e in found]
        assert all(len(d) <= 1024 and re.search(r"\.\.\.\[cut, \d+ bytes\]$", d) for d in dns), dns[:2]
        # The newest were kept: the last connection's last delete is there.
        assert any(d.startswith("cn=") and "-99-" in d for d in dns), dns[:3]
        assert store_bytes(srv) - before < 8 * MiB
        assert int(monitor_logs(srv)["pandoAccessLogPurged"][0]) >= 250
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as r:
            text = r.read().decode()
        assert re.search(r"^pando_accesslog_purged_total [1-9]", text, re.M), text[-2000:]
        # Successful writes are the change log's: never purged by the cap.
        rc, found, err = srv.search("cn=accesslog", "(reqDN=uid=alice,%s)" % PEOPLE, "reqMod", scope="one")
        assert rc == 0, err
        mods = [v for _, e in found for v in e.get("reqMod", [])]
        assert {"kept", "kept too"} <= {m.split(" ", 1)[1] for m in mods if m.startswith("description:")}, mods
    finally:
        srv.stop_and_verify()


def test_a_bad_cap_is_refused(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('data_dir = "%s"\n[[overlay]]\ntype = "accesslog"\nmax_bytes = 1000\n' % (tmp_path / "d"))
    r = subprocess.run([PANDO_BIN, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "overlay[0].max_bytes" in r.stderr and "1048576" in r.stderr, r.stderr


# ------------------------------------------------------------ secrets (item 7)

SAMBA_SCHEMA = """
attributetype ( 1.3.6.1.4.1.7165.2.1.25 NAME 'sambaNTPassword'
	DESC 'MD4 hash of the unicode password'
	EQUALITY caseIgnoreIA5Match
	SYNTAX 1.3.6.1.4.1.1466.115.121.1.26{32} SINGLE-VALUE )

objectclass ( 1.3.6.1.4.1.99999.37.1 NAME 'testSambaAccount'
	SUP top AUXILIARY
	MAY sambaNTPassword )
"""

NT_HASH = "8846F7EAEE8FB117AD06BDD830B7586C"
NT_HASH2 = "32ED87BDB5FDC5E9CBA88547376818D4"
GUESS = "0123456789ABCDEF0123456789ABCDEF"


def test_samba_nt_password_is_withheld_from_the_logs(tmp_path):
    (tmp_path / "samba.schema").write_text(SAMBA_SCHEMA)
    cfg = 'schema_files = ["%s"]\n%s\n[logs]\naccess = "%s"\naudit = "%s"\n\n' \
          '[[overlay]]\ntype = "accesslog"\nops = ["all"]\n' % (
              tmp_path / "samba.schema", PUBLIC_READ, tmp_path / "access.log", tmp_path / "audit.log")
    srv = Pando(tmp_path, demo=True, config=cfg, name="alog-secret").start()
    try:
        dn = "uid=samba," + PEOPLE
        add = ldif_entry(dn, {"objectClass": ["inetOrgPerson", "testSambaAccount"], "uid": ["samba"],
                              "cn": ["Samba"], "sn": ["Samba"], "sambaNTPassword": [NT_HASH]})
        rc, _, err = srv.ldap("ldapadd", input=add)
        assert rc == 0, err
        rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: sambaNTPassword\n"
                                                  "sambaNTPassword: %s\n-\nreplace: sn\nsn: Smb\n" % (dn, NT_HASH2))
        assert rc == 0, err
        rc, _, _ = srv.ldap("ldapcompare", dn, "sambaNTPassword:" + GUESS)
        assert rc in (5, 6)
        rc, _, _ = srv.ldap("ldapsearch", "-b", PEOPLE, "(sambaNTPassword=%s)" % GUESS, "cn")
        assert rc == 0
        # Everything above has reached the logs once the access log shows
        # the search (records and log lines are written after answering).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rc, found, err = srv.search("cn=accesslog", "(|(reqType=search)(reqType=compare))",
                                        "reqFilter", "reqAssertion", scope="one")
            if any("sambaNTPassword" in v for _, e in found for v in e.get("reqFilter", [])):
                break
            time.sleep(0.2)
        audit = (tmp_path / "audit.log").read_text()
        assert "uid=samba" in audit and "sn: Smb" in audit, audit
        assert NT_HASH not in audit and NT_HASH2 not in audit, audit
        assert "sambaNTPassword: 1 value(s) withheld" in audit, audit
        access = (tmp_path / "access.log").read_text()
        assert "sambaNTPassword" in access and GUESS not in access, access[-2000:]
        shown = [v for _, e in found for a in ("reqFilter", "reqAssertion") for v in e.get(a, [])
                 if "sambaNTPassword" in v]
        assert len(shown) == 2 and not any(GUESS in v for v in shown), shown
    finally:
        srv.stop_and_verify()
