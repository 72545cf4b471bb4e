"""Translucency: Pando serving dc=example,dc=com from a remote slapd (read
over StartTLS with a service bind), with local attributes and local
entries added here; a remote that is down or answers garbage."""

import socket
import subprocess
import threading
from pathlib import Path

import ldap3
import pytest

from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando, free_port, have, ldif_entry
from test_differential import SLAPD, Slapd
from test_tls import Pki

pytestmark = pytest.mark.skipif(not (Path(SLAPD).exists() and have("ldapsearch")),
                                reason="slapd or ldap-utils not installed")

READER = "cn=reader," + SUFFIX
READER_PW = "reader-secret"
BOB_PW = "bob-remote-secret"


def user(uid, **extra):
    a = {"objectClass": ["inetOrgPerson"], "uid": [uid], "cn": [uid.title()], "sn": [uid],
         "mail": ["%s@example.com" % uid], "description": ["remote"]}
    a.update(extra)
    return ("uid=%s,%s" % (uid, PEOPLE), a)


REMOTE = [
    (SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["remote"]}),
    (READER, {"objectClass": ["person"], "cn": ["reader"], "sn": ["reader"], "userPassword": [READER_PW]}),
    (PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]}),
    user("alice"),
    user("bob", userPassword=[BOB_PW]),
    user("carol"),
]


class TlsSlapd(Slapd):
    """slapd with StartTLS (the certificate `pki` issued for 127.0.0.1)."""

    def __init__(self, base, pki):
        super().__init__(base)
        self.pki = pki

    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        cert, key = self.pki.server
        tls = "TLSCACertificateFile %s\nTLSCertificateFile %s\nTLSCertificateKeyFile %s\n" % (
            self.pki.ca, cert, key)
        text = conf.read_text().replace("sizelimit unlimited\n", "sizelimit unlimited\n" + tls)
        conf.write_text(text)


def translucent_config(uri, base, ca, extra=""):
    """Over StartTLS with the service bind when `ca` is given; otherwise
    anonymous over plain LDAP (a simple bind without TLS is refused)."""
    creds = base / "reader-password"
    creds.write_text(READER_PW + "\n")
    creds.chmod(0o600)
    if ca:
        how = 'bind_dn = "%s"\ncredentials_file = "%s"\nstart_tls = true\ntls_ca_file = "%s"\n' % (
            READER, creds, ca)
    else:
        how = 'bind_method = "none"\n'
    return PUBLIC_READ + """
[[overlay]]
type = "translucent"
suffix = "%s"
uri = "%s"
%slocal_attributes = ["description", "telephoneNumber"]
timeout_secs = 3
%s""" % (SUFFIX, uri, how, extra)


def start_remote(base, entries, cls=TlsSlapd):
    """A CA in base/pki and a started remote slapd of class `cls` (a
    TlsSlapd) in base/remote holding `entries`: (pki, remote)."""
    (base / "pki").mkdir()
    pki = Pki(base / "pki")
    pki.server = pki.issue("server", "/O=Pando Test/CN=localhost", server=True)
    remote = cls(base / "remote", pki)
    ldif = base / "remote.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in entries))
    remote.load(ldif)
    remote.start()
    return pki, remote


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("translucent")
    pki, remote = start_remote(base, REMOTE)
    (base / "pando").mkdir()
    srv = Pando(base / "pando", config=translucent_config(remote.url, base / "pando", pki.ca),
                name="pando-translucent")
    try:
        srv.start()
        yield remote, srv
        srv.stop_and_verify()
    finally:
        remote.stop()


def uids(entries):
    return sorted(v for _, a in entries for k, vs in a.items() if k.lower() == "uid" for v in vs)


def values(entries, dn, attr):
    for d, a in entries:
        if d.lower() == dn.lower():
            return sorted(v for k, vs in a.items() if k.lower() == attr.lower() for v in vs)
    return None


