"""Configuration changed while serving: SIGHUP reloads of the file, and
(as it lands) cn=config over LDAP. Each change is seen by the next
operation, also on connections opened before it."""

import random
import signal
import subprocess
import threading
import time

from conftest import PANDO_BIN, PUBLIC_READ, SUFFIX, Pando, parse_ldif

PEOPLE = "ou=People," + SUFFIX


def wait_log(srv, text, timeout=10.0):
    deadline = time.monotonic() + timeout
    while text not in srv.logs(tail=100000):
        assert time.monotonic() < deadline, "no %r in the log:\n%s" % (text, srv.logs())
        time.sleep(0.05)


def test_sighup_applies_access_rules_and_limits_to_open_connections(tmp_path):
    srv = Pando(tmp_path, demo=True, config="[limits]\nsize_limit = 500\n").start()
    anon = srv.conn(admin=False)
    # The built-in rules give anonymous clients nothing below the suffix.
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert anon.entries == []
    (tmp_path / "pando.toml").write_text("[limits]\nsize_limit = 2\n" + PUBLIC_READ)
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "SIGHUP: configuration changed")
    # The same connection, its next operation: the new rules and limit.
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 2
    assert anon.result["description"] == "sizeLimitExceeded"
    logs = srv.logs(tail=100000)
    assert "access" in logs and "limits.size_limit" in logs
    # A key taken at the next start is reported, and the rest applies.
    (tmp_path / "pando.toml").write_text(
        "[limits]\nsize_limit = 3\npersistent_search_backlog = 77\n" + PUBLIC_READ)
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "take effect at the next start")
    assert "limits.persistent_search_backlog" in srv.logs(tail=100000)
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 3
    # A bad access rule changes nothing.
    (tmp_path / "pando.toml").write_text(
        "[limits]\nsize_limit = 3\n[[access]]\ndn_regex = \"(\"\nby = [{ who = \"*\", rights = \"read\" }]\n")
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "not reloaded")
    assert "access[0]" in srv.logs(tail=100000)
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 3
    anon.unbind()
    # The log level too: debug lines (connections accepted) appear.
    assert "connection accepted" not in srv.logs(tail=100000)
    (tmp_path / "pando.toml").write_text("log_level = \"debug\"\n")
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "log_level")
    srv.conn().unbind()
    wait_log(srv, "connection accepted")
    srv.stop_and_verify()


# --- cn=config over LDAP ---------------------------------------------------

DB = "olcDatabase={1}mdb,cn=config"


def config_modify(srv, ldif):
    """ldapmodify -Y EXTERNAL over ldapi (the server's own user: an
    administrator). Returns (rc, stderr)."""
    r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                       input=ldif, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def config_read(srv, base="cn=config", *attrs, scope="sub"):
    r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-o", "ldif-wrap=no", "-Y", "EXTERNAL",
                        "-H", srv.ldapi_url, "-b", base, "-s", scope, "(objectClass=*)", *attrs],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {dn.lower(): attrs for dn, attrs in parse_ldif(r.stdout)}


def values(entry, attr):
    for k, v in entry.items():
        if k.lower() == attr.lower():
            return v
    return []


