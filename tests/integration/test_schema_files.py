"""Add-on schema files (`schema_files`), loaded at start in the two forms
they ship in: OpenLDAP `.schema` text and `cn=schema` LDIF. The files are
the real ones: sudo's (from Debian's sudo-ldap package, unpacked, not
installed) and those Debian's slapd package puts in /etc/ldap/schema."""

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PANDO_BIN, SUFFIX, Pando, ldif_entry

DEBIAN_SCHEMA = Path("/etc/ldap/schema")
pytestmark = pytest.mark.skipif(not (DEBIAN_SCHEMA / "misc.schema").exists() or not shutil.which("ldapadd"),
                                reason="slapd's schema files or ldap-utils not installed")


@pytest.fixture(scope="module")
def sudo_schema(tmp_path_factory):
    """sudo's schema in both forms, from the sudo-ldap package (downloaded
    and unpacked only: it would replace sudo if installed)."""
    d = tmp_path_factory.mktemp("sudo-ldap")
    r = subprocess.run(["apt-get", "download", "sudo-ldap"], cwd=d, capture_output=True, text=True, timeout=300)
    debs = glob.glob(str(d / "sudo-ldap_*.deb"))
    if r.returncode != 0 or not debs:
        pytest.skip("cannot download sudo-ldap: %s" % r.stderr.strip()[-300:])
    subprocess.run(["dpkg", "-x", debs[0], str(d / "x")], check=True, timeout=120)
    doc = d / "x/usr/share/doc/sudo-ldap"
    return doc / "schema.OpenLDAP", doc / "schema.olcSudo"


def config(files, extra=""):
    return "schema_files = [%s]\n%s\n[indexes]\nsudoUser = [\"eq\"]\nobjectClass = [\"eq\"]\n" % (
        ", ".join('"%s"' % f for f in files), extra)


def test_sudo_rules_and_misc_schema(tmp_path, sudo_schema):
    text, _ = sudo_schema
    s = Pando(tmp_path, demo=True, config=config([text, DEBIAN_SCHEMA / "misc.schema",
                                                  DEBIAN_SCHEMA / "openldap.ldif"])).start()
    try:
        sudoers = "ou=SUDOers," + SUFFIX
        entries = [
            (sudoers, {"objectClass": ["organizationalUnit"], "ou": ["SUDOers"]}),
            ("cn=defaults," + sudoers, {"objectClass": ["sudoRole"], "cn": ["defaults"],
                                        "sudoOption": ["!authenticate"]}),
            ("cn=alice-apt," + sudoers, {"objectClass": ["sudoRole"], "cn": ["alice-apt"],
                                         "sudoUser": ["alice"], "sudoHost": ["ALL"],
                                         "sudoCommand": ["/usr/bin/apt"], "sudoOrder": ["10"]}),
        ]
        f = tmp_path / "sudo.ldif"
        f.write_text("\n".join(ldif_entry(dn, a) for dn, a in entries))
        rc, _, err = s.ldap("ldapadd", "-f", str(f))
        assert rc == 0, err
        # What sudo asks: the rules for a user.
        rc, found, err = s.search(sudoers, "(|(sudoUser=alice)(sudoUser=ALL))", "sudoCommand", "sudoHost")
        assert rc == 0, err
        assert [(dn.lower(), a["sudoCommand"]) for dn, a in found] == [("cn=alice-apt," + sudoers.lower(),
                                                                      ["/usr/bin/apt"])]
        # misc.schema: a mail routing attribute on a demo user.
        rc, _, err = s.ldap("ldapmodify", input="dn: uid=alice,ou=People,%s\nchangetype: modify\n"
                            "add: objectClass\nobjectClass: inetLocalMailRecipient\n-\n"
                            "add: mailLocalAddress\nmailLocalAddress: alice@example.net\n" % SUFFIX)
        assert rc == 0, err
        rc, found, err = s.search(SUFFIX, "(mailLocalAddress=alice@example.net)", "uid")
        assert rc == 0 and [a["uid"] for _, a in found] == [["alice"]], (found, err)
        # The subschema publishes what was loaded.
        rc, sub, err = s.search("cn=Subschema", "(objectClass=*)", "objectClasses", scope="base")
        ocs = " ".join(sub[0][1]["objectClasses"])
        assert "'sudoRole'" in ocs and "'inetLocalMailRecipient'" in ocs and "'OpenLDAPperson'" in ocs
    finally:
        s.stop_and_verify()


