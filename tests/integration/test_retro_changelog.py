"""The retro change log (cn=changelog, issue 43 item 3) against the real
binary, read as the sync tools of the Sun/389 family (LSC) read it: the
root DSE's firstChangeNumber/lastChangeNumber, then each change by number
from the last one seen. Adds, modifies, renames (with a move) and deletes;
who may read it; attributes left out; trimming that renumbers nothing, so
a reader resumes where it was and loses nothing it has not passed."""


from conftest import PEOPLE, PUBLIC_READ, SUFFIX, Pando

READER = ("uid=bob," + PEOPLE, "bob-secret")

CONFIG = PUBLIC_READ + """
[[access]]
dn = "cn=changelog"
by = [{ who = "dn:uid=bob,ou=People,dc=example,dc=com", rights = "read" }]

[[overlay]]
type = "retrochangelog"
exclude_attributes = ["userPassword"]
"""

WRITES = """dn: uid=cl,{people}
changetype: add
objectClass: inetOrgPerson
uid: cl
cn: Change Log
sn: Log
userPassword: {{SSHA}}notshownanywhere
description: first

dn: uid=cl,{people}
changetype: modify
replace: description
description: second
-
add: mail
mail: cl@example.com

dn: ou=Moved,{suffix}
changetype: add
objectClass: organizationalUnit
ou: Moved

dn: uid=cl,{people}
changetype: modrdn
newrdn: uid=cl2
deleteoldrdn: 1
newsuperior: ou=Moved,{suffix}

dn: uid=cl2,ou=Moved,{suffix}
changetype: delete
""".format(people=PEOPLE, suffix=SUFFIX)


def root_numbers(srv, auth="admin"):
    rc, entries, err = srv.search("", "(objectClass=*)", "changelog", "firstChangeNumber",
                                  "lastChangeNumber", scope="base", auth=auth)
    assert rc == 0, err
    attrs = {k.lower(): v for k, v in entries[0][1].items()}
    return attrs


def change(srv, n, auth=READER):
    """Change `n` read as LSC reads it: a search by number below cn=changelog."""
    rc, entries, err = srv.search("cn=changelog", "(changeNumber=%d)" % n, scope="one", auth=auth)
    assert rc == 0, err
    assert len(entries) <= 1, entries
    return {k.lower(): v for k, v in entries[0][1].items()} if entries else None


def walk(srv, first, last):
    return [(n, change(srv, n)) for n in range(first, last + 1)]


def start(tmp_path, config, name):
    srv = Pando(tmp_path, demo=True, config=config, name=name).start()
    for user in ("alice", "bob"):
        rc, _, err = srv.ldap("ldappasswd", "-s", user + "-secret", "uid=%s,%s" % (user, PEOPLE))
        assert rc == 0, err
    return srv


def write(srv, ldif):
    rc, out, err = srv.ldap("ldapmodify", input=ldif)
    assert rc == 0, err + out


def test_changes_are_read_by_number_through_every_kind_of_write(tmp_path):
    srv = start(tmp_path, CONFIG, "retrocl")
    try:
        root = root_numbers(srv)
        assert root["changelog"] == ["cn=changelog"]
        last = int(root["lastchangenumber"][0])
        write(srv, WRITES)
        root = root_numbers(srv)
        assert int(root["lastchangenumber"][0]) == last + 5, root
        got = walk(srv, last + 1, last + 5)
        kinds = [(e["changetype"][0], e["targetdn"][0].lower()) for _, e in got]
        assert kinds == [
            ("add", "uid=cl," + PEOPLE.lower()),
            ("modify", "uid=cl," + PEOPLE.lower()),
            ("add", "ou=moved," + SUFFIX.lower()),
            ("modrdn", "uid=cl," + PEOPLE.lower()),
            ("delete", "uid=cl2,ou=moved," + SUFFIX.lower()),
        ], kinds
        for n, e in got:
            assert e["changenumber"] == [str(n)]
            assert "changeLogEntry" in e["objectclass"]
            assert len(e["changetime"][0]) == 15 and e["changetime"][0].endswith("Z")
        add = got[0][1]["changes"][0]
        assert "uid: cl\n" in add and "description: first\n" in add, add
        assert "userPassword" not in add and "notshownanywhere" not in add, add
        mod = got[1][1]["changes"][0]
        assert "replace: description\ndescription: second\n-\n" in mod, mod
        assert "add: mail\nmail: cl@example.com\n-\n" in mod, mod
        ren = got[3][1]
        assert ren["newrdn"] == ["uid=cl2"]
        assert ren["deleteoldrdn"] == ["TRUE"]
        assert ren["newsuperior"][0].lower() == "ou=moved," + SUFFIX.lower()
        assert "changes" not in got[4][1]
        assert got[0][1]["changeinitiatorsname"][0].lower() == srv.admin_dn.lower()
        # A range, as a reader catching up asks for it, in number order.
        rc, entries, err = srv.search("cn=changelog", "(&(changeNumber>=%d)(changeNumber<=%d))"
                                      % (last + 2, last + 4), "changeNumber", scope="one", auth=READER)
        assert rc == 0, err
        assert [e[1]["changeNumber"][0] for e in entries] == [str(last + i) for i in (2, 3, 4)]
        # The base names one change.
        rc, entries, err = srv.search("changenumber=%d,cn=changelog" % (last + 3), "(objectClass=*)",
                                      "targetDN", scope="base", auth=READER)
        assert rc == 0 and len(entries) == 1, (rc, entries, err)
        # Closed to everyone else, whatever the catch-all rules grant.
        for who in [None, ("uid=alice," + PEOPLE, "alice-secret")]:
            rc, entries, err = srv.search("cn=changelog", "(objectClass=*)", scope="sub", auth=who)
            assert rc == 32 and not entries, (who, rc, entries, err)
        # The entries keep their numbers over a restart.
        srv.stop()
        srv.start()
        assert change(srv, last + 4)["targetdn"][0].lower() == "uid=cl," + PEOPLE.lower()
    finally:
        srv.stop_and_verify()


