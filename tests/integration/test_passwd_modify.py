"""Password Modify (RFC 3062), differential: the same requests, byte for
byte, against a throwaway slapd and Pando holding the same users. The
requests are what the common clients send: PHP's
`ldap_exop_passwd($conn, "", $old, $new)` and python-ldap's
`passwd_s('', old, new)` send a zero-length userIdentity (as `ldappasswd -a
OLD -s NEW ""` does), ldappasswd without a user sends none."""

import shutil
import subprocess
from pathlib import Path

import pytest

import ber
from conftest import SUFFIX, ldif_entry, server_with
from test_differential import SLAPD, SLAPADD, Slapd

pytestmark = pytest.mark.skipif(not (Path(SLAPD).exists() and Path(SLAPADD).exists()
                                     and shutil.which("ldapsearch")),
                                reason="slapd/slapadd/ldap-utils not installed")

PW_OID = "1.3.6.1.4.1.4203.1.11.1"
PEOPLE = "ou=People," + SUFFIX


def person(uid, pw):
    return ("uid=%s,%s" % (uid, PEOPLE),
            {"objectClass": ["inetOrgPerson"], "uid": [uid], "cn": [uid], "sn": [uid], "userPassword": [pw]})


USERS = {"alice": "alice-old", "bob": "bob-old", "carol": "carol-old", "dave": "dave-old",
         "erin": "erin-old", "frank": "frank-old", "gina": "gina-old", "hank": "hank-old",
         "ivan": "ivan-old"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("passwd")
    people = [(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]})]
    people += [person(u, p) for u, p in USERS.items()]
    suffix = (SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["example"]})
    full = base / "full.ldif"
    full.write_text("\n".join(ldif_entry(dn, a) for dn, a in [suffix] + people))
    slapd = Slapd(base / "slapd")
    slapd.load(full)
    slapd.start()
    # Pando's default rules match the slapd's: users write their own
    # password, nobody reads it, anyone may bind with it.
    pando = server_with(base / "pando", "pando-passwd", None, people)
    try:
        yield slapd, pando
    finally:
        slapd.stop()
    pando.stop_and_verify()


def request(identity=None, old=None, new=None):
    """A PasswdModifyRequestValue with exactly the fields given (b"" is a
    present, zero-length field)."""
    parts = []
    for tag, v in ((0x80, identity), (0x81, old), (0x82, new)):
        if v is not None:
            parts.append(ber.octets(v, tag=tag))
    return ber.seq(*parts)


def exop(server, who, value, msgid=2):
    """Bind as `who` ((dn, password), or None for anonymous), send the
    request, return (result code, response value or None)."""
    with ber.Conn("127.0.0.1", server.port, timeout=30) as c:
        if who is not None:
            assert ber.simple_bind(c, who[0], who[1]) == 0, who
        c.send(ber.message(msgid, ber.extended_op(PW_OID, value)))
        m = c.recv_msg()
        assert m is not None and m["op"] == "extended", m
        return m["code"], m.get("value")


def binds(server, dn, pw):
    with ber.Conn("127.0.0.1", server.port, timeout=30) as c:
        return ber.simple_bind(c, dn, pw) == 0


def dn(uid):
    return "uid=%s,%s" % (uid, PEOPLE)


def both(pair, who, value):
    slapd, pando = pair
    return exop(slapd, who(slapd), value), exop(pando, who(pando), value)


def user(uid, pw=None):
    return lambda s: (dn(uid), pw or USERS[uid])


def admin(s):
    return (s.admin_dn, s.admin_pw)


def test_empty_identity_means_the_bound_user(pair):
    # PHP's ldap_exop_passwd($c, "", $old, $new), python-ldap passwd_s('', old, new).
    s, p = both(pair, user("alice"), request(identity=b"", old=b"alice-old", new=b"alice-new"))
    assert s == p == (0, None), (s, p)
    assert all(binds(srv, dn("alice"), "alice-new") for srv in pair)
    assert not any(binds(srv, dn("alice"), "alice-old") for srv in pair)


def test_absent_identity_and_no_value(pair):
    s, p = both(pair, user("bob"), request(old=b"bob-old", new=b"bob-new"))
    assert s == p == (0, None), (s, p)
    assert all(binds(srv, dn("bob"), "bob-new") for srv in pair)


def test_identity_as_a_dn(pair):
    s, p = both(pair, user("carol"), request(identity=dn("carol").encode(), old=b"carol-old", new=b"carol-new"))
    assert s == p == (0, None), (s, p)
    assert all(binds(srv, dn("carol"), "carol-new") for srv in pair)


