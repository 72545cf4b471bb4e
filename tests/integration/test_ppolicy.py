"""The password policy overlay against the real binary, compared with slapd
running its ppolicy overlay on the same entries: lockout after failed binds,
expiry warnings and grace binds, must-change after an administrator's reset
(and the restricted connection until then), quality and history checks on
Password Modify, with the password policy response control read from both."""

import subprocess
import time
from pathlib import Path

import ldap3
import pytest
from ldap3 import MODIFY_REPLACE

from conftest import SUFFIX, Pando, ldif_entry
from test_differential import SLAPD, Slapd

pytestmark = pytest.mark.skipif(not Path(SLAPD).exists(), reason="slapd not installed")

PPOLICY = "1.3.6.1.4.1.42.2.27.8.5.1"
PASSWD_MODIFY = "1.3.6.1.4.1.4203.1.11.1"
PEOPLE = "ou=People," + SUFFIX
POLICIES = "ou=Policies," + SUFFIX
DEFAULT = "cn=default," + POLICIES

PANDO_CONFIG = """
[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "read" }]

[[overlay]]
type = "ppolicy"
default_policy = "%s"
use_lockout = true
""" % DEFAULT


class SlapdWithPolicy(Slapd):
    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        text = conf.read_text().replace("moduleload back_mdb\n", "moduleload back_mdb\nmoduleload ppolicy\n")
        text = text.replace("access to attrs=userPassword by self write by anonymous auth by * none",
                            "access to attrs=userPassword by self write by anonymous auth by * none")
        conf.write_text(text + 'overlay ppolicy\nppolicy_default "%s"\nppolicy_use_lockout\n' % DEFAULT)


def policy(cn, **attrs):
    a = {"objectClass": ["device", "pwdPolicy"], "cn": [cn], "pwdAttribute": ["userPassword"]}
    a.update({k: [str(v)] for k, v in attrs.items()})
    return ("cn=%s,%s" % (cn, POLICIES), a)


def user(uid, policy_cn=None, pw="Initial-pw-1"):
    a = {"objectClass": ["inetOrgPerson"], "uid": [uid], "cn": [uid], "sn": [uid], "userPassword": [pw]}
    if policy_cn:
        a["pwdPolicySubentry"] = ["cn=%s,%s" % (policy_cn, POLICIES)]
    return ("uid=%s,%s" % (uid, PEOPLE), a)


ENTRIES = [
    (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
    (POLICIES, {"objectClass": ["organizationalUnit"], "ou": ["Policies"]}),
    policy("default", pwdCheckQuality=1, pwdMinLength=8, pwdInHistory=2, pwdMustChange="TRUE"),
    policy("lock", pwdLockout="TRUE", pwdMaxFailure=3, pwdLockoutDuration=0),
    policy("expire", pwdMaxAge=3, pwdExpireWarning=100, pwdGraceAuthNLimit=2),
    user("locky", "lock"),
    user("expiry", "expire"),
    user("fresh"),
    user("ended"),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("ppolicy")
    slapd = SlapdWithPolicy(base / "slapd")
    top = base / "top.ldif"
    top.write_text(ldif_entry(SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"],
                                       "o": ["example"]}))
    slapd.load(top)
    slapd.start()
    pando = Pando(base / "pando", demo=False, config=PANDO_CONFIG, name="pando-ppolicy").start()
    rest = base / "rest.ldif"
    rest.write_text("\n".join(ldif_entry(dn, a) for dn, a in ENTRIES))
    try:
        for srv in (slapd, pando):
            rc, _, err = srv.ldap("ldapadd", "-f", str(rest))
            assert rc == 0, err
        yield slapd, pando
    finally:
        slapd.stop()
    pando.stop_and_verify()


def decode_policy(value):
    """(warning, error) of a password policy response value: warning is
    ("expire", seconds) or ("grace", n); error the draft's number."""
    assert value[0] == 0x30, value
    body, i, warning, error = value[2:2 + value[1]], 0, None, None
    while i < len(body):
        tag, ln = body[i], body[i + 1]
        inner = body[i + 2:i + 2 + ln]
        if tag == 0xA0:
            kind = {0x80: "expire", 0x81: "grace"}[inner[0]]
            warning = (kind, int.from_bytes(inner[2:2 + inner[1]], "big"))
        elif tag == 0x81:
            error = int.from_bytes(inner, "big")
        i += 2 + ln
    return warning, error


def bind(srv, dn, pw):
    """Bind with the password policy control: (result code, warning, error, conn)."""
    c = ldap3.Connection(ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE),
                         user=dn, password=pw, raise_exceptions=False)
    c.open()
    c.bind(controls=[(PPOLICY, False, None)])
    ctl = (c.result.get("controls") or {}).get(PPOLICY)
    warning, error = decode_policy(ctl["value"]) if ctl else (None, None)
    return c.result["result"], warning, error, c


def on_both(pair, fn):
    return [fn(srv) for srv in pair]


