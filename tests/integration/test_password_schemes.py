"""Legacy and foreign password hashes (issue 43, item 1): every scheme slapd
and its shipped modules verify, with values made at test time by slapd's
own `slappasswd` and by `mkpasswd` (libxcrypt's crypt methods), stored in
both servers; a bind with the right password succeeds on Pando exactly
where it succeeds on slapd, and a wrong one fails on both.

phpLDAPadmin writes `{MD5}` by default; before this, such a user could not
bind to Pando (49) while slapd accepted it.
"""

import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SUFFIX, Pando, ldif_entry
from test_differential import MODULE_DIR, Slapd

SLAPPASSWD = "/usr/sbin/slappasswd"
PW = "pässwörd 1"
PEOPLE = "ou=People," + SUFFIX

pytestmark = pytest.mark.skipif(not (Path(SLAPPASSWD).exists() and shutil.which("mkpasswd")),
                                reason="slappasswd (slapd) or mkpasswd (whois) not installed")


def slappasswd(scheme, *extra):
    # slappasswd keeps only the last module-load option: one module a call.
    module = "argon2" if scheme == "{ARGON2}" else "pw-sha2"
    r = subprocess.run([SLAPPASSWD, "-o", "module-path=" + MODULE_DIR, "-o", "module-load=" + module,
                        "-h", scheme, "-s", PW, *extra],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def mkpasswd(method):
    r = subprocess.run(["mkpasswd", "-m", method, PW], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return "{CRYPT}" + r.stdout.strip()


def ab64(b):
    return base64.b64encode(b).decode().replace("+", ".").rstrip("=")


def pbkdf2(name, digest):
    """As OpenLDAP's contrib pw-pbkdf2 writes them (not packaged by Debian)."""
    salt = os.urandom(16)
    dk = hashlib.pbkdf2_hmac(digest, PW.encode(), salt, 10000)
    return "{%s}10000$%s$%s" % (name, ab64(salt), ab64(dk))


def values():
    """(label, stored value) for every scheme."""
    out = [(s, slappasswd("{%s}" % s)) for s in
           ("MD5", "SMD5", "SHA", "SSHA", "SHA256", "SSHA256", "SHA384", "SSHA384", "SHA512", "SSHA512",
            "ARGON2")]
    out.append(("CLEARTEXT", "{CLEARTEXT}" + PW))
    out.append(("no scheme", PW))
    for fmt in ("$1$%.8s", "$5$%.16s", "$6$%.16s", "$y$j9T$%.16s"):
        out.append(("slappasswd CRYPT " + fmt[:4], slappasswd("{CRYPT}", "-c", fmt)))
    methods = subprocess.run(["mkpasswd", "-m", "help"], capture_output=True, text=True).stdout
    for m in ("md5crypt", "sha256crypt", "sha512crypt", "yescrypt", "gost-yescrypt", "scrypt", "bcrypt",
              "bcrypt-a", "sunmd5", "bsdicrypt", "descrypt", "nt"):
        if m in methods.split():
            out.append(("mkpasswd " + m, mkpasswd(m)))
    for name, digest in (("PBKDF2", "sha1"), ("PBKDF2-SHA1", "sha1"), ("PBKDF2-SHA256", "sha256"),
                         ("PBKDF2-SHA512", "sha512")):
        out.append((name, pbkdf2(name, digest)))
    return out


class SlapdWithModules(Slapd):
    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        conf.write_text(conf.read_text().replace(
            "moduleload back_mdb\n", "moduleload back_mdb\nmoduleload pw-sha2\nmoduleload argon2\n"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("schemes")
    users = [("uid=s%02d,%s" % (i, PEOPLE), label, v) for i, (label, v) in enumerate(values())]
    ents = [(SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["example"]}),
            (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]})]
    ents += [(dn, {"objectClass": ["inetOrgPerson"], "uid": [dn[4:7]], "cn": [label], "sn": ["s"],
                   "userPassword": [v]}) for dn, label, v in users]
    ldif = base / "all.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents))
    slapd = SlapdWithModules(base / "slapd")
    slapd.load(ldif)
    slapd.start()
    pando_ldif = base / "pando.ldif"
    pando_ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents[1:]))
    pando = Pando(base / "pando", name="schemes",
                  # Every user gets one wrong password: no throttling delays.
                  config="[limits]\nfailed_bind_free = 1000\n").start()
    try:
        rc, _, err = pando.ldap("ldapadd", "-f", str(pando_ldif))
        assert rc == 0, err
        yield slapd, pando, users
    finally:
        slapd.stop()
    pando.stop_and_verify()


def bind_rc(url, dn, pw):
    r = subprocess.run(["ldapwhoami", "-x", "-H", url, "-D", dn, "-w", pw], capture_output=True,
                       text=True, timeout=30)
    return r.returncode


def test_every_scheme_binds_on_pando_where_it_binds_on_slapd(servers):
    slapd, pando, users = servers
    assert len(users) >= 25
    differ = []
    for dn, label, value in users:
        got = {name: (bind_rc(s.url, dn, PW), bind_rc(s.url, dn, "another password"))
               for name, s in (("slapd", slapd), ("pando", pando))}
        # Debian does not package slapd's pw-pbkdf2 module, and its slapd
        # does not verify a {CLEARTEXT} prefix: Pando alone there (Pando
        # hashes what follows the prefix when it is written).
        slapd_knows = not label.startswith(("PBKDF2", "CLEARTEXT"))
        if got["pando"] != (0, 49) or (slapd_knows and got["slapd"] != got["pando"]):
            differ.append("%s (%s): %r" % (label, value, got))
    assert not differ, "\n".join(differ)


