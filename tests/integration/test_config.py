"""Configuration changed while serving: SIGHUP reloads of the file, and
(as it lands) cn=config over LDAP. Each change is seen by the next
operation, also on connections opened before it."""

import signal
import time

from conftest import PUBLIC_READ, SUFFIX, Pando

PEOPLE = "ou=People," + SUFFIX


def wait_log(srv, text, timeout=10.0):
    deadline = time.monotonic() + timeout
    while text not in srv.logs(tail=100000):
        assert time.monotonic() < deadline, "no %r in the log:\n%s" % (text, srv.logs())
        time.sleep(0.05)


def test_sighup_applies_access_rules_and_limits_to_open_connections(tmp_path):
    srv = Pando(tmp_path, demo=True, config="[limits]\nsize_limit = 500\n").start()
    anon = srv.conn(admin=False)
    # The built-in rules give anonymous clients nothing below the suffix.
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert anon.entries == []
    (tmp_path / "pando.toml").write_text("[limits]\nsize_limit = 2\n" + PUBLIC_READ)
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "SIGHUP: configuration changed")
    # The same connection, its next operation: the new rules and limit.
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 2
    assert anon.result["description"] == "sizeLimitExceeded"
    logs = srv.logs(tail=100000)
    assert "access" in logs and "limits.size_limit" in logs
    # A key taken at the next start is reported, and the rest applies.
    (tmp_path / "pando.toml").write_text(
        "[limits]\nsize_limit = 3\nmax_connections = 77\n" + PUBLIC_READ)
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "take effect at the next start")
    assert "limits.max_connections" in srv.logs(tail=100000)
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 3
    # A bad access rule changes nothing.
    (tmp_path / "pando.toml").write_text(
        "[limits]\nsize_limit = 3\n[[access]]\ndn_regex = \"(\"\nby = [{ who = \"*\", rights = \"read\" }]\n")
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "not reloaded")
    assert "access[0]" in srv.logs(tail=100000)
    anon.search(PEOPLE, "(uid=*)", attributes=["uid"])
    assert len(anon.entries) == 3
    anon.unbind()
    # The log level too: debug lines (connections accepted) appear.
    assert "connection accepted" not in srv.logs(tail=100000)
    (tmp_path / "pando.toml").write_text("log_level = \"debug\"\n")
    srv.proc.send_signal(signal.SIGHUP)
    wait_log(srv, "log_level")
    srv.conn().unbind()
    wait_log(srv, "connection accepted")
    srv.stop_and_verify()
