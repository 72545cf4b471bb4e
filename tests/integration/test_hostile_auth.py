"""Authentication paths an attacker would probe (issue 37, item 7): the
must-change restriction against proxied authorization, password-policy
lockout across a provider and its read-only consumer, failed binds that
take as long whether the account exists or not, Password Modify's old
password counted as a failed bind, cn=Monitor parts no rule names, and
the administrator-DN traps of docs/access-control.md."""

import statistics
import subprocess
import time
from pathlib import Path

import ldap3
import pytest

import ber
from conftest import PANDO_BIN, PUBLIC_READ, SUFFIX, Pando, ldif_entry, server_with
from test_replication import converge_nodes, pando_consumer

PEOPLE = "ou=People," + SUFFIX
POLICIES = "ou=Policies," + SUFFIX
PROXY_AUTHZ = "2.16.840.1.113730.3.4.18"
PWD_FAILURES = "2.25.15972167931155808496075090497880241257.1.3"
RESTRICTED = "Operations are restricted to bind/unbind/abandon/StartTLS/modify password"


def ppolicy_block(default):
    return """
[[overlay]]
type = "ppolicy"
default_policy = "cn=%s,%s"
use_lockout = true
""" % (default, POLICIES)


def policy(cn, **attrs):
    a = {"objectClass": ["device", "pwdPolicy"], "cn": [cn], "pwdAttribute": ["userPassword"]}
    a.update({k: [str(v)] for k, v in attrs.items()})
    return ("cn=%s,%s" % (cn, POLICIES), a)


def user(uid, pw="Initial-pw-1", policy_cn=None):
    a = {"objectClass": ["inetOrgPerson"], "uid": [uid], "cn": [uid], "sn": [uid], "userPassword": [pw]}
    if policy_cn:
        a["pwdPolicySubentry"] = ["cn=%s,%s" % (policy_cn, POLICIES)]
    return ("uid=%s,%s" % (uid, PEOPLE), a)


def tree(*more):
    return [(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
            (POLICIES, {"objectClass": ["organizationalUnit"], "ou": ["Policies"]})] + list(more)


def dn(uid):
    return "uid=%s,%s" % (uid, PEOPLE)


def bind_code(srv, who, pw):
    c = srv.raw()
    try:
        return ber.simple_bind(c, who, pw)
    finally:
        c.close()


def locked_time(srv, uid):
    rc, entries, err = srv.search(dn(uid), "(objectClass=*)", "pwdAccountLockedTime", scope="base")
    assert rc == 0, err
    return entries[0][1].get("pwdAccountLockedTime") if entries else None


# ------------------------------------------------------------ (a) must change vs proxied authorization

PROXY_RULES = """
[[access]]
dn = "%s"
attrs = ["entry"]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = ["auth", "compare", "search", "read", "proxy"] }]
""" % PEOPLE


def test_a_restricted_connection_cannot_escape_through_proxied_authorization(tmp_path):
    """A user whose password must be changed (pwdReset after the
    administrator set it) may not run operations as another identity;
    slapd keeps the restriction per connection, and so does Pando. Acting
    as the must-change account from an unrestricted connection is not
    restricted (the requester did not use the reset password)."""
    srv = server_with(tmp_path, "mustchange", PROXY_RULES + PUBLIC_READ + ppolicy_block("reset"),
                      tree(policy("reset", pwdMustChange="TRUE"), policy("plain"), user("fresh"),
                           user("other", policy_cn="plain")))
    try:
        assert srv.search(dn("fresh"), "(objectClass=*)", "pwdReset", scope="base")[1][0][1]["pwdReset"] == ["TRUE"]
        s = ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE)
        c = ldap3.Connection(s, dn("fresh"), "Initial-pw-1", raise_exceptions=False)
        assert c.bind(), c.result
        c.search(PEOPLE, "(objectClass=*)", search_scope=ldap3.BASE)
        assert c.result["result"] == 50 and RESTRICTED in c.result["message"], c.result
        proxied = [(PROXY_AUTHZ, True, ("dn:" + dn("other")).encode())]
        c.search(PEOPLE, "(objectClass=*)", search_scope=ldap3.BASE, controls=proxied)
        assert c.result["result"] == 50 and RESTRICTED in c.result["message"], c.result
        c.extend.standard.who_am_i(controls=proxied)
        assert c.result["result"] == 50, c.result
        c.modify(dn("other"), {"description": [(ldap3.MODIFY_REPLACE, ["escaped"])]}, controls=proxied)
        assert c.result["result"] == 50, c.result
        c.unbind()
        # Acting as the must-change account, from an unrestricted connection.
        o = ldap3.Connection(s, dn("other"), "Initial-pw-1", raise_exceptions=False)
        assert o.bind(), o.result
        o.search(PEOPLE, "(objectClass=*)", search_scope=ldap3.BASE,
                 controls=[(PROXY_AUTHZ, True, ("dn:" + dn("fresh")).encode())])
        assert o.result["result"] == 0, o.result
        o.unbind()
    finally:
        srv.stop_and_verify()