def test_values_above_a_cost_cap_never_verify(servers):
    """A stored value sets its own cost: a yescrypt value asking for 1 GiB
    is refused without being computed (slapd would compute it)."""
    _, pando, _ = servers
    dn = "uid=costly," + PEOPLE
    big = "{CRYPT}" + subprocess.run(["mkpasswd", "-m", "yescrypt", "-R", "11", PW], capture_output=True,
                                     text=True, timeout=60).stdout.strip()
    rc, _, err = pando.ldap("ldapadd", input=ldif_entry(dn, {
        "objectClass": ["inetOrgPerson"], "uid": ["costly"], "cn": ["c"], "sn": ["c"], "userPassword": [big]}))
    assert rc == 0, err
    assert bind_rc(pando.url, dn, PW) == 49
    assert pando.alive()


def stored_password(pando, dn):
    rc, ents, err = pando.search(dn, "userPassword", scope="base")
    assert rc == 0, err
    return ents[0][1]["userPassword"]


def monitor_upgrades(pando):
    rc, ents, err = pando.search("cn=Passwords,cn=Monitor", "pandoPasswordUpgrades", scope="base")
    assert rc == 0, err
    return int(ents[0][1]["pandoPasswordUpgrades"][0])


def test_a_bind_upgrades_a_legacy_hash_to_the_configured_scheme(servers):
    """Upgrade on bind (issue 43): the {MD5} value phpLDAPadmin wrote is
    replaced by the configured scheme's ({ARGON2} by default) once its
    owner binds; the password keeps working; counted in cn=Monitor; the
    weaker value of another user stays while upgrade_on_bind is off."""
    _, pando, _ = servers
    legacy = slappasswd("{MD5}")
    dn, other = "uid=legacy," + PEOPLE, "uid=kept," + PEOPLE
    for d in (dn, other):
        rc, _, err = pando.ldap("ldapadd", input=ldif_entry(d, {
            "objectClass": ["inetOrgPerson"], "uid": [d[4:d.index(",")]], "cn": ["l"], "sn": ["l"],
            "userPassword": [legacy]}))
        assert rc == 0, err
    before = monitor_upgrades(pando)
    assert stored_password(pando, dn) == [legacy]
    assert bind_rc(pando.url, dn, "another password") == 49
    assert stored_password(pando, dn) == [legacy], "a wrong password upgraded the value"
    assert bind_rc(pando.url, dn, PW) == 0
    now = stored_password(pando, dn)
    assert len(now) == 1 and now[0].startswith("{ARGON2}$argon2id$"), now
    assert bind_rc(pando.url, dn, PW) == 0
    assert bind_rc(pando.url, dn, "another password") == 49
    assert monitor_upgrades(pando) == before + 1
    # Off, over cn=config: nothing is rewritten.
    off = "dn: cn=config\nchangetype: modify\nreplace: pandoPasswordsUpgradeOnBind\npandoPasswordsUpgradeOnBind: FALSE\n"
    r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", pando.ldapi_url], input=off,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    try:
        assert bind_rc(pando.url, other, PW) == 0
        assert stored_password(pando, other) == [legacy]
    finally:
        r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", pando.ldapi_url],
                           input=off.replace("FALSE", "TRUE"), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr


def test_import_reports_schemes_and_what_cannot_be_verified(tmp_path):
    """`pando import` names how many values each scheme holds, warns about
    those no bind can verify, and counts the legacy ones."""
    from conftest import PANDO_BIN
    ents = [(SUFFIX, {"objectClass": ["domain"], "dc": ["example"]})]
    vals = [slappasswd("{MD5}"), slappasswd("{SSHA}"), "{KERBEROS}bob@EXAMPLE.COM", mkpasswd("md5crypt"),
            "{CRYPT}" + subprocess.run(["mkpasswd", "-m", "yescrypt", "-R", "11", PW], capture_output=True,
                                       text=True).stdout.strip()]
    ents += [("uid=u%d,%s" % (i, SUFFIX), {"objectClass": ["inetOrgPerson"], "uid": ["u%d" % i], "cn": ["u"],
                                            "sn": ["u"], "userPassword": [v]}) for i, v in enumerate(vals)]
    ldif = tmp_path / "in.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents))
    r = subprocess.run([PANDO_BIN, "import", "--data-dir", str(tmp_path / "d"), "-f", str(ldif)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "userPassword values by scheme: {CRYPT} md5-crypt 1, {CRYPT} yescrypt 1, {KERBEROS} 1, {MD5} 1, {SSHA} 1" \
        in r.stderr, r.stderr
    assert "1 userPassword value(s) in {KERBEROS} cannot be verified" in r.stderr
    assert "1 userPassword value(s) in {CRYPT} yescrypt cannot be verified" in r.stderr
    assert "note: 3 userPassword value(s) in weak or legacy schemes" in r.stderr
