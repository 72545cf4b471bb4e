"""One configuration for a ring: consumers with `config = true` follow
their providers' cn=config (every key but each server's own: server ID,
listeners, data directory, its consumers), the later change of each key
winning. Three providers, changes made over cn=config on each — an index,
an access rule, a limit, a schema, an overlay, and one key changed on two
servers in turn — then all three configurations compared."""

import subprocess
import time

import pytest

from conftest import ADMIN_DN, PEOPLE, PUBLIC_READ, SUFFIX, Pando
from test_multi_provider import PW, Ring

# What each server keeps for itself, as cn=config names it.
LOCAL = {"olcserverid", "pandolisten", "olcdbdirectory", "pandoreplicationconsumer"}


def ring(base):
    """Three providers (test_multi_provider.Ring), each following the
    others' configuration."""
    r = Ring(base, n=3)
    for node in r.nodes:
        node.config = node.config.replace('credentials = "%s"\n' % PW, 'credentials = "%s"\nconfig = true\n' % PW)
    return r


def config_ldif(node):
    r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-o", "ldif-wrap=no", "-Y", "EXTERNAL", "-H", node.ldapi_url,
                        "-b", "cn=config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def shared_config(node):
    """cn=config less each server's own values, comparable."""
    out = []
    for block in config_ldif(node).split("\n\n"):
        lines = [l for l in block.splitlines() if l and l.split(":")[0].lower() not in LOCAL]
        if lines:
            out.append(sorted(lines))
    return sorted(out)


