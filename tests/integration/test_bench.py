"""pando bench, the load generator: every workload against a real Pando
(JSON output checked for sanity), the same against a throwaway OpenLDAP
slapd (it works against any server), bad input, and a side-by-side run with
the C generator of the shared benchmark kit (both must produce results; no
speed is asserted here).

Every run is short (about 2 s), uses few connections, and talks to
127.0.0.1 only."""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PANDO_BIN, PEOPLE, REPO, SUFFIX, Pando, ldif_entry, PUBLIC_READ

USERS = 300
USER_PW = "password"
SHARED_BENCH = Path(os.environ.get("PANDO_SHARED_BENCH", REPO.parent / "shared" / "bench"))


def ssha(password, i):
    salt = hashlib.sha1(b"bench-salt-%d" % i).digest()[:8]
    digest = hashlib.sha1(password.encode() + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def user_entries(n=USERS):
    for i in range(n):
        uid = "user.%d" % i
        yield ("uid=%s,%s" % (uid, PEOPLE), {
            "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
            "uid": [uid], "cn": ["User %d" % i], "sn": ["Sn%d" % i],
            "mail": ["%s@example.com" % uid], "userPassword": [ssha(USER_PW, i)],
        })


PEOPLE_OU = (PEOPLE, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Pando with ou=People and uid=user.0..299 ({SSHA} passwords)."""
    # Anonymous searches (ldapi, no bind) read the tree, as against slapd.
    s = Pando(tmp_path_factory.mktemp("bench"), demo=False, name="bench", config=PUBLIC_READ).start()
    s.bulk_add([PEOPLE_OU] + list(user_entries()))
    yield s
    s.stop_and_verify()


def bench(url, *args, bind=None, timeout=60):
    """Runs pando bench; returns the CompletedProcess."""
    cmd = [PANDO_BIN, "bench", "--url", url]
    if bind:
        cmd += ["--bind-dn", bind[0], "--bind-pw", bind[1]]
    cmd += list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


SHORT = ["--duration", "2s", "--warmup", "500ms", "--connections", "4",
         "--range", "0-%d" % (USERS - 1), "--interval", "500ms"]


def run_json(url, *args, bind=None):
    r = bench(url, *SHORT, "--json", *args, bind=bind)
    assert r.returncode == 0, "pando bench failed (rc=%d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


def assert_sane(j, workload, errors=0):
    assert j["workload"] == workload, j
    assert j["ops"] > 0, j
    assert j["errors"] == errors, (j["errors_by_code"], j["warnings"])
    assert j["ops_per_s"] > 0
    lat = j["latency_ms"]
    assert 0 < lat["mean"] <= lat["max"], lat
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"], lat
    assert j["elapsed_s"] > 0
    assert j["intervals"], "no interval lines"
    assert sum(i["ops"] for i in j["intervals"]) == j["ops"], "intervals must add up to the total"
    assert sum(o["ops"] for o in j["by_op"].values()) == j["ops"]
    assert j["result"].startswith("RESULT workload=%s " % workload), j["result"]
    assert j["fatal"] is None and j["stopped"] is None, j


def admin(srv):
    return (srv.admin_dn, srv.admin_pw)


# ------------------------------------------------------------------ against Pando


@pytest.mark.parametrize("workload,extra", [
    ("search", ["--attrs", "cn,mail"]),
    ("search", ["--depth", "8", "--hot", "80:20"]),
    ("auth", []),
    ("bind", []),
    ("modify", ["--sequential"]),
])
def test_workloads_against_pando(server, workload, extra):
    j = run_json(server.url, "--workload", workload, *extra, bind=admin(server))
    assert_sane(j, workload)
    if workload == "search":
        # Each uid=user.N exists exactly once.
        assert j["entries"] == j["ops"] and j["empty_searches"] == 0, j
    if "--depth" in extra:
        assert j["depth"] == 8


def test_modify_changed_the_entries(server):
    rc, entries, err = server.search(PEOPLE, "(description=modified by pando bench *)", "1.1", scope="one")
    assert rc == 0 and entries, "no entry carries a pando bench description: %s" % err


def test_mixed_ratio(server):
    j = run_json(server.url, "--mix", "search=80,modify=10,auth=10", "--depth", "4", bind=admin(server))
    assert_sane(j, "mixed")
    by = j["by_op"]
    assert set(by) == {"search", "modify", "auth"}
    total = j["ops"]
    assert 0.65 < by["search"]["ops"] / total < 0.92, by
    assert by["modify"]["ops"] > 0 and by["auth"]["ops"] > 0, by


def test_add_then_delete_leaves_the_directory_clean(server):
    keys = ["--range", "1000-1149", "--duration", "20s", "--warmup", "0s"]
    a = run_json(server.url, "--workload", "add", *keys, bind=admin(server))
    # The range holds 150 keys: the run adds each once, then ends early.
    assert a["ops"] == 150 and a["errors"] == 0, a
    assert any("every key" in w for w in a["warnings"]), a["warnings"]
    rc, entries, err = server.search(PEOPLE, "(uid=bench.*)", "uid", scope="one")
    assert rc == 0 and len(entries) == 150, err
    assert sorted(int(e[1]["uid"][0].split(".")[1]) for e in entries) == list(range(1000, 1150))
    d = run_json(server.url, "--workload", "delete", *keys, bind=admin(server))
    assert d["ops"] == 150 and d["errors"] == 0, d
    rc, entries, err = server.search(PEOPLE, "(uid=bench.*)", "uid", scope="one")
    assert rc == 0 and entries == [], entries


def test_count_stops_exactly(server):
    r = bench(server.url, "--count", "500", "--warmup", "0s", "--connections", "3", "--depth", "2",
              "--range", "0-%d" % (USERS - 1), "--json", bind=admin(server))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["ops"] + j["errors"] == 500, j


def test_open_loop_holds_the_rate(server):
    j = run_json(server.url, "--rate", "300", bind=admin(server))
    assert_sane(j, "search")
    assert j["mode"] == "open" and j["target_rate"] == 300
    # 300/s for 2 s: within the schedule's granularity.
    assert 240 <= j["ops_per_s"] <= 330, j["ops_per_s"]


def test_ldapi_and_text_output(server):
    r = bench(server.ldapi_url, *SHORT, "--attrs", "1.1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "ops/s" in out and "latency ms: mean" in out, out
    m = re.search(r"^RESULT workload=search .*ops_per_s=([0-9.]+) mean_ms=([0-9.]+) .*p99_ms=([0-9.]+)", out, re.M)
    assert m and float(m.group(1)) > 0, out


def test_errors_are_counted_by_result_code(server):
    j = run_json(server.url, "--base", "ou=Nowhere," + SUFFIX, bind=admin(server))
    assert j["ops"] == 0 and j["errors"] > 0, j
    assert [(e["code"], e["name"]) for e in j["errors_by_code"]] == [(32, "noSuchObject")], j


def test_bad_input_gives_clear_errors(server):
    cases = [
        (["--bind-dn", server.admin_dn, "--bind-pw", "not-the-password"],
         "bind as '%s' failed: invalidCredentials (49)" % server.admin_dn),
        (["--url", "ldap://127.0.0.1:1"], "cannot connect to ldap://127.0.0.1:1"),
        (["--url", "http://127.0.0.1:1"], "expected ldap://HOST:PORT"),
        (["--filter", "(uid=user.%d"], "bad search filter"),
        (["--filter", "(uid=%s)"], "unknown '%s'"),
        (["--range", "10"], "expected FIRST-LAST"),
        (["--mix", "search=1,add=1"], "separate runs"),
        (["--duration", "soon"], "expected a duration"),
    ]
    for args, want in cases:
        cmd = [PANDO_BIN, "bench", "--url", server.url, "--duration", "1s", "--warmup", "0s"] + args
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, (args, r.stdout)
        assert want in r.stderr, (args, r.stderr)


# ------------------------------------------------------------------ against OpenLDAP


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    if not (Path("/usr/sbin/slapd").exists() and Path("/usr/sbin/slapadd").exists()):
        pytest.skip("slapd/slapadd not installed")
    from test_differential import Slapd
    base = tmp_path_factory.mktemp("bench-slapd")
    suffix = (SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"], "o": ["example"]})
    ldif = base / "users.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in [suffix, PEOPLE_OU] + list(user_entries())))
    s = Slapd(base / "slapd")
    s.load(ldif)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("workload", ["search", "auth", "bind", "modify"])
def test_workloads_against_openldap(slapd, workload):
    j = run_json(slapd.url, "--workload", workload, bind=(slapd.admin_dn, slapd.admin_pw))
    assert_sane(j, workload)


def test_wrong_user_password_is_counted_per_operation(slapd):
    # (Against slapd: Pando would throttle, then lock out, 127.0.0.1 after
    # hundreds of failed binds, which the other tests need.)
    j = run_json(slapd.url, "--workload", "bind", "--password", "wrong")
    assert j["ops"] == 0 and j["errors"] > 0, j
    assert [(e["code"], e["name"]) for e in j["errors_by_code"]] == [(49, "invalidCredentials")], j


def test_add_delete_against_openldap(slapd):
    creds = (slapd.admin_dn, slapd.admin_pw)
    keys = ["--range", "0-49", "--duration", "20s", "--warmup", "0s"]
    a = run_json(slapd.url, "--workload", "add", *keys, bind=creds)
    d = run_json(slapd.url, "--workload", "delete", *keys, bind=creds)
    assert (a["ops"], a["errors"], d["ops"], d["errors"]) == (50, 0, 50, 0), (a, d)
    rc, out, err = slapd.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "(uid=bench.*)", "1.1")
    assert rc == 0 and "dn:" not in out, out


# ------------------------------------------------------------------ beside the C generator


def test_side_by_side_with_ldbench(server, tmp_path):
    load_sh = SHARED_BENCH / "load.sh"
    if not load_sh.exists() or not shutil.which("gcc"):
        pytest.skip("shared benchmark kit (%s) or gcc not available" % load_sh)
    env = dict(os.environ, LDBENCH=str(tmp_path / "ldbench"))
    r = subprocess.run(
        ["bash", str(load_sh), "--url", server.url, "--label", "pando",
         "--bind-dn", server.admin_dn, "--bind-pw", server.admin_pw,
         "--users", str(USERS), "--conns", "4", "--secs", "2", "--warmup", "1",
         "--wait-idle", "0", "--retry-noisy", "0", "search-exact-1attr"],
        capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    c_line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert c_line, r.stdout + r.stderr
    # The same requests: sub search under ou=People for (uid=user.<random>), attribute cn.
    b = bench(server.url, "--duration", "2s", "--warmup", "1s", "--connections", "4",
              "--range", "0-%d" % (USERS - 1), "--attrs", "cn", "--label", "pando", bind=admin(server))
    assert b.returncode == 0, b.stderr
    r_line = [l for l in b.stdout.splitlines() if l.startswith("RESULT ")]
    assert r_line, b.stdout
    for line in (c_line[0], r_line[0]):
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert float(fields["ops_per_s"]) > 0 and fields["errors"] == "0", line
        assert float(fields["mean_ms"]) > 0 and float(fields["p99_ms"]) >= float(fields["p50_ms"]), line
    print("\n" + c_line[0] + "\n" + r_line[0])
