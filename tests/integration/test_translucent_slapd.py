"""Translucency compared with slapd: Pando's translucent overlay and
slapd 2.5's (back-mdb with `overlay translucent` over its captive
back-ldap) read the same remote slapd, both over StartTLS as the same
service account; the same local values are set on both by each server's
administrator, then the same searches (base/one/sub, filters on remote
attributes, on local ones, on both, presence) must find the same entries
with the same description/mail/telephoneNumber values, and the same
compares and writes get the same result codes, except where the two are
documented to differ (DIFFERENT_SEARCHES, WRITES): those are pinned as
observed with slapd 2.5.13, Pando's answer asserted, slapd's allowed to
become Pando's."""

from pathlib import Path

import pytest

from conftest import PEOPLE, SUFFIX, Pando, ldif_entry, parse_ldif
from test_differential import MODULE_DIR, SCHEMA_DIR, Slapd
from test_translucent import READER, READER_PW, REMOTE, TlsSlapd, start_remote, translucent_config, user

pytestmark = pytest.mark.skipif(
    not all(any(Path(MODULE_DIR, m + ext).exists() for ext in (".la", ".so"))
            for m in ("translucent", "back_ldap")),
    reason="slapd's translucent or back_ldap module is missing from " + MODULE_DIR)

ALICE, BOB, CAROL = ("uid=%s,%s" % (u, PEOPLE) for u in ("alice", "bob", "carol"))
TRANSLUCENT_PW = "slapd-translucent-secret"
LOCAL_ATTRS = ["description", "telephoneNumber"]
# Attributes slapd sends to the remote in filters: every attribute the
# searches below test (slapd drops the others from the remote's filter).
REMOTE_FILTER_ATTRS = ["objectClass", "uid", "cn", "sn", "mail", "description", "telephoneNumber"]
# Requested by every search. slapd 2.5.13 tests the entries only the remote
# matched against the attributes the client asked for, not the whole entry:
# with `1.1` it drops them (`(description=remote)` finds nobody), so every
# attribute the filters test is named here;
# test_the_requested_attributes_do_not_change_which_entries_match pins that.
ATTRS = ["objectClass", "uid", "cn", "description", "mail", "telephoneNumber"]
COMPARED = ["description", "mail", "telephoneNumber"]


class RemoteSlapd(TlsSlapd):
    """The remote: simple binds need TLS, so both proxies must use StartTLS
    for their service bind (anonymous reads stay open for checks here)."""

    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        conf.write_text(conf.read_text().replace("sizelimit unlimited\n",
                                                 "sizelimit unlimited\nsecurity simple_bind=1\n"))


class TranslucentSlapd(Slapd):
    """slapd-translucent: an empty back-mdb for the suffix holding the local
    values, the translucent overlay, and its captive back-ldap reading the
    remote over StartTLS as READER (idassert for clients, acl-bind for the
    rootdn's own reads, e.g. the remote entry a modify checks)."""

    def __init__(self, base, remote_url, ca):
        super().__init__(base)
        self.admin_pw = TRANSLUCENT_PW
        self.remote_url, self.ca = remote_url, ca

    def write_conf(self):
        tls = "starttls=critical tls_cacert=%s tls_reqcert=demand" % self.ca
        bind = 'bindmethod=simple binddn="%s" credentials="%s" %s' % (READER, READER_PW, tls)
        lines = ["include %s/%s.schema" % (SCHEMA_DIR, s) for s in ("core", "cosine", "inetorgperson", "nis")]
        lines += [
            "modulepath " + MODULE_DIR,
            "moduleload back_mdb",
            "moduleload back_ldap",
            "moduleload translucent",
            "pidfile %s/slapd.pid" % self.base,
            "argsfile %s/slapd.args" % self.base,
            "loglevel 0",
            "threads 2",
            "sizelimit unlimited",
            "",
            "database mdb",
            'suffix "%s"' % SUFFIX,
            'rootdn "%s"' % self.admin_dn,
            "rootpw %s" % self.admin_pw,
            "directory %s/db" % self.base,
            "maxsize 268435456",
            "lastmod off",
            "access to attrs=userPassword by self write by anonymous auth by * none",
            "access to * by * read",
            "overlay translucent",
            "translucent_local " + ",".join(LOCAL_ATTRS),
            "translucent_remote " + ",".join(REMOTE_FILTER_ATTRS),
            "uri %s" % self.remote_url,
            "tls start tls_cacert=%s tls_reqcert=demand" % self.ca,
            "network-timeout 3",
            "timeout 5",
            "idassert-bind %s mode=none" % bind,
            "acl-bind %s" % bind,
        ]
        (self.base / "db").mkdir(parents=True, exist_ok=True)
        (self.base / "slapd.conf").write_text("\n".join(lines) + "\n")


