"""Differential tests: the same data in a throwaway OpenLDAP slapd (back-mdb)
and in Pando; the same searches, compares and modifications must give the
same answers (after normalising order, attribute-name case and DN spacing,
and dropping operational attributes)."""

import random
import shutil
import subprocess
import time
from pathlib import Path

import ldap3
import pytest
from ldap3 import BASE, SUBTREE, MODIFY_ADD, MODIFY_DELETE, MODIFY_REPLACE, MODIFY_INCREMENT

from conftest import ADMIN_DN, SUFFIX, Pando, free_port, ldif_entry, parse_ldif, terminate, wait_port

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
SCHEMA_DIR = "/etc/ldap/schema"
MODULE_DIR = "/usr/lib/ldap"
SLAPD_PW = "differential-secret"

pytestmark = pytest.mark.skipif(not (Path(SLAPD).exists() and Path(SLAPADD).exists()
                                     and shutil.which("ldapsearch")),
                                reason="slapd/slapadd/ldap-utils not installed")

PEOPLE = "ou=People," + SUFFIX
CONTRACT = "ou=Contractors," + PEOPLE
GROUPS = "ou=Groups," + SUFFIX

# ------------------------------------------------------------------ data

GIVEN = ["Ana", "John", "Joanna", "Jürgen", "Zoë", "Øyvind", "Mary", "José", "Li", "Sam", "Renée", "Nils"]
SURN = ["Smith", "Jones", "Müller", "MÜLLER-Lüdenscheidt", "Johnson", "Åström", "Núñez", "Dvořák",
        "O'Brien", "van der Berg", "Şahin", "Nakamura", "Anderson", "Lee"]
TITLES = ["Engineer", "Senior Engineer", "Manager", "Product Manager", "Intern", "Director of Stuff"]


def gen_entries():
    rnd = random.Random(4511)
    ents = [
        (SUFFIX, {"objectClass": ["top", "dcObject", "organization"], "dc": ["example"], "o": ["example"]}),
        (PEOPLE, {"objectClass": ["top", "organizationalUnit"], "ou": ["People"]}),
        (CONTRACT, {"objectClass": ["top", "organizationalUnit"], "ou": ["Contractors"],
                    "description": ["External staff"]}),
        (GROUPS, {"objectClass": ["top", "organizationalUnit"], "ou": ["Groups"]}),
    ]
    users = []
    for i in range(200):
        uid = "user%03d" % i
        g, s = GIVEN[i % len(GIVEN)], SURN[(i * 5) % len(SURN)]
        a = {
            "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
            "uid": [uid],
            "cn": ["%s %s" % (g, s)],
            "sn": [s],
            "givenName": [g],
            "mail": ["%s@example.com" % uid] + (["%s.alias@Example.COM" % uid] if i % 9 == 0 else []),
            "employeeNumber": [str((i * 37) % 1000)],
            "title": [TITLES[i % len(TITLES)]],
        }
        if i % 3:
            a["telephoneNumber"] = ["+1 555 %04d" % i] + (["+1-555-9%03d" % i] if i % 4 == 0 else [])
        if i % 7 == 0:
            a["cn"].append("%s%03d" % (g.lower(), i))
        if i % 2 == 0:
            a["objectClass"].append("posixAccount")
            a.update({"uidNumber": [str(10000 + i)], "gidNumber": [str(500 + i % 4)],
                      "homeDirectory": ["/home/%s" % uid], "loginShell": ["/bin/sh"]})
        if i % 11 == 0:
            a["description"] = ["has a star * in it (and parens)"]
        elif i % 13 == 0:
            a["description"] = ["back\\slash and ünïcödé"]
        elif i % 5 == 0:
            a["description"] = ["plain description %d" % i, "second line %d" % (i % 3)]
        parent = CONTRACT if i >= 180 else PEOPLE
        dn = "uid=%s,%s" % (uid, parent)
        ents.append((dn, a))
        users.append(dn)
    specials = [
        ("cn=Test (Paren) User", {"cn": ["Test (Paren) User"], "sn": ["Paren"]}),
        ("cn=Star*Name", {"cn": ["Star*Name"], "sn": ["Star"]}),
        ("cn=Back\\5Cslash", {"cn": ["Back\\slash"], "sn": ["Slash"]}),
        ("cn=Comma\\, Person", {"cn": ["Comma, Person"], "sn": ["Comma"]}),
    ]
    for rdn, a in specials:
        ents.append(("%s,%s" % (rdn, PEOPLE), dict({"objectClass": ["top", "person"]}, **a)))
    for gi, name in enumerate(["admins", "developers", "everyone", "empty-ish"]):
        members = rnd.sample(users, {0: 3, 1: 25, 2: 200, 3: 1}[gi])
        ents.append(("cn=%s,%s" % (name, GROUPS), {"objectClass": ["top", "groupOfNames"], "cn": [name],
                                                     "member": members}))
        ents.append(("cn=%s-posix,%s" % (name, GROUPS), {
            "objectClass": ["top", "posixGroup"], "cn": ["%s-posix" % name], "gidNumber": [str(500 + gi)],
            "memberUid": [m.split(",")[0][4:] for m in members[:30]]}))
    return ents