# ------------------------------------------------------------ (b) lockout across provider and consumer

def test_b_lockout_holds_across_a_provider_and_its_read_only_consumer(tmp_path):
    """Wrong passwords spread over a provider and its consumer lock the
    account on both: the consumer forwards its failures to the provider,
    which counts them and locks, and the lock replicates back."""
    block = ppolicy_block("lock")
    srv = server_with(tmp_path / "provider", "provider", PUBLIC_READ + block,
                      tree(policy("lock", pwdLockout="TRUE", pwdMaxFailure=4, pwdLockoutDuration=0),
                           user("spread")))
    con = None
    try:
        # Forwarded failures count toward a lockout: only an identity that
        # may write pwdFailureTime (here the administrator) may send them.
        s = ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE)
        u = ldap3.Connection(s, dn("spread"), "Initial-pw-1", raise_exceptions=False)
        assert u.bind(), u.result
        u.extended(PWD_FAILURES, ("%s\n%d" % (dn("spread"), 10)).encode())
        assert u.result["result"] == 50, u.result
        u.unbind()
        assert not locked_time(srv, "spread")
        con = pando_consumer(tmp_path / "consumer", srv, tail=block)
        converge_nodes([srv, con], log=con.logs)
        assert bind_code(srv, dn("spread"), "wrong-1") == 49
        assert bind_code(con, dn("spread"), "wrong-2") == 49
        assert bind_code(srv, dn("spread"), "wrong-3") == 49
        assert bind_code(con, dn("spread"), "wrong-4") == 49
        deadline = time.monotonic() + 10
        while not (locked_time(srv, "spread") and locked_time(con, "spread")):
            assert time.monotonic() < deadline, (
                "not locked on both: provider %r, consumer %r\n%s"
                % (locked_time(srv, "spread"), locked_time(con, "spread"), con.logs()))
            time.sleep(0.2)
        assert bind_code(srv, dn("spread"), "Initial-pw-1") == 49
        assert bind_code(con, dn("spread"), "Initial-pw-1") == 49
    finally:
        if con:
            con.stop()
        srv.stop_and_verify()


# ------------------------------------------------------------ (c) no account-existence timing oracle

TIMING = PUBLIC_READ + ppolicy_block("count") + """
[passwords]
scheme = "ssha512"

[limits]
failed_bind_free = 100000
failed_bind_lockout = 0
failed_bind_lockout_ip = 0
"""


def test_c_a_wrong_password_takes_as_long_for_an_existing_account_as_for_a_missing_one(tmp_path):
    """Under a policy that records failures, the answer to a wrong password
    does not wait for the failure's durable write, so it takes the time a
    missing DN takes (medians of interleaved samples, a generous bound)."""
    srv = server_with(tmp_path, "timing", TIMING,
                      tree(policy("count", pwdLockout="TRUE", pwdMaxFailure=100000), user("timed")))
    try:
        c = srv.raw()
        times = {"existing": [], "missing": []}
        targets = {"existing": dn("timed"), "missing": dn("nobody-here")}
        msgid = 1
        for i in range(60):
            for kind in ("existing", "missing") if i % 2 else ("missing", "existing"):
                t0 = time.perf_counter()
                assert ber.simple_bind(c, targets[kind], "wrong-pw", msgid=msgid) == 49
                times[kind].append(time.perf_counter() - t0)
                msgid += 1
        c.close()
        existing = statistics.median(times["existing"][5:])
        missing = statistics.median(times["missing"][5:])
        print("median wrong-password bind: existing %.3f ms, missing %.3f ms" % (existing * 1e3, missing * 1e3))
        assert existing <= 2.0 * missing + 0.0002 and missing <= 2.0 * existing + 0.0002, (
            "median existing %.3f ms, missing %.3f ms" % (existing * 1e3, missing * 1e3))
        # The failures were recorded all the same.
        deadline = time.monotonic() + 10
        while True:
            rc, entries, err = srv.search(dn("timed"), "(objectClass=*)", "pwdFailureTime", scope="base")
            n = len(entries[0][1].get("pwdFailureTime", []))
            if n == 60 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert n == 60, n
    finally:
        srv.stop_and_verify()


# ------------------------------------------------------------ (d) Password Modify's old password

def wrong_old_passwords(srv, uid, n):
    """n Password Modify requests with a wrong old password, on one
    connection bound as the account (a successful bind in between would
    clear the failures)."""
    s = ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE)
    c = ldap3.Connection(s, dn(uid), "Initial-pw-1", raise_exceptions=False, receive_timeout=30)
    assert c.bind(), c.result
    for i in range(n):
        c.extend.standard.modify_password(dn(uid), "guess-%d" % i, "New-pw-123")
        assert c.result["result"] == 53, c.result
    c.unbind()