def cn_config(node, text):
    r = subprocess.run(["ldapmodify", "-Q", "-Y", "EXTERNAL", "-H", node.ldapi_url], input=text,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def wait_same(nodes, check=lambda: True, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        views = [shared_config(n) for n in nodes]
        if views[0] == views[1] == views[2] and check():
            return views[0]
        if time.monotonic() > deadline:
            diff = [l for l in views[1] if l not in views[0]] + [l for l in views[2] if l not in views[0]]
            pytest.fail("the configurations differ: %r\n%s" % (diff[:4], "\n".join(n.logs(3000) for n in nodes)))
        time.sleep(0.5)


def values(node, attr, base="olcDatabase={1}mdb,cn=config"):
    r = subprocess.run(["ldapsearch", "-Q", "-LLL", "-o", "ldif-wrap=no", "-Y", "EXTERNAL", "-H", node.ldapi_url,
                        "-b", base, "-s", "base", attr], capture_output=True, text=True, timeout=60)
    return [l.split(": ", 1)[1] for l in r.stdout.splitlines() if l.lower().startswith(attr.lower() + ":")]


DB = "dn: olcDatabase={1}mdb,cn=config\nchangetype: modify\n"
GLOBAL = "dn: cn=config\nchangetype: modify\n"


def test_three_servers_share_one_configuration_and_keep_their_own_ids(tmp_path):
    group = ring(tmp_path).start()
    nodes = group.nodes
    try:
        a, b, c = nodes
        cn_config(a, DB + "add: olcDbIndex\nolcDbIndex: description eq\n")
        cn_config(b, DB + "add: olcAccess\nolcAccess: {0}to dn.subtree=\"ou=Groups,%s\" by * read\n" % SUFFIX)
        cn_config(c, GLOBAL + "replace: olcSizeLimit\nolcSizeLimit: 321\n")
        cn_config(c, "dn: cn=ring,cn=schema,cn=config\nchangetype: add\nobjectClass: olcSchemaConfig\ncn: ring\n"
                     "olcAttributeTypes: ( 1.3.6.1.4.1.99999.7.1 NAME 'ringBadge' EQUALITY caseIgnoreMatch "
                     "SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 )\nolcObjectClasses: ( 1.3.6.1.4.1.99999.7.2 "
                     "NAME 'ringHolder' SUP top AUXILIARY MAY ringBadge )\n")
        cn_config(a, "dn: olcOverlay=refint,olcDatabase={1}mdb,cn=config\nchangetype: add\n"
                     "objectClass: olcOverlayConfig\nolcOverlay: refint\nolcRefintAttribute: member\n")
        # One key changed on two servers in turn: the later change wins.
        cn_config(a, GLOBAL + "replace: olcTimeLimit\nolcTimeLimit: 11\n")
        time.sleep(0.05)
        cn_config(b, GLOBAL + "replace: olcTimeLimit\nolcTimeLimit: 22\n")
        shared = wait_same(nodes, check=lambda: all(values(n, "olcTimeLimit", "cn=config") == ["22"]
                                                    and values(n, "olcSizeLimit", "cn=config") == ["321"]
                                                    for n in nodes))
        text = "\n".join(" ".join(block) for block in shared)
        assert "description eq" in text and "ou=Groups" in text and "ringBadge" in text, text
        assert "refint" in text, text
        # Server IDs and consumers are never copied.
        assert [values(n, "olcServerID", "cn=config") for n in nodes] == [["1"], ["2"], ["3"]]
        for n in nodes:
            provs = " ".join(values(n, "pandoReplicationConsumer"))
            assert n.url not in provs and provs.count("rid =") == 2, provs
        # The schema made on C serves an entry written on A, replicated
        # to B, where the overlay made on A holds.
        r = subprocess.run(["ldapmodify", "-x", "-H", a.url, "-D", ADMIN_DN, "-w", PW],
                           input="dn: uid=alice,%s\nchangetype: modify\nadd: objectClass\nobjectClass: ringHolder\n"
                                 "-\nadd: ringBadge\nringBadge: gold\n" % PEOPLE,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        # A server down while a key changes takes it when it is back.
        c.stop()
        cn_config(a, GLOBAL + "replace: olcSizeLimit\nolcSizeLimit: 654\n")
        c.start(keep_port=True)
        c.admin_pw = PW
        wait_same(nodes, check=lambda: values(c, "olcSizeLimit", "cn=config") == ["654"])
        assert values(c, "olcServerID", "cn=config") == ["3"]
    finally:
        group.stop()


CONFIG_STATE = "2.25.15972167931155808496075090497880241257.1.5"


def test_the_configuration_state_is_for_administrators_only(tmp_path):
    """Anonymous and ordinary users are refused (insufficientAccessRights,
    nothing read); a request with a value is a protocolError; an
    administrator reads the shared keys, never a consumer's password nor
    the server ID."""
    srv = Pando(tmp_path / "srv", demo=True, config=PUBLIC_READ + "\n[replication]\nserver_id = 9\n"
                "[[replication.consumer]]\nrid = 1\nprovider = \"ldap://127.0.0.1:1\"\nsearch_base = \"%s\"\n"
                "bind_dn = \"%s\"\ncredentials = \"consumer-secret\"\nretry = \"60 1\"\n" % ("ou=Groups," + SUFFIX,
                                                                                 ADMIN_DN))
    try:
        srv.start()
        anon = subprocess.run(["ldapexop", "-x", "-H", srv.url, CONFIG_STATE], capture_output=True, text=True)
        assert "Insufficient access (50)" in anon.stderr and not anon.stdout, (anon.stdout, anon.stderr)
        cn_config(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: userPassword\nuserPassword: alice-pw\n"
                  % PEOPLE)
        user = subprocess.run(["ldapexop", "-x", "-H", srv.url, "-D", "uid=alice," + PEOPLE, "-w", "alice-pw",
                               CONFIG_STATE], capture_output=True, text=True)
        assert "Insufficient access (50)" in user.stderr, (user.stdout, user.stderr)
        valued = subprocess.run(["ldapexop", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url, CONFIG_STATE + ":x"],
                                capture_output=True, text=True)
        assert "Protocol error (2)" in valued.stderr, (valued.stdout, valued.stderr)
        admin = subprocess.run(["ldapexop", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url, CONFIG_STATE],
                               capture_output=True, text=True)
        assert admin.returncode == 0, admin.stderr
        assert "consumer-secret" not in admin.stdout and "server_id = 9" not in admin.stdout, admin.stdout
    finally:
        srv.stop_and_verify()