def test_debian_s_schema_files_load_together_as_slapd_takes_them(tmp_path):
    """Every file of Debian's /etc/ldap/schema that loads here, at once;
    dsee.schema spells one keyword `attributeype`, which slapd takes
    (it matches the directive by its `attribute` prefix). pmi needs named
    substitute syntaxes and a matching rule Pando does not have yet."""
    names = ["collective", "corba", "dsee", "duaconf", "dyngroup", "java", "misc", "msuser", "namedobject",
             "openldap"]
    files = [DEBIAN_SCHEMA / ("%s.schema" % n) for n in names]
    files = [f for f in files if f.exists()]
    cfg = "schema_files = [%s]\n" % ", ".join('"%s"' % f for f in files)
    s = Pando(tmp_path, demo=False, config=cfg).start()
    try:
        rc, sub, err = s.search("cn=Subschema", "(objectClass=*)", "objectClasses", "attributeTypes",
                                scope="base")
        assert rc == 0, err
        text = " ".join(sub[0][1]["objectClasses"] + sub[0][1]["attributeTypes"])
        for name in ["targetUniqueId", "javaObject", "DUAConfigProfile", "corbaObject", "namedObject",
                     "c-PostalCode", "OpenLDAPperson", "dgAuthz", "groupOfURLs"]:
            assert "NAME '%s'" % name in text, name
    finally:
        s.stop_and_verify()


def test_the_ldif_form_loads_the_same(tmp_path, sudo_schema):
    _, olc = sudo_schema
    s = Pando(tmp_path, demo=False, config=config([olc])).start()
    try:
        rc, _, err = s.ldap("ldapadd", input=ldif_entry("cn=r1," + SUFFIX, {
            "objectClass": ["sudoRole"], "cn": ["r1"], "sudoUser": ["%admins"]}))
        assert rc == 0, err
        rc, found, err = s.search(SUFFIX, "(sudoUser=%admins)", "cn")
        assert rc == 0 and len(found) == 1, (found, err)
    finally:
        s.stop_and_verify()


@pytest.mark.parametrize("text, where, what", [
    ("attributetype ( 1.2.3.4.5 NAME 'x1' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n\n"
     "objectclass ( 1.2.3.4.6 NAME 'x2' SUP noSuchClass AUXILIARY )\n", "line 3", "noSuchClass"),
    ("attributetype ( 2.5.4.3 NAME 'sameOidAsCn' SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n",
     "line 1", "2.5.4.3"),
    ("attributetype ( 1.2.3.4.7 NAME 'x3' SYNTAX directoryString )\n", "line 1", "directoryString"),
])
def test_a_bad_file_stops_the_start_naming_file_and_line(tmp_path, text, where, what):
    bad = tmp_path / "bad.schema"
    bad.write_text(text)
    cfg = tmp_path / "pando.toml"
    cfg.write_text('schema_files = ["%s"]\ndata_dir = "%s"\nlisten = ["ldap://127.0.0.1:1"]\n'
                   % (bad, tmp_path / "data"))
    r = subprocess.run([PANDO_BIN, "serve", "-c", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "schema file %s, %s" % (bad, where) in r.stderr and what in r.stderr, r.stderr


def test_rfc2307bis_groups_are_group_of_names_with_posix_group_added(tmp_path):
    """`posix_schema = "rfc2307bis"`: posixGroup is auxiliary, so one group
    entry names its members by DN (groupOfNames) and carries a gidNumber, as
    SSSD's and nslcd's rfc2307bis modes expect; the demo's POSIX groups are
    loaded that way. The default (RFC 2307) refuses that combination."""
    bis = Pando(tmp_path / "bis", demo=True, config='posix_schema = "rfc2307bis"\n').start()
    plain = Pando(tmp_path / "plain", demo=False).start()
    group = ("cn=ops,ou=Groups," + SUFFIX,
             {"objectClass": ["groupOfNames", "posixGroup"], "cn": ["ops"], "gidNumber": ["5001"],
              "member": ["uid=alice,ou=People," + SUFFIX]})
    try:
        rc, sub, err = bis.search("cn=Subschema", "(objectClass=*)", "objectClasses", scope="base")
        assert rc == 0, err
        posix_group = [d for d in sub[0][1]["objectClasses"] if "NAME 'posixGroup'" in d]
        assert len(posix_group) == 1 and "AUXILIARY" in posix_group[0], posix_group
        assert any("NAME 'automountMap'" in d for d in sub[0][1]["objectClasses"])

        rc, _, err = bis.ldap("ldapadd", input=ldif_entry(*group))
        assert rc == 0, err
        rc, found, err = bis.search("ou=Groups," + SUFFIX,
                                    "(&(objectClass=posixGroup)(member=uid=alice,ou=People,%s))" % SUFFIX,
                                    "cn", "gidNumber")
        assert rc == 0, err
        assert sorted(a["cn"][0] for _, a in found) == ["engineering-posix", "ops", "staff-posix"], found
        # posixGroup alone has no structural class any more.
        rc, _, err = bis.ldap("ldapadd", input=ldif_entry(
            "cn=lonely,ou=Groups," + SUFFIX, {"objectClass": ["posixGroup"], "cn": ["lonely"], "gidNumber": ["7"]}))
        assert rc == 65, (rc, err)

        rc, _, err = plain.ldap("ldapadd", input=ldif_entry(
            "ou=Groups," + SUFFIX, {"objectClass": ["organizationalUnit"], "ou": ["Groups"]}))
        assert rc == 0, err
        rc, _, err = plain.ldap("ldapadd", input=ldif_entry(*group))
        assert rc == 65, "RFC 2307's posixGroup is structural; groupOfNames beside it: rc=%d %s" % (rc, err)
    finally:
        bis.stop_and_verify()
        plain.stop_and_verify()