# ------------------------------------------------------------------ servers


class Slapd:
    def __init__(self, base):
        self.base = Path(base)
        self.port = None
        self.pid = None
        self.admin_dn, self.admin_pw = ADMIN_DN, SLAPD_PW

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    def write_conf(self):
        lines = ["include %s/%s.schema" % (SCHEMA_DIR, s) for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += [
            "modulepath " + MODULE_DIR,
            "moduleload back_mdb",
            "pidfile %s/slapd.pid" % self.base,
            "argsfile %s/slapd.args" % self.base,
            "loglevel 0",
            "threads 2",
            "sizelimit unlimited",
            "",
            "database mdb",
            'suffix "%s"' % SUFFIX,
            'rootdn "%s"' % ADMIN_DN,
            "rootpw %s" % SLAPD_PW,
            "directory %s/db" % self.base,
            "maxsize 268435456",
            "index objectClass eq",
            "access to attrs=userPassword by self write by anonymous auth by * none",
            "access to * by * read",
        ]
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")

    def load(self, ldif_path):
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        self.write_conf()
        r = subprocess.run([SLAPADD, "-q", "-f", str(self.base / "slapd.conf"), "-b", SUFFIX, "-l", str(ldif_path)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, "slapadd failed: %s %s" % (r.stdout, r.stderr)

    def start(self):
        self.port = free_port()
        r = subprocess.run([SLAPD, "-f", str(self.base / "slapd.conf"), "-h", self.url + "/"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "slapd failed to start: %s %s" % (r.stdout, r.stderr)
        assert wait_port(self.port, timeout=30), "slapd not listening on %s" % self.url
        for _ in range(100):
            pf = self.base / "slapd.pid"
            if pf.exists() and pf.read_text().strip():
                self.pid = int(pf.read_text().strip())
                break
            time.sleep(0.05)

    def stop(self):
        if not self.pid:
            return
        terminate(self.pid, 30)
        self.pid = None

    def ldap(self, tool, *args, auth="admin", input=None, timeout=120):
        cmd = [tool, "-x", "-H", self.url]
        if auth == "admin":
            cmd += ["-D", self.admin_dn, "-w", self.admin_pw]
        r = subprocess.run(cmd + list(args), input=input, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def conn(self):
        c = ldap3.Connection(ldap3.Server("127.0.0.1", port=self.port, get_info=ldap3.NONE),
                             user=self.admin_dn, password=self.admin_pw, raise_exceptions=False)
        assert c.bind(), c.result
        return c


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("differential")
    ents = gen_entries()
    full = base / "full.ldif"
    full.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents))
    sub = base / "pando.ldif"
    sub.write_text("\n".join(ldif_entry(dn, a) for dn, a in ents if dn != SUFFIX))

    slapd = Slapd(base / "slapd")
    slapd.load(full)
    slapd.start()
    pando = Pando(base / "pando", demo=False, name="pando-differential").start()
    try:
        rc, out, err = pando.ldap("ldapadd", "-f", str(sub))
        assert rc == 0, "ldapadd of the differential LDIF into pando failed rc=%d: %s" % (rc, err[-2000:])
        yield slapd, pando
    finally:
        slapd.stop()
    pando.stop_and_verify()


# ------------------------------------------------------------------ normalisation


def norm_dn(dn):
    """Parse an RFC 4514 DN (escapes \\c and \\XX) and return a canonical
    lower-case form, so that equivalent spellings compare equal."""
    rdns, cur, val, typ = [], [], bytearray(), None
    i, s = 0, dn
    in_value = False
    while i < len(s):
        ch = s[i]
        if not in_value:
            if ch == "=":
                typ = "".join(cur).strip().lower()
                cur, in_value, val = [], True, bytearray()
            else:
                cur.append(ch)
            i += 1
            continue
        if ch == "\\":
            nxt = s[i + 1:i + 3]
            if len(nxt) == 2 and all(c in "0123456789abcdefABCDEF" for c in nxt):
                val.append(int(nxt, 16))
                i += 3
            else:
                val += s[i + 1].encode()
                i += 2
            continue
        if ch in ",+":
            rdns.append((typ, val.decode("utf-8", "replace").strip().lower()))
            in_value = False
            i += 1
            continue
        val += ch.encode()
        i += 1
    if typ is not None and in_value:
        rdns.append((typ, val.decode("utf-8", "replace").strip().lower()))
    return ",".join("%s=%s" % (t, v.replace(",", "\\2c").replace("+", "\\2b")) for t, v in rdns)


OPERATIONAL = {"entryuuid", "entrycsn", "createtimestamp", "modifytimestamp", "creatorsname", "modifiersname",
               "structuralobjectclass", "entrydn", "subschemasubentry", "hassubordinates", "numsubordinates"}


def norm_entries(entries, drop_suffix=True):
    out = {}
    for dn, attrs in entries:
        if drop_suffix and norm_dn(dn) == norm_dn(SUFFIX):
            continue
        na = {}
        for k, vs in attrs.items():
            k = k.lower()
            if k in OPERATIONAL:
                continue
            if k == "objectclass":
                vs = [v.lower() for v in vs]
            na[k] = tuple(sorted(vs))
        out[norm_dn(dn)] = na
    return out


def search_both(pair, base, scope, filt, *attrs, types_only=False):
    res = []
    for srv in pair:
        args = ["-LLL", "-o", "ldif-wrap=no", "-b", base, "-s", scope]
        if types_only:
            args.append("-A")
        rc, out, err = srv.ldap("ldapsearch", *args, filt, *attrs)
        res.append((rc, norm_entries(parse_ldif(out)), err.strip()))
    return res


def diff(a, b):
    lines = []
    for dn in sorted(set(a) | set(b)):
        if dn not in a:
            lines.append("  only pando: %s" % dn)
        elif dn not in b:
            lines.append("  only slapd: %s" % dn)
        elif a[dn] != b[dn]:
            for k in sorted(set(a[dn]) | set(b[dn])):
                if a[dn].get(k) != b[dn].get(k):
                    lines.append("  %s %s: slapd=%s pando=%s" % (dn, k, a[dn].get(k), b[dn].get(k)))
    return "\n".join(lines[:15]) + ("\n  ... %d more" % (len(lines) - 15) if len(lines) > 15 else "")


# ------------------------------------------------------------------ searches

S = SUFFIX
SEARCHES = [
    # (base, scope, filter, attrs)
    (S, "sub", "(objectClass=*)", ["*"]),
    (S, "sub", "(uid=user007)", ["*"]),
    (S, "sub", "(UID=USER007)", ["uid"]),
    (S, "sub", "(cn=*)", ["cn"]),
    (S, "sub", "(cn=Jo*)", ["cn"]),
    (S, "sub", "(cn=*son)", ["cn"]),
    (S, "sub", "(cn=*an*)", ["cn"]),
    (S, "sub", "(cn=J*n*s*)", ["cn"]),
    (S, "sub", "(sn=M*ller*)", ["sn"]),
    (S, "sub", "(sn=Müller)", ["sn"]),
    (S, "sub", "(sn=MÜLLER)", ["sn"]),
    (S, "sub", "(sn=*dvořák*)", ["sn"]),
    (S, "sub", "(givenName=zoë)", ["givenName"]),
    (S, "sub", "(cn=*\\2a*)", ["cn"]),
    (S, "sub", "(description=*\\2a*)", ["description"]),
    (S, "sub", "(cn=*\\28paren\\29*)", ["cn"]),
    (S, "sub", "(cn=back\\5cslash)", ["cn"]),
    (S, "sub", "(description=*\\5c*)", ["description"]),
    (S, "sub", "(mail=USER010@EXAMPLE.COM)", ["mail"]),
    (S, "sub", "(mail=*alias*)", ["mail"]),
    (S, "sub", "(telephoneNumber=+15550005)", ["telephoneNumber"]),
    (S, "sub", "(telephoneNumber=+1 555-9004)", ["telephoneNumber"]),
    (S, "sub", "(telephoneNumber=*0*5)", ["telephoneNumber"]),
    (S, "sub", "(uidNumber>=10150)", ["uidNumber"]),
    (S, "sub", "(uidNumber<=10010)", ["uidNumber"]),
    (S, "sub", "(gidNumber=501)", ["uid", "gidNumber"]),
    (S, "sub", "(&(objectClass=posixAccount)(!(uidNumber>=10050)))", ["uid"]),
    (S, "sub", "(|(sn=Smith)(sn=Jones)(givenName=Ana))", ["uid"]),
    (S, "sub", "(!(objectClass=inetOrgPerson))", ["objectClass"]),
    (S, "sub", "(&(title=*manager*)(|(employeeNumber=1*)(employeeNumber=*5)))", ["title", "employeeNumber"]),
    (S, "sub", "(employeeNumber=37)", ["employeeNumber"]),
    (S, "sub", "(employeeNumber=9*)", ["employeeNumber"]),
    (S, "sub", "(member=uid=user001,ou=People,dc=example,dc=com)", ["cn"]),
    (S, "sub", "(member=UID=user190, OU=contractors,OU=People, DC=Example,DC=COM)", ["cn"]),
    (S, "sub", "(memberUid=*0*)", ["cn", "memberUid"]),
    (S, "sub", "(cn:caseExactMatch:=Ana Smith)", ["cn"]),
    (S, "sub", "(cn:caseExactMatch:=ana smith)", ["cn"]),
    (S, "sub", "(ou:dn:=Contractors)", ["1.1"]),
    (S, "sub", "(uidNumber:integerMatch:=10004)", ["uid"]),
    (S, "sub", "(|(nonExistentAttr=x)(uid=user003))", ["uid"]),
    (S, "sub", "(!(nonExistentAttr=x))", ["1.1"]),
    (S, "sub", "(&)", ["1.1"]),
    (S, "sub", "(|)", ["1.1"]),
    (PEOPLE, "one", "(objectClass=*)", ["uid", "cn"]),
    (PEOPLE, "base", "(objectClass=*)", ["*"]),
    (CONTRACT, "sub", "(objectClass=person)", ["uid"]),
    (PEOPLE, "children", "(uid=user18*)", ["uid"]),
    (S, "sub", "(uid=user01*)", ["1.1"]),
    (S, "sub", "(uid=user02*)", ["@posixAccount"]),
    (S, "sub", "(uid=user03*)", ["mail", "MAIL", "Cn"]),
    (S, "sub", "(objectClass=groupOfNames)", ["*"]),
    (S, "sub", "(objectClass=posixGroup)", ["*"]),
    # Attribute selections (only what is returned or tested is decoded):
    # a supertype, aliases, an OID, and filters on attributes not returned.
    (S, "sub", "(uid=user007)", ["name"]),
    (S, "sub", "(uid=user007)", ["commonName", "SURNAME"]),
    (S, "sub", "(uid=user007)", ["2.5.4.3"]),
    (S, "sub", "(sn=Smith)", ["givenName"]),
    (S, "sub", "(&(uid=user00*)(givenName=Ana))", ["mail"]),
    (S, "sub", "(|(cn=Ana*)(mail=user011@example.com))", ["uidNumber"]),
]


@pytest.mark.parametrize("base,scope,filt,attrs", SEARCHES,
                         ids=["%s-%s-%s" % (b.split(",")[0], s, f) for b, s, f, _ in SEARCHES])
def test_search_same_answers(pair, base, scope, filt, attrs):
    (rc_o, ents_o, err_o), (rc_p, ents_p, err_p) = search_both(pair, base, scope, filt, *attrs)
    assert rc_p == rc_o, "result code differs: slapd=%d pando=%d (pando: %s)" % (rc_o, rc_p, err_p)
    assert ents_p == ents_o, "entries differ for %s (slapd %d, pando %d):\n%s" % (
        filt, len(ents_o), len(ents_p), diff(ents_o, ents_p))


def test_search_types_only(pair):
    (rc_o, ents_o, _), (rc_p, ents_p, _) = search_both(pair, PEOPLE, "one", "(uid=user1*)", "cn", "mail",
                                                       types_only=True)
    assert rc_o == rc_p == 0
    assert {k: set(v) for k, v in ents_p.items()} == {k: set(v) for k, v in ents_o.items()}, diff(ents_o, ents_p)


def test_search_approx_loosely(pair):
    (rc_o, ents_o, _), (rc_p, ents_p, _) = search_both(pair, S, "sub", "(sn~=Smyth)", "sn")
    assert rc_p == 0
    exact = {dn for dn, a in ents_o.items() if "smith" in [v.lower() for v in a.get("sn", ())]}
    assert exact <= set(ents_p), "approx (sn~=Smyth) misses entries with sn=Smith"


# The schema's own definitions, left out when comparing the subschema
# subentry's other attributes (the schemas themselves differ).
SCHEMA_CONTENT = {"attributetypes", "objectclasses", "ldapsyntaxes", "matchingrules", "matchingruleuse",
                  "ditcontentrules", "ditstructurerules", "nameforms"}


@pytest.mark.parametrize("attrs", ["*", "+"])
def test_subschema_subentry_shows_what_slapd_shows(pair, attrs):
    """cn=Subschema read with `+` carried no entryDN or subschemaSubentry
    (issue 37, item 8); with `*` and `+` the attribute names match slapd's."""
    names = []
    for srv in pair:
        r = subprocess.run(["ldapsearch", "-x", "-LLL", "-H", srv.url, "-D", srv.admin_dn, "-w", srv.admin_pw,
                            "-b", "cn=Subschema", "-s", "base", "(objectClass=*)", attrs],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        (dn, got), = parse_ldif(r.stdout)
        names.append({k.lower() for k in got} - SCHEMA_CONTENT)
    assert names[1] == names[0], "slapd %s, pando %s" % tuple(sorted(n) for n in names)


# ------------------------------------------------------------------ compares

U = "uid=user%03d," + PEOPLE
COMPARES = [
    (U % 0, "cn", "Ana Smith"),
    (U % 0, "cn", "ANA SMITH"),
    (U % 0, "cn", "Nobody"),
    (U % 3, "telephoneNumber", "+15550003"),
    (U % 2, "uidNumber", "10002"),
    (U % 2, "uidNumber", "abc"),
    (U % 1, "uidNumber", "10001"),
    (U % 0, "objectClass", "INETORGPERSON"),
    (U % 0, "nonExistentAttr", "x"),
    ("uid=ghost," + PEOPLE, "cn", "x"),
    ("cn=admins," + GROUPS, "member", None),  # filled in from the data
    (U % 10, "mail", "USER010@example.com"),
]


def compare_code(conn, dn, attr, value):
    conn.compare(dn, attr, value)
    return conn.result["result"]


def test_compares(pair):
    slapd, pando = pair
    co, cp = slapd.conn(), pando.conn()
    co.search("cn=admins," + GROUPS, "(objectClass=*)", BASE, attributes=["member"])
    member = co.response[0]["raw_attributes"]["member"][0].decode().upper()
    problems = []
    for dn, attr, value in COMPARES:
        value = member if value is None else value
        ro, rp = compare_code(co, dn, attr, value), compare_code(cp, dn, attr, value)
        if ro != rp:
            problems.append("compare %s %s=%r: slapd=%d pando=%d (%s)" % (dn, attr, value, ro, rp,
                                                                        cp.result.get("message")))
    co.unbind()
    cp.unbind()
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ modifications

NEW = "uid=newbie," + PEOPLE
NEW_ATTRS = {"objectClass": ["top", "inetOrgPerson", "posixAccount"], "uid": ["newbie"], "cn": ["Nëw Bïe"],
             "sn": ["Bïe"], "uidNumber": ["20000"], "gidNumber": ["500"], "homeDirectory": ["/home/newbie"],
             "description": ["first", "second"]}


def add_op(c, dn, attrs):
    attrs = dict(attrs)
    ocs = attrs.pop("objectClass")
    c.add(dn, ocs, attrs)


MODS = [
    ("add", lambda c: add_op(c, NEW, NEW_ATTRS), [NEW]),
    ("add duplicate", lambda c: add_op(c, NEW, NEW_ATTRS), [NEW]),
    ("add missing parent", lambda c: add_op(c, "uid=x,ou=Nope," + PEOPLE, NEW_ATTRS), []),
    ("add missing MUST", lambda c: add_op(c, "uid=nomust," + PEOPLE,
                                          {"objectClass": ["inetOrgPerson"], "uid": ["nomust"], "cn": ["x"]}), []),
    ("add undefined attr", lambda c: add_op(c, "uid=undef," + PEOPLE, dict(NEW_ATTRS, uid=["undef"],
                                                                           fooBarBaz=["1"])), []),
    ("modify multi", lambda c: c.modify(NEW, {"mail": [(MODIFY_REPLACE, ["n@example.com"])],
                                              "telephoneNumber": [(MODIFY_ADD, ["+1 555 1234", "+1 555 4321"])],
                                              "description": [(MODIFY_DELETE, ["first"])]}), [NEW]),
    ("modify delete missing value", lambda c: c.modify(NEW, {"description": [(MODIFY_DELETE, ["nope"])]}), [NEW]),
    ("modify add existing (case)", lambda c: c.modify(NEW, {"description": [(MODIFY_ADD, ["SECOND"])]}), [NEW]),
    ("modify increment", lambda c: c.modify(NEW, {"uidNumber": [(MODIFY_INCREMENT, ["5"])]}), [NEW]),
    ("modify bad syntax", lambda c: c.modify(NEW, {"uidNumber": [(MODIFY_REPLACE, ["abc"])]}), [NEW]),
    ("modify single-value", lambda c: c.modify(NEW, {"uidNumber": [(MODIFY_ADD, ["7"])]}), [NEW]),
    ("modify delete MUST", lambda c: c.modify(NEW, {"sn": [(MODIFY_DELETE, [])]}), [NEW]),
    ("modrdn deleteoldrdn", lambda c: c.modify_dn(NEW, "uid=newbie2", delete_old_dn=True),
     [NEW, "uid=newbie2," + PEOPLE]),
    ("modrdn keep old", lambda c: c.modify_dn(U % 4, "cn=Renamed Four", delete_old_dn=False),
     [U % 4, "cn=Renamed Four," + PEOPLE]),
    ("modrdn new superior", lambda c: c.modify_dn("uid=newbie2," + PEOPLE, "uid=newbie2",
                                                  new_superior=CONTRACT),
     ["uid=newbie2," + PEOPLE, "uid=newbie2," + CONTRACT]),
    ("delete leaf", lambda c: c.delete("uid=newbie2," + CONTRACT), ["uid=newbie2," + CONTRACT]),
    ("delete non-leaf", lambda c: c.delete(CONTRACT), [CONTRACT]),
    ("delete missing", lambda c: c.delete("uid=ghost," + PEOPLE), []),
    ("add unknown objectClass", lambda c: add_op(c, "cn=unk," + PEOPLE, {"objectClass": ["noSuchClass"],
                                                                          "cn": ["unk"]}), []),
    ("add outside suffix", lambda c: add_op(c, "uid=x,dc=other,dc=org", NEW_ATTRS), []),
    ("modify delete RDN value", lambda c: c.modify(U % 1, {"uid": [(MODIFY_DELETE, ["user001"])]}), [U % 1]),
    ("modify increment non-integer", lambda c: c.modify(U % 1, {"cn": [(MODIFY_INCREMENT, ["1"])]}), [U % 1]),
    ("modify operational", lambda c: c.modify(U % 1, {"entryUUID": [(MODIFY_REPLACE, [
        "00000000-0000-0000-0000-000000000000"])]}), [U % 1]),
    ("move below itself", lambda c: c.modify_dn(PEOPLE, "ou=Inside", new_superior=U % 1), [PEOPLE]),
    ("modify the subschema subentry", lambda c: c.modify("cn=Subschema", {"description": [(MODIFY_REPLACE, ["x"])]}),
     []),
]


def read_entries(conn, dns):
    out = {}
    for dn in dns:
        conn.search(dn, "(objectClass=*)", BASE, attributes=["*"])
        for r in conn.response or []:
            if r.get("type") == "searchResEntry":
                out[norm_dn(r["dn"])] = {
                    k.lower(): tuple(sorted(v.decode().lower() if k.lower() == "objectclass" else v.decode()
                                            for v in vs))
                    for k, vs in r["raw_attributes"].items()}
    return out


# Where slapd departs from the RFC and Pando follows it: (slapd, pando) codes.
RFC_OVER_SLAPD = {
    # RFC 4511 4.6: removing an RDN value is notAllowedOnRDN; slapd says
    # namingViolation.
    "modify delete RDN value": (64, 67),
}


def test_modifications(pair):
    slapd, pando = pair
    co, cp = slapd.conn(), pando.conn()
    problems = []
    for name, op, dns in MODS:
        op(co)
        ro = (co.result["result"], co.result.get("dn", ""))
        op(cp)
        rp = (cp.result["result"], cp.result.get("dn", ""))
        if RFC_OVER_SLAPD.get(name) == (ro[0], rp[0]):
            pass
        elif ro[0] != rp[0]:
            problems.append("%s: result slapd=%d pando=%d (%s)" % (name, ro[0], rp[0], cp.result.get("message")))
        elif ro[0] == 32 and norm_dn(ro[1]) != norm_dn(rp[1]):
            problems.append("%s: matchedDN slapd=%r pando=%r" % (name, ro[1], rp[1]))
        eo, ep = read_entries(co, dns), read_entries(cp, dns)
        if eo != ep:
            problems.append("%s: entries differ:\n%s" % (name, diff(eo, ep)))
    # whole-tree comparison at the end
    (rc_o, ents_o, _), (rc_p, ents_p, _) = search_both(pair, S, "sub", "(objectClass=*)", "*")
    if ents_o != ents_p:
        problems.append("tree differs after modifications:\n" + diff(ents_o, ents_p))
    # The root DSE (ldap3 sends no modify of the empty DN).
    codes = [subprocess.run(["ldapmodify", "-x", "-H", srv.url, "-D", srv.admin_dn, "-w", srv.admin_pw],
                            input="dn:\nchangetype: modify\nreplace: description\ndescription: x\n",
                            capture_output=True, text=True, timeout=30).returncode for srv in (slapd, pando)]
    if codes[0] != codes[1]:
        problems.append("modify the root DSE: result slapd=%d pando=%d" % tuple(codes))
    co.unbind()
    cp.unbind()
    assert not problems, "\n".join(problems)