def modify(dn, *changes):
    """LDIF for one modify: changes are (op, attr, [values])."""
    parts = ["%s: %s\n%s" % (op, attr, "".join("%s: %s\n" % (attr, v) for v in vals))
             for op, attr, vals in changes]
    return "dn: %s\nchangetype: modify\n%s" % (dn, "-\n".join(parts))


# The local steps, made on both by the administrator.
LOCAL_STEPS = [
    modify(CAROL, ("replace", "description", ["kept here"])),
    modify(ALICE, ("add", "telephoneNumber", ["+1 555 0100"])),
]


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """(remote, slapd-translucent, pando) with LOCAL_STEPS applied to both
    proxies."""
    base = tmp_path_factory.mktemp("translucent-slapd")
    pki, remote = start_remote(base, REMOTE, RemoteSlapd)
    started = [remote]
    try:
        slapd = TranslucentSlapd(base / "slapd-translucent", remote.url, pki.ca)
        slapd.write_conf()
        slapd.start()
        started.append(slapd)
        (base / "pando").mkdir()
        pando = Pando(base / "pando", config=translucent_config(remote.url, base / "pando", pki.ca),
                      name="pando-translucent-slapd").start()
        try:
            # Pando's own suffix entry (made at its first start) would hide
            # the remote's; slapd's local database starts empty.
            rc, _, err = pando.ldap("ldapdelete", SUFFIX)
            assert rc == 0, err
            for step in LOCAL_STEPS:
                for srv in (slapd, pando):
                    rc, _, err = srv.ldap("ldapmodify", input=step)
                    assert rc == 0, (type(srv).__name__, step, err)
            yield remote, slapd, pando
        finally:
            pando.stop_and_verify()
    finally:
        for s in reversed(started):
            s.stop()


def norm_dn(dn):
    return ",".join(p.strip() for p in dn.lower().split(","))


def search(srv, base, scope, filt, attrs=ATTRS):
    """(result code, {normalised dn: {attr: sorted values}}), keeping the
    COMPARED attributes the entry has."""
    rc, out, _ = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", base, "-s", scope, filt,
                          *attrs, timeout=30)
    got = {}
    for dn, a in parse_ldif(out):
        lower = {k.lower(): vs for k, vs in a.items()}
        got[norm_dn(dn)] = {k: sorted(lower[k.lower()]) for k in COMPARED if k.lower() in lower}
    return rc, got


# (base, scope, filter); the merged entries are: alice (remote, with a local
# telephoneNumber), bob (remote), carol (remote, description replaced here by
# "kept here"; the remote's is "remote"), the suffix, cn=reader, ou=People.
SEARCHES = [
    # Scopes, no attribute test.
    (SUFFIX, "sub", "(objectClass=*)"),
    (SUFFIX, "one", "(objectClass=*)"),
    (PEOPLE, "one", "(objectClass=*)"),
    (CAROL, "base", "(objectClass=*)"),
    (BOB, "base", "(objectClass=*)"),
    # Remote attributes only.
    (PEOPLE, "one", "(mail=alice@example.com)"),
    (SUFFIX, "sub", "(cn=Bob)"),
    (PEOPLE, "sub", "(uid=*)"),
    (SUFFIX, "sub", "(mail=*)"),
    (SUFFIX, "sub", "(objectClass=inetOrgPerson)"),
    (SUFFIX, "sub", "(objectClass=organizationalUnit)"),
    (SUFFIX, "sub", "(!(uid=bob))"),
    # Local attributes only.
    (PEOPLE, "sub", "(description=kept here)"),
    (PEOPLE, "sub", "(description=*here)"),
    (PEOPLE, "sub", "(description=remote)"),
    (PEOPLE, "one", "(!(description=remote))"),
    (SUFFIX, "sub", "(description=*)"),
    (SUFFIX, "sub", "(telephoneNumber=*)"),
    (SUFFIX, "sub", "(!(telephoneNumber=*))"),
    (ALICE, "base", "(telephoneNumber=+1 555 0100)"),
    (CAROL, "base", "(description=remote)"),
    (CAROL, "base", "(description=kept here)"),
    (PEOPLE, "sub", "(|(description=kept here)(telephoneNumber=*))"),
    (PEOPLE, "sub", "(!(|(description=kept here)(telephoneNumber=*)))"),
    # Both.
    (PEOPLE, "sub", "(&(description=kept*)(mail=carol@*))"),
    (PEOPLE, "sub", "(&(description=kept*)(mail=alice@*))"),
    (PEOPLE, "sub", "(&(uid=carol)(description=remote))"),
    (PEOPLE, "sub", "(&(telephoneNumber=+1 555*)(description=remote))"),
    (PEOPLE, "sub", "(&(objectClass=inetOrgPerson)(!(description=kept here)))"),
    (PEOPLE, "sub", "(|(telephoneNumber=*)(mail=bob@*))"),
    (PEOPLE, "sub", "(|(description=kept here)(uid=alice))"),
    (SUFFIX, "sub", "(|(mail=carol@*)(telephoneNumber=*))"),
    (PEOPLE, "one", "(!(&(description=remote)(mail=bob@*)))"),
    (PEOPLE, "sub", "(&(mail=*)(description=*)(!(telephoneNumber=*)))"),
]

