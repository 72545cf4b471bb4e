"""Java JNDI (com.sun.jndi.ldap, the LDAP provider every Java application
uses) against Pando: the Java entry of the real-client matrix.

java/ClientMatrix.java runs one scenario per process and prints what came
back in tab-separated lines; these tests parse and check them. Proved here:
simple binds (right password, wrong password and unknown DN giving an
AuthenticationException with LDAP code 49, anonymous), the root DSE, subtree
searches with filters (non-ASCII values too) returning only the asked
attributes, count limits, JNDI's compare (a base search for no
attributes), modifications (add, replace, remove values and whole
attributes, atomic failure), add and delete with the exceptions JNDI maps
the result codes to, Context.rename in place and to another parent, paged
results through the cookie loop, server-side sorting (ascending with a
tie-break key, reverse, entries lacking the key) and sorted pages in
reverse order (SortedPages.java in test_sort_vlv.py has the ascending
ones)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SUFFIX

pytestmark = pytest.mark.skipif(not shutil.which("java"), reason="no Java runtime")

SRC = Path(__file__).resolve().parent / "java" / "ClientMatrix.java"
MATRIX = "ou=Matrix," + SUFFIX
MOVES = "ou=Moves," + SUFFIX
MOVED = "ou=Moved," + SUFFIX
# Case differences and case-insensitive ties ("Adams"/"adams", "baker"/"Baker").
SNS = ["walker", "Adams", "baker", "Clark", "adams", "Young", "evans", "Baker", "hughes", "Irwin",
       "jones", "King", "lewis", "Moore", "nash", "Owens", "Price", "quinn", "Reed", "Scott",
       "turner", "Upton", "vance"]
NO_TITLE = {"m05", "m17"}
USER_PW = "m00-secret"


def mdn(uid, parent=MATRIX):
    return "uid=%s,%s" % (uid, parent)


def matrix_entries():
    out = [(MATRIX, {"objectClass": ["top", "organizationalUnit"], "ou": ["Matrix"]})]
    for i, sn in enumerate(SNS):
        uid = "m%02d" % i
        a = {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
             "uid": [uid], "cn": ["Zoë Øster" if uid == "m07" else "User " + uid], "sn": [sn],
             "mail": [uid + "@example.com"]}
        if uid not in NO_TITLE:
            a["title"] = ["Title %02d" % ((i * 7) % 23)]
        if uid == "m00":
            a["userPassword"] = [USER_PW]
        out.append((mdn(uid), a))
    for ou in (MOVES, MOVED):
        out.append((ou, {"objectClass": ["top", "organizationalUnit"], "ou": [ou[3:].split(",")[0]]}))
    out.append((mdn("jmod", MOVES), {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
                                     "uid": ["jmod"], "cn": ["Mod Target"], "sn": ["Target"],
                                     "mail": ["jmod@example.com"], "telephoneNumber": ["+1 555 0100"]}))
    out.append((mdn("jren", MOVES), {"objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
                                     "uid": ["jren"], "cn": ["Rename Target"], "sn": ["Target"]}))
    return out


@pytest.fixture(scope="module")
def srv(demo_server):
    demo_server.bulk_add(matrix_entries())
    return demo_server


@pytest.fixture(scope="module")
def java_cmd(tmp_path_factory):
    """How to start ClientMatrix, compiled once: with javac when there is a
    JDK, else with the compiler module of the runtime (a JRE has no javac
    command; Debian's default-jre-headless has the module, which is what
    `java File.java` uses too)."""
    d = tmp_path_factory.mktemp("jndi-classes")
    if shutil.which("javac"):
        compiler = ["javac"]
    else:
        compiler = ["java", "-m", "jdk.compiler/com.sun.tools.javac.Main"]
    r = subprocess.run(compiler + ["-d", str(d), str(SRC)], capture_output=True, text=True, timeout=180)
    if r.returncode != 0 and compiler[0] == "java" and "jdk.compiler" in r.stderr:
        pytest.skip("this Java runtime has no compiler module: " + r.stderr.strip()[:200])
    assert r.returncode == 0, "%s failed:\n%s%s" % (" ".join(compiler), r.stdout, r.stderr)
    return ["java", "-cp", str(d), "ClientMatrix"]


class Run:
    """One ClientMatrix run: its lines, split on tabs."""

    def __init__(self, shown, stdout, stderr):
        self.text = "$ ClientMatrix %s\n%s%s" % (" ".join(shown), stdout, stderr)
        self.lines = [l.split("\t") for l in stdout.splitlines()]

    def __str__(self):
        return self.text

    __repr__ = __str__

    def kind(self, k):
        return [l[1:] for l in self.lines if l[0] == k]

    @property
    def bound(self):
        return bool(self.kind("bound"))

    @property
    def oks(self):
        return {l[0] for l in self.kind("ok")}

    def error(self, step):
        """(exception class, LDAP code, resolved name, remaining name) of the step's error, or None."""
        errs = [l for l in self.kind("error") if l[0] == step]
        assert len(errs) <= 1, self
        return (errs[0][1], int(errs[0][2]), errs[0][3], errs[0][4]) if errs else None

    def failure(self, step):
        """(exception class, LDAP code) of a step that must have failed."""
        e = self.error(step)
        assert e is not None, "step %r did not fail:\n%s" % (step, self)
        return e[:2]

    def attrs(self, label):
        """{lower-case attribute name: [values]} read back under label."""
        out = {}
        for l in self.kind("attr"):
            if l[0] == label:
                out.setdefault(l[1].lower(), []).append(l[2])
        return out

    @property
    def entries(self):
        """[(dn, [values])] in the order received."""
        return [(l[0], l[1:]) for l in self.kind("entry")]

    def uids(self):
        return [dn.split(",")[0][4:] for dn, _ in self.entries]


