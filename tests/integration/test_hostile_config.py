"""cn=config against hostile or careless clients (issue 37, items 4 and 7):
configuration writes honour the write controls exactly as data writes do
(No-Op, assertion, pre-/post-read, permissive modify), and a consumer's
password never shows in a configuration read, an export or the audit log,
nor crosses a network in clear."""

import re
import subprocess
import time

import ldap
import pytest
from ldap.controls import LDAPControl
from ldap.controls.libldap import AssertionControl
from ldap.controls.readentry import PostReadControl, PreReadControl

from conftest import PANDO_BIN, PUBLIC_READ, SUFFIX, Pando, parse_ldif

PEOPLE = "ou=People," + SUFFIX
DB = "olcDatabase={1}mdb,cn=config"
NO_OP = "1.3.6.1.4.1.4203.1.10.2"
NO_OP_DRAFT = "1.3.6.1.4.1.4203.666.5.2"
PERMISSIVE_MODIFY = "1.2.840.113556.1.4.1413"
SCHEMA_DOC = ("dn: cn=h37,cn=schema,cn=config\nobjectClass: olcSchemaConfig\ncn: h37\n"
              "olcAttributeTypes: ( 1.3.6.1.4.1.99999.37.1 NAME 'h37Colour' EQUALITY caseIgnoreMatch "
              "SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n")


def external(srv):
    c = ldap.initialize(srv.ldapi_url)
    c.sasl_non_interactive_bind_s("EXTERNAL")
    return c


def outcome(call):
    """(result code, response controls) of a python-ldap *_ext_s call."""
    try:
        r = call()
        return 0, (r[3] if r and len(r) > 3 else [])
    except ldap.LDAPError as e:
        info = e.args[0] if e.args and isinstance(e.args[0], dict) else {}
        return info.get("result"), info.get("ctrls", [])


def read_control(ctrls, kind):
    """The entry (dn, attrs) of the pre-/post-read response control in
    `ctrls` (decoded controls or raw (oid, crit, value) tuples)."""
    for c in ctrls:
        if isinstance(c, tuple):
            oid, _, value = c
            if oid == kind.controlType:
                d = kind()
                d.decodeControlValue(value)
                return d.dn, d.entry
        elif c.controlType == kind.controlType:
            return c.dn, c.entry
    return None


def config_entry(srv, dn):
    r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-o", "ldif-wrap=no", "-Y", "EXTERNAL", "-H",
                        srv.ldapi_url, "-b", dn, "-s", "base", "(objectClass=*)"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode == 32:
        return None
    assert r.returncode == 0, r.stderr
    return parse_ldif(r.stdout)[0][1]


def size_limit(srv):
    return config_entry(srv, "cn=config")["olcSizeLimit"]


def anonymous_people(srv):
    """How many People an anonymous search returns, and its result."""
    c = srv.conn(admin=False)
    c.search(PEOPLE, "(uid=*)", attributes=["uid"])
    n, desc = len(c.entries), c.result["description"]
    c.unbind()
    return n, desc