# Searches where the two are documented to answer differently:
# (base, scope, filter) -> (Pando's answer as DNs, slapd's as observed with
# 2.5.13). slapd may also give Pando's answer (a later slapd that changes
# passes too); Pando must give its own.
DIFFERENT_SEARCHES = {
    # slapd's translucent makes `glue` entries (objectClass top, glue) for
    # the ancestors of every local entry it creates, and a local objectClass
    # REPLACES the remote's like any other attribute: once carol has a local
    # description, ou=People and the suffix show objectClass top/glue through
    # slapd and no longer match. Pando adds the classes of its parts to the
    # remote's (docs/overlays.md, "Reads"); test_ancestors_of_local_values.
    (SUFFIX, "sub", "(objectClass=organizationalUnit)"): ([PEOPLE], []),
    # Both attributes are translucent_local, so slapd tests this whole filter
    # on its local entries as stored: alice's holds telephoneNumber but not
    # the remote's description, and the remote never matches (it has no
    # telephoneNumber). Pando tests the merged entry, which matches.
    (PEOPLE, "sub", "(&(telephoneNumber=+1 555*)(description=remote))"): ([ALICE], []),
}


@pytest.mark.parametrize("base,scope,filt", SEARCHES)
def test_same_entries_and_values(trio, base, scope, filt):
    _, slapd, pando = trio
    rs, s = search(slapd, base, scope, filt)
    rp, p = search(pando, base, scope, filt)
    known = DIFFERENT_SEARCHES.get((base, scope, filt))
    if known is None:
        assert (rp, p) == (rs, s), "slapd: %r\npando: %r" % ((rs, s), (rp, p))
        return
    pando_dns, slapd_dns = (sorted(norm_dn(d) for d in ds) for ds in known)
    assert rp == 0 and sorted(p) == pando_dns, (rp, p)
    assert rs == 0 and sorted(s) in (pando_dns, slapd_dns), (rs, s)


@pytest.mark.parametrize("base,scope,filt,slapd_with_1_1", [
    (PEOPLE, "sub", "(description=remote)", []),
    (PEOPLE, "sub", "(|(telephoneNumber=*)(mail=bob@*))", [ALICE]),
    (PEOPLE, "sub", "(&(description=remote)(mail=*))", []),
])
def test_the_requested_attributes_do_not_change_which_entries_match(trio, base, scope, filt, slapd_with_1_1):
    """slapd 2.5.13, with translucent_local and translucent_remote both set,
    keeps the entries only the remote matched and tests them at the end
    against what the client asked for rather than the whole entry: with
    `1.1` (or attributes the filter does not test) it loses alice and bob
    where only the remote matched them, and keeps what its local database
    matched (alice's local telephoneNumber). Pando's answer is the same
    whatever is requested."""
    _, slapd, pando = trio
    rp, full = search(pando, base, scope, filt)
    assert rp == 0 and full, full
    for attrs in (["1.1"], ["uid"], ["*"]):
        rp, p = search(pando, base, scope, filt, attrs)
        assert (rp, sorted(p)) == (0, sorted(full)), (attrs, p)
    rs, s = search(slapd, base, scope, filt, ["1.1"])
    assert rs == 0 and sorted(s) in (sorted(full), sorted(norm_dn(d) for d in slapd_with_1_1)), s


def test_ancestors_of_local_values(trio):
    """ou=People and the suffix, ancestors of carol's and alice's local
    values: Pando shows the remote's object classes; slapd shows those of
    the glue entries it made (see DIFFERENT_SEARCHES)."""
    _, slapd, pando = trio
    for dn, remote_classes in ((PEOPLE, ["organizationalunit"]), (SUFFIX, ["dcobject", "organization"])):
        got = {}
        for srv in (slapd, pando):
            rc, out, err = srv.ldap("ldapsearch", "-LLL", "-b", dn, "-s", "base", "(objectClass=*)",
                                    "objectClass", timeout=30)
            assert rc == 0, err
            got[srv] = sorted(v.lower() for _, a in parse_ldif(out) for v in a.get("objectClass", []))
        assert got[pando] == remote_classes, got[pando]
        assert got[slapd] in (remote_classes, ["glue", "top"]), got[slapd]