def test_cn_config_is_for_administrators_only(tmp_path):
    srv = Pando(tmp_path, demo=True, config=PUBLIC_READ).start()
    tree = config_read(srv)
    assert set(tree) == {"cn=config", DB.lower(), "cn=schema,cn=config"}
    assert values(tree["cn=config"], "olcSizeLimit") == ["500"]
    assert values(tree[DB.lower()], "olcSuffix") == [SUFFIX]
    r = subprocess.run(["ldapcompare", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url, "cn=config",
                        "olcSizeLimit:500"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 6, r.stdout + r.stderr  # compareTrue
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", "", "-s", "base", "configContext", auth=None)
    assert "configContext: cn=config" in out, out + err
    # The root DN is an administrator too.
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", "cn=config", "-s", "base", "olcLogLevel")
    assert rc == 0 and "olcLogLevel: info" in out, err
    # A user and an anonymous client: it does not exist, whatever the
    # filter or operation asks.
    c = srv.conn(admin=False)
    for base, flt in [("cn=config", "(objectClass=*)"), (DB, "(olcAccess=*)"),
                      ("cn=config", "(olcSizeLimit=500)")]:
        assert not c.search(base, flt, search_scope="SUBTREE")
        assert c.result["description"] == "noSuchObject", c.result
    assert not c.compare("cn=config", "olcSizeLimit", "500")
    assert c.result["description"] == "noSuchObject", c.result
    c.modify("cn=config", {"olcSizeLimit": [("MODIFY_REPLACE", ["0"])]})
    assert c.result["description"] == "noSuchObject", c.result
    c.unbind()
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", "cn=config", auth=None)
    assert rc == 32, out + err
    # The schema of the configuration is published.
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", "cn=Subschema",
                            "-s", "base", "attributeTypes", "objectClasses")
    assert "NAME 'olcAccess'" in out and "NAME 'pandoStoreDurability'" in out
    assert "NAME 'olcGlobal'" in out
    srv.stop_and_verify()


def test_access_rules_inserted_moved_and_deleted_apply_to_open_connections(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    anon = srv.conn(admin=False)
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert anon.entries == []
    rules = values(config_read(srv, DB)[DB.lower()], "olcAccess")
    assert rules[0].startswith("{0}to attrs=userPassword"), rules
    # Insert a rule at {1}: anonymous reads of People.
    rc, out = config_modify(srv, """dn: %s
changetype: modify
add: olcAccess
olcAccess: {1}to dn.subtree="%s" by * read
""" % (DB, PEOPLE))
    assert rc == 0, out
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) >= 3
    assert values(config_read(srv, DB)[DB.lower()], "olcAccess")[1] == \
        "{1}to dn.subtree=%s by * read" % PEOPLE
    # Move it after the catch-all rule: it no longer decides.
    rc, out = config_modify(srv, """dn: %s
changetype: modify
delete: olcAccess
olcAccess: {1}
-
add: olcAccess
olcAccess: {2}to dn.subtree="%s" by * read
""" % (DB, PEOPLE))
    assert rc == 0, out
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert anon.entries == []
    # Delete it.
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\ndelete: olcAccess\nolcAccess: {2}\n" % DB)
    assert rc == 0, out
    assert len(values(config_read(srv, DB)[DB.lower()], "olcAccess")) == 2
    anon.unbind()
    srv.stop_and_verify()


def test_limits_log_level_and_durability_change_over_ldap(tmp_path):
    srv = Pando(tmp_path, demo=True, config=PUBLIC_READ).start()
    anon = srv.conn(admin=False)
    rc, out = config_modify(srv, """dn: cn=config
changetype: modify
replace: olcSizeLimit
olcSizeLimit: 2
-
replace: olcLogLevel
olcLogLevel: debug
""")
    assert rc == 0, out
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 2 and anon.result["description"] == "sizeLimitExceeded"
    srv.conn().unbind()
    wait_log(srv, "connection accepted")
    rc, out = config_modify(srv, """dn: %s
changetype: modify
replace: pandoStoreDurability
pandoStoreDurability: batched
""" % DB)
    assert rc == 0, out
    wait_log(srv, "durability changed")
    # The audit log names who changed the configuration.
    assert "cn=config changed" in srv.logs(tail=100000)
    anon.unbind()
    srv.stop_and_verify()


def test_bad_configuration_values_are_refused_and_change_nothing(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    before = config_read(srv)
    cases = [
        ("cn=config", "replace: olcFoo\nolcFoo: 1\n", "olcFoo"),
        (DB, "add: olcAccess\nolcAccess: to dn.regex=\"(\" by * read\n", "olcAccess"),
        (DB, "add: olcAccess\nolcAccess: to * by martians read\n", "not a subject"),
        (DB, "replace: olcRootDN\nolcRootDN: not a dn\n", "olcRootDN"),
        (DB, "add: olcDbIndex\nolcDbIndex: uid fuzzy\n", "olcDbIndex"),
        (DB, "add: olcDbIndex\nolcDbIndex: noSuchAttr eq\n", "noSuchAttr"),
        ("cn=config", "add: pandoListen\npandoListen: %s\n" % srv.url, "is there already"),
        ("cn=config", "replace: pandoListen\npandoListen: gopher://x\n", "pandoListen"),
        ("cn=config", "replace: olcSizeLimit\nolcSizeLimit: lots\n", "not an integer"),
        ("cn=config", "replace: olcTLSCertificateFile\nolcTLSCertificateFile: /nonexistent/cert.pem\n"
         "-\nreplace: olcTLSCertificateKeyFile\nolcTLSCertificateKeyFile: /nonexistent/key.pem\n",
         "/nonexistent/cert.pem"),
        (DB, "replace: olcDbDirectory\nolcDbDirectory: /tmp\n", "cannot be changed"),
        (DB, "replace: pandoStoreDurability\npandoStoreDurability: sometimes\n", "pandoStoreDurability"),
        (DB, "replace: olcMultiProvider\nolcMultiProvider: TRUE\n", "needs replication.server_id"),
    ]
    for dn, change, says in cases:
        rc, out = config_modify(srv, "dn: %s\nchangetype: modify\n%s" % (dn, change))
        assert rc != 0, (change, out)
        assert says in out, (change, out)
    assert config_read(srv) == before
    rc, out = config_modify(srv, "dn: cn=other,cn=config\nchangetype: add\nobjectClass: top\ncn: other\n")
    assert rc == 53, out
    # Multi-provider needs a server ID: refused alone (19), taken with one.
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\nreplace: olcMultiProvider\nolcMultiProvider: TRUE\n"
                            % DB)
    assert rc == 19, out
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcServerID\nolcServerID: 7\n\n"
                            "dn: %s\nchangetype: modify\nreplace: olcMultiProvider\nolcMultiProvider: TRUE\n" % DB)
    assert rc == 0, out
    assert config_read(srv, DB, "olcMultiProvider", scope="base")[DB.lower()]["olcMultiProvider"] == ["TRUE"]
    srv.stop_and_verify()


