"""Every operation type passes the same stack (issue 38): an error-injection
rule with no operation and no DN named refuses each one, whatever tree it
is aimed at (the store, the root DSE, the subschema entry, cn=config,
cn=Monitor, cn=accesslog, cn=changelog) and whoever sends it. An operation
that went around the stack would run instead of being refused."""

import subprocess

import ldap3

from conftest import Pando

SUFFIX = "dc=example,dc=com"
PEOPLE = "ou=People," + SUFFIX
CONFIG = """
[[overlay]]
type = "accesslog"
ops = ["writes"]

[[overlay]]
type = "retrochangelog"

[[overlay]]
type = "errors"
rules = ["result=53 text=\\"refused by the stack\\""]
"""

TARGETS = ["", "cn=Subschema", "cn=config", "cn=Monitor", "cn=accesslog", "cn=changelog", PEOPLE]


def refused(c, what):
    r = c.result
    assert r["result"] == 53 and "refused by the stack" in r["description"] + r["message"], (what, r)


def every_operation(c):
    """Each operation type once per tree it can be aimed at, each refused."""
    for base in TARGETS:
        c.search(base, "(objectClass=*)", search_scope=ldap3.BASE, attributes=["*", "+"])
        refused(c, "search " + base)
        c.compare(base or "cn=Subschema", "objectClass", "top")
        refused(c, "compare " + base)
    for parent in [PEOPLE, "cn=config", "cn=Monitor", "cn=accesslog", "cn=changelog"]:
        dn = "cn=stack-test," + parent
        c.add(dn, ["person"], {"cn": "stack-test", "sn": "x"})
        refused(c, "add under " + parent)
    for dn in ["uid=alice," + PEOPLE, "olcDatabase={1}mdb,cn=config", "cn=Monitor",
               "cn=accesslog", "cn=changelog"]:
        c.modify(dn, {"description": [(ldap3.MODIFY_REPLACE, ["x"])]})
        refused(c, "modify " + dn)
        c.modify_dn(dn, "cn=renamed")
        refused(c, "modify DN " + dn)
        c.delete(dn)
        refused(c, "delete " + dn)
    for oid, value in [("1.3.6.1.4.1.4203.1.11.3", None),          # WhoAmI
                       ("1.3.6.1.4.1.4203.1.11.1", None),          # password modify
                       ("1.3.6.1.1.8", b"\x30\x03\x02\x01\x07"),   # cancel (message 7)
                       ("1.3.6.1.4.1.1466.20037", None),           # StartTLS
                       ("1.2.3.4.5.6.7", None)]:                   # unknown
        c.extended(oid, value)
        refused(c, "extended " + oid)


def test_every_operation_type_is_refused_by_an_error_injection_layer(tmp_path):
    srv = Pando(tmp_path, demo=True, config=CONFIG, name="stack").start()
    try:
        server = ldap3.Server("127.0.0.1", port=srv.port, get_info=ldap3.NONE, connect_timeout=10)
        # Bind itself is refused, for the administrator too.
        c = ldap3.Connection(server, user=srv.admin_dn, password=srv.admin_pw,
                             raise_exceptions=False, receive_timeout=30)
        c.open()
        assert not c.bind()
        refused(c, "bind")
        # Anonymous: every other operation, every tree.
        every_operation(c)
        # Error injection comes first in the stack (ops::stack::ADMISSION):
        # a request whose controls the next layer would refuse (an unknown
        # critical one: unavailableCriticalExtension) or that asks to run
        # as another identity is refused by the injected rule instead.
        c.search(PEOPLE, "(uid=alice)", controls=[("1.2.3.4.5.6.7.8", True, None)])
        refused(c, "search with an unknown critical control")
        c.search(PEOPLE, "(uid=alice)", controls=[("2.16.840.1.113730.3.4.18", True, b"dn:uid=alice," + PEOPLE.encode())])
        refused(c, "search with proxied authorization")
        # Abandon has no answer: the connection goes on, still refusing.
        c.abandon(3)
        c.search(PEOPLE, "(uid=alice)")
        refused(c, "search after abandon")
        c.unbind()
        # Over ldapi as the owner (SASL EXTERNAL, the administrator): bind
        # is refused as well, and every operation with it.
        rc, out, err = srv.ldap("ldapsearch", "-b", PEOPLE, "(uid=alice)", auth=None,
                                url=srv.ldapi_url)
        assert rc == 53 and "refused by the stack" in out + err, (rc, out, err)
        r = subprocess.run(["ldapwhoami", "-Q", "-Y", "EXTERNAL", "-H", srv.ldapi_url],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "refused by the stack" in r.stdout + r.stderr, r
        assert srv.alive()
    finally:
        srv.stop_and_verify()
