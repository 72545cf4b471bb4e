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


def test_manual_pages_and_completions_come_from_the_command_line_definition(tmp_path):
    """`pando man` writes pando.1 and a page per command; `pando completions`
    prints a script that knows the commands; both as README's install lines use them."""
    r = subprocess.run([PANDO_BIN, "man", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pages = sorted(p.name for p in tmp_path.glob("*.1"))
    for name in ["pando.1", "pando-serve.1", "pando-import.1", "pando-migrate.1", "pando-completions.1"]:
        assert name in pages, pages
    serve = (tmp_path / "pando-serve.1").read_text()
    assert serve.startswith(".ie") or ".TH" in serve, serve[:200]
    assert "\\-\\-demo" in serve, "the serve page documents --demo"
    r = subprocess.run([PANDO_BIN, "completions", "bash"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_pando()" in r.stdout and "migrate" in r.stdout and "--verify-against" in r.stdout
    r = subprocess.run([PANDO_BIN, "completions", "tcsh"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "tcsh" in r.stderr, r.stderr


def test_migrate_names_a_missing_or_unreadable_configuration(tmp_path):
    missing = tmp_path / "nowhere" / "slapd.d"
    r = subprocess.run([PANDO_BIN, "migrate", "--from", str(missing), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and str(missing) in r.stderr, r.stderr
    empty = tmp_path / "empty.d"
    empty.mkdir()
    r = subprocess.run([PANDO_BIN, "migrate", "--from", str(empty), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cn=config.ldif" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "pando.toml").exists()
