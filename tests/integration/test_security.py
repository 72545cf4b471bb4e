"""Security: access control rules, SASL EXTERNAL and running without a root
DN, require_secure_binds, failed-bind throttling, per-requester limits and
the modes of the files in the data directory.

Servers are shared per configuration (module-scoped fixtures). Demo users get
the password "pw-<uid>", stored as {SSHA} so that binds are cheap (bind
timings are measured in the throttling tests).
"""

import base64
import hashlib
import os
import re
import socket
import stat
import subprocess
import time

import pytest

import ber
from ber import SCOPE_BASE, f_eq, f_not, message, search_op
from conftest import (ADMIN_DN, GROUPS, PANDO_BIN, PEOPLE, SUFFIX, Pando, free_port, have, ldif_entry,
                      parse_ldif, person_attrs, wait_port)

pytestmark = pytest.mark.skipif(not (have("ldapsearch") and have("ldapwhoami") and have("ldapmodify")),
                                 reason="ldap-utils not installed")

ACL = "ou=Acl," + SUFFIX
SVC = "uid=svc,ou=Svc," + SUFFIX

# result codes
SUCCESS, SIZE_LIMIT, COMPARE_FALSE, COMPARE_TRUE = 0, 4, 5, 6
PROTOCOL_ERROR, STRONGER_AUTH, ADMIN_LIMIT, CONFIDENTIALITY = 2, 8, 11, 13
NO_SUCH_OBJECT, INAPPROPRIATE_AUTH, INVALID_CREDENTIALS, INSUFFICIENT_ACCESS = 32, 48, 49, 50
UNAVAILABLE = 52


def dn_of(uid):
    return "uid=%s,%s" % (uid, PEOPLE)


def pw_of(uid):
    return "pw-" + uid


def ssha(password):
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def peercred_dn():
    return "gidNumber=%d+uidNumber=%d,cn=peercred,cn=external,cn=auth" % (os.getgid(), os.getuid())


# ------------------------------------------------------------------ server


def start(tmp_path_factory, name, config, demo=True, admin_password=True):
    """admin_password=False: a server without root DN, so without the file."""
    s = Pando(tmp_path_factory.mktemp(name), demo=demo, config=config, name=name).start()
    assert (s.admin_pw is not None) == admin_password, s.logs()
    return s


# ------------------------------------------------------------------ clients


def tool(srv, name, *args, who=None, over="tcp", input=None, timeout=60):
    """Run an ldap-utils tool. who: None (anonymous), "admin", "ext" (SASL
    EXTERNAL over ldapi), a demo uid, or (dn, password). over: "tcp" or
    "ldapi" (simple binds). Returns (rc, stdout, stderr)."""
    if who == "ext":
        cmd = [name, "-Y", "EXTERNAL", "-Q", "-H", srv.ldapi_url]
    else:
        cmd = [name, "-x", "-H", srv.ldapi_url if over == "ldapi" else srv.url]
        if who == "admin":
            cmd += ["-D", srv.admin_dn, "-w", srv.admin_pw]
        elif isinstance(who, str):
            cmd += ["-D", dn_of(who), "-w", pw_of(who)]
        elif who is not None:
            cmd += ["-D", who[0], "-w", who[1]]
    cmd += list(args)
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def search(srv, base, filt="(objectClass=*)", *attrs, scope="base", who=None, over="tcp", extra=()):
    """ldapsearch -LLL; returns (rc, entries, stderr)."""
    rc, out, err = tool(srv, "ldapsearch", "-LLL", "-o", "ldif-wrap=no", *extra, "-b", base, "-s", scope, filt,
                        *attrs, who=who, over=over)
    return rc, parse_ldif(out), err


def modify(srv, ldif, who="admin", over="tcp"):
    return tool(srv, "ldapmodify", who=who, over=over, input=ldif)


def add(srv, ldif, who="admin", over="tcp"):
    return tool(srv, "ldapmodify", "-a", who=who, over=over, input=ldif)


def whoami(srv, who, over="tcp"):
    rc, out, err = tool(srv, "ldapwhoami", who=who, over=over)
    return rc, out.strip(), err


def compare(srv, dn, ava, who=None):
    rc, out, err = tool(srv, "ldapcompare", dn, ava, who=who)
    return rc


def passwd(srv, who, new, user=None):
    """ldappasswd (Password Modify): the LDAP result code (ldappasswd itself exits 1 on any error)."""
    args = ["-s", new] + ([user] if user else [])
    rc, out, err = tool(srv, "ldappasswd", *args, who=who)
    if rc == 0:
        return 0
    m = re.search(r"\((\d+)\)", out + err)
    assert m, "ldappasswd failed without a result code: rc=%d %s %s" % (rc, out, err)
    return int(m.group(1))


def replace_ldif(dn, attr, *values):
    lines = ["dn: " + dn, "changetype: modify", "replace: " + attr]
    lines += ["%s: %s" % (attr, v) for v in values]
    return "\n".join(lines) + "\n-\n\n"


def password_ldif(uids):
    return "".join(replace_ldif(dn_of(u), "userPassword", ssha(pw_of(u))) for u in uids)


def set_passwords(srv, uids, who="admin"):
    rc, out, err = modify(srv, password_ldif(uids), who=who)
    assert rc == 0, "setting passwords failed (rc=%d): %s" % (rc, err)


def add_entries(srv, entries, who="admin"):
    ldif = "\n".join(ldif_entry(d, a) for d, a in entries)
    rc, out, err = add(srv, ldif, who=who)
    assert rc == 0, "adding entries failed (rc=%d): %s\n%s" % (rc, err, srv.logs())


def dns(entries):
    return {d.lower() for d, _ in entries}


def attr(entry, name):
    return [v for k, vs in entry[1].items() if k.lower() == name.lower() for v in vs]


def names(entry):
    return {k.lower() for k in entry[1]}


def by_uid(entries):
    out = {}
    for e in entries:
        u = attr(e, "uid")
        out[u[0].lower() if u else e[0].lower()] = e
    return out


def visible(srv, dn, who=None, over="tcp"):
    """Search `dn` with scope base: (rc, [dns])."""
    rc, es, err = search(srv, dn, who=who, over=over)
    return rc, sorted(dns(es))


def assert_visible(srv, dn, who=None, over="tcp", what=""):
    rc, got = visible(srv, dn, who=who, over=over)
    assert (rc, got) == (0, [dn.lower()]), "%s: %s must see %s: rc=%d entries=%s" % (what, who, dn, rc, got)


def assert_invisible(srv, dn, who=None, over="tcp", what=""):
    rc, got = visible(srv, dn, who=who, over=over)
    assert (rc, got) == (NO_SUCH_OBJECT, []), "%s: %s must get noSuchObject (32) for %s: rc=%d entries=%s" % (
        what, who, dn, rc, got)


# ------------------------------------------------------------------ raw BER


