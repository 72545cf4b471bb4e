"""`pando repl check`: replicas compared by content (hash trees over their
entries, compared top-down), every differing entry named, and repaired
with --repair. Pando servers answer with digests; slapd is read with a
search and digested by the command the same way, so a check across a
mixed ring shows that both ways give equal digests."""

import re
import subprocess
import time

import pytest

from conftest import PANDO_BIN, PEOPLE, PUBLIC_READ, SUFFIX, Pando
from test_multi_provider import PW
from test_mixed_ring import MixedRing, conflict_records, following, slapd_values, write
from test_replication import HAVE_SLAPD, attrs_of, converge_nodes, modify, pando_consumer, wait_monitor

DIGEST_EXOP = "2.25.15972167931155808496075090497880241257.1.4"
MONITOR = "cn=Consumer 001,cn=Replication,cn=Monitor"


def check(*args, timeout=120):
    r = subprocess.run([PANDO_BIN, "repl", "check"] + list(args), capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def named(out):
    """The DNs the check names as differing (the lines before the
    indented details)."""
    return sorted(ln.split(" (entryUUID")[0].lower() for ln in out.splitlines() if "(entryUUID " in ln)


def test_a_check_names_every_entry_a_stale_consumer_holds_differently(tmp_path):
    # Identities other than administrators may walk 5 entries unindexed.
    srv = Pando(tmp_path / "provider", demo=True,
                config=PUBLIC_READ + "\n[limits]\nunindexed_search_limit = 5\n").start()
    # refreshOnly once an hour: after its first refresh it keeps what it
    # has. It compares itself with its provider every second.
    con = pando_consumer(tmp_path / "consumer", srv, "refreshOnly", interval=3600, extra="check_secs = 1\n")
    try:
        converge_nodes([srv, con], log=con.logs)
        rc, out = check(srv.ldapi_url, con.ldapi_url)
        assert rc == 0 and "the same entries everywhere" in out, out
        assert out.count(": digests, ") == 2, out
        # The agreeing case costs one question per server.
        assert re.search(r": digests, 2 requests, 0 entries read", out), out
        wait_monitor(con, "pandoReplCheckDiffering", "0")
        rc, out = check("--read-all", srv.ldapi_url, con.ldapi_url)
        assert rc == 0 and out.count(": read whole, ") == 2, out

        modify(srv, "dn: uid=frank,%s\nchangetype: modify\nreplace: description\ndescription: moved\n" % PEOPLE)
        modify(srv, "dn: uid=judy,%s\nchangetype: delete\n" % PEOPLE)
        modify(srv, "dn: uid=newbie,%s\nchangetype: add\nobjectClass: account\nuid: newbie\n" % PEOPLE)
        want = sorted("uid=%s,%s" % (u, PEOPLE.lower()) for u in ("frank", "judy", "newbie"))
        for extra in ([], ["--read-all"]):
            rc, out = check(*extra, srv.ldapi_url, con.ldapi_url)
            assert rc == 1 and "3 entries differ" in out, out
            assert named(out) == want, out
        assert re.search(r"differs from \S+ in: description", out), out
        frank = out[out.index("uid=frank"):].splitlines()
        assert "entryCSN" in frank[1] and "entryCSN" in frank[2] and frank[1] != frank[2], out
        newbie = out[out.index("uid=newbie"):].splitlines()
        assert newbie[2].endswith("missing"), out
        # The consumer found the same by itself, shows it on its cn=Monitor
        # entry and put each on its conflict record once.
        wait_monitor(con, "pandoReplCheckDiffering", "3")
        shown = attrs_of(con, MONITOR, "pandoReplCheckEntry")["pandoReplCheckEntry"]
        assert sorted(v.split(":")[0].lower() for v in shown) == want, shown
        assert any("here missing; on the provider entryCSN" in v for v in shown), shown
        time.sleep(2.5)
        records = [r for r in conflict_records(con) if "found by a check" in r]
        assert sorted(r.split(" ")[1].rstrip(":").lower() for r in records) == want, records
        assert int(attrs_of(con, MONITOR, "pandoReplCheckPasses")["pandoReplCheckPasses"][0]) >= 3
        # The digests descend only where the trees differ: a few leaves'
        # entries are listed, not the whole tree.
        rc, out = check(srv.ldapi_url, con.ldapi_url)
        listed = [int(n) for n in re.findall(r"(\d+) entries read", out)]
        assert all(n <= 6 for n in listed), out

        # The operation itself: for authenticated identities; a record
        # only for administrators; bad requests named.
        r = subprocess.run(["ldapexop", "-x", "-H", srv.url, DIGEST_EXOP + ":base %s\nnodes -\n" % SUFFIX],
                           capture_output=True, text=True, timeout=30)
        assert "(50)" in r.stderr and "authenticated identity" in r.stderr, r.stdout + r.stderr
        r = subprocess.run(["ldapexop", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url,
                            DIGEST_EXOP + ":base %s\nnodes 12345\n" % SUFFIX],
                           capture_output=True, text=True, timeout=30)
        assert "(2)" in r.stderr and "4 hex digits" in r.stderr, r.stdout + r.stderr
        modify(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: userPassword\nuserPassword: alice-pw\n"
               % PEOPLE)
        r = subprocess.run(["ldapexop", "-x", "-H", srv.url, "-D", "uid=alice,%s" % PEOPLE, "-w", "alice-pw",
                            DIGEST_EXOP + ":base %s\nrecord\nhello\n" % SUFFIX],
                           capture_output=True, text=True, timeout=30)
        assert "(50)" in r.stderr and "administrator" in r.stderr, r.stdout + r.stderr
        # A digest pass is an unindexed search of the subtree, held to the
        # same limits.
        r = subprocess.run(["ldapexop", "-x", "-H", srv.url, "-D", "uid=alice,%s" % PEOPLE, "-w", "alice-pw",
                            DIGEST_EXOP + ":base %s\nnodes -\n" % SUFFIX],
                           capture_output=True, text=True, timeout=30)
        assert "(11)" in r.stderr and "unindexed search limit (5)" in r.stderr, r.stdout + r.stderr
        # A server that cannot be read: exit 2, named.
        rc, out = check(srv.ldapi_url, "ldap://127.0.0.1:1")
        assert rc == 2 and "ldap://127.0.0.1:1" in out, out
    finally:
        con.stop_and_verify()
        srv.stop_and_verify()


@pytest.mark.skipif(not HAVE_SLAPD, reason="slapd not installed")
def test_one_name_added_on_both_sides_of_a_mixed_ring_is_found_and_repaired(tmp_path):
    # Added on Pando and on slapd while the links are cut: Pando keeps the
    # first entry at the name, slapd the newer or neither; contextCSN ends
    # equal, the entries do not. The check finds it (Pando answering with
    # digests, slapd read whole), and --repair makes one win on both, on
    # record.
    ring = MixedRing(tmp_path)
    # One identity for the check on both: slapd's rootdn given Pando's password.
    conf = ring.slapd.base / "slapd.conf"
    conf.write_text(conf.read_text().replace("rootpw %s" % ring.slapd.admin_pw, "rootpw %s" % PW))
    ring.pando.config = ring.pando.config.replace(ring.slapd.admin_pw, PW)
    # Pando compares itself with slapd every second (reading slapd whole).
    ring.pando.config = ring.pando.config.replace("timeout_secs = 5\n",
                                                  "timeout_secs = 5\ncheck_secs = 1\ncheck_slices = 1\n")
    ring.slapd.admin_pw = PW
    ring.start()
    pando, slapd = ring.pando, ring.slapd
    auth = ["-D", pando.admin_dn, "-w", pando.admin_pw]
    urls = [pando.url, slapd.url]
    try:
        converge_nodes(ring.nodes, timeout=60, log=ring.logs)
        following(ring)
        rc, out = check(*auth, *urls)
        assert rc == 0 and "the same entries everywhere" in out, out
        assert ": digests, " in out and ": read whole, " in out, out

        ring.cut()
        modify(pando, "dn: uid=twin,%s\nchangetype: add\nobjectClass: account\nuid: twin\n"
               "description: made on Pando\n" % PEOPLE)
        time.sleep(0.05)
        write(slapd, "dn: uid=twin,%s\nchangetype: add\nobjectClass: account\nuid: twin\n"
              "description: made on slapd\n" % PEOPLE)
        ring.heal()
        status = [PANDO_BIN, "repl", "status", *auth, *urls]
        deadline = time.monotonic() + 60
        while subprocess.run(status, capture_output=True, timeout=30).returncode != 0:
            assert time.monotonic() < deadline, ring.logs()
            time.sleep(0.3)
        time.sleep(1)
        rc, out = check(*auth, *urls)
        twin = "uid=twin,%s" % PEOPLE.lower()
        if rc == 0:
            pytest.skip("the two adds converged by protocol this time:\n" + out)
        # slapd ends with neither entry or with its own; Pando with its own.
        assert rc == 1 and twin in named(out), out
        # Pando found it too, by itself.
        mon = "cn=Consumer 002,cn=Replication,cn=Monitor"
        deadline = time.monotonic() + 30
        while attrs_of(pando, mon).get("pandoReplCheckDiffering", ["0"]) == ["0"]:
            assert time.monotonic() < deadline, attrs_of(pando, mon)
            time.sleep(0.3)
        shown = attrs_of(pando, mon, "pandoReplCheckEntry")["pandoReplCheckEntry"]
        assert all(v.lower().startswith(twin) for v in shown), shown

        rc, out = check("--repair", "--wait", "60", *auth, *urls)
        assert rc == 0 and "after the repair: the same entries everywhere" in out, out
        rc, out = check(*auth, *urls)
        assert rc == 0, out
        got = [slapd_values(node, "uid=twin," + PEOPLE, "description") for node in (pando, slapd)]
        assert got[0] and got[0] == got[1], got
        records = conflict_records(pando)
        assert any("uid=twin,%s: repaired by a check" % PEOPLE in r for r in records), records
        assert any("found by a check" in r for r in records), records
        deadline = time.monotonic() + 30
        while attrs_of(pando, mon).get("pandoReplCheckDiffering") != ["0"]:
            assert time.monotonic() < deadline, attrs_of(pando, mon)
            time.sleep(0.3)
    finally:
        ring.stop()