def test_changes_survive_restarts_and_file_edits_still_apply(tmp_path):
    srv = Pando(tmp_path, demo=True, config="[limits]\ntime_limit = 100\n").start()
    rc, out = config_modify(srv, """dn: cn=config
changetype: modify
replace: olcSizeLimit
olcSizeLimit: 7
-
replace: pandoLimitsPersistentSearchBacklog
pandoLimitsPersistentSearchBacklog: 50
""")
    assert rc == 0, out
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "pandoAtNextStart") == ["pandoLimitsPersistentSearchBacklog"]
    srv.stop_and_verify()
    # Same file: the changes made over LDAP stay, and the one waiting for
    # a start is taken.
    srv.start()
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "olcSizeLimit") == ["7"]
    assert values(g, "pandoLimitsPersistentSearchBacklog") == ["50"]
    assert values(g, "pandoAtNextStart") == []
    assert "keep the values changed over LDAP" in srv.logs()
    srv.stop()
    # An edit to the file wins for the key edited, the rest stays.
    srv.config = "[limits]\ntime_limit = 100\nsize_limit = 9\n"
    srv.start()
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "olcSizeLimit") == ["9"]
    assert values(g, "pandoLimitsPersistentSearchBacklog") == ["50"]
    assert values(g, "olcTimeLimit") == ["100"]
    # `pando config export` writes the configuration as TOML.
    r = subprocess.run([PANDO_BIN, "config", "export", "--data-dir", str(srv.data_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "size_limit = 9" in r.stdout and "persistent_search_backlog = 50" in r.stdout
    srv.stop_and_verify()


def test_kill_9_during_configuration_changes_leaves_old_or_new(tmp_path):
    """Rounds go through changes of two keys at once, schema documents
    added and deleted, and an index added and dropped with another key of
    its entry; each is cut by kill -9 at a random moment."""
    rng = random.Random(18)
    srv = Pando(tmp_path, demo=True).start()
    doc = ("dn: cn=k9,cn=schema,cn=config\nobjectClass: olcSchemaConfig\ncn: k9\n"
           "olcAttributeTypes: ( 1.3.6.1.4.1.99999.1.1 NAME 'k9Colour' EQUALITY caseIgnoreMatch "
           "SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\n"
           "olcObjectClasses: ( 1.3.6.1.4.1.99999.2.1 NAME 'k9Thing' SUP top AUXILIARY MAY k9Colour )\n")
    acknowledged = 0
    for round_ in range(6):
        done = []
        schema_round = round_ % 3 == 1
        index_round = round_ % 3 == 2

        def change_loop():
            for i in range(1000):
                if index_round:
                    rc, _ = config_modify(srv, "dn: %s\nchangetype: modify\n%s: olcDbIndex\n"
                                          "olcDbIndex: description eq\n-\nreplace: pandoStoreDurability\n"
                                          "pandoStoreDurability: %s\n"
                                          % (DB, "add" if i % 2 == 0 else "delete",
                                             "batched" if i % 2 == 0 else "durable"))
                elif schema_round:
                    if i % 2 == 0:
                        rc, _ = ldapadd_external(srv, input=doc)
                    else:
                        rc = subprocess.run(["ldapdelete", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url,
                                             "cn=k9,cn=schema,cn=config"], capture_output=True,
                                            timeout=60).returncode
                else:
                    rc, _ = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcSizeLimit\n"
                                          "olcSizeLimit: %d\n-\nreplace: olcTimeLimit\nolcTimeLimit: %d\n"
                                          % (1000 + i, 1000 + i))
                if rc != 0:
                    return
                done.append(i)
        t = threading.Thread(target=change_loop)
        t.start()
        time.sleep(0.3 + rng.random())
        srv.proc.kill()
        srv.proc.wait()
        t.join(60)
        srv.stop()
        srv.start()
        g = config_read(srv, "cn=config", scope="base")["cn=config"]
        size, tl = values(g, "olcSizeLimit"), values(g, "olcTimeLimit")
        # Both keys of one change, never a mix; at least every acknowledged one.
        assert size == tl, (size, tl)
        if done and not schema_round and not index_round:
            assert int(size[0]) >= 1000 + done[-1], (size, done[-1])
        if index_round:
            d = config_read(srv, DB, scope="base")[DB.lower()]
            indexed = any(v.startswith("description ") for v in values(d, "olcDbIndex"))
            assert indexed == (values(d, "pandoStoreDurability") == ["batched"]), d
            ready, building = monitor_indexes(srv)
            assert ("description eq" in ready) == indexed and building == [], (ready, building)
            if indexed:
                rc, _ = config_modify(srv, "dn: %s\nchangetype: modify\ndelete: olcDbIndex\n"
                                           "olcDbIndex: description eq\n-\nreplace: pandoStoreDurability\n"
                                           "pandoStoreDurability: durable\n" % DB)
                assert rc == 0
        if schema_round:
            # The document is there whole or not at all, as the last
            # acknowledged change (or a later one) left it.
            docs = [dn for dn in config_read(srv, "cn=schema,cn=config") if dn != "cn=schema,cn=config"]
            assert len(docs) <= 1, docs
            rc, out, err = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", "cn=Subschema",
                                    "-s", "base", "attributeTypes", "objectClasses")
            assert ("'k9Colour'" in out) == ("'k9Thing'" in out) == bool(docs), (docs, out[-300:])
            if docs:
                rc = subprocess.run(["ldapdelete", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url,
                                     "cn=k9,cn=schema,cn=config"], capture_output=True, timeout=60).returncode
                assert rc == 0
        acknowledged += len(done)
    assert acknowledged > 0
    srv.stop_and_verify()


def test_listeners_added_and_removed_while_serving(tmp_path):
    import socket
    from conftest import free_port
    srv = Pando(tmp_path, demo=True, config=PUBLIC_READ).start()
    port = free_port()
    url = "ldap://127.0.0.1:%d" % port
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nadd: pandoListen\npandoListen: %s\n" % url)
    assert rc == 0, out
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "-s", "base", "1.1", url=url)
    assert rc == 0, err
    held = srv.conn()  # on the first listener; stays open throughout
    # A port in use and a duplicate are refused, and nothing changes.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = "ldap://127.0.0.1:%d" % taken.getsockname()[1]
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nadd: pandoListen\npandoListen: %s\n" % busy)
    assert rc != 0 and "cannot listen on" in out and "in use" in out, out
    taken.close()
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nadd: pandoListen\npandoListen: %s\n" % srv.url)
    assert rc != 0 and "is there already" in out, out
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nadd: pandoListen\n"
                            "pandoListen: ldap://127.0.0.1:0%d\n" % port)
    assert rc != 0 and "same listener" in out, out
    # Remove the first: it stops accepting; connections made on it go on.
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\ndelete: pandoListen\npandoListen: %s\n" % srv.url)
    assert rc == 0, out
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "-s", "base", "1.1")
    assert rc == 255, (rc, out, err)  # cannot contact
    assert held.search(SUFFIX, "(objectClass=*)", search_scope="BASE")
    held.unbind()
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", SUFFIX, "-s", "base", "1.1", url=url)
    assert rc == 0, err
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "pandoListen") == ["ldapi://", url]
    srv.stop_and_verify()


