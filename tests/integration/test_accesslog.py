"""The in-directory access log (cn=accesslog) against the real binary:
writes shown from the change log in OpenLDAP's accesslog form, compared
with slapd's accesslog overlay on the same writes; reads, binds and
failed writes recorded; filters on it; who may read it; its records
surviving a restart."""

import subprocess
import time
from pathlib import Path

import pytest

from conftest import ADMIN_DN, PEOPLE, SUFFIX, Pando, ldif_entry, parse_ldif
from test_differential import SLAPD, Slapd

pytestmark = pytest.mark.skipif(not Path(SLAPD).exists(), reason="slapd not installed")

CONFIG = """
[[access]]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "read" }]

[[overlay]]
type = "accesslog"
ops = ["writes", "reads", "bind"]
"""

WRITES = """dn: uid=logged,{people}
changetype: add
objectClass: inetOrgPerson
uid: logged
cn: Logged Person
sn: Person
description: first

dn: uid=logged,{people}
changetype: modify
replace: description
description: second
-
add: mail
mail: logged@example.com

dn: uid=logged,{people}
changetype: modrdn
newrdn: uid=renamed
deleteoldrdn: 1

dn: uid=renamed,{people}
changetype: delete
""".format(people=PEOPLE)

STAMPS = {"entrycsn", "modifiersname", "modifytimestamp", "creatorsname", "createtimestamp",
          "entryuuid", "structuralobjectclass"}


class SlapdWithLog(Slapd):
    def write_conf(self):
        super().write_conf()
        conf = self.base / "slapd.conf"
        (self.base / "log").mkdir(parents=True, exist_ok=True)
        text = conf.read_text().replace("moduleload back_mdb\n", "moduleload back_mdb\nmoduleload accesslog\n")
        logdb = ("database mdb\nsuffix \"cn=accesslog\"\nrootdn \"cn=admin,cn=accesslog\"\n"
                 "directory %s/log\nindex reqStart eq\n\n" % self.base)
        text = text.replace("database mdb\n", logdb + "database mdb\n", 1)
        conf.write_text(text + "overlay accesslog\nlogdb cn=accesslog\nlogops writes\n")


def user_part(entry):
    """(reqType, reqDN, reqMod values on user attributes, reqNewRDN, reqDeleteOldRDN)."""
    mods = sorted(m for m in entry.get("reqMod", [])
                  if m.split(":", 1)[0].lower() not in STAMPS)
    return (entry["reqType"][0], entry["reqDN"][0].lower(), mods,
            entry.get("reqNewRDN", [""])[0].lower(), entry.get("reqDeleteOldRDN", [""])[0])


def search(srv, base, filt, scope="sub", auth="admin", *attrs):
    """ldapsearch -LLL: (rc, {dn: {attr: [values]}}, stderr)."""
    rc, out, err = srv.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", base, "-s", scope, filt,
                            *attrs, auth=auth)
    return rc, dict(parse_ldif(out)), err


def write_records(srv):
    rc, entries, err = search(srv, "cn=accesslog", "(objectClass=auditWriteObject)", "one", "admin",
                              "*", "entryCSN")
    assert rc == 0, err
    return [e for e in sorted(entries.values(), key=lambda e: e["reqStart"][0])
            if e["reqDN"][0].lower().startswith("uid=logged") or e["reqDN"][0].lower().startswith("uid=renamed")]


def test_writes_read_as_slapd_logs_them(tmp_path):
    slapd = SlapdWithLog(tmp_path / "slapd")
    top = tmp_path / "top.ldif"
    top.write_text("\n".join([
        ldif_entry(SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["example"]}),
        ldif_entry(PEOPLE, {"objectClass": ["organizationalUnit"], "ou": ["People"]})]))
    slapd.load(top)
    slapd.start()
    pando = Pando(tmp_path / "pando", demo=True, config=CONFIG, name="accesslog-diff").start()
    try:
        for srv in (slapd, pando):
            rc, _, err = srv.ldap("ldapmodify", input=WRITES)
            assert rc == 0, err
        got = [[user_part(e) for e in write_records(s)] for s in (slapd, pando)]
        assert got[0] == got[1], "slapd=%s\npando=%s" % tuple(got)
        assert [g[0] for g in got[1]] == ["add", "modify", "modrdn", "delete"], got[1]
        assert ("description:+ first") in got[1][0][2]
        assert got[1][2][3:] == ("uid=renamed", "TRUE")
        # Pando's records carry the operation's CSN and who made it.
        recs = write_records(pando)
        assert all(r["entryCSN"][0] and r["reqAuthzID"][0].lower() == ADMIN_DN for r in recs), recs
    finally:
        slapd.stop()
        pando.stop_and_verify()