def ldapmodify(srv, ldif, *controls):
    args = ["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url]
    for c in controls:
        args += ["-e", c]
    r = subprocess.run(args, input=ldif, capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture
def srv(tmp_path):
    s = Pando(tmp_path, demo=True, config=PUBLIC_READ).start()
    yield s
    s.stop_and_verify()


SET_LIMIT = "dn: cn=config\nchangetype: modify\nreplace: olcSizeLimit\nolcSizeLimit: 1\n"


def test_noop_on_cn_config_answers_16654_and_changes_nothing(srv):
    assert size_limit(srv) == ["500"]
    n, _ = anonymous_people(srv)
    assert n > 1
    # ldapmodify -e noop: the server answers noOperation (16654).
    rc, out = ldapmodify(srv, SET_LIMIT, "noop")
    assert "16654" in out or "No Operation" in out, (rc, out)
    assert size_limit(srv) == ["500"]
    assert anonymous_people(srv) == (n, "success")
    c = external(srv)
    mod = [(ldap.MOD_REPLACE, "olcSizeLimit", [b"1"])]
    for oid in (NO_OP, NO_OP_DRAFT):
        code, _ = outcome(lambda: c.modify_ext_s("cn=config", mod,
                                                   serverctrls=[LDAPControl(oid, True, None)]))
        assert code == 16654, (oid, code)
    # An add and a delete under No-Op: checked, answered 16654, not made.
    noop = [LDAPControl(NO_OP, True, None)]
    doc = parse_ldif(SCHEMA_DOC)[0]
    attrs = [(k, [v.encode() for v in vs]) for k, vs in doc[1].items()]
    code, _ = outcome(lambda: c.add_ext_s(doc[0], attrs, serverctrls=noop))
    assert code == 16654, code
    assert config_entry(srv, "cn=h37,cn=schema,cn=config") is None
    # A bad value under No-Op is refused as without it.
    bad = [(ldap.MOD_REPLACE, "olcSizeLimit", [b"lots"])]
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", bad, serverctrls=noop))
    assert code == 21, code
    assert outcome(lambda: c.add_ext_s(doc[0], attrs))[0] == 0
    code, _ = outcome(lambda: c.delete_ext_s("cn={0}h37,cn=schema,cn=config", serverctrls=noop))
    assert code == 16654, code
    assert config_entry(srv, "cn={0}h37,cn=schema,cn=config") is not None
    assert size_limit(srv) == ["500"]
    assert anonymous_people(srv) == (n, "success")
    c.unbind_s()


def test_assertion_on_cn_config_is_tested_first(srv):
    n, _ = anonymous_people(srv)
    rc, out = ldapmodify(srv, SET_LIMIT, "assert=(olcSizeLimit=1)")
    assert rc == 122 or "(122)" in out, (rc, out)
    assert size_limit(srv) == ["500"]
    assert anonymous_people(srv) == (n, "success")
    c = external(srv)
    false = [AssertionControl(True, "(olcSizeLimit=7)")]
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", [(ldap.MOD_REPLACE, "olcSizeLimit", [b"1"])],
                                               serverctrls=false))
    assert code == 122, code
    # Compare, add (tested on the entry added) and delete too.
    code, _ = outcome(lambda: c.compare_ext_s("cn=config", "olcSizeLimit", b"500", serverctrls=false))
    assert code == 122, code
    doc = parse_ldif(SCHEMA_DOC)[0]
    attrs = [(k, [v.encode() for v in vs]) for k, vs in doc[1].items()]
    code, _ = outcome(lambda: c.add_ext_s(doc[0], attrs, serverctrls=[AssertionControl(True, "(cn=other)")]))
    assert code == 122, code
    assert config_entry(srv, "cn={0}h37,cn=schema,cn=config") is None
    code, _ = outcome(lambda: c.add_ext_s(doc[0], attrs, serverctrls=[AssertionControl(True, "(cn=h37)")]))
    assert code == 0, code
    code, _ = outcome(lambda: c.delete_ext_s("cn={0}h37,cn=schema,cn=config",
                                               serverctrls=[AssertionControl(True, "(cn=other)")]))
    assert code == 122, code
    assert config_entry(srv, "cn={0}h37,cn=schema,cn=config") is not None
    # A true assertion lets the change through.
    rc, out = ldapmodify(srv, SET_LIMIT, "assert=(olcSizeLimit=500)")
    assert rc == 0, out
    assert size_limit(srv) == ["1"]
    assert anonymous_people(srv) == (1, "sizeLimitExceeded")
    c.unbind_s()


def test_pre_and_post_read_on_cn_config(srv):
    c = external(srv)
    reads = [PreReadControl(True, ["olcSizeLimit"]), PostReadControl(True, ["olcSizeLimit"])]
    mod = [(ldap.MOD_REPLACE, "olcSizeLimit", [b"3"])]
    code, ctrls = outcome(lambda: c.modify_ext_s("cn=config", mod, serverctrls=reads))
    assert code == 0, code
    assert read_control(ctrls, PreReadControl) == ("cn=config", {"olcSizeLimit": [b"500"]})
    assert read_control(ctrls, PostReadControl) == ("cn=config", {"olcSizeLimit": [b"3"]})
    # Under No-Op the post-read shows the entry as it would be.
    mod = [(ldap.MOD_REPLACE, "olcSizeLimit", [b"9"])]
    code, ctrls = outcome(lambda: c.modify_ext_s("cn=config", mod,
                                                   serverctrls=reads + [LDAPControl(NO_OP, True, None)]))
    assert code == 16654, code
    assert read_control(ctrls, PostReadControl) == ("cn=config", {"olcSizeLimit": [b"9"]})
    assert size_limit(srv) == ["3"]
    # An added entry is read back under the name it got ({0}), and a
    # deleted one before it went.
    doc = parse_ldif(SCHEMA_DOC)[0]
    attrs = [(k, [v.encode() for v in vs]) for k, vs in doc[1].items()]
    code, ctrls = outcome(lambda: c.add_ext_s(doc[0], attrs, serverctrls=[PostReadControl(True, ["cn"])]))
    assert code == 0, code
    assert read_control(ctrls, PostReadControl) == ("cn={0}h37,cn=schema,cn=config", {"cn": [b"{0}h37"]})
    code, ctrls = outcome(lambda: c.delete_ext_s("cn={0}h37,cn=schema,cn=config",
                                                   serverctrls=[PreReadControl(True, ["olcAttributeTypes"])]))
    assert code == 0, code
    dn, entry = read_control(ctrls, PreReadControl)
    assert dn == "cn={0}h37,cn=schema,cn=config" and b"h37Colour" in entry["olcAttributeTypes"][0]
    # ldapmodify -e preread/postread prints both.
    rc, out = ldapmodify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcSizeLimit\nolcSizeLimit: 4\n",
                         "preread=olcSizeLimit", "postread=olcSizeLimit")
    assert rc == 0, out
    assert "olcSizeLimit: 3" in out and "olcSizeLimit: 4" in out, out
    c.unbind_s()