def test_trimming_keeps_numbers_so_a_reader_loses_nothing_it_has_not_passed(tmp_path):
    srv = start(tmp_path, CONFIG, "retrocl-trim")
    try:
        first = int(root_numbers(srv)["lastchangenumber"][0])
        for i in range(30):
            write(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\n"
                       "description: v%d\n" % (PEOPLE, i))
        last = int(root_numbers(srv)["lastchangenumber"][0])
        assert last == first + 30
        # The reader has read up to `passed`.
        passed = first + 12
        seen = {n: e["changes"][0] for n, e in walk(srv, first + 1, passed)}
        before = {n: change(srv, n)["changes"][0] for n in range(passed + 1, last + 1)}
        # The log is trimmed to its newest 18 records (the server purges at
        # start): only changes the reader has passed go.
        srv.stop()
        srv.config = CONFIG + "\n[replication]\nchangelog_max_changes = 18\n"
        srv.start()
        root = root_numbers(srv)
        assert int(root["firstchangenumber"][0]) == passed + 1, root
        assert int(root["lastchangenumber"][0]) == last, root
        assert change(srv, passed) is None
        # Resuming after `passed`: every change, same numbers, same content.
        after = {n: change(srv, n)["changes"][0] for n in range(passed + 1, last + 1)}
        assert after == before
        assert "description: v11\n-\n" in seen[passed], seen[passed]
        # The next change takes the next number: nothing is given twice.
        write(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: next\n" % PEOPLE)
        assert int(root_numbers(srv)["lastchangenumber"][0]) == last + 1
        assert "description: next" in change(srv, last + 1)["changes"][0]
    finally:
        srv.stop_and_verify()


def test_a_server_without_the_overlay_has_no_changelog(tmp_path):
    srv = start(tmp_path, None, "retrocl-off")
    try:
        root = root_numbers(srv)
        assert "changelog" not in root and "lastchangenumber" not in root, root
        rc, _, _ = srv.search("cn=changelog", "(objectClass=*)", scope="base")
        assert rc == 32
        # Turned on later: the changes the log still holds are numbered.
        write(srv, "dn: uid=alice,%s\nchangetype: modify\nreplace: description\ndescription: x\n" % PEOPLE)
        srv.stop()
        srv.config = CONFIG
        srv.start()
        last = int(root_numbers(srv)["lastchangenumber"][0])
        assert last >= 1
        got = change(srv, last)
        assert got["targetdn"][0].lower() == "uid=alice," + PEOPLE.lower()
    finally:
        srv.stop_and_verify()


def test_the_overlay_added_and_removed_over_cn_config_numbers_what_the_log_holds(tmp_path):
    # Without the overlay no change numbers are kept (they cost a write per
    # change); added over cn=config, every change the log holds is numbered
    # then; removed and added again, the log is numbered again after the
    # last number given, so a reader misses nothing and no number comes twice.
    from test_overlays import DB, ldapi
    srv = start(tmp_path, PUBLIC_READ, "retrocl-live")
    overlay = ("dn: olcOverlay=retrochangelog,%s\nobjectClass: olcOverlayConfig\n"
               "objectClass: pandoRetroChangelogConfig\nolcOverlay: retrochangelog\n" % DB)

    def described(who, text):
        write(srv, "dn: uid=%s,%s\nchangetype: modify\nreplace: description\ndescription: %s\n"
              % (who, PEOPLE, text))

    def numbered():
        rc, entries, err = srv.search("cn=changelog", "(objectClass=*)", "changeNumber", "changes",
                                      scope="one")
        assert rc == 0, err
        return {int(e[1]["changeNumber"][0]): e[1]["changes"][0] for e in entries}

    try:
        described("alice", "before")
        rc, _, err = ldapi(srv, "ldapadd", input=overlay)
        assert rc == 0, err
        first = numbered()
        assert any("description: before" in c for c in first.values()), first
        top = max(first)
        described("bob", "while on")
        assert int(root_numbers(srv)["lastchangenumber"][0]) == top + 1
        rc, _, err = ldapi(srv, "ldapdelete", "olcOverlay={0}retrochangelog," + DB)
        assert rc == 0, err
        described("carol", "while off")
        rc, _, err = ldapi(srv, "ldapadd", input=overlay)
        assert rc == 0, err
        again = numbered()
        assert min(again) == top + 2, (top, sorted(again))
        texts = list(again.values())
        for text in ("before", "while on", "while off"):
            assert sum("description: " + text in c for c in texts) == 1, (text, again)
        # Kept across a restart with the overlay configured.
        assert srv.stop() == 0
        srv.start()
        assert numbered() == again
    finally:
        srv.stop_and_verify()