def test_d_a_wrong_old_password_counts_toward_the_policy_lockout(tmp_path):
    srv = server_with(tmp_path, "pwmod", PUBLIC_READ + ppolicy_block("lock"),
                      tree(policy("lock", pwdLockout="TRUE", pwdMaxFailure=3, pwdLockoutDuration=0),
                           user("guessed")))
    try:
        wrong_old_passwords(srv, "guessed", 3)
        deadline = time.monotonic() + 10
        while not locked_time(srv, "guessed"):
            assert time.monotonic() < deadline, "three wrong old passwords did not lock the account"
            time.sleep(0.1)
        assert bind_code(srv, dn("guessed"), "Initial-pw-1") == 49
    finally:
        srv.stop_and_verify()


def test_d_a_wrong_old_password_meets_the_failed_bind_throttle(tmp_path):
    cfg = PUBLIC_READ + "\n[limits]\nfailed_bind_lockout = 3\nfailed_bind_max_delay_ms = 100\n"
    srv = server_with(tmp_path, "pwthrottle", cfg, tree(user("throttled")))
    try:
        wrong_old_passwords(srv, "throttled", 3)
        # The DN is locked out by the throttle: the right password is
        # answered as a wrong one.
        assert bind_code(srv, dn("throttled"), "Initial-pw-1") == 49
    finally:
        srv.stop_and_verify()


# ------------------------------------------------------------ (e) cn=Monitor parts no rule names

def test_e_a_rule_naming_one_monitor_entry_opens_no_other(tmp_path):
    rule = """
[[access]]
dn = "cn=Connections,cn=Monitor"
scope = "base"
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"""
    srv = server_with(tmp_path, "monacl", rule + PUBLIC_READ, tree(user("watcher")))
    try:
        auth = (dn("watcher"), "Initial-pw-1")
        rc, entries, err = srv.search("cn=Connections,cn=Monitor", "(objectClass=*)", scope="base", auth=auth)
        assert rc == 0 and len(entries) == 1, (rc, err)
        for other in ("cn=Monitor", "cn=Operations,cn=Monitor", "cn=Store,cn=Monitor"):
            rc, entries, err = srv.search(other, "(objectClass=*)", scope="base", auth=auth)
            assert rc == 32 and entries == [], (other, rc, entries)
        rc, entries, err = srv.search("cn=Monitor", "(objectClass=*)", "1.1", auth=auth)
        assert rc == 32, (rc, entries)
    finally:
        srv.stop_and_verify()


# ------------------------------------------------------------ (f) migrate: unanchored dn.regex targets

@pytest.mark.skipif(not Path("/etc/ldap/schema/core.schema").exists(), reason="no OpenLDAP schema files")
def test_f_migrate_keeps_an_unanchored_dn_regex_covering_the_entries_below(tmp_path):
    """slapd matches `to dn.regex` anywhere in the DN: a rule refusing
    `ou=Secret,...` refuses the entries below it too. The translation must
    not cover only the one DN, letting them fall through to the later
    `to * by * read`."""
    conf = tmp_path / "slapd.conf"
    conf.write_text("\n".join([
        "include /etc/ldap/schema/core.schema",
        "database mdb",
        'suffix "%s"' % SUFFIX,
        'rootdn "cn=admin,%s"' % SUFFIX,
        "directory %s" % tmp_path,
        'access to dn.regex="ou=Secret,%s" by * none' % SUFFIX,
        "access to * by * read",
    ]) + "\n")
    out = tmp_path / "out"
    r = subprocess.run([PANDO_BIN, "migrate", "--from", str(conf), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    secret = "ou=Secret," + SUFFIX
    ldif = tmp_path / "data.ldif"
    ldif.write_text("\n".join(ldif_entry(d, a) for d, a in [
        (SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["Example"]}),
        (secret, {"objectClass": ["organizationalUnit"], "ou": ["Secret"]}),
        ("cn=plans," + secret, {"objectClass": ["device"], "cn": ["plans"]}),
        ("ou=Open," + SUFFIX, {"objectClass": ["organizationalUnit"], "ou": ["Open"]}),
    ]))
    srv = Pando(tmp_path / "pando", demo=False, config=(out / "pando.toml").read_text(), name="migrated")
    r = subprocess.run([PANDO_BIN, "import", "--config", str(out / "pando.toml"), "--data-dir",
                        str(srv.data_dir), "-f", str(ldif)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    srv.start()
    try:
        rc, entries, err = srv.search(SUFFIX, "(objectClass=*)", "1.1", auth=None)
        got = sorted(d.lower() for d, _ in entries)
        assert got == sorted([SUFFIX, "ou=open," + SUFFIX]), (rc, got, (out / "pando.toml").read_text())
    finally:
        srv.stop()