def test_logs_and_password_hashing_change_over_ldap(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    access = tmp_path / "access.log"
    audit = tmp_path / "audit.log"
    rc, out = config_modify(srv, """dn: cn=config
changetype: modify
replace: pandoLogsAccess
pandoLogsAccess: %s
-
replace: pandoLogsAudit
pandoLogsAudit: %s
-
replace: pandoPasswordsScheme
pandoPasswordsScheme: ssha512
""" % (access, audit))
    assert rc == 0, out
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "pandoAtNextStart") == []
    rc, out, err = srv.ldap("ldapmodify", input="dn: uid=alice,ou=People,%s\nchangetype: modify\n"
                            "replace: userPassword\nuserPassword: s3cret-Pass\n" % SUFFIX)
    assert rc == 0, err
    rc, found, err = srv.search("uid=alice,ou=People," + SUFFIX, "userPassword", scope="base")
    assert found[0][1]["userPassword"][0].startswith("{SSHA512}"), found
    # The next change to cn=config is in the audit log with who made it.
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: olcSizeLimit\nolcSizeLimit: 77\n")
    assert rc == 0, out
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        a = audit.read_text() if audit.exists() else ""
        if "olcSizeLimit: 77" in a and "cn=peercred" in a and "uid=alice" in a:
            break
        time.sleep(0.1)
    assert "olcSizeLimit: 77" in a and "cn=peercred" in a, a
    # Operations after the change are in the new access log.
    assert "MOD dn=\"uid=alice,ou=People," in access.read_text(), access.read_text()
    srv.stop_and_verify()