def test_remote_entries_are_read_through(setup):
    _, srv = setup
    rc, es, err = srv.search(PEOPLE, "(objectClass=inetOrgPerson)", "uid", "mail")
    assert rc == 0, err
    assert uids(es) == ["alice", "bob", "carol"], es
    rc, es, err = srv.search(PEOPLE, "(mail=alice@example.com)", "mail", scope="sub", auth=None)
    assert rc == 0 and uids(es) == [] and [d for d, _ in es] == ["uid=alice," + PEOPLE], (rc, es, err)
    # A base search of a remote entry; an entry that exists nowhere.
    rc, es, err = srv.search("uid=bob," + PEOPLE, "(objectClass=*)", "cn", scope="base")
    assert rc == 0 and values(es, "uid=bob," + PEOPLE, "cn") == ["Bob"], (rc, es, err)
    rc, es, err = srv.search("uid=nobody," + PEOPLE, "(objectClass=*)", scope="base")
    assert rc == 32, (rc, es, err)


def test_local_attributes_override_the_remote_and_filters_combine_both(setup):
    remote, srv = setup
    carol = "uid=carol," + PEOPLE
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: description\n"
                          "description: kept here\n-\nadd: telephoneNumber\ntelephoneNumber: +1 555 0100\n"
                          % carol)
    assert rc == 0, err
    rc, es, err = srv.search(PEOPLE, "(description=kept here)", "description", "mail", "telephoneNumber")
    assert rc == 0, err
    assert [d.lower() for d, _ in es] == [carol.lower()], es
    assert values(es, carol, "description") == ["kept here"]
    assert values(es, carol, "mail") == ["carol@example.com"]
    assert values(es, carol, "telephoneNumber") == ["+1 555 0100"]
    # A filter on a local and a remote attribute at once.
    rc, es, _ = srv.search(PEOPLE, "(&(description=kept*)(mail=carol@*))", "1.1")
    assert [d.lower() for d, _ in es] == [carol.lower()], es
    rc, es, _ = srv.search(PEOPLE, "(&(description=kept*)(mail=alice@*))", "1.1")
    assert es == [], es
    # The remote value is hidden for carol, still there for the others.
    rc, es, _ = srv.search(PEOPLE, "(description=remote)", "1.1")
    assert sorted(d.lower() for d, _ in es) == sorted(
        ("uid=%s,%s" % (u, PEOPLE)).lower() for u in ("alice", "bob")), es
    rc, es, _ = srv.search(PEOPLE, "(!(description=remote))", "1.1", scope="one")
    assert [d.lower() for d, _ in es] == [carol.lower()], es
    # The remote server is not changed.
    rc, out, err = remote.ldap("ldapsearch", "-LLL", "-b", carol, "-s", "base", "description")
    assert rc == 0 and "description: remote" in out and "kept here" not in out, out
    # Compare sees the merged entry.
    rc, out, err = srv.ldap("ldapcompare", carol, "description:kept here")
    assert rc == 6, (rc, out, err)
    rc, out, err = srv.ldap("ldapcompare", carol, "mail:carol@example.com")
    assert rc == 6, (rc, out, err)


def test_writes_to_what_the_remote_holds_are_refused(setup):
    _, srv = setup
    alice = "uid=alice," + PEOPLE
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: mail\nmail: x@y\n" % alice)
    assert rc == 53 and "mail" in err and "remote server" in err and "local_attributes" in err, (rc, err)
    rc, _, err = srv.ldap("ldapdelete", alice)
    assert rc == 53 and "remote server" in err, (rc, err)
    rc, _, err = srv.ldap("ldapmodrdn", alice, "uid=alicia")
    assert rc == 53, (rc, err)
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: uid\nuid: a2\n" % alice)
    assert rc in (53, 67), (rc, err)
    # An add of a name the remote holds, or a rename to one: the local
    # entry would hide the remote's (and its password would log in as it).
    rc, _, err = srv.ldap("ldapadd", input=ldif_entry(*user("bob")))
    assert rc == 68 and "remote server" in err, (rc, err)
    dn, attrs = user("mallory", userPassword=["mallory-secret"])
    rc, _, err = srv.ldap("ldapadd", input=ldif_entry(dn, attrs))
    assert rc == 0, err
    try:
        rc, out, err = srv.ldap("ldapmodrdn", dn, "uid=bob")
        assert rc == 68 and "remote server" in out + err, (rc, out, err)
    finally:
        srv.ldap("ldapdelete", dn)