def test_failed_binds_lock_the_account_as_in_slapd(pair):
    dn = "uid=locky," + PEOPLE
    for attempt in range(3):
        got = on_both(pair, lambda s: bind(s, dn, "wrong")[:3])
        assert got[0] == got[1] == (49, None, None), (attempt, got)
    got = on_both(pair, lambda s: bind(s, dn, "Initial-pw-1")[:3])
    assert got[0] == got[1] == (49, None, 1), got      # accountLocked
    # The state is in the entry, on both.
    for srv in pair:
        c = srv.conn()
        c.search(dn, "(objectClass=*)", search_scope="BASE",
                 attributes=["pwdAccountLockedTime", "pwdFailureTime"])
        e = c.entries[0]
        assert e.pwdAccountLockedTime.value is not None, srv
        assert len(e.pwdFailureTime.values) == 3, (srv, e)
    # An administrator unlocks it: the bind works again.
    for srv in pair:
        c = srv.conn()
        c.modify(dn, {"pwdAccountLockedTime": [(ldap3.MODIFY_DELETE, [])]})
        assert c.result["result"] == 0, (srv, c.result)
    got = on_both(pair, lambda s: bind(s, dn, "Initial-pw-1")[:3])
    assert got[0] == got[1] == (0, None, None), got


def test_expiry_warns_then_allows_grace_binds_then_refuses(pair):
    dn = "uid=expiry," + PEOPLE
    # The administrator sets the password now: pwdChangedTime starts.
    for srv in pair:
        c = srv.conn()
        c.modify(dn, {"userPassword": [(MODIFY_REPLACE, ["Expiring-pw-1"])]})
        assert c.result["result"] == 0
    got = on_both(pair, lambda s: bind(s, dn, "Expiring-pw-1")[:3])
    for code, warning, error in got:
        assert code == 0 and error is None and warning[0] == "expire" and 0 < warning[1] <= 3, got
    time.sleep(4.2)
    for remaining in (1, 0):
        got = on_both(pair, lambda s: bind(s, dn, "Expiring-pw-1")[:3])
        assert got[0] == got[1] == (0, ("grace", remaining), None), got
    got = on_both(pair, lambda s: bind(s, dn, "Expiring-pw-1")[:3])
    assert got[0] == got[1] == (49, None, 0), got      # passwordExpired


def passwd(conn, new, old=None):
    """Password Modify of the bound user's own password, with the policy control."""
    conn.extend.standard.modify_password(old_password=old, new_password=new,
                                         controls=[(PPOLICY, False, None)])
    ctl = (conn.result.get("controls") or {}).get(PPOLICY)
    return conn.result["result"], (decode_policy(ctl["value"])[1] if ctl else None)


def test_reset_passwords_must_be_changed_and_changes_are_checked(pair):
    dn = "uid=fresh," + PEOPLE
    for srv in pair:
        c = srv.conn()
        c.modify(dn, {"userPassword": [(MODIFY_REPLACE, ["Reset-by-admin-1"])]})
        assert c.result["result"] == 0
        c.search(dn, "(objectClass=*)", search_scope="BASE", attributes=["pwdReset"])
        assert c.entries[0].pwdReset.value in (True, "TRUE"), (srv, c.entries)
    results = []
    for srv in pair:
        code, warning, error, c = bind(srv, dn, "Reset-by-admin-1")
        row = [(code, error)]
        # Restricted to changing the password.
        c.search(PEOPLE, "(uid=*)", attributes=["uid"])
        row.append(c.result["result"])
        row.append(passwd(c, "short"))
        row.append(passwd(c, "Reset-by-admin-1"))
        row.append(passwd(c, "Brand-new-pw-2"))
        c.search(PEOPLE, "(uid=fresh)", attributes=["uid"])
        row.append(c.result["result"])
        results.append(row)
    assert results[0] == results[1], "slapd=%s pando=%s" % tuple(results)
    assert results[1] == [(0, 2), 50, (19, 6), (19, 8), (0, None), 0], results[1]
    for srv in pair:
        c = srv.conn()
        c.search(dn, "(objectClass=*)", search_scope="BASE",
                 attributes=["pwdReset", "pwdChangedTime", "pwdHistory"])
        e = c.entries[0]
        assert e.pwdReset.value is None and e.pwdChangedTime.value is not None, (srv, e)
        assert len(e.pwdHistory.values) >= 1, (srv, e)


def test_a_password_past_its_end_time_does_not_work_as_in_slapd(pair):
    dn = "uid=ended," + PEOPLE
    got = on_both(pair, lambda s: bind(s, dn, "Initial-pw-1")[0])
    assert got == [0, 0], got
    for srv in pair:
        c = srv.conn()
        c.modify(dn, {"pwdEndTime": [(MODIFY_REPLACE, ["20000101000000Z"])]})
        assert c.result["result"] == 0, (srv, c.result)
    got = on_both(pair, lambda s: bind(s, dn, "Initial-pw-1")[0])
    assert got == [49, 49], got
    for srv in pair:
        c = srv.conn()
        c.modify(dn, {"pwdEndTime": [(ldap3.MODIFY_DELETE, [])],
                      "pwdStartTime": [(MODIFY_REPLACE, ["29990101000000Z"])]})
        assert c.result["result"] == 0, (srv, c.result)
    got = on_both(pair, lambda s: bind(s, dn, "Initial-pw-1")[0])
    assert got == [49, 49], got


def test_a_bad_policy_entry_is_refused(pair):
    _, pando = pair
    c = pando.conn()
    c.add("cn=bad," + POLICIES, attributes={"objectClass": ["device", "pwdPolicy"], "cn": ["bad"],
                                            "pwdAttribute": ["userPassword"], "pwdCheckQuality": ["7"]})
    assert c.result["result"] == 19 and "pwdCheckQuality" in c.result["message"], c.result