class Raw(ber.Conn):
    """ber.Conn with an optional source address (127.0.0.x)."""

    def __init__(self, port, src=None, timeout=10.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if src:
            self.sock.bind((src, 0))
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""
        self.eof = False


def sasl_bind_op(mechanism, credentials=None):
    creds = ber.octets(mechanism)
    if credentials is not None:
        creds += ber.octets(credentials)
    return ber.tlv(0x60, ber.integer(3) + ber.octets("") + ber.tlv(0xA3, creds))


def raw_search(c, msgid, base, scope=SCOPE_BASE, filt=None, attrs=("1.1",)):
    c.send(message(msgid, search_op(base, scope, filt, list(attrs))))
    entries = []
    while True:
        m = c.recv_msg()
        assert m is not None, "connection closed during search of %s" % base
        if m["op"] == "entry":
            entries.append(m)
        elif m["op"] == "searchDone":
            return entries, m
        else:
            pytest.fail("unexpected message %r" % m)


def timed_bind(srv, dn, password, src=None):
    """One simple bind on a new connection: (resultCode, seconds)."""
    with Raw(srv.port, src=src, timeout=30) as c:
        t0 = time.monotonic()
        code = ber.simple_bind(c, dn, password)
        return code, time.monotonic() - t0


def notices(msgs):
    return [m for m in msgs if m["id"] == 0 and m["op"] == "extended"]


# ================================================================== A. default rules

@pytest.fixture(scope="module")
def dflt(tmp_path_factory):
    """No configuration at all: built-in access rules, default [auth]."""
    s = start(tmp_path_factory, "defaults", None)
    set_passwords(s, ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"])
    yield s
    s.stop_and_verify()


def test_file_modes(dflt):
    d = dflt.data_dir
    assert stat.S_IMODE(d.stat().st_mode) == 0o700, "data dir mode %o" % stat.S_IMODE(d.stat().st_mode)
    pw = d / "admin-password"
    assert stat.S_IMODE(pw.stat().st_mode) == 0o600, "admin-password mode %o" % stat.S_IMODE(pw.stat().st_mode)
    for name in ("data.mdb", "lock.mdb"):
        p = d / "db" / name
        assert p.exists(), "%s missing" % p
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o077 == 0, "%s is group/world accessible: mode %o" % (p, mode)


def test_defaults_anonymous_sees_nothing(dflt):
    for base, scope in ((SUFFIX, "sub"), (PEOPLE, "one"), (dn_of("alice"), "base"), (GROUPS, "sub")):
        rc, es, err = search(dflt, base, scope=scope)
        assert (rc, es) == (NO_SUCH_OBJECT, []), "anonymous search of %s: rc=%d entries=%s" % (base, rc, dns(es))


def test_defaults_root_dse_and_subschema_public(dflt):
    rc, es, err = search(dflt, "", "(objectClass=*)", "namingContexts")
    assert rc == 0 and len(es) == 1, (rc, es, err)
    assert [v.lower() for v in attr(es[0], "namingContexts")] == [SUFFIX], es
    rc, es, err = search(dflt, "cn=Subschema", "(objectClass=*)", "objectClasses")
    assert rc == 0 and len(es) == 1, (rc, es, err)
    assert attr(es[0], "objectClasses"), "subschema without objectClasses for anonymous"


def test_defaults_anonymous_can_bind(dflt):
    assert whoami(dflt, "alice")[:2] == (0, "dn:" + dn_of("alice"))
    rc, out, err = whoami(dflt, None)
    assert (rc, out) == (0, "anonymous"), (rc, out, err)


def test_defaults_users_read_all_but_passwords(dflt):
    rc, es, err = search(dflt, SUFFIX, "(objectClass=*)", "*", "userPassword", scope="sub", who="bob")
    assert rc == 0, err
    assert len(es) == 1 + 2 + 10 + 6, "bob should read the whole tree: %s" % sorted(dns(es))
    with_pw = [d for d, a in es if "userpassword" in {k.lower() for k in a}]
    assert with_pw == [], "userPassword visible to a user: %s" % with_pw
    alice = by_uid(es)["alice"]
    assert attr(alice, "mail") == ["alice@example.com"] and attr(alice, "uidNumber") == ["1001"], alice
    # not even their own
    rc, es, err = search(dflt, dn_of("bob"), "(objectClass=*)", "userPassword", "uid", who="bob")
    assert rc == 0 and len(es) == 1 and names(es[0]) == {"uid"}, (rc, es)
    # nor through a search the uid index answers exactly (entries then go
    # from the store to the wire undecoded: the per-attribute check holds)
    rc, es, err = search(dflt, SUFFIX, "(uid=alice)", "*", "userPassword", scope="sub", who="bob")
    assert rc == 0 and len(es) == 1, (rc, es, err)
    assert "userpassword" not in names(es[0]) and attr(es[0], "uid") == ["alice"], es


def test_defaults_admin_reads_passwords(dflt):
    rc, es, err = search(dflt, dn_of("alice"), "(objectClass=*)", "userPassword", who="admin")
    assert rc == 0 and len(es) == 1, (rc, err)
    # {SSHA} as loaded, or {ARGON2} once alice has bound (upgrade on bind).
    assert attr(es[0], "userPassword") and attr(es[0], "userPassword")[0].startswith(("{SSHA}", "{ARGON2}")), es


def test_defaults_self_password_change(dflt):
    # Password Modify (ldappasswd) on oneself
    rc = passwd(dflt, "grace", "new-grace")
    assert rc == 0, "ldappasswd on oneself: %d" % rc
    assert whoami(dflt, (dn_of("grace"), "new-grace"))[:2] == (0, "dn:" + dn_of("grace"))
    # modify replace userPassword on oneself
    rc, out, err = modify(dflt, replace_ldif(dn_of("heidi"), "userPassword", "new-heidi"), who="heidi")
    assert rc == 0, "self replace userPassword: rc=%d %s" % (rc, err)
    assert whoami(dflt, (dn_of("heidi"), "new-heidi"))[:2] == (0, "dn:" + dn_of("heidi"))


def test_defaults_user_cannot_write_other_attributes(dflt):
    rc, out, err = modify(dflt, replace_ldif(dn_of("alice"), "telephoneNumber", "+1 555 9999"), who="alice")
    assert rc == INSUFFICIENT_ACCESS, "alice modifying her telephoneNumber: rc=%d %s" % (rc, err)
    rc, out, err = modify(dflt, replace_ldif(dn_of("bob"), "description", "x"), who="alice")
    assert rc == INSUFFICIENT_ACCESS, "alice modifying bob: rc=%d %s" % (rc, err)
    rc, es, err = search(dflt, dn_of("alice"), "(objectClass=*)", "telephoneNumber", who="admin")
    assert attr(es[0], "telephoneNumber") == ["+1 555 0101"], es


def test_defaults_user_cannot_change_others_password(dflt):
    rc = passwd(dflt, "alice", "stolen", dn_of("bob"))
    assert rc == INSUFFICIENT_ACCESS, "alice's ldappasswd on bob: %d" % rc
    rc, out, err = modify(dflt, replace_ldif(dn_of("bob"), "userPassword", "stolen"), who="alice")
    assert rc == INSUFFICIENT_ACCESS, "alice replacing bob's userPassword: rc=%d %s" % (rc, err)
    assert whoami(dflt, "bob")[0] == 0, "bob's password changed"


def test_defaults_anonymous_writes_need_auth(dflt):
    rc, out, err = modify(dflt, replace_ldif(dn_of("alice"), "description", "x"), who=None)
    assert rc == STRONGER_AUTH, "anonymous modify: rc=%d %s" % (rc, err)
    rc, out, err = tool(dflt, "ldapdelete", dn_of("judy"), who=None)
    assert rc == STRONGER_AUTH, "anonymous delete: rc=%d %s" % (rc, err)
    # compare on an invisible entry: noSuchObject
    assert compare(dflt, dn_of("alice"), "uid:alice", who=None) == NO_SUCH_OBJECT


def test_defaults_matched_dn_not_leaked(dflt):
    missing = "uid=nobody," + PEOPLE
    with dflt.raw() as c:
        entries, done = raw_search(c, 1, missing)
        assert entries == [] and done["code"] == NO_SUCH_OBJECT, done
        assert done["matched"] == "", "anonymous learnt the matchedDN %r" % done["matched"]
        entries, done = raw_search(c, 2, "uid=x,ou=Nowhere," + SUFFIX)
        assert done["code"] == NO_SUCH_OBJECT and done["matched"] == "", done
    with dflt.raw() as c:
        assert ber.simple_bind(c, dn_of("bob"), pw_of("bob")) == 0
        entries, done = raw_search(c, 2, missing)
        assert entries == [] and done["code"] == NO_SUCH_OBJECT, done
        assert done["matched"] == PEOPLE, "user: matchedDN %r, want %r" % (done["matched"], PEOPLE)


# ------------------------------------------------------------------ B. EXTERNAL on the default server


def test_external_whoami_peercred(dflt):
    rc, out, err = whoami(dflt, "ext")
    assert rc == 0, err
    assert out == "dn:" + peercred_dn(), out


def test_ldapi_owner_is_admin(dflt):
    e = ("cn=ext-made," + SUFFIX, {"objectClass": ["organizationalRole"], "cn": ["ext-made"]})
    rc, out, err = add(dflt, ldif_entry(*e), who="ext")
    assert rc == 0, "ldapadd -Y EXTERNAL: rc=%d %s" % (rc, err)
    rc, out, err = modify(dflt, replace_ldif(e[0], "description", "by ldapi owner"), who="ext")
    assert rc == 0, "ldapmodify -Y EXTERNAL: rc=%d %s" % (rc, err)
    rc, es, err = search(dflt, dn_of("alice"), "(objectClass=*)", "userPassword", who="ext")
    assert rc == 0 and attr(es[0], "userPassword"), "ldapi owner cannot read userPassword: %s %s" % (es, err)
    rc, es, err = search(dflt, e[0], "(objectClass=*)", "description", who="bob")
    assert rc == 0 and attr(es[0], "description") == ["by ldapi owner"], es
    rc, out, err = tool(dflt, "ldapdelete", e[0], who="ext")
    assert rc == 0, "ldapdelete -Y EXTERNAL: rc=%d %s" % (rc, err)


def test_simple_bind_over_ldapi_is_not_the_owner(dflt):
    """The ldapi owner's role belongs to its EXTERNAL identity: a simple bind
    as an ordinary user over the same socket is just that user."""
    rc, es, err = search(dflt, dn_of("alice"), "(objectClass=*)", "userPassword", who="bob", over="ldapi")
    assert rc == 0 and es and not attr(es[0], "userPassword"), (
        "bob over the owner's ldapi socket read a password: %s %s" % (es, err))
    e = ("cn=bob-made," + SUFFIX, {"objectClass": ["organizationalRole"], "cn": ["bob-made"]})
    rc, out, err = add(dflt, ldif_entry(*e), who="bob", over="ldapi")
    assert rc == 50, "bob over ldapi added an entry: rc=%d %s" % (rc, err)


def test_external_over_tcp_refused(dflt):
    with dflt.raw() as c:
        c.send(message(1, sasl_bind_op("EXTERNAL")))
        m = c.recv_msg()
        assert m is not None and m["op"] == "bind", m
        assert m["code"] == INAPPROPRIATE_AUTH, "EXTERNAL over plain TCP: %d %s" % (m["code"], m["diag"])
        # the connection stays anonymous
        entries, done = raw_search(c, 2, SUFFIX)
        assert done["code"] == NO_SUCH_OBJECT


# ================================================================== A. configured rules


def bt(who, rights):
    w = '"%s"' % who if isinstance(who, str) else "[" + ", ".join('"%s"' % x for x in who) + "]"
    r = '"%s"' % rights if isinstance(rights, str) else "[" + ", ".join('"%s"' % x for x in rights) + "]"
    return "{ who = %s, rights = %s }" % (w, r)


ADM = bt("admins", "all")


def rule(by, dn=None, scope=None, attrs=None, filt=None, dn_regex=None):
    out = ["[[access]]"]
    if dn is not None:
        out.append('dn = "%s"' % dn)
    if scope is not None:
        out.append('scope = "%s"' % scope)
    if dn_regex is not None:
        out.append("dn_regex = '%s'" % dn_regex)
    if filt is not None:
        out.append('filter = "%s"' % filt)
    if attrs is not None:
        out.append("attrs = [%s]" % ", ".join('"%s"' % a for a in attrs))
    out.append("by = [%s]" % ", ".join(by))
    return "\n".join(out) + "\n\n"


SUBJECTS = {  # entry cn -> clauses
    "s-anyone": [ADM, bt("*", "read")],
    "s-anyone2": [ADM, bt("anyone", "read")],
    "s-anon": [ADM, bt("anonymous", "read")],
    "s-users": [ADM, bt("users", "read")],
    "s-admins": [ADM, bt("users", "search")],
    "s-dn": [ADM, bt("dn:" + dn_of("bob"), "read")],
    "s-subtree": [ADM, bt("subtree:" + PEOPLE, "read")],
    "s-group": [ADM, bt("group:cn=g-outer," + GROUPS, "read")],
    "s-ip-ok": [ADM, bt("ip:127.0.0.1", "read")],
    "s-ip-net": [ADM, bt("ip:127.0.0.0/8", "read")],
    "s-ip-no": [ADM, bt("ip:10.0.0.0/8", "read")],
    "s-tls": [bt(["users", "tls"], "read"), ADM],
    "s-ldapi": [bt(["users", "ldapi"], "read"), ADM],
}

RIGHTS = {  # entry cn -> clauses (bob has the right, carol something without it)
    "r-compare": [ADM, bt("dn:" + dn_of("bob"), "compare"), bt("dn:" + dn_of("carol"), ["read", "search"])],
    "r-search": [ADM, bt("dn:" + dn_of("bob"), "search"), bt("dn:" + dn_of("carol"), ["read"])],
    "r-read": [ADM, bt("dn:" + dn_of("bob"), "read"), bt("dn:" + dn_of("carol"), "search")],
    "r-write": [ADM, bt("dn:" + dn_of("bob"), "write"), bt("dn:" + dn_of("carol"), "read")],
}

CONTAINERS = {  # ou -> clauses for its children
    "r-add": [ADM, bt("dn:" + dn_of("bob"), ["add", "read", "search"]), bt("dn:" + dn_of("carol"), "read")],
    "r-del": [ADM, bt("dn:" + dn_of("bob"), ["delete", "read", "search"]), bt("dn:" + dn_of("carol"), "read")],
    "r-move": [ADM, bt("dn:" + dn_of("bob"), ["add", "delete", "read", "search"])],
}

SCOPES = ["base", "one", "sub", "children"]


def acl_config():
    c = ""
    c += rule([ADM, bt("*", "none")], dn=dn_of("heidi"), scope="base", attrs=["userPassword"])
    c += rule([ADM, bt("self", ["auth", "write"]), bt("*", "auth")], attrs=["userPassword"])
    c += rule([ADM, bt("self", "read")], dn=PEOPLE, scope="one", attrs=["telephoneNumber"])
    c += rule([ADM, bt("users", "none")], dn_regex="^uid=[a-c][^,]*,ou=people,dc=example,dc=com$",
              attrs=["departmentNumber"])
    c += rule([ADM, bt("users", "none")], dn=PEOPLE, filt="(departmentNumber=Legal)", attrs=["mail"])
    c += rule([ADM, bt("users", ["read"])], dn=PEOPLE, attrs=["loginShell"])
    c += rule([bt("anonymous", "read")], dn="cn=staff-posix," + GROUPS, scope="base")
    c += rule([ADM], dn=GROUPS, filt="(objectClass=posixGroup)")
    for cn, by in list(SUBJECTS.items()) + list(RIGHTS.items()):
        c += rule(by, dn="cn=%s,%s" % (cn, ACL), scope="base")
    for ou, by in CONTAINERS.items():
        c += rule(by, dn="ou=%s,%s" % (ou, ACL), scope="children")
    for s in SCOPES:
        c += rule([ADM, bt("dn:" + dn_of("bob"), "read")], dn="ou=sc-%s,%s" % (s, ACL), scope=s)
    c += rule([ADM], dn=ACL)
    c += rule([ADM, bt("users", "read")])
    return c


def role(cn, parent=ACL, desc=None):
    return ("cn=%s,%s" % (cn, parent), {"objectClass": ["organizationalRole"], "cn": [cn],
                                         "description": [desc or cn]})


def ou(name, parent=ACL):
    return ("ou=%s,%s" % (name, parent), {"objectClass": ["organizationalUnit"], "ou": [name]})


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    s = start(tmp_path_factory, "acl", acl_config())
    set_passwords(s, ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"])
    ents = [ou("Acl", SUFFIX)]
    ents += [role(cn) for cn in SUBJECTS]
    ents += [role(cn, desc="secret") for cn in RIGHTS]
    ents += [ou(o) for o in CONTAINERS]
    ents += [role("d1", "ou=r-del," + ACL), role("d2", "ou=r-del," + ACL), role("m1", "ou=r-move," + ACL)]
    for sc in SCOPES:
        x = "ou=sc-%s,%s" % (sc, ACL)
        ents += [ou("sc-" + sc), role("c", x), role("g", "cn=c," + x)]
    ents += [ou("Svc", SUFFIX),
             (SVC, person_attrs("svc", 0, {"userPassword": [ssha("pw-svc")]}))]
    ents += [("cn=g-inner," + GROUPS, {"objectClass": ["groupOfNames"], "cn": ["g-inner"],
                                        "member": [dn_of("carol")]}),
             ("cn=g-uniq," + GROUPS, {"objectClass": ["groupOfUniqueNames"], "cn": ["g-uniq"],
                                       "uniqueMember": [dn_of("erin")]}),
             ("cn=g-outer," + GROUPS, {"objectClass": ["groupOfNames"], "cn": ["g-outer"],
                                        "member": [dn_of("dave"), "cn=g-inner," + GROUPS,
                                                   "cn=g-uniq," + GROUPS]})]
    add_entries(s, ents)
    yield s
    s.stop_and_verify()


def sdn(cn):
    return "cn=%s,%s" % (cn, ACL)


SVC_WHO = (SVC, "pw-svc")


# --- subjects


def test_subject_anyone(acl):
    for cn in ("s-anyone", "s-anyone2"):
        for who in (None, "bob", SVC_WHO):
            assert_visible(acl, sdn(cn), who=who, what=cn)
        rc, es, err = search(acl, sdn(cn), "(objectClass=*)", "description", who=None)
        assert attr(es[0], "description") == [cn], es


def test_subject_anonymous(acl):
    assert_visible(acl, sdn("s-anon"), who=None, what="anonymous")
    assert_invisible(acl, sdn("s-anon"), who="bob", what="anonymous")
    assert_invisible(acl, sdn("s-anon"), who=SVC_WHO, what="anonymous")


def test_subject_users(acl):
    assert_visible(acl, sdn("s-users"), who="bob", what="users")
    assert_visible(acl, sdn("s-users"), who=SVC_WHO, what="users")
    assert_invisible(acl, sdn("s-users"), who=None, what="users")


def test_subject_self(acl):
    rc, es, err = search(acl, PEOPLE, "(|(uid=alice)(uid=bob))", "cn", "telephoneNumber", scope="one",
                         who="alice")
    assert rc == 0, err
    got = {d.lower(): (d, a) for d, a in es}
    a, b = got[dn_of("alice").lower()], got[dn_of("bob").lower()]
    assert attr(a, "telephoneNumber") == ["+1 555 0101"], "alice must read her own telephoneNumber: %s" % (a,)
    assert attr(b, "telephoneNumber") == [], "alice must not read bob's telephoneNumber: %s" % (b,)
    assert attr(b, "cn") == ["Bob Builder"], b
    rc, es, err = search(acl, dn_of("bob"), "(objectClass=*)", "telephoneNumber", who="admin")
    assert attr(es[0], "telephoneNumber") == ["+1 555 0102"], es
    # self holds only for an authenticated requester
    rc, es, err = search(acl, dn_of("alice"), who=None)
    assert (rc, es) == (NO_SUCH_OBJECT, []), (rc, es)


def test_subject_admins(acl):
    rc, es, err = search(acl, sdn("s-admins"), "(objectClass=*)", "description", who="admin")
    assert rc == 0 and attr(es[0], "description") == ["s-admins"], (rc, es, err)
    rc, es, err = search(acl, sdn("s-admins"), "(objectClass=*)", "description", who="ext")
    assert rc == 0 and attr(es[0], "description") == ["s-admins"], "ldapi owner is an admin: %s %s" % (es, err)
    # users: search but not read -> the base exists but is not returned
    rc, es, err = search(acl, sdn("s-admins"), who="bob")
    assert (rc, es) == (0, []), (rc, es)


def test_admins_subject_to_rules(acl):
    target = "cn=staff-posix," + GROUPS
    assert_visible(acl, target, who=None, what="anonymous-only rule")
    assert_invisible(acl, target, who="admin", what="root DN under an anonymous-only rule")
    assert_invisible(acl, target, who="ext", what="ldapi owner under an anonymous-only rule")
    assert_invisible(acl, target, who="bob", what="user under an anonymous-only rule")
    rc, out, err = modify(acl, replace_ldif(target, "description", "x"), who="admin")
    assert rc == NO_SUCH_OBJECT, "admin modifying an entry no rule lets it see: rc=%d %s" % (rc, err)


def test_subject_dn(acl):
    assert_visible(acl, sdn("s-dn"), who="bob", what="dn:")
    assert_invisible(acl, sdn("s-dn"), who="alice", what="dn:")
    assert_invisible(acl, sdn("s-dn"), who=None, what="dn:")


def test_subject_subtree(acl):
    assert_visible(acl, sdn("s-subtree"), who="bob", what="subtree:")
    assert_visible(acl, sdn("s-subtree"), who="alice", what="subtree:")
    assert_invisible(acl, sdn("s-subtree"), who=SVC_WHO, what="subtree:")
    assert_invisible(acl, sdn("s-subtree"), who=None, what="subtree:")


def test_subject_group_direct(acl):
    assert_visible(acl, sdn("s-group"), who="dave", what="group: direct member")
    assert_invisible(acl, sdn("s-group"), who="bob", what="group: non-member")
    assert_invisible(acl, sdn("s-group"), who=None, what="group: anonymous")


def test_subject_group_nested(acl):
    assert_visible(acl, sdn("s-group"), who="carol", what="group: member of a nested groupOfNames")


def test_subject_group_nested_unique_member(acl):
    assert_visible(acl, sdn("s-group"), who="erin", what="group: uniqueMember of a nested groupOfUniqueNames")


def test_subject_ip(acl):
    assert_visible(acl, sdn("s-ip-ok"), who=None, what="ip:127.0.0.1")
    assert_visible(acl, sdn("s-ip-net"), who=None, what="ip:127.0.0.0/8")
    assert_invisible(acl, sdn("s-ip-no"), who=None, what="ip:10.0.0.0/8")
    assert_invisible(acl, sdn("s-ip-no"), who="bob", what="ip:10.0.0.0/8")
    # from another loopback address
    with Raw(acl.port, src="127.0.0.2") as c:
        es, done = raw_search(c, 1, sdn("s-ip-ok"))
        assert (len(es), done["code"]) == (0, NO_SUCH_OBJECT), "ip:127.0.0.1 held for 127.0.0.2: %r" % done
        es, done = raw_search(c, 2, sdn("s-ip-net"))
        assert (len(es), done["code"]) == (1, 0), "ip:127.0.0.0/8 did not hold for 127.0.0.2: %r" % done
    # ldapi has no address
    assert_invisible(acl, sdn("s-ip-ok"), who=None, over="ldapi", what="ip: over ldapi")


def test_subject_tls_never_without_tls(acl):
    assert_invisible(acl, sdn("s-tls"), who="bob", what="[users, tls] over plain TCP")
    assert_invisible(acl, sdn("s-tls"), who=None, what="[users, tls] anonymous")
    assert_visible(acl, sdn("s-tls"), who="admin", what="admins clause after [users, tls]")


def test_subject_ldapi(acl):
    assert_visible(acl, sdn("s-ldapi"), who="bob", over="ldapi", what="[users, ldapi] over ldapi")
    assert_invisible(acl, sdn("s-ldapi"), who="bob", over="tcp", what="[users, ldapi] over TCP")
    assert_invisible(acl, sdn("s-ldapi"), who=None, over="ldapi", what="[users, ldapi] anonymous over ldapi")


# --- rights


def test_right_auth(acl):
    rc, out, err = whoami(acl, "ivan")
    assert (rc, out) == (0, "dn:" + dn_of("ivan")), (rc, out, err)
    rc, out, err = whoami(acl, "heidi")
    assert rc == INVALID_CREDENTIALS, "bind with the right password but no auth right: rc=%d %s" % (rc, err)
    rc, out, err = whoami(acl, (dn_of("ivan"), "wrong"))
    assert rc == INVALID_CREDENTIALS, (rc, err)


def test_right_compare(acl):
    t = sdn("r-compare")
    assert compare(acl, t, "description:secret", who="bob") == COMPARE_TRUE
    assert compare(acl, t, "description:other", who="bob") == COMPARE_FALSE
    # compare level has no search: the entry cannot be searched
    assert visible(acl, t, who="bob") == (NO_SUCH_OBJECT, [])
    assert compare(acl, t, "description:secret", who="carol") == INSUFFICIENT_ACCESS, "visible, no compare"
    assert compare(acl, t, "description:secret", who="alice") == NO_SUCH_OBJECT, "invisible entry"
    assert compare(acl, t, "description:secret", who=None) == NO_SUCH_OBJECT, "invisible entry (anonymous)"


def test_right_search(acl):
    t = sdn("r-search")
    # search without read: the base is found but not returned
    rc, es, err = search(acl, t, who="bob")
    assert (rc, es) == (0, []), "bob (search only): rc=%d %s" % (rc, dns(es))
    # read without search: the base cannot be searched
    assert visible(acl, t, who="carol") == (NO_SUCH_OBJECT, []), "carol (read only)"
    assert visible(acl, t, who="alice") == (NO_SUCH_OBJECT, []), "alice (nothing)"


def test_right_read(acl):
    t = sdn("r-read")
    rc, es, err = search(acl, t, "(objectClass=*)", "description", who="bob")
    assert rc == 0 and dns(es) == {t.lower()} and attr(es[0], "description") == ["secret"], (rc, es)
    rc, es, err = search(acl, t, "(objectClass=*)", "description", who="carol")
    assert (rc, es) == (0, []), "carol (search only) must not get the entry: rc=%d %s" % (rc, es)


def test_right_write(acl):
    t = sdn("r-write")
    rc, out, err = modify(acl, replace_ldif(t, "description", "bob was here"), who="bob")
    assert rc == 0, "bob (write): rc=%d %s" % (rc, err)
    rc, out, err = modify(acl, replace_ldif(t, "description", "carol"), who="carol")
    assert rc == INSUFFICIENT_ACCESS, "carol (read): rc=%d %s" % (rc, err)
    rc, out, err = modify(acl, replace_ldif(t, "description", "alice"), who="alice")
    assert rc == NO_SUCH_OBJECT, "alice (invisible): rc=%d %s" % (rc, err)
    rc, out, err = modify(acl, replace_ldif(t, "description", "anon"), who=None)
    assert rc == STRONGER_AUTH, "anonymous: rc=%d %s" % (rc, err)
    rc, es, err = search(acl, t, "(objectClass=*)", "description", who="admin")
    assert attr(es[0], "description") == ["bob was here"], es


def test_right_add(acl):
    parent = "ou=r-add," + ACL
    rc, out, err = add(acl, ldif_entry(*role("by-bob", parent)), who="bob")
    assert rc == 0, "bob (add): rc=%d %s" % (rc, err)
    rc, out, err = add(acl, ldif_entry(*role("by-carol", parent)), who="carol")
    assert rc == INSUFFICIENT_ACCESS, "carol (read): rc=%d %s" % (rc, err)
    rc, out, err = add(acl, ldif_entry(*role("by-alice", parent)), who="alice")
    assert rc == NO_SUCH_OBJECT, "alice (nothing): rc=%d %s" % (rc, err)
    rc, out, err = add(acl, ldif_entry(*role("by-anon", parent)), who=None)
    assert rc == STRONGER_AUTH, "anonymous: rc=%d %s" % (rc, err)
    # the container itself is not covered by the children rule
    rc, out, err = add(acl, ldif_entry(*role("beside", ACL)), who="bob")
    assert rc == NO_SUCH_OBJECT, "bob adding outside the rule: rc=%d %s" % (rc, err)
    rc, es, err = search(acl, parent, scope="one", who="admin")
    assert dns(es) == {("cn=by-bob," + parent).lower()}, dns(es)


def test_right_delete(acl):
    parent = "ou=r-del," + ACL
    rc, out, err = tool(acl, "ldapdelete", "cn=d1," + parent, who="carol")
    assert rc == INSUFFICIENT_ACCESS, "carol (read): rc=%d %s" % (rc, err)
    rc, out, err = tool(acl, "ldapdelete", "cn=d1," + parent, who="alice")
    assert rc == NO_SUCH_OBJECT, "alice (nothing): rc=%d %s" % (rc, err)
    rc, out, err = tool(acl, "ldapdelete", "cn=d1," + parent, who=None)
    assert rc == STRONGER_AUTH, "anonymous: rc=%d %s" % (rc, err)
    rc, out, err = tool(acl, "ldapdelete", "cn=d1," + parent, who="bob")
    assert rc == 0, "bob (delete): rc=%d %s" % (rc, err)
    rc, es, err = search(acl, parent, scope="one", who="admin")
    assert dns(es) == {("cn=d2," + parent).lower()}, dns(es)


def test_right_modify_dn(acl):
    # delete but no add on the new DN
    rc, out, err = tool(acl, "ldapmodrdn", "-r", "cn=d2,ou=r-del," + ACL, "cn=d2x", who="bob")
    assert rc == INSUFFICIENT_ACCESS, "modrdn without add on the new DN: rc=%d %s" % (rc, err)
    # delete on the old and add on the new
    rc, out, err = tool(acl, "ldapmodrdn", "-r", "cn=m1,ou=r-move," + ACL, "cn=m1x", who="bob")
    assert rc == 0, "modrdn with delete+add: rc=%d %s" % (rc, err)
    rc, es, err = search(acl, "ou=r-move," + ACL, scope="one", who="admin")
    assert dns(es) == {("cn=m1x,ou=r-move," + ACL).lower()}, dns(es)


def test_password_modify_needs_write(acl):
    rc = passwd(acl, "alice", "stolen", dn_of("bob"))
    assert rc == INSUFFICIENT_ACCESS, "alice's ldappasswd on bob: %d" % rc
    rc = passwd(acl, "frank", "pw2-frank")
    assert rc == 0, "frank's ldappasswd on himself: %d" % rc
    assert whoami(acl, (dn_of("frank"), "pw2-frank"))[0] == 0
    assert whoami(acl, "bob")[0] == 0


# --- targets


@pytest.mark.parametrize("scope,expect", [("base", {"x"}), ("one", {"c"}), ("sub", {"x", "c", "g"}),
                                          ("children", {"c", "g"})])
def test_rule_scope(acl, scope, expect):
    x = "ou=sc-%s,%s" % (scope, ACL)
    targets = {"x": x, "c": "cn=c," + x, "g": "cn=g,cn=c," + x}
    got = set()
    for k, d in targets.items():
        rc, ds = visible(acl, d, who="bob")
        assert (rc, ds) in ((0, [d.lower()]), (NO_SUCH_OBJECT, [])), (k, rc, ds)
        if rc == 0:
            got.add(k)
    assert got == expect, "scope %s: bob sees %s, want %s" % (scope, sorted(got), sorted(expect))


def test_dn_regex_rule(acl):
    rc, es, err = search(acl, PEOPLE, "(objectClass=inetOrgPerson)", "departmentNumber", scope="one", who="bob")
    assert rc == 0 and len(es) == 10, (rc, err)
    got = {u: attr(e, "departmentNumber") for u, e in by_uid_dn(es).items()}
    for u in ("alice", "bob", "carol"):
        assert got[u] == [], "dn_regex rule: departmentNumber of %s visible: %s" % (u, got[u])
    assert got["dave"] == ["Support"] and got["judy"] == ["Legal"], got
    rc, es, err = search(acl, dn_of("alice"), "(objectClass=*)", "departmentNumber", who="admin")
    assert attr(es[0], "departmentNumber") == ["Engineering"], es


def by_uid_dn(entries):
    """uid (from the DN) -> entry."""
    return {d.split(",")[0].split("=")[1].lower(): (d, a) for d, a in entries}


def test_filter_scoped_rule(acl):
    rc, es, err = search(acl, PEOPLE, "(objectClass=inetOrgPerson)", "mail", scope="one", who="bob")
    assert rc == 0 and len(es) == 10, (rc, err)
    got = {u: attr(e, "mail") for u, e in by_uid_dn(es).items()}
    assert got["erin"] == [] and got["judy"] == [], "mail of Legal people visible: %s" % got
    for u in ("alice", "bob", "dave", "ivan"):
        assert got[u] == ["%s@example.com" % u], got


def test_filter_objectclass_rule_and_invisible_entries(acl):
    rc, es, err = search(acl, GROUPS, "(objectClass=*)", "cn", scope="one", who="bob")
    assert rc == 0, err
    want = {"cn=%s,%s" % (g, GROUPS.lower()) for g in ("engineering", "operations", "staff", "g-inner", "g-uniq",
                                                        "g-outer")}
    assert dns(es) == want, "bob: missing %s, extra %s" % (want - dns(es), dns(es) - want)
    rc, es, err = search(acl, GROUPS, "(objectClass=posixGroup)", "cn", scope="one", who="admin")
    assert rc == 0, err
    assert dns(es) == {"cn=engineering-posix," + GROUPS.lower(), "cn=operations-posix," + GROUPS.lower()}, dns(es)


def test_search_omits_invisible_attributes(acl):
    rc, es, err = search(acl, dn_of("judy"), "(objectClass=*)", who="alice")
    assert rc == 0 and len(es) == 1, (rc, err)
    want = {"objectclass", "uid", "cn", "sn", "givenname", "departmentnumber", "uidnumber", "gidnumber",
            "homedirectory", "loginshell"}
    assert names(es[0]) == want, "alice reading judy: extra %s, missing %s" % (names(es[0]) - want,
                                                                              want - names(es[0]))
    rc, es, err = search(acl, dn_of("judy"), "(objectClass=*)", who="admin")
    assert {"mail", "telephonenumber", "userpassword"} <= names(es[0]), names(es[0])


def test_filter_on_unsearchable_attribute(acl):
    for filt, want in (("(loginShell=/bin/bash)", set()),
                       ("(!(loginShell=/bin/bash))", set()),
                       ("(loginShell=*)", set()),
                       ("(|(loginShell=/bin/bash)(uid=alice))", {"alice"}),
                       ("(&(objectClass=posixAccount)(!(loginShell=/bin/zsh)))", set())):
        rc, es, err = search(acl, PEOPLE, filt, "loginShell", scope="one", who="bob")
        assert rc == 0, (filt, err)
        assert set(by_uid_dn(es)) == want, "%s as bob: %s, want %s" % (filt, sorted(by_uid_dn(es)), sorted(want))
    # read is granted: the attribute is returned
    rc, es, err = search(acl, dn_of("dave"), "(uid=dave)", "loginShell", who="bob")
    assert attr(es[0], "loginShell") == ["/bin/bash"], es
    rc, es, err = search(acl, PEOPLE, "(loginShell=/bin/bash)", "1.1", scope="one", who="admin")
    assert len(es) == 10, dns(es)


def test_filter_on_unsearchable_attribute_value_not_leaked(acl):
    """telephoneNumber of others is neither readable nor searchable for alice."""
    rc, es, err = search(acl, PEOPLE, "(telephoneNumber=+1 555 0102)", "1.1", scope="one", who="alice")
    assert (rc, es) == (0, []), (rc, dns(es))
    rc, es, err = search(acl, PEOPLE, "(telephoneNumber=+1 555 0101)", "1.1", scope="one", who="alice")
    assert (rc, dns(es)) == (0, {dn_of("alice").lower()}), (rc, dns(es))


# --- configuration errors


@pytest.mark.parametrize("rule_text,key,word", [
    ('[[access]]\nby = [{ who = "*", rights = "peek" }]\n', "by.rights", "peek"),
    ('[[access]]\nby = [{ who = "nobody", rights = "read" }]\n', "by.who", "nobody"),
    ('[[access]]\nattrs = ["noSuchAttr"]\nby = [{ who = "*", rights = "read" }]\n', "attrs", "noSuchAttr"),
    ('[[access]]\nscope = "deep"\nby = [{ who = "*", rights = "read" }]\n', "scope", "deep"),
    ('[[access]]\nby = [{ who = "*", rights = ["read", "peek"] }]\n', "by.rights", "peek"),
], ids=["rights", "who", "attrs", "scope", "rights-list"])
def test_config_error_names_rule(tmp_path, rule_text, key, word):
    cfg = tmp_path / "pando.toml"
    cfg.write_text(rule_text)
    port = free_port()
    try:
        r = subprocess.run([PANDO_BIN, "serve", "--data-dir", str(tmp_path / "data"), "--listen",
                            "ldap://127.0.0.1:%d" % port, "--config", str(cfg)],
                           capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("pando serve kept running with a bad access rule")
    msg = r.stdout + r.stderr
    assert r.returncode != 0, "pando serve accepted a bad rule: %s" % msg
    assert "access[0]" in msg and key in msg and word in msg, "message does not name access[0].%s: %r" % (key, msg)


# ================================================================== B. no root DN, mapping, admins, break-glass


@pytest.fixture(scope="module")
def noroot(tmp_path_factory):
    s = start(tmp_path_factory, "noroot", 'root_dn = ""\n', admin_password=False)
    s.admin_pw = "anything"
    yield s
    s.stop_and_verify()


def test_no_root_dn(noroot):
    assert not (noroot.data_dir / "admin-password").exists(), "admin-password created although root_dn = \"\""
    rc, out, err = whoami(noroot, (ADMIN_DN, "anything"))
    assert rc == INVALID_CREDENTIALS, "bind as cn=admin without a root DN: rc=%d %s" % (rc, err)
    e = ("cn=made-without-root," + SUFFIX, {"objectClass": ["organizationalRole"], "cn": ["made-without-root"]})
    rc, out, err = add(noroot, ldif_entry(*e), who="ext")
    assert rc == 0, "ldapadd -Y EXTERNAL without a root DN: rc=%d %s" % (rc, err)
    rc, out, err = modify(noroot, password_ldif(["alice"]), who="ext")
    assert rc == 0, err
    rc, es, err = search(noroot, e[0], who="alice")
    assert (rc, dns(es)) == (0, {e[0].lower()}), (rc, es, err)


MAP_PATTERN = r"gidnumber=(\d+)\+uidnumber=(\d+),cn=peercred,cn=external,cn=auth"


@pytest.fixture(scope="module")
def map_dn(tmp_path_factory):
    cfg = "[[auth.external_map]]\npattern = '%s'\ndn = \"%s\"\n" % (MAP_PATTERN, dn_of("alice"))
    s = start(tmp_path_factory, "mapdn", cfg)
    yield s
    s.stop_and_verify()


def test_external_map_dn(map_dn):
    rc, out, err = whoami(map_dn, "ext")
    assert (rc, out) == (0, "dn:" + dn_of("alice")), (rc, out, err)


DEFAULT_INDEXES = """
[indexes]
objectClass = ["eq"]
uid = ["eq", "sub"]
mail = ["eq", "sub"]
cn = ["eq", "sub"]
sn = ["eq", "sub"]
givenName = ["eq", "sub"]
member = ["eq"]
uniqueMember = ["eq"]
memberUid = ["eq"]
entryUUID = ["eq"]
uidNumber = ["eq"]
"""


@pytest.fixture(scope="module")
def map_search(tmp_path_factory):
    cfg = DEFAULT_INDEXES + "\n[[auth.external_map]]\npattern = '%s'\nbase = \"%s\"\nfilter = \"(uidNumber=$2)\"\n" % (
        MAP_PATTERN, PEOPLE)
    s = start(tmp_path_factory, "mapsearch", cfg)
    yield s
    s.stop_and_verify()


def test_external_map_search(map_search):
    me = "uid=local-op," + PEOPLE
    add_entries(map_search, [(me, person_attrs("local-op", 0, {
        "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson", "posixAccount"],
        "uidNumber": [str(os.getuid())], "gidNumber": [str(os.getgid())], "homeDirectory": ["/nonexistent"]}))])
    rc, out, err = whoami(map_search, "ext")
    assert (rc, out) == (0, "dn:" + me), (rc, out, err)


@pytest.fixture(scope="module")
def noadmins(tmp_path_factory):
    s = start(tmp_path_factory, "noadmins", "[auth]\nadmins = []\n")
    set_passwords(s, ["alice"])
    yield s
    s.stop_and_verify()


def test_admins_empty_removes_ldapi_owner_role(noadmins):
    rc, out, err = whoami(noadmins, "ext")
    assert (rc, out) == (0, "dn:" + peercred_dn()), (rc, out, err)
    rc, out, err = modify(noadmins, replace_ldif(dn_of("alice"), "description", "x"), who="ext")
    assert rc == INSUFFICIENT_ACCESS, "ldapi owner without the admin role modifying: rc=%d %s" % (rc, err)
    rc, out, err = add(noadmins, ldif_entry(*role("x", SUFFIX)), who="ext")
    assert rc == INSUFFICIENT_ACCESS, "ldapi owner without the admin role adding: rc=%d %s" % (rc, err)
    rc, es, err = search(noadmins, dn_of("alice"), "(objectClass=*)", "uid", "userPassword", who="ext")
    assert rc == 0 and names(es[0]) == {"uid"}, "ldapi owner (a mere user) reading alice: %s" % (es,)
    # the root DN is still the administrator
    rc, es, err = search(noadmins, dn_of("alice"), "(objectClass=*)", "userPassword", who="admin")
    assert rc == 0 and attr(es[0], "userPassword"), es


@pytest.fixture(scope="module")
def breakglass(tmp_path_factory):
    cfg = ('[auth]\nadmins = []\nbreak_glass = "ldapi-owner"\n\n'
           '[[access]]\nby = [{ who = "*", rights = "none" }]\n')
    s = start(tmp_path_factory, "breakglass", cfg)
    yield s
    s.stop_and_verify()


def test_break_glass_over_ldapi(breakglass):
    rc, es, err = search(breakglass, PEOPLE, "(objectClass=inetOrgPerson)", "uid", scope="one", who="ext")
    assert rc == 0 and len(es) == 10, "break-glass read: rc=%d %s" % (rc, err)
    rc, out, err = modify(breakglass, password_ldif(["alice"]), who="ext")
    assert rc == 0, "break-glass write: rc=%d %s" % (rc, err)
    rc, out, err = add(breakglass, ldif_entry(*role("bg", SUFFIX)), who="ext")
    assert rc == 0, "break-glass add: rc=%d %s" % (rc, err)
    rc, es, err = search(breakglass, dn_of("alice"), "(objectClass=*)", "userPassword", who="ext")
    assert rc == 0 and attr(es[0], "userPassword"), es


def test_break_glass_not_over_tcp(breakglass):
    rc, out, err = modify(breakglass, password_ldif(["bob"]), who="ext")
    assert rc == 0, err
    rc, out, err = whoami(breakglass, "bob")
    assert rc == INVALID_CREDENTIALS, "simple bind under a deny-all rule: rc=%d %s" % (rc, err)
    # the root DN binds (no entry, no rule), but the rules deny it everything
    assert whoami(breakglass, "admin")[0] == 0
    rc, es, err = search(breakglass, SUFFIX, scope="sub", who="admin")
    assert (rc, es) == (NO_SUCH_OBJECT, []), (rc, dns(es))
    rc, out, err = add(breakglass, ldif_entry(*role("tcp", SUFFIX)), who="admin")
    assert rc == NO_SUCH_OBJECT, "root DN adding an entry it may not see: rc=%d %s" % (rc, err)
    rc, es, err = search(breakglass, SUFFIX, who=None)
    assert (rc, es) == (NO_SUCH_OBJECT, []), (rc, dns(es))


def test_root_dse_and_subschema_readable_under_deny_all(breakglass):
    for who in (None, "admin"):
        rc, es, err = search(breakglass, "", "(objectClass=*)", "namingContexts", who=who)
        assert rc == 0 and [v.lower() for v in attr(es[0], "namingContexts")] == [SUFFIX], (who, rc, es, err)
        rc, es, err = search(breakglass, "cn=Subschema", "(objectClass=*)", "attributeTypes", who=who)
        assert rc == 0 and len(es) == 1 and attr(es[0], "attributeTypes"), (who, rc, err)


# ================================================================== C. require_secure_binds


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    s = start(tmp_path_factory, "secure", "[auth]\nrequire_secure_binds = true\n")
    set_passwords(s, ["alice"], who="ext")
    yield s
    s.stop_and_verify()


def test_secure_binds(secure):
    rc, out, err = whoami(secure, "alice", over="tcp")
    assert rc == CONFIDENTIALITY, "simple bind over ldap://: rc=%d %s" % (rc, err)
    rc, out, err = whoami(secure, "admin", over="tcp")
    assert rc == CONFIDENTIALITY, "root DN bind over ldap://: rc=%d %s" % (rc, err)
    rc, out, err = whoami(secure, "alice", over="ldapi")
    assert (rc, out) == (0, "dn:" + dn_of("alice")), "simple bind over ldapi: rc=%d %s %s" % (rc, out, err)
    rc, out, err = whoami(secure, None, over="tcp")
    assert (rc, out) == (0, "anonymous"), (rc, out, err)
    with secure.raw() as c:
        assert ber.simple_bind(c, "", "") == 0
        assert ber.simple_bind(c, dn_of("alice"), pw_of("alice"), msgid=2) == CONFIDENTIALITY


# ================================================================== D. failed-bind throttling


@pytest.fixture(scope="module")
def throttle(tmp_path_factory):
    cfg = ("[limits]\nfailed_bind_free = 2\nfailed_bind_max_delay_ms = 300\nfailed_bind_lockout = 5\n"
           "failed_bind_lockout_seconds = 3\n")
    s = start(tmp_path_factory, "throttle", cfg)
    set_passwords(s, ["alice", "bob", "carol", "dave"])
    yield s
    s.stop_and_verify()


def test_throttle_delay(throttle):
    src = "127.0.0.11"
    for i in range(2):
        code, dt = timed_bind(throttle, dn_of("alice"), "wrong", src=src)
        assert code == INVALID_CREDENTIALS
        assert dt < 0.2, "free failure %d took %.3fs" % (i + 1, dt)
    code, dt = timed_bind(throttle, dn_of("alice"), "wrong", src=src)
    assert code == INVALID_CREDENTIALS
    assert dt >= 0.25, "3rd failure answered after %.3fs, want >= 0.25s" % dt


def test_throttle_lockout_and_expiry(throttle):
    src = "127.0.0.12"
    for i in range(5):
        code, dt = timed_bind(throttle, dn_of("bob"), "wrong", src=src)
        assert code == INVALID_CREDENTIALS
    code, dt = timed_bind(throttle, dn_of("bob"), pw_of("bob"), src=src)
    assert code == INVALID_CREDENTIALS, "right password during a lockout: %d" % code
    code, dt = timed_bind(throttle, dn_of("carol"), pw_of("carol"), src=src)
    assert code == 0, "another DN is not locked out: %d" % code
    code, dt = timed_bind(throttle, dn_of("bob"), pw_of("bob"), src="127.0.0.13")
    assert code == INVALID_CREDENTIALS, "the DN lockout holds from any address: %d" % code
    time.sleep(3.3)
    code, dt = timed_bind(throttle, dn_of("bob"), pw_of("bob"), src=src)
    assert code == 0, "right password after the lockout period: %d" % code


def test_throttle_success_resets(throttle):
    src = "127.0.0.14"
    for _ in range(4):
        assert timed_bind(throttle, dn_of("dave"), "wrong", src=src)[0] == INVALID_CREDENTIALS
    assert timed_bind(throttle, dn_of("dave"), pw_of("dave"), src=src)[0] == 0
    for _ in range(4):
        assert timed_bind(throttle, dn_of("dave"), "wrong", src=src)[0] == INVALID_CREDENTIALS
    code, dt = timed_bind(throttle, dn_of("dave"), pw_of("dave"), src=src)
    assert code == 0, "8 failures with a success after 4 must not lock out (lockout 5): %d" % code


@pytest.fixture(scope="module")
def throttle_ip(tmp_path_factory):
    cfg = ("[limits]\nfailed_bind_free = 100\nfailed_bind_max_delay_ms = 300\nfailed_bind_lockout = 0\n"
           "failed_bind_lockout_ip = 4\n"
           "failed_bind_lockout_seconds = 30\n")
    s = start(tmp_path_factory, "throttleip", cfg)
    set_passwords(s, ["alice", "bob", "carol", "dave", "erin", "frank"])
    yield s
    s.stop_and_verify()


def test_throttle_lockout_by_address(throttle_ip):
    assert timed_bind(throttle_ip, dn_of("frank"), pw_of("frank"))[0] == 0
    for u in ("alice", "bob", "carol", "dave"):
        assert timed_bind(throttle_ip, dn_of(u), "wrong")[0] == INVALID_CREDENTIALS
    code, dt = timed_bind(throttle_ip, dn_of("erin"), pw_of("erin"))
    assert code == INVALID_CREDENTIALS, "right password from a locked-out address: %d" % code
    code, dt = timed_bind(throttle_ip, dn_of("frank"), pw_of("frank"))
    assert code == INVALID_CREDENTIALS, "right password from a locked-out address: %d" % code
    # another address is not locked out
    code, dt = timed_bind(throttle_ip, dn_of("erin"), pw_of("erin"), src="127.0.0.21")
    assert code == 0, "another address: %d" % code


# ================================================================== E. limits


LIMITS_CONFIG = """
[limits]
size_limit = 3
unindexed_search_limit = 5
max_pdu_bytes = 2048
max_filter_depth = 10
idle_timeout = 1

[[limits.by]]
who = "dn:uid=alice,ou=People,dc=example,dc=com"
size_limit = 5

[[limits.by]]
who = "group:cn=engineering,ou=Groups,dc=example,dc=com"
size_limit = 4

[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "read" }]
"""


@pytest.fixture(scope="module")
def limits(tmp_path_factory):
    s = start(tmp_path_factory, "limits", LIMITS_CONFIG)
    set_passwords(s, ["alice", "bob", "carol"])
    yield s
    s.stop_and_verify()


@pytest.mark.parametrize("who,n,code", [(None, 3, SIZE_LIMIT), ("bob", 3, SIZE_LIMIT), ("alice", 5, SIZE_LIMIT),
                                        ("carol", 4, SIZE_LIMIT), ("admin", 10, 0)],
                         ids=["anonymous", "bob", "alice-by-dn", "carol-by-group", "admin"])
def test_size_limit(limits, who, n, code):
    rc, es, err = search(limits, PEOPLE, "(objectClass=inetOrgPerson)", "1.1", scope="one", who=who)
    assert (rc, len(es)) == (code, n), "%s: rc=%d with %d entries, want %d with %d (%s)" % (
        who, rc, len(es), code, n, err.strip())


def test_size_limit_client_smaller(limits):
    rc, es, err = search(limits, PEOPLE, "(objectClass=inetOrgPerson)", "1.1", scope="one", who="alice",
                         extra=("-z", "2"))
    assert (rc, len(es)) == (SIZE_LIMIT, 2), (rc, len(es), err)


@pytest.mark.parametrize("who,code,n", [(None, ADMIN_LIMIT, 0), ("bob", ADMIN_LIMIT, 0), ("admin", 0, 2)],
                         ids=["anonymous", "bob", "admin"])
def test_unindexed_search_limit(limits, who, code, n):
    rc, es, err = search(limits, SUFFIX, "(description=*)", "1.1", scope="sub", who=who)
    assert (rc, len(es)) == (code, n), "%s: rc=%d with %d entries (%s)" % (who, rc, len(es), err.strip())
    if n:
        assert dns(es) == {PEOPLE.lower(), GROUPS.lower()}, dns(es)


def test_max_pdu_bytes(limits):
    with limits.raw() as c:
        c.send(message(1, search_op(PEOPLE, SCOPE_BASE, f_eq("description", "y" * 1800), ["1.1"])))
        m = c.recv_msg()
        assert m is not None and m["op"] == "searchDone" and m["code"] == 0, "PDU under the limit: %r" % m
        try:
            c.send(message(2, search_op(PEOPLE, SCOPE_BASE, f_eq("description", "x" * 3000), ["1.1"])))
        except (BrokenPipeError, ConnectionResetError):
            pass
        msgs, eof = c.drain(timeout=5)
    assert eof, "connection not closed after a PDU over max_pdu_bytes: %r" % msgs
    assert not [m for m in msgs if m["id"] == 2], "the oversized request was answered: %r" % msgs
    n = notices(msgs)
    assert n and n[0].get("name") == ber.NOTICE_OF_DISCONNECTION, "no notice of disconnection: %r" % msgs
    assert n[0]["code"] == PROTOCOL_ERROR, "notice code %d" % n[0]["code"]


def test_max_filter_depth(limits):
    def nested(depth):
        f = f_eq("uid", "alice")
        for _ in range(depth):
            f = f_not(f)
        return f
    with limits.raw() as c:
        es, done = raw_search(c, 1, dn_of("alice"), SCOPE_BASE, nested(8))
        assert done["code"] == 0 and [e["dn"] for e in es] == [dn_of("alice")], (done, es)
    with limits.raw() as c:
        c.send(message(2, search_op(dn_of("alice"), SCOPE_BASE, nested(12), ["1.1"])))
        msgs, eof = [], False
        deadline = time.monotonic() + 10
        done = None
        while time.monotonic() < deadline:
            try:
                m = c.recv_msg(timeout=deadline - time.monotonic())
            except socket.timeout:
                break
            if m is None:
                eof = True
                break
            msgs.append(m)
            if m["id"] == 2 and m["op"] == "searchDone":
                done = m
                break
    assert not [m for m in msgs if m["op"] == "entry"], "a filter over max_filter_depth matched entries"
    if done is not None:
        assert done["code"] == PROTOCOL_ERROR, "filter over max_filter_depth: code %d %s" % (done["code"],
                                                                                           done["diag"])
    else:
        assert eof, "neither a result nor a disconnection for a filter over max_filter_depth"
        n = notices(msgs)
        assert n and n[0].get("name") == ber.NOTICE_OF_DISCONNECTION, msgs


def test_idle_timeout(limits):
    with limits.raw(timeout=10) as c:
        t0 = time.monotonic()
        msgs, eof = c.drain(timeout=4)
        dt = time.monotonic() - t0
    assert eof, "idle connection not closed within 4s (idle_timeout = 1): %r" % msgs
    assert dt < 2.5, "idle connection closed after %.2fs (idle_timeout = 1)" % dt
    n = notices(msgs)
    assert n and n[0].get("name") == ber.NOTICE_OF_DISCONNECTION, "no notice of disconnection: %r" % msgs
    assert n[0]["code"] == UNAVAILABLE, "idle notice code %d" % n[0]["code"]


def test_busy_connection_not_idle(limits):
    """A connection used every 0.5s is not closed by idle_timeout = 1."""
    with limits.raw(timeout=10) as c:
        for i in range(5):
            es, done = raw_search(c, i + 1, PEOPLE)
            assert done["code"] == 0 and len(es) == 1
            time.sleep(0.5)
        es, done = raw_search(c, 10, PEOPLE)
        assert done["code"] == 0


def test_dn_only_lookup_on_an_exact_index_respects_search_rights(tmp_path_factory):
    """(mail=…) with attributes 1.1 is answered from the equality index
    without decoding entries when no rule tests entry contents: the result
    must still honour search rights on the filter's attribute."""
    cfg = rule([ADM, bt("self", "read"), bt("*", "auth")], attrs=["mail", "userPassword"])
    cfg += rule([ADM, bt("users", "read")])
    s = start(tmp_path_factory, "exactidx", cfg)
    try:
        set_passwords(s, ["alice", "bob"])
        # bob may not search mail: the item is Undefined, nothing matches.
        rc, es, err = search(s, PEOPLE, "(mail=alice@example.com)", "1.1", scope="sub", who="bob")
        assert (rc, es) == (0, []), (rc, dns(es), err)
        # alice may search her own mail; the administrator anyone's.
        rc, es, err = search(s, PEOPLE, "(mail=alice@example.com)", "1.1", scope="sub", who="alice")
        assert (rc, dns(es)) == (0, {dn_of("alice").lower()}), (rc, dns(es), err)
        rc, es, err = search(s, PEOPLE, "(mail=ALICE@example.com)", "1.1", scope="sub", who="admin")
        assert (rc, dns(es)) == (0, {dn_of("alice").lower()}), (rc, dns(es), err)
        # uid is searchable by users: found without decoding, DN only.
        rc, es, err = search(s, PEOPLE, "(uid=bob)", "1.1", scope="sub", who="alice")
        assert rc == 0 and dns(es) == {dn_of("bob").lower()} and es[0][1] == {}, (rc, es, err)
        # Out of scope candidates are still dropped.
        rc, es, err = search(s, "ou=Groups," + SUFFIX, "(uid=bob)", "1.1", scope="sub", who="admin")
        assert (rc, es) == (0, []), (rc, dns(es), err)
    finally:
        s.stop_and_verify()