def test_local_entries_live_beside_the_remote_ones(setup):
    _, srv = setup
    dn, attrs = user("dave", description=["local only"])
    rc, _, err = srv.ldap("ldapadd", input=ldif_entry(dn, attrs))
    assert rc == 0, err
    rc, es, err = srv.search(PEOPLE, "(objectClass=inetOrgPerson)", "uid", "description")
    assert rc == 0 and uids(es) == ["alice", "bob", "carol", "dave"], (rc, es, err)
    assert values(es, dn, "description") == ["local only"]
    # ou=People, made here as the parent of dave, still shows the remote entry.
    rc, es, err = srv.search(PEOPLE, "(objectClass=*)", "objectClass", scope="base")
    assert rc == 0 and values(es, PEOPLE, "objectClass") == ["organizationalUnit"], es
    # Computed attributes of a local entry, in filters and results.
    rc, es, err = srv.search(PEOPLE, "(entryDN=%s)" % dn, "entryDN", "hasSubordinates")
    assert rc == 0 and values(es, dn, "hasSubordinates") == ["FALSE"], (rc, es, err)
    # A base that exists nowhere is noSuchObject whatever the scope.
    rc, es, err = srv.search("ou=Nowhere," + SUFFIX, "(objectClass=*)", "1.1", scope="one")
    assert rc == 32, (rc, es, err)
    # A local entry is changed and deleted as any other.
    rc, _, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: mail\nmail: d@x\n" % dn)
    assert rc == 0, err
    rc, _, err = srv.ldap("ldapdelete", dn)
    assert rc == 0, err
    rc, es, _ = srv.search(PEOPLE, "(uid=dave)", "1.1")
    assert es == [], es


