"""Command-line tools around the server: pando gen (MakeLDIF templates)."""

import hashlib
import subprocess

from conftest import PANDO_BIN, SUFFIX, Pando


def gen(*args):
    r = subprocess.run([PANDO_BIN, "gen", *args], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def test_gen_is_deterministic_and_loads_into_the_server(tmp_path):
    a = gen("-D", "numusers=200", "--seed", "3")
    b = gen("-D", "numusers=200", "--seed", "3")
    c = gen("-D", "numusers=200", "--seed", "4")
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert a != c
    assert a.count(b"\ndn: ") + a.startswith(b"dn: ") == 202
    srv = Pando(tmp_path).start()
    # The suffix entry exists already; load the rest (ldapadd -c skips it).
    rc, out, err = srv.ldap("ldapadd", "-c", input=a.decode())
    assert "Already exists" in err and err.count("ldap_add") == 1, err
    rc, entries, err = srv.search("ou=People," + SUFFIX, "(objectClass=inetOrgPerson)", "uid", scope="one")
    assert rc == 0 and len(entries) == 200, err
    rc, entries, err = srv.search(SUFFIX, "(uid=user.199)", "mail")
    assert entries[0][1]["mail"] == ["user.199@example.com"]
    srv.stop_and_verify()


def test_gen_template_errors_name_the_line(tmp_path):
    t = tmp_path / "bad.template"
    t.write_text("define suffix=dc=example,dc=com\n\nbranch: [suffix]\n\ntemplate: x\nrdnAttr: cn\ncn: <nosuchtag>\n")
    r = subprocess.run([PANDO_BIN, "gen", "-t", str(t)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "bad.template:7" in r.stderr, r.stderr