SCHEMA_DIR = "/etc/ldap/schema"


def ldapadd_external(srv, *args, input=None):
    r = subprocess.run(["ldapadd", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url, *args],
                       input=input, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_schema_added_used_refused_while_used_and_deleted_over_ldap(tmp_path):
    import os
    import pytest
    if not os.path.exists(SCHEMA_DIR + "/java.ldif"):
        pytest.skip("Debian's slapd schema files are not installed")
    srv = Pando(tmp_path, demo=True).start()
    # Debian's cn=schema LDIF files load as they are, as into slapd.
    for name in ["java", "misc", "corba", "collective", "duaconf", "openldap", "dsee",
                 "msuser", "namedobject", "dyngroup"]:
        rc, out = ldapadd_external(srv, "-f", "%s/%s.ldif" % (SCHEMA_DIR, name))
        assert rc == 0, (name, out)
    tree = config_read(srv, "cn=schema,cn=config")
    assert "cn={0}java,cn=schema,cn=config" in tree, list(tree)
    assert any(v.startswith("{0}( 1.3.6.1.4.1.42.2.27.4.1.6 ")
               for v in values(tree["cn={0}java,cn=schema,cn=config"], "olcAttributeTypes"))
    # Usable at once, in entries and filters, and published.
    rc, out, err = srv.ldap("ldapadd", input="dn: cn=app,%s\nobjectClass: javaContainer\ncn: app\n" % SUFFIX)
    assert rc == 0, err
    rc, found, err = srv.search(SUFFIX, "(objectClass=javaContainer)", "cn")
    assert rc == 0 and [dn for dn, _ in found] == ["cn=app," + SUFFIX], (found, err)
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", "cn=Subschema", "-s", "base",
                            "objectClasses")
    assert "NAME 'javaContainer'" in out
    # A second document of the same name, and a broken one, are refused.
    rc, out = ldapadd_external(srv, "-f", SCHEMA_DIR + "/java.ldif")
    assert rc == 68, out
    rc, out = ldapadd_external(srv, input="dn: cn=broken,cn=schema,cn=config\nobjectClass: olcSchemaConfig\n"
                               "cn: broken\nolcAttributeTypes: ( 1.2.3.4 NAME 'x' EQUALITY noSuchMatch )\n")
    assert rc != 0 and "cn={10}broken,cn=schema,cn=config" in out and "noSuchMatch" in out, out
    # In use: refused, naming the count and an entry.
    r = subprocess.run(["ldapdelete", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url,
                        "cn={0}java,cn=schema,cn=config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 53, r.stdout + r.stderr
    assert "javaContainer is used by 1 entry (e.g. cn=app,%s)" % SUFFIX in r.stderr, r.stderr
    # The data goes, then the schema can.
    rc, out, err = srv.ldap("ldapdelete", "cn=app," + SUFFIX)
    assert rc == 0, err
    r = subprocess.run(["ldapdelete", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url,
                        "cn=java,cn=schema,cn=config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", "cn=Subschema", "-s", "base",
                            "objectClasses")
    assert "NAME 'javaContainer'" not in out and "NAME 'corbaContainer'" in out
    rc, out, err = srv.ldap("ldapadd", input="dn: cn=app2,%s\nobjectClass: javaContainer\ncn: app2\n" % SUFFIX)
    assert rc != 0, out
    # The schema changed over LDAP is there after a restart.
    srv.stop()
    srv.start()
    tree = config_read(srv, "cn=schema,cn=config")
    assert "cn={0}misc,cn=schema,cn=config" in tree, list(tree)
    rc, out, err = srv.ldap("ldapadd", input="dn: cn=orb,%s\nobjectClass: corbaContainer\ncn: orb\n" % SUFFIX)
    assert rc == 0, err
    srv.stop_and_verify()


def test_metrics_endpoint_moves_over_ldap(tmp_path):
    import urllib.request
    from conftest import free_port
    srv = Pando(tmp_path, demo=True).start()
    port = free_port()
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: pandoMetricsListen\n"
                            "pandoMetricsListen: 127.0.0.1:%d\n" % port)
    assert rc == 0, out
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    assert "pando_" in body
    other = free_port()
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: pandoMetricsListen\n"
                            "pandoMetricsListen: 127.0.0.1:%d\n" % other)
    assert rc == 0, out
    assert "pando_" in urllib.request.urlopen("http://127.0.0.1:%d/metrics" % other, timeout=10).read().decode()
    deadline = time.monotonic() + 5
    while True:
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2)
        except OSError:
            break
        assert time.monotonic() < deadline, "the old endpoint still answers"
        time.sleep(0.1)
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\ndelete: pandoMetricsListen\n")
    assert rc == 0, out
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "pandoMetricsListen") == [] and values(g, "pandoAtNextStart") == []
    srv.stop_and_verify()