def test_binds_are_checked_by_the_remote_unless_the_password_is_local(setup):
    _, srv = setup
    bob = "uid=bob," + PEOPLE
    r = subprocess.run(["ldapwhoami", "-x", "-H", srv.url, "-D", bob, "-w", BOB_PW],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and bob.lower() in r.stdout.lower(), (r.stdout, r.stderr)
    r = subprocess.run(["ldapwhoami", "-x", "-H", srv.url, "-D", bob, "-w", "wrong"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 49, (r.stdout, r.stderr)
    # The bound user reads through the overlay as itself.
    c = ldap3.Connection(ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE), user=bob,
                         password=BOB_PW, raise_exceptions=False)
    assert c.bind(), c.result
    c.search(PEOPLE, "(uid=alice)", attributes=["mail"])
    assert [e.entry_dn.lower() for e in c.entries] == [("uid=alice," + PEOPLE).lower()], c.result
    c.unbind()


def test_persistent_searches_on_the_suffix_are_refused(setup):
    _, srv = setup
    rc, out, err = srv.ldap("ldapsearch", "-b", PEOPLE, "-E", "!sync=ro", "(uid=alice)")
    assert rc == 53 and "translucent" in out + err, (rc, out, err)


# ------------------------------------------------------------- a failing remote


def garbage_server():
    """A TCP server that answers anything with bytes that are not LDAP."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(60)

    def serve():
        for _ in range(20):
            try:
                c, _ = s.accept()
            except OSError:
                return
            try:
                c.recv(4096)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff" * 64)
            except OSError:
                pass
            finally:
                c.close()
    threading.Thread(target=serve, daemon=True).start()
    return s


@pytest.mark.parametrize("kind", ["down", "garbage"])
def test_a_failing_remote_is_named_and_local_entries_are_still_served(tmp_path, kind):
    listener = None
    if kind == "down":
        uri = "ldap://127.0.0.1:%d" % free_port()
    else:
        listener = garbage_server()
        uri = "ldap://127.0.0.1:%d" % listener.getsockname()[1]
    srv = Pando(tmp_path, config=translucent_config(uri, tmp_path, None), name="pando-translucent-" + kind)
    srv.start()
    try:
        # The suffix entry is local: a base search needs no remote.
        rc, es, err = srv.search(SUFFIX, "(objectClass=*)", "1.1", scope="base")
        assert rc == 0 and len(es) == 1, (rc, es, err)
        rc, es, err = srv.search(SUFFIX, "(objectClass=*)", "1.1")
        assert rc == 52, (rc, es, err)
        assert "remote server" in err and ("connect" in err or "malformed" in err or "closed" in err), err
        assert [d.lower() for d, _ in es] == [SUFFIX], es
        # Others are told where to look, not the details.
        rc, es, err = srv.search(SUFFIX, "(objectClass=*)", "1.1", auth=None)
        assert rc == 52 and "log says why" in err and "127.0.0.1" not in err, (rc, err)
        rc, _, err = srv.ldap("ldapmodify", input="dn: uid=x,%s\nchangetype: modify\nreplace: description\n"
                              "description: y\n" % PEOPLE)
        assert rc == 52 and "remote server" in err, (rc, err)
        r = subprocess.run(["ldapwhoami", "-x", "-H", srv.url, "-D", "uid=bob," + PEOPLE, "-w", "pw"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 52, (r.stdout, r.stderr)
        assert "remote server" in srv.logs(tail=20000)
    finally:
        srv.stop_and_verify()
        if listener:
            listener.close()


def test_bad_translucent_settings_name_the_key(tmp_path):
    bin_ = str(Path(__import__("conftest").PANDO_BIN))
    cfg = tmp_path / "bad.toml"
    cases = [
        ('uri = "http://x"', "overlay[0].uri"),
        ('uri = "ldap://127.0.0.1:1"\nlocal_attributes = ["noSuchAttr"]', "overlay[0].local_attributes"),
        ('uri = "ldap://127.0.0.1:1"\nremote_writes = "sometimes"', "overlay[0].remote_writes"),
        ('uri = "ldap://127.0.0.1:1"\nbind_method = "none"\nsuffix = "dc=other,dc=org"', "overlay[0].suffix"),
        ('uri = "ldaps://127.0.0.1:1"\nbind_dn = "cn=x"', "overlay[0].credentials_file"),
        ('uri = "ldap://127.0.0.1:1"\nbind_dn = "cn=x"\ncredentials_file = "/etc/hostname"',
         "overlay[0].bind_method"),
    ]
    for settings, key in cases:
        text = 'data_dir = "%s"\n[[overlay]]\ntype = "translucent"\n%s\n' % (tmp_path / "d", settings)
        if "suffix =" not in settings:
            text += 'suffix = "%s"\n' % SUFFIX
        if "bind_method" not in settings and "bind_dn" not in settings:
            text += 'bind_method = "none"\n'
        cfg.write_text(text)
        r = subprocess.run([bin_, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and key in r.stderr, (settings, r.stderr)


def test_the_overlay_is_added_and_removed_over_cn_config(setup, tmp_path):
    remote, _ = setup
    db = "olcDatabase={1}mdb,cn=config"
    srv = Pando(tmp_path, config=PUBLIC_READ, name="pando-translucent-config").start()

    def ldapi(tool, *args, input=None):
        r = subprocess.run([tool, "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url, *args],
                           input=input, capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout, r.stderr

    try:
        rc, es, _ = srv.search(PEOPLE, "(uid=alice)", "1.1")
        assert rc == 32, (rc, es)
        creds = tmp_path / "reader-password"
        creds.write_text(READER_PW + "\n")
        entry = ("dn: olcOverlay=translucent,%s\nobjectClass: olcOverlayConfig\n"
                 "objectClass: pandoTranslucentConfig\nolcOverlay: translucent\n"
                 "pandoTranslucentSuffix: %s\npandoTranslucentURI: %s\npandoTranslucentBindDN: %s\n"
                 "pandoTranslucentCredentialsFile: %s\npandoTranslucentStartTLS: TRUE\n"
                 "pandoTranslucentCACertFile: %s\n" % (db, SUFFIX, remote.url, READER, creds, remote.pki.ca))
        # A bad value is refused, naming the setting.
        rc, _, err = ldapi("ldapadd", input=entry + "pandoTranslucentLocalAttribute: noSuchAttr\n")
        assert rc == 19 and "local_attributes" in err, (rc, err)
        rc, _, err = ldapi("ldapadd", input=entry + "pandoTranslucentLocalAttribute: description\n")
        assert rc == 0, err
        rc, es, err = srv.search(PEOPLE, "(uid=alice)", "mail")
        assert rc == 0 and values(es, "uid=alice," + PEOPLE, "mail") == ["alice@example.com"], (rc, es, err)
        rc, _, err = ldapi("ldapdelete", "olcOverlay={0}translucent," + db)
        assert rc == 0, err
        rc, es, _ = srv.search(PEOPLE, "(uid=alice)", "1.1")
        assert rc == 32, (rc, es)
    finally:
        srv.stop_and_verify()


def test_a_remote_entrys_modify_is_the_clients_own_write(tmp_path):
    """A change to a remote entry's local attributes goes through the
    write pipeline as the client, with its controls, judged on the entry
    as the client sees it; the audit log has the client's own change."""
    sub = "ou=Sub," + PEOPLE
    sub2 = "ou=Sub2," + sub
    deep = ("uid=deep," + sub2, {"objectClass": ["inetOrgPerson"], "uid": ["deep"], "cn": ["Deep"],
                                 "sn": ["deep"], "description": ["remote"]})
    pki, remote = start_remote(tmp_path, REMOTE + [
        (sub, {"objectClass": ["organizationalUnit"], "ou": ["Sub"]}),
        (sub2, {"objectClass": ["organizationalUnit"], "ou": ["Sub2"]}), deep])
    (tmp_path / "pando").mkdir()
    audit = tmp_path / "pando" / "audit.ldif"
    cfg = translucent_config(remote.url, tmp_path / "pando", pki.ca) + '\n[logs]\naudit = "%s"\n' % audit
    srv = Pando(tmp_path / "pando", config=cfg, name="pando-translucent-pipeline")
    alice = "uid=alice," + PEOPLE
    change = ("dn: %s\nchangetype: modify\nreplace: description\ndescription: changed here\n-\n"
              "add: telephoneNumber\ntelephoneNumber: +1 555 0199\n" % alice)

    def shown(attr):
        rc, es, err = srv.search(alice, "(objectClass=*)", attr, scope="base")
        assert rc == 0, err
        return values(es, alice, attr)

    try:
        srv.start()
        # No-Op: checked whole, answered noOperation, nothing kept.
        rc, out, err = srv.ldap("ldapmodify", "-e", "noop", input=change)
        assert "16654" in out + err or "No Operation" in out + err, (rc, out, err)
        assert shown("description") == ["remote"] and shown("telephoneNumber") == []
        # The assertion is tested on the entry as the client sees it: mail
        # is the remote's.
        rc, out, err = srv.ldap("ldapmodify", "-e", "assert=(mail=nobody@example.com)", input=change)
        assert rc == 122, (rc, out, err)
        # A user without write access is refused; nothing is kept.
        rc, out, err = srv.ldap("ldapmodify", auth=("uid=bob," + PEOPLE, BOB_PW), input=change)
        assert rc == 50, (rc, out, err)
        assert shown("description") == ["remote"]
        assert not audit.exists() or "changed here" not in audit.read_text()
        rc, out, err = srv.ldap("ldapmodify", "-e", "assert=(mail=alice@example.com)", input=change)
        assert rc == 0, (rc, out, err)
        assert shown("description") == ["changed here"]
        assert shown("telephoneNumber") == ["+1 555 0199"]
        assert shown("mail") == ["alice@example.com"]
        # The audit log holds one record: the client's modify as sent (an
        # add stays an add), by the client; the parts made are the store's.
        text = audit.read_text()
        records = [r for r in text.split("\n\n") if r.strip()]
        # The first start's own suffix entry comes first.
        assert "dn: %s\nchangetype: add" % SUFFIX in records[0], text
        records = records[1:]
        assert len(records) == 1, text
        head, dn, kind = records[0].splitlines()[:3]
        assert ADMIN_DN in head and dn == "dn: " + alice and kind == "changetype: modify", text
        assert "add: telephoneNumber" in text and "replace: description" in text, text
        # Three levels below what the store holds (ou=People's part, which
        # alice's write made): the parts of ou=Sub, ou=Sub2 and the entry
        # are made in the one write; the entry reads merged, its parents
        # still the remote's.
        rc, out, err = srv.ldap("ldapmodify", input=(
            "dn: %s\nchangetype: modify\nreplace: description\ndescription: deep here\n" % deep[0]))
        assert rc == 0, (rc, out, err)
        rc, es, err = srv.search(deep[0], "(objectClass=*)", "description", "cn", scope="base")
        assert rc == 0 and values(es, deep[0], "description") == ["deep here"], (rc, es, err)
        assert values(es, deep[0], "cn") == ["Deep"], es
        for parent in (sub, sub2):
            rc, es, err = srv.search(parent, "(objectClass=*)", "objectClass", scope="base")
            assert rc == 0 and values(es, parent, "objectClass") == ["organizationalUnit"], (rc, es, err)
        rc, es, err = srv.search(sub, "(objectClass=*)", "1.1", scope="sub")
        assert sorted(d.lower() for d, _ in es) == sorted(d.lower() for d in (sub, sub2, deep[0])), es
    finally:
        try:
            srv.stop_and_verify()
        finally:
            remote.stop()