def test_generated_password_when_none_is_given(pair):
    # The administrator, for another user, no old password: a new one is
    # generated and returned as genPasswd.
    for srv in pair:
        code, value = exop(srv, admin(srv), request(identity=dn("dave").encode()))
        assert code == 0 and value, (srv, code, value)
        # PasswdModifyResponseValue ::= SEQUENCE { genPasswd [0] OCTET STRING OPTIONAL }
        _, s, e = ber.read_tlv(value, 0)
        [(tag, generated)] = ber.children(value, s, e)
        assert tag == 0x80 and binds(srv, dn("dave"), generated.decode())


def test_refusals_give_slapd_s_codes(pair):
    cases = {
        "wrong old password": (user("erin"), request(old=b"not-it", new=b"x-new")),
        "anonymous caller": (lambda s: None, request(identity=dn("erin").encode(), new=b"x-new")),
        "another user's password": (user("erin"), request(identity=dn("frank").encode(), new=b"x-new")),
        "unknown user": (admin, request(identity=("uid=nobody," + PEOPLE).encode(), new=b"x-new")),
        "identity not a DN": (admin, request(identity=b"not a dn", new=b"x-new")),
        "malformed value": (user("erin"), b"\x30\x03\x80\x05x"),
        "empty new password": (user("erin"), request(old=b"erin-old", new=b"")),
    }
    differ = {}
    for name, (who, value) in cases.items():
        s, p = both(pair, who, value)
        print("%-26s slapd %3d  Pando %3d" % (name, s[0], p[0]))
        if s[0] != p[0]:
            differ[name] = (s[0], p[0])
    assert not differ, "slapd vs Pando result codes differ: %r" % differ
    # Nothing changed.
    assert all(binds(srv, dn("erin"), "erin-old") and binds(srv, dn("frank"), "frank-old") for srv in pair)


def test_authzid_forms(pair):
    # slapd takes userIdentity as a DN only (invalidAttributeSyntax for
    # anything else); Pando also takes the RFC 4513 authzId forms
    # "dn:<DN>" and "u:<uid>", which RFC 3062 allows ("may or may not be an
    # LDAPDN"). A deliberate difference.
    slapd, pando = pair
    for identity, new in ((b"dn:" + dn("frank").encode(), "frank-2"), (b"u:frank", "frank-3")):
        assert exop(slapd, admin(slapd), request(identity=identity, new=new.encode()))[0] == 21
        assert exop(pando, admin(pando), request(identity=identity, new=new.encode())) == (0, None)
        assert binds(pando, dn("frank"), new)
    assert exop(pando, admin(pando), request(identity=b"u:nobody", new=b"x"))[0] == 32


def have_php_ldap():
    if not shutil.which("php"):
        return False
    r = subprocess.run(["php", "-m"], capture_output=True, text=True, timeout=30)
    return "ldap" in r.stdout.split()


PHP_SELF_SERVICE = """
$c = ldap_connect($argv[1]);
ldap_set_option($c, LDAP_OPT_PROTOCOL_VERSION, 3);
if (!ldap_bind($c, $argv[2], $argv[3])) { fwrite(STDERR, ldap_error($c)); exit(2); }
// What password self-service portals call: no identity, old and new.
if (!ldap_exop_passwd($c, "", $argv[3], $argv[4])) { fwrite(STDERR, ldap_error($c)); exit(1); }
"""


@pytest.mark.skipif(not have_php_ldap(), reason="php with the ldap extension not installed")
def test_php_ldap_exop_passwd(pair):
    for srv in pair:
        r = subprocess.run(["php", "-r", PHP_SELF_SERVICE, srv.url, dn("gina"), "gina-old", "gina-new"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (srv, r.stdout, r.stderr)
        assert binds(srv, dn("gina"), "gina-new") and not binds(srv, dn("gina"), "gina-old")


def test_python_ldap_passwd_s(pair):
    ldap = pytest.importorskip("ldap")
    for srv in pair:
        c = ldap.initialize(srv.url)
        c.simple_bind_s(dn("hank"), "hank-old")
        c.passwd_s("", "hank-old", "hank-new")
        c.unbind_s()
        assert binds(srv, dn("hank"), "hank-new") and not binds(srv, dn("hank"), "hank-old")


def test_ldappasswd_with_an_empty_user(pair):
    for srv in pair:
        r = subprocess.run(["ldappasswd", "-x", "-H", srv.url, "-D", dn("ivan"), "-w", "ivan-old",
                            "-a", "ivan-old", "-s", "ivan-new", ""], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (srv, r.stdout, r.stderr)
        assert binds(srv, dn("ivan"), "ivan-new")