def test_failed_bind_lockout_changes_over_ldap(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    alice = "uid=alice,ou=People," + SUFFIX
    rc, out, err = srv.ldap("ldapmodify", input="dn: %s\nchangetype: modify\nreplace: userPassword\n"
                            "userPassword: right-Pass-1\n" % alice)
    assert rc == 0, err

    def bind(pw):
        return subprocess.run(["ldapwhoami", "-x", "-H", srv.url, "-D", alice, "-w", pw],
                              capture_output=True, text=True, timeout=30).returncode

    # The default lockout (50 failures) is far away.
    assert bind("wrong") == 49 and bind("wrong") == 49 and bind("right-Pass-1") == 0
    rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: pandoLimitsFailedBindLockout\n"
                            "pandoLimitsFailedBindLockout: 2\n-\nreplace: pandoLimitsFailedBindMaxDelayMs\n"
                            "pandoLimitsFailedBindMaxDelayMs: 0\n")
    assert rc == 0, out
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    assert values(g, "pandoAtNextStart") == []
    # Now two failures lock the DN out: the right password no longer binds.
    assert bind("wrong") == 49 and bind("wrong") == 49
    assert bind("right-Pass-1") != 0
    srv.stop_and_verify()


def monitor_indexes(srv):
    e = config_read(srv, "cn=Indexes,cn=Monitor", scope="base")["cn=indexes,cn=monitor"]
    return values(e, "pandoIndexReady"), values(e, "pandoIndexBuilding")