# Compares agree: slapd compares on its local entry when that holds the
# attribute, on the remote otherwise; Pando compares the merged entry.
COMPARES = [
    (CAROL, "description:remote", 5),
    (CAROL, "description:kept here", 6),
    (ALICE, "description:remote", 6),
    (ALICE, "telephoneNumber:+1 555 0100", 6),
    (ALICE, "mail:alice@example.com", 6),
    (BOB, "telephoneNumber:+1 555 0100", 16),
    ("uid=nobody," + PEOPLE, "uid:nobody", 32),
]


def test_same_compare_results(trio):
    _, slapd, pando = trio
    for dn, ava, want in COMPARES:
        got = [srv.ldap("ldapcompare", dn, ava, timeout=30)[0] for srv in (slapd, pando)]
        assert got == [want, want], (dn, ava, got)


# Writes by the administrator, in this order (each changes what the next
# sees): (what, tool, args, LDIF input, Pando's code, slapd's code).
#
# Deliberate differences (docs/overlays.md, "Local entries" and "Writes to
# remote entries"):
# - delete of a remote entry: Pando refuses it (53, the remote holds it);
#   slapd passes it to its local database: noSuchObject (32) when that holds
#   nothing for the name (bob), and success when it holds local values
#   (carol), which deletes only those values: carol's description is the
#   remote's again through slapd.
# - add of a name the remote holds: Pando refuses it (68), since the local
#   entry would hide the remote's (and its password would log in as it);
#   slapd adds it to its local database when that holds nothing for the name
#   (bob, now shown with the added values over the remote's), and says 68
#   only when it does (alice, who has a local telephoneNumber).
# - modify of a remote-only attribute (mail): Pando refuses it (53) unless
#   remote_writes = "local"; slapd keeps the value locally (0), replacing
#   the remote's in what it shows.
# Both agree on a modify of a local attribute (0) and of a name that exists
# nowhere (32).
WRITES = [
    ("delete a remote entry", "ldapdelete", [BOB], None, 53, 32),
    ("delete a remote entry with local values", "ldapdelete", [CAROL], None, 53, 0),
    ("add a name the remote holds", "ldapadd", [],
     ldif_entry(*user("bob", description=["added here"])), 68, 0),
    ("add a name the remote holds, with local values", "ldapadd", [], ldif_entry(*user("alice")), 68, 68),
    ("modify a remote-only attribute", "ldapmodify", [],
     modify(ALICE, ("replace", "mail", ["alice@local.example.com"])), 53, 0),
    ("modify a local attribute", "ldapmodify", [],
     modify(ALICE, ("replace", "description", ["alice here"])), 0, 0),
    ("modify a name that exists nowhere", "ldapmodify", [],
     modify("uid=nobody," + PEOPLE, ("replace", "description", ["x"])), 32, 32),
]

# What each shows after WRITES (description, mail of alice, bob, carol).
AFTER_WRITES = {
    "pando": {ALICE: (["alice here"], ["alice@example.com"]),
              BOB: (["remote"], ["bob@example.com"]),
              CAROL: (["kept here"], ["carol@example.com"])},
    "slapd": {ALICE: (["alice here"], ["alice@local.example.com"]),
              BOB: (["added here"], ["bob@example.com"]),
              CAROL: (["remote"], ["carol@example.com"])},
}


def test_writes_to_what_the_remote_holds(trio):
    """Last: it changes both proxies' local values."""
    remote, slapd, pando = trio
    for what, tool, args, ldif, want_pando, want_slapd in WRITES:
        rs = slapd.ldap(tool, *args, input=ldif, timeout=30)[0]
        rp, _, err = pando.ldap(tool, *args, input=ldif, timeout=30)
        assert (rp, rs) == (want_pando, want_slapd), (what, "pando", rp, err, "slapd", rs)
    for name, srv in (("pando", pando), ("slapd", slapd)):
        rc, got = search(srv, PEOPLE, "one", "(objectClass=*)")
        assert rc == 0
        shown = {dn: (got[norm_dn(dn)].get("description"), got[norm_dn(dn)].get("mail"))
                 for dn in (ALICE, BOB, CAROL)}
        assert shown == AFTER_WRITES[name], (name, shown)
    # Neither wrote to the remote.
    rc, out, err = remote.ldap("ldapsearch", "-LLL", "-b", PEOPLE, "-s", "one", "(objectClass=*)",
                               "description", "mail", "telephoneNumber", auth=None, timeout=30)
    assert rc == 0, err
    assert sorted((norm_dn(d), a.get("description"), a.get("mail"), a.get("telephoneNumber"))
                  for d, a in parse_ldif(out)) == sorted(
        (norm_dn(dn), ["remote"], ["%s@example.com" % u], None)
        for dn, u in ((ALICE, "alice"), (BOB, "bob"), (CAROL, "carol"))), out