@pytest.fixture(scope="module")
def jndi(java_cmd, srv):
    def run(scenario, *args, who="admin"):
        if who == "admin":
            dn, pw = srv.admin_dn, srv.admin_pw
        elif who is None:
            dn, pw = "", ""
        else:
            dn, pw = who
        cmd = java_cmd + [srv.url, dn, pw, scenario, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        run = Run([srv.url, repr(dn), scenario, *map(repr, args)], r.stdout, r.stderr)
        assert r.returncode == 0, "ClientMatrix exited %d:\n%s" % (r.returncode, run)
        assert run.lines and run.lines[-1] == ["done"], "ClientMatrix did not finish:\n%s" % run
        return run
    return run


def ci(values):
    return sorted(v.lower() for v in values)


# ------------------------------------------------------------------ bind


def test_simple_bind_with_the_right_password_succeeds(jndi):
    for who in ("admin", (mdn("m00"), USER_PW)):
        r = jndi("bind", who=who)
        assert r.bound and r.error("connect") is None, r


def test_wrong_password_and_unknown_dn_give_authentication_exception_49(jndi):
    for who in ((mdn("m00"), "not-the-password"), (mdn("ghost"), USER_PW), (mdn("m01"), "m01 has none")):
        r = jndi("bind", who=who)
        assert not r.bound, r
        assert r.failure("connect") == ("AuthenticationException", 49), r


def test_anonymous_reads_but_writes_need_authentication_and_rights(jndi):
    r = jndi("search", MATRIX, "(uid=m03)", "uid", who=None)
    assert r.bound and [dn.lower() for dn, _ in r.entries] == [mdn("m03").lower()], r
    # Anonymous updates: strongerAuthRequired (8), as slapd without "allow update_anon".
    r = jndi("modify", mdn("m03"), who=None)
    assert r.failure("add values") == ("AuthenticationNotSupportedException", 8), r
    assert r.failure("replace") == ("AuthenticationNotSupportedException", 8), r
    # A user without write rights on the entry: insufficientAccessRights (50).
    r = jndi("modify", mdn("m03"), who=(mdn("m00"), USER_PW))
    assert r.failure("add values") == ("NoPermissionException", 50), r
    assert r.failure("remove attribute") == ("NoPermissionException", 50), r
    after = r.attrs("after remove attribute")
    assert "description" not in after and after["mail"] == ["m03@example.com"], r


# ------------------------------------------------------------------ search


def test_root_dse_base_search(jndi):
    r = jndi("rootdse")
    dse = r.attrs("")
    assert dse.get("namingcontexts") == [SUFFIX], r
    assert dse.get("supportedldapversion") == ["3"], r
    assert {"1.2.840.113556.1.4.319", "1.2.840.113556.1.4.473"} <= set(dse.get("supportedcontrol", [])), r
    assert dse.get("subschemasubentry"), r


def test_subtree_search_with_filter_returns_the_asked_attributes_only(jndi):
    r = jndi("search", SUFFIX, "(&(objectClass=inetOrgPerson)(sn=ADAMS))", "uid,sn")
    assert sorted(dn.lower() for dn, _ in r.entries) == [mdn("m01").lower(), mdn("m04").lower()], r
    for uid, sn in (("m01", "Adams"), ("m04", "adams")):
        attrs = {k: v for k, v in r.attrs(mdn(uid)).items()}
        if not attrs:  # the DN as the server spelled it
            attrs = next(r.attrs(dn) for dn, _ in r.entries if dn.lower() == mdn(uid).lower())
        assert attrs == {"uid": [uid], "sn": [sn]}, r


def test_search_with_a_non_ascii_filter_value(jndi):
    r = jndi("search", MATRIX, "(cn=zoë øster)", "cn")
    assert [dn.lower() for dn, _ in r.entries] == [mdn("m07").lower()], r
    assert r.attrs(r.entries[0][0]) == {"cn": ["Zoë Øster"]}, r


def test_count_limit_gives_size_limit_exceeded_after_the_entries(jndi):
    r = jndi("sizelimit", MATRIX, "(objectClass=inetOrgPerson)", "3")
    assert len(r.entries) == 3, r
    assert r.failure("sizelimit") == ("SizeLimitExceededException", 4), r


def test_compare_through_a_base_search_for_no_attributes(jndi):
    assert jndi("compare", mdn("m00"), "(sn=WALKER)").kind("compare") == [["true"]]
    assert jndi("compare", mdn("m00"), "(sn=Walk)").kind("compare") == [["false"]]
    r = jndi("compare", mdn("ghost"), "(sn=x)")
    assert r.failure("compare") == ("NameNotFoundException", 32), r


# ------------------------------------------------------------------ writes


@pytest.fixture(scope="module")
def modified(jndi):
    """The modify scenario, run once on uid=jmod."""
    return jndi("modify", mdn("jmod", MOVES))


def test_modify_add_replace_remove_values_and_read_back(modified):
    r = modified
    assert {"add values", "replace", "remove value", "remove attribute"} <= r.oks, r
    after = r.attrs("after add")
    assert ci(after["description"]) == ["jndi one", "jndi two"], r
    assert after["telephonenumber"] == ["+1 555 0100"], r
    after = r.attrs("after replace")
    assert sorted(after["telephonenumber"]) == ["+1 555 0198", "+1 555 0199"], r
    assert r.attrs("after remove value")["description"] == ["jndi two"], r
    after = r.attrs("after remove attribute")
    assert "mail" not in after and after["description"] == ["jndi two"], r


def test_modify_errors_map_to_jndi_exceptions_and_apply_nothing(modified):
    r = modified
    assert r.failure("add existing value") == ("AttributeInUseException", 20), r
    assert r.failure("remove absent value") == ("NoSuchAttributeException", 16), r
    assert r.failure("half failing") == ("AttributeInUseException", 20), r
    after = r.attrs("after half failing")
    assert after["sn"] == ["Target"] and after["description"] == ["jndi two"], r
    assert r.failure("undefined attribute") == ("InvalidAttributeIdentifierException", 17), r
    assert r.failure("missing entry") == ("NameNotFoundException", 32), r


def test_add_and_delete_an_entry(jndi):
    r = jndi("adddelete", MOVES)
    assert {"add", "delete"} <= r.oks, r
    added = r.attrs("added")
    assert added["uid"] == ["jndi-new"] and added["cn"] == ["Zoë Jndi jndi-new"], r
    assert added["mail"] == ["jndi-new@example.com"], r
    assert r.failure("add again") == ("NameAlreadyBoundException", 68), r
    assert r.failure("add without sn") == ("SchemaViolationException", 65), r
    assert r.failure("add under missing parent") == ("NameNotFoundException", 32), r
    assert r.failure("delete non-leaf") == ("ContextNotEmptyException", 66), r
    assert r.failure("read deleted") == ("NameNotFoundException", 32), r


def test_rename_in_place_and_to_another_parent(jndi, srv):
    old, new, moved = mdn("jren", MOVES), mdn("jren2", MOVES), mdn("jren2", MOVED)
    r = jndi("rename", old, new, moved)
    assert {"rename", "move"} <= r.oks, r
    # JNDI asks for the old RDN value to be deleted (java.naming.ldap.deleteRDN defaults to true).
    assert r.attrs("renamed")["uid"] == ["jren2"], r
    assert r.failure("read old name") == ("NameNotFoundException", 32), r
    assert r.attrs("moved")["uid"] == ["jren2"] and r.attrs("moved")["cn"] == ["Rename Target"], r
    assert r.failure("rename missing") == ("NameNotFoundException", 32), r
    rc, found, err = srv.search(SUFFIX, "(cn=Rename Target)", "1.1")
    assert rc == 0 and [dn.lower() for dn, _ in found] == [moved.lower()], (found, err)


# ------------------------------------------------------------------ paged and sorted


def pages(r):
    return [int(p[1]) for p in r.kind("page")]


def test_paged_results_through_the_cookie_loop(jndi):
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "uid", "5", "-")
    assert pages(r) == [5, 5, 5, 5, 3], r
    uids = r.uids()
    assert sorted(uids) == ["m%02d" % i for i in range(len(SNS))], r
    assert not r.kind("sort"), r