def test_an_index_added_over_ldap_builds_under_load_and_then_serves(tmp_path):
    """100k entries; employeeNumber is not indexed. The index added over
    ldapi is built while searches and writes run (none fails), with its
    progress in cn=Monitor and the log, and searches use it once it is
    ready. A kill -9 during a second build: the restart builds it whole."""
    ldif = tmp_path / "100k.ldif"
    run = lambda *a: subprocess.run([PANDO_BIN, *a], capture_output=True, text=True, timeout=300)
    r = run("gen", "-D", "numusers=100000", "--seed", "3", "-o", str(ldif))
    assert r.returncode == 0, r.stderr
    r = run("import", "--data-dir", str(tmp_path / "data"), "-f", str(ldif))
    assert r.returncode == 0, r.stderr
    srv = Pando(tmp_path, config="[limits]\nunindexed_search_limit = 1000\n" + PUBLIC_READ).start()
    anon = srv.conn(admin=False)
    anon.search(PEOPLE, "(employeeNumber=77)")
    assert anon.result["description"] == "adminLimitExceeded", anon.result
    stop = threading.Event()
    errors, counts, modified, added = [], {"search": 0, "write": 0}, {}, {}

    def searcher():
        c, rng = srv.conn(), random.Random(1)
        while not stop.is_set():
            i = rng.randrange(100000)
            if not c.search(PEOPLE, "(uid=user.%d)" % i, attributes=["uid"]) or len(c.entries) != 1:
                errors.append(("search", i, c.result))
            counts["search"] += 1
        c.unbind()

    def writer():
        c, rng, n = srv.conn(), random.Random(2), 0
        while not stop.is_set():
            n += 1
            if n % 3:
                uid = "user.%d" % rng.randrange(100000)
                value = str(9000000 + n)
                ok = c.modify("uid=%s,%s" % (uid, PEOPLE), {"employeeNumber": [("MODIFY_REPLACE", [value])]})
                if ok:
                    modified[uid] = value
            else:
                uid = "new.%d" % n
                ok = c.add("uid=%s,%s" % (uid, PEOPLE), ["inetOrgPerson"],
                           {"uid": uid, "cn": uid, "sn": "New", "employeeNumber": str(5000000 + n)})
                if ok:
                    added[uid] = str(5000000 + n)
            if not ok:
                errors.append(("write", n, c.result))
            counts["write"] += 1
        c.unbind()

    threads = [threading.Thread(target=searcher), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\nadd: olcDbIndex\n"
                                 "olcDbIndex: employeeNumber eq\n" % DB)
    assert rc == 0, out
    seen_building = []
    deadline = time.monotonic() + 180
    while True:
        ready, building = monitor_indexes(srv)
        seen_building += [b for b in building if b.startswith("employeenumber eq ")]
        if "employeenumber eq" in ready:
            break
        assert time.monotonic() < deadline, (ready, building)
        time.sleep(0.05)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(60)
    assert errors == [], errors[:5]
    assert counts["search"] > 0 and counts["write"] > 0, counts
    # Progress was visible: entries read of the entries there.
    assert seen_building, "the build was never seen in progress"
    done, total = map(int, seen_building[-1].split()[2:4])
    assert total >= 100002 and 0 <= done <= total, seen_building[-1]
    logs = srv.logs(tail=100000)
    assert "index build started" in logs and "index ready" in logs
    changed = [l for l in logs.splitlines() if "cn=config changed" in l and "employeeNumber" in l]
    assert len(changed) == 1 and "olcAccess" not in changed[0], changed
    # The planner uses it: the search refused as unindexed is answered,
    # right for entries changed and added during the build.
    anon.search(PEOPLE, "(employeeNumber=77)", attributes=["uid"])
    assert anon.result["description"] == "success", anon.result
    assert [e.uid.value for e in anon.entries] in ([], ["user.77"])
    assert ("user.77" in modified) == (anon.entries == [])
    for uid, value in list(modified.items())[-20:] + list(added.items())[-20:]:
        anon.search(PEOPLE, "(employeeNumber=%s)" % value, attributes=["uid"])
        assert [e.uid.value for e in anon.entries] == [uid], (uid, value, anon.result)
    # A second index, cut by kill -9 while it builds: the change was
    # acknowledged, so the restart has it, built whole before serving.
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\nadd: olcDbIndex\n"
                                 "olcDbIndex: description sub\n" % DB)
    assert rc == 0, out
    ready, building = monitor_indexes(srv)
    cut_mid_build = any(b.startswith("description sub ") for b in building)
    srv.proc.kill()
    srv.proc.wait()
    anon.unbind()
    srv.start()
    ready, building = monitor_indexes(srv)
    assert "description sub" in ready and "employeenumber eq" in ready and building == [], (ready, building)
    assert cut_mid_build, "the build ended before the kill"
    anon = srv.conn(admin=False)
    anon.search(PEOPLE, "(description=*for Marie Meyer.)", attributes=["uid"])
    assert anon.result["description"] == "success" and anon.entries, anon.result
    anon.unbind()
    srv.stop_and_verify()