def test_other_write_controls_on_cn_config(srv):
    c = external(srv)
    listen = config_entry(srv, "cn=config")["pandoListen"]
    add_again = [(ldap.MOD_ADD, "pandoListen", [listen[0].encode()])]
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", add_again))
    assert code == 20, code  # attributeOrValueExists
    # Permissive modify: adding a value present is no error, and changes nothing.
    permissive = [LDAPControl(PERMISSIVE_MODIFY, True, None)]
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", add_again, serverctrls=permissive))
    assert code == 0, code
    absent = [(ldap.MOD_DELETE, "pandoListen", [b"ldap://127.0.0.9:1"])]
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", absent, serverctrls=permissive))
    assert code == 0, code
    assert config_entry(srv, "cn=config")["pandoListen"] == listen
    # An unknown critical control: unavailableCriticalExtension, nothing changed.
    code, _ = outcome(lambda: c.modify_ext_s("cn=config", [(ldap.MOD_REPLACE, "olcSizeLimit", [b"1"])],
                                               serverctrls=[LDAPControl("1.2.3.4.5.37", True, None)]))
    assert code == 12, code
    assert size_limit(srv) == ["500"]
    c.unbind_s()


# --- consumer credentials ---------------------------------------------------

SECRET = "h37-Consumer-Secret"


def consumer_toml(provider, extra="", credentials=SECRET):
    return ("[[replication.consumer]]\nrid = 7\nprovider = \"%s\"\nsearch_base = \"%s\"\n"
            "bind_dn = \"cn=admin,%s\"\ncredentials = \"%s\"\nretry = \"1 +\"\ntimeout_secs = 2\n%s"
            % (provider, PEOPLE, SUFFIX, credentials, extra))