def test_reads_binds_and_failures_are_recorded_and_only_admins_read_them(tmp_path):
    srv = Pando(tmp_path, demo=True, config=CONFIG, name="accesslog").start()
    try:
        started = time.strftime("%Y%m%d%H%M%SZ", time.gmtime(time.time() - 1))
        rc, _, _ = srv.ldap("ldapsearch", "-b", PEOPLE, "(uid=alice)", "cn", auth=None)
        assert rc == 0
        rc, _, _ = srv.ldap("ldapwhoami", auth=("uid=alice," + PEOPLE, "wrong"))
        assert rc == 49
        rc, _, _ = srv.ldap("ldapmodify", input="dn: uid=nobody,%s\nchangetype: modify\nreplace: sn\nsn: x\n" % PEOPLE)
        assert rc == 32
        rc, _, _ = srv.ldap("ldapmodify", input="dn: uid=alice,%s\nchangetype: modify\nreplace: sn\nsn: x\n" % PEOPLE)
        assert rc == 0
        deadline = time.time() + 10
        while True:
            rc, entries, err = search(srv, "cn=accesslog", "(reqStart>=%s)" % started, "one")
            assert rc == 0, err
            kinds = {(e["reqType"][0], e.get("reqResult", [""])[0]) for e in entries.values()}
            if {("search", "0"), ("bind", "49"), ("modify", "32")} <= kinds or time.time() > deadline:
                break
            time.sleep(0.2)
        assert {("search", "0"), ("bind", "49"), ("modify", "32")} <= kinds, kinds
        found = [e for e in entries.values() if e["reqType"] == ["search"] and e["reqDN"][0].lower() == PEOPLE.lower()]
        assert found and found[0]["reqFilter"] == ["(uid=alice)"] and found[0]["reqEntries"] == ["1"], found
        assert found[0]["reqScope"] == ["sub"] and found[0]["reqAttr"] == ["cn"]
        # Successful writes come from the change log.
        rc, writes, _ = search(srv, "cn=accesslog", "(&(objectClass=auditWriteObject)(reqResult=0))", "one")
        assert rc == 0 and [w["reqMod"] for w in writes.values()
                            if w["reqDN"][0].lower() == "uid=alice," + PEOPLE.lower()], writes
        # A user, even one who may read everything else, sees nothing.
        rc, _, err = search(srv, "cn=accesslog", "(objectClass=*)", "base", ("uid=alice," + PEOPLE, "wrong"))
        assert rc != 0
        rc, _, _ = srv.ldap("ldapsearch", "-b", "cn=accesslog", "-s", "base", auth=None)
        assert rc == 32
        # One record read by its DN.
        dn = sorted(entries)[0]
        rc, one, _ = search(srv, dn, "(objectClass=*)", "base")
        assert rc == 0 and list(one) == [dn], one
        # Records outlive a restart.
        count = len(entries)
        assert srv.stop() == 0
        srv.start()
        rc, again, _ = search(srv, "cn=accesslog", "(reqStart>=%s)" % started, "one")
        assert rc == 0 and len(again) >= count, (count, len(again))
    finally:
        srv.stop_and_verify()


def test_a_bad_accesslog_setting_is_refused(tmp_path):
    from conftest import PANDO_BIN
    cfg = tmp_path / "bad.toml"
    cfg.write_text('data_dir = "%s"\n[[overlay]]\ntype = "accesslog"\nops = ["writes", "everything"]\n' % (tmp_path / "d"))
    r = subprocess.run([PANDO_BIN, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "overlay[0].ops" in r.stderr and "everything" in r.stderr, r.stderr