def test_connection_and_search_counts_change_over_ldap(tmp_path):
    """Connections per address and places for searches that follow
    changes: lowered and raised while serving; connections already open
    stay open."""
    srv = Pando(tmp_path, demo=True).start()

    def limit(attr, value):
        rc, out = config_modify(srv, "dn: cn=config\nchangetype: modify\nreplace: %s\n%s: %d\n"
                                     % (attr, attr, value))
        assert rc == 0, out

    held = [srv.conn(admin=False) for _ in range(3)]
    limit("pandoLimitsMaxConnectionsPerIp", 2)
    assert values(config_read(srv, "cn=config", scope="base")["cn=config"], "pandoAtNextStart") == []
    # Three open, above the new limit: they go on, a fourth is refused.
    for c in held:
        assert c.search("", "(objectClass=*)", search_scope="BASE"), c.result
    rc, _, err = srv.ldap("ldapwhoami", auth=None)
    assert rc != 0, err
    assert "limits.max_connections_per_ip reached" in srv.logs(tail=100000)
    held.pop().unbind()
    held.pop().unbind()
    # Down to one held: a second connection is taken again.
    rc, out, err = srv.ldap("ldapwhoami", auth=None)
    assert rc == 0, err
    limit("pandoLimitsMaxConnectionsPerIp", 0)
    more = [srv.conn(admin=False) for _ in range(4)]
    for c in more + held:
        c.unbind()
    # No places for searches that follow changes, then some again.
    def follow(seconds):
        """A refresh-and-persist search for `seconds`: its output, and
        whether it was still running (ldapsearch waits on even after a
        refusal, so the output tells)."""
        p = subprocess.Popen(["ldapsearch", "-x", "-H", srv.url, "-D", srv.admin_dn, "-w", srv.admin_pw,
                              "-E", "sync=rp", "-b", SUFFIX, "(uid=nobody)"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(seconds)
        running = p.poll() is None
        p.kill()
        return p.communicate()[0], running

    # The store's batch size and compression take the next writes.
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\nreplace: pandoStoreMaxWriteBatch\n"
                                 "pandoStoreMaxWriteBatch: 4\n-\nreplace: pandoStoreCompression\n"
                                 "pandoStoreCompression: off\n" % DB)
    assert rc == 0, out
    g = config_read(srv, "cn=config", scope="base")["cn=config"]
    d = config_read(srv, DB, scope="base")[DB.lower()]
    assert values(g, "pandoAtNextStart") == [] and values(d, "pandoAtNextStart") == [], (g, d)
    rc, out, err = srv.ldap("ldapadd", input="".join(
        "dn: uid=plain%d,%s\nobjectClass: inetOrgPerson\nuid: plain%d\ncn: P\nsn: P\n\n" % (i, PEOPLE, i)
        for i in range(10)))
    assert rc == 0, out + err
    limit("pandoLimitsMaxPersistentSearches", 0)
    out, _ = follow(1.0)
    assert "turned off" in out, out
    limit("pandoLimitsMaxPersistentSearches", 1)
    out, running = follow(1.0)
    assert running and "result:" not in out, out
    srv.stop_and_verify()


def test_suffixes_added_and_removed_while_serving(tmp_path):
    srv = Pando(tmp_path, demo=True).start()
    other = "dc=other,dc=org"
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\nadd: olcSuffix\nolcSuffix: %s\n" % (DB, other))
    assert rc == 0, out
    assert values(config_read(srv, "cn=config", scope="base")["cn=config"], "pandoAtNextStart") == []
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", "", "-s", "base", "namingContexts", auth=None)
    assert "namingContexts: " + other in out, out + err
    rc, entries, err = srv.search(other, "(objectClass=*)", scope="base")
    assert rc == 0 and entries[0][0].lower() == other, err
    rc, out, err = srv.ldap("ldapadd", input="dn: ou=Things,%s\nobjectClass: organizationalUnit\nou: Things\n" % other)
    assert rc == 0, out + err
    # Removing a suffix that holds entries is refused, naming them.
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\ndelete: olcSuffix\nolcSuffix: %s\n" % (DB, other))
    assert rc == 53 and "holds 2 entries" in out and "ou=Things,dc=other,dc=org" in out, out
    # Survives a restart; then emptied and removed.
    srv.stop()
    srv.start()
    rc, entries, err = srv.search("ou=Things," + other, "(objectClass=*)", scope="base")
    assert rc == 0 and entries, err
    rc, out, err = srv.ldap("ldapdelete", "-r", other)
    assert rc == 0, out + err
    rc, out = config_modify(srv, "dn: %s\nchangetype: modify\ndelete: olcSuffix\nolcSuffix: %s\n" % (DB, other))
    assert rc == 0, out
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", "", "-s", "base", "namingContexts", auth=None)
    assert other not in out, out
    rc, _, err = srv.search(other, "(objectClass=*)", scope="base")
    assert rc == 32, err
    srv.stop_and_verify()