def wait_for(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_consumer_password_never_read_back_and_kept_on_write_back(tmp_path):
    provider = Pando(tmp_path / "provider", demo=True, config=PUBLIC_READ).start()
    audit = tmp_path / "audit.log"
    config = (PUBLIC_READ + "[logs]\naudit = \"%s\"\n" % audit
              + consumer_toml(provider.url, credentials=provider.admin_pw))
    con = Pando(tmp_path / "consumer", config=config, name="consumer").start()
    try:
        def has(dn, value):
            c = con.conn()
            c.search(dn, "(objectClass=*)", search_scope="BASE", attributes=["description"])
            found = bool(c.entries) and value in c.entries[0]["description"].values
            c.unbind()
            return found

        provider.ldap("ldapmodify", input="dn: uid=alice,%s\nchangetype: modify\nreplace: description\n"
                                          "description: one\n" % PEOPLE)
        wait_for(lambda: has("uid=alice," + PEOPLE, "one"))
        # A read shows the placeholder, never the password.
        r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-o", "ldif-wrap=no", "-Y", "EXTERNAL", "-H",
                            con.ldapi_url, "-b", "cn=config"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and provider.admin_pw not in r.stdout, r.stdout
        values = config_entry(con, DB)["pandoReplicationConsumer"]
        assert len(values) == 1 and 'credentials = "****"' in values[0], values
        # An export neither.
        r = subprocess.run([PANDO_BIN, "config", "export", "--data-dir", str(con.data_dir),
                            "--config", str(con.base / "pando.toml")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert provider.admin_pw not in r.stdout and 'credentials = "****"' in r.stdout, r.stdout
        # Written back as read (with another change): the stored password stays.
        rc, out = ldapmodify(con, "dn: %s\nchangetype: modify\nreplace: pandoReplicationConsumer\n"
                                  "pandoReplicationConsumer: %s\n-\nreplace: olcDbIndex\nolcDbIndex: uid eq\n"
                                  % (DB, values[0]))
        assert rc == 0, out
        # The placeholder does not go to another provider.
        moved = values[0].replace(provider.url, "ldap://127.0.0.1:9")
        rc, out = ldapmodify(con, "dn: %s\nchangetype: modify\nreplace: pandoReplicationConsumer\n"
                                  "pandoReplicationConsumer: %s\n" % (DB, moved))
        assert rc == 19 and "rid 007" in out, (rc, out)
        # A new password given over LDAP is not in the audit log.
        changed = values[0].replace('"****"', '"%s"' % SECRET)
        rc, out = ldapmodify(con, "dn: %s\nchangetype: modify\nreplace: pandoReplicationConsumer\n"
                                  "pandoReplicationConsumer: %s\n" % (DB, changed))
        assert rc == 0, out
        wait_for(lambda: audit.exists() and "pandoReplicationConsumer" in audit.read_text())
        text = audit.read_text()
        assert SECRET not in text and provider.admin_pw not in text, text
        assert "****" in text, text
        # Back to the working password, then a restart: it still binds.
        rc, out = ldapmodify(con, "dn: %s\nchangetype: modify\nreplace: pandoReplicationConsumer\n"
                                  "pandoReplicationConsumer: %s\n" % (DB, values[0].replace(
                                      '"****"', '"%s"' % provider.admin_pw)))
        assert rc == 0, out
        rc, out = ldapmodify(con, "dn: %s\nchangetype: modify\nreplace: olcDbIndex\nolcDbIndex: uid eq,pres\n"
                             % DB)
        assert rc == 0, out
        assert provider.admin_pw not in audit.read_text()
        con.stop()
        provider.ldap("ldapmodify", input="dn: uid=alice,%s\nchangetype: modify\nreplace: description\n"
                                          "description: two\n" % PEOPLE)
        con.start(keep_port=True)
        wait_for(lambda: has("uid=alice," + PEOPLE, "two"))
        con.stop_and_verify()
        provider.stop_and_verify()
    finally:
        con.stop()
        provider.stop()


def serve_fails(tmp_path, text):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('data_dir = "%s"\n' % (tmp_path / "d") + text)
    try:
        r = subprocess.run([PANDO_BIN, "serve", "--config", str(cfg), "--listen", "ldapi://"],
                           capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False, "it started serving"
    return r.returncode != 0, r.stderr


def test_consumer_password_in_clear_over_the_network_is_refused(tmp_path):
    failed, err = serve_fails(tmp_path, consumer_toml("ldap://192.0.2.7:389"))
    assert failed and "replication.consumer[0].start_tls" in err and "rid 007" in err, err
    # The placeholder of a read is not a password.
    failed, err = serve_fails(tmp_path, consumer_toml("ldaps://192.0.2.7", credentials="****"))
    assert failed and "replication.consumer[0].credentials" in err, err
    # Nor over cn=config.
    srv = Pando(tmp_path / "srv", demo=True).start()
    table = ('{ rid = 8, provider = "ldap://192.0.2.7:389", search_base = "%s", '
             'bind_dn = "cn=x", credentials = "pw" }' % PEOPLE)
    rc, out = ldapmodify(srv, "dn: %s\nchangetype: modify\nadd: pandoReplicationConsumer\n"
                              "pandoReplicationConsumer: %s\n" % (DB, table))
    assert rc == 19 and "rid 008" in out and "start_tls" in out, (rc, out)
    assert "pandoReplicationConsumer" not in config_entry(srv, DB)
    # A lab may allow it, explicitly.
    allowed = table.replace("}", ", allow_plaintext_password = true, timeout_secs = 1 }")
    rc, out = ldapmodify(srv, "dn: %s\nchangetype: modify\nadd: pandoReplicationConsumer\n"
                              "pandoReplicationConsumer: %s\n" % (DB, allowed))
    assert rc == 0, out
    shown = config_entry(srv, DB)["pandoReplicationConsumer"]
    assert "allow_plaintext_password = true" in shown[0] and '"pw"' not in shown[0], shown
    rc, out = ldapmodify(srv, "dn: %s\nchangetype: modify\ndelete: pandoReplicationConsumer\n" % DB)
    assert rc == 0, out
    srv.stop_and_verify()