def expected_order(keys):
    """uids in the order RFC 2891 gives for keys like [("sn", False), ("uid", True)]
    (reverse flag); case-insensitive values, entries without the key last."""
    rows = [(dn.split(",")[0][4:], a) for dn, a in matrix_entries()[1:] if dn.endswith(MATRIX)]
    for attr, reverse in reversed(keys):  # stable sorts, the last key first
        rows.sort(key=lambda row: (attr not in row[1], row[1].get(attr, [""])[0].lower()), reverse=reverse)
    return [uid for uid, _ in rows]


def test_sort_ascending_with_a_tie_break_key(jndi):
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "sn", "0", "sn,-uid")
    assert r.kind("sort") == [["0"]], r
    got = r.uids()
    assert got == expected_order([("sn", False), ("uid", True)]), r
    sns = [v[0] for _, v in r.entries]
    assert sns[:4] == ["adams", "Adams", "Baker", "baker"], r


def test_sort_in_reverse_order(jndi):
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "sn", "0", "-sn")
    assert r.kind("sort") == [["0"]], r
    sns = [v[0].lower() for _, v in r.entries]
    assert len(sns) == len(SNS) and sns == sorted(sns, reverse=True), r


def test_sort_puts_entries_without_the_key_last_and_first_in_reverse(jndi):
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "title", "0", "title,uid")
    assert r.kind("sort") == [["0"]], r
    uids = r.uids()
    assert set(uids[-2:]) == NO_TITLE and uids == expected_order([("title", False), ("uid", False)]), r
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "title", "0", "-title")
    assert set(r.uids()[:2]) == NO_TITLE, r


def test_sorted_pages_in_reverse_order(jndi):
    r = jndi("list", MATRIX, "(objectClass=inetOrgPerson)", "sn", "4", "-sn,uid")
    assert pages(r) == [4, 4, 4, 4, 4, 3], r
    assert r.kind("sort") == [["0"]] * 6, r
    assert r.uids() == expected_order([("sn", True), ("uid", False)]), r
