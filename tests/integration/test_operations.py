"""Running Pando the way production runs it: systemd socket activation,
dropping root after binding, and staying responsive while thousands of idle
and slow (slowloris) connections are held open."""

import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import ber
from conftest import PANDO_BIN, PEOPLE, PUBLIC_READ, SUFFIX, free_port, make_server, wait_port


def ldap(*args, timeout=30):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------ socket activation


def test_systemd_socket_activation(tmp_path):
    """Sockets passed as fds 3.. with LISTEN_PID/LISTEN_FDS are served; the
    configured listener is not bound, and a received socket file is left in
    place at shutdown."""
    data = tmp_path / "data"
    port = free_port()
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", port))
    tcp.listen(64)
    sock_path = str(tmp_path / "activated.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(sock_path)
    unix.listen(64)
    unused = free_port()  # `listen` names it; activation must ignore it
    log = open(tmp_path / "stderr.log", "wb")
    pid = os.fork()
    if pid == 0:  # child: put the sockets at 3 and 4, then become pando
        try:
            hi_t, hi_u = os.dup(tcp.fileno()), os.dup(unix.fileno())
            t, u = os.dup2(hi_t, 100), os.dup2(hi_u, 101)
            os.dup2(t, 3)
            os.dup2(u, 4)
            os.dup2(log.fileno(), 2)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            env = dict(os.environ, LISTEN_PID=str(os.getpid()), LISTEN_FDS="2",
                       LISTEN_FDNAMES="ldap:ldapi")
            os.execve(PANDO_BIN, [PANDO_BIN, "serve", "--demo", "--data-dir", str(data),
                                  "--listen", "ldap://127.0.0.1:%d" % unused], env)
        finally:
            os._exit(127)
    tcp.close()
    unix.close()
    try:
        assert wait_port(port, None, 30)
        for _ in range(100):
            if (data / "admin-password").exists():
                break
            time.sleep(0.05)
        pw = (data / "admin-password").read_text()
        r = ldap("ldapsearch", "-x", "-LLL", "-H", "ldap://127.0.0.1:%d" % port,
                 "-D", "cn=admin," + SUFFIX, "-w", pw, "-b", PEOPLE, "(uid=alice)", "uid")
        assert r.returncode == 0 and "uid: alice" in r.stdout, r.stderr
        url = "ldapi://" + sock_path.replace("/", "%2F")
        r = ldap("ldapwhoami", "-Q", "-Y", "EXTERNAL", "-H", url)
        assert r.returncode == 0 and "cn=peercred,cn=external,cn=auth" in r.stdout, r.stderr
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", unused)) != 0, "the configured listener was bound too"
    finally:
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (tmp_path / "stderr.log").read_text()
    assert Path(sock_path).exists(), "a socket received from systemd was removed"
    assert "socket activation" in (tmp_path / "stderr.log").read_text()


# ------------------------------------------------------------ dropping root


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to test switching users")
def test_switches_user_after_binding():
    """Started as root with `user = "nobody"`: binds, then runs as nobody;
    everything it created in the data directory belongs to nobody."""
    base = Path(tempfile.mkdtemp(prefix="pando-priv-"))
    os.chmod(base, 0o755)  # nobody must reach the data directory
    data = base / "data"
    port = free_port()
    cfg = base / "pando.toml"
    cfg.write_text('user = "nobody"\n')
    err = open(base / "stderr.log", "wb")
    proc = subprocess.Popen([PANDO_BIN, "serve", "--demo", "--config", str(cfg), "--data-dir", str(data),
                             "--listen", "ldap://127.0.0.1:%d" % port, "--listen", "ldapi://"],
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        assert wait_port(port, proc, 30), (base / "stderr.log").read_text()
        for _ in range(100):
            if (data / "admin-password").exists():
                break
            time.sleep(0.05)
        status = Path("/proc/%d/status" % proc.pid).read_text()
        uids = [l for l in status.splitlines() if l.startswith("Uid:")][0].split()[1:]
        gids = [l for l in status.splitlines() if l.startswith("Gid:")][0].split()[1:]
        assert uids == ["65534"] * 4, status
        assert gids == ["65534"] * 4, status
        groups = [l for l in status.splitlines() if l.startswith("Groups:")][0].split()[1:]
        assert groups in ([], ["65534"]), groups
        pw = (data / "admin-password").read_text()
        r = ldap("ldapsearch", "-x", "-LLL", "-H", "ldap://127.0.0.1:%d" % port,
                 "-D", "cn=admin," + SUFFIX, "-w", pw, "-b", PEOPLE, "(uid=bob)", "uid")
        assert r.returncode == 0 and "uid: bob" in r.stdout, r.stderr
        for p in [data, data / "db", data / "db" / "data.mdb", data / "admin-password"]:
            st = p.stat()
            assert (st.st_uid, st.st_gid) == (65534, 65534), "%s owned by %d:%d" % (p, st.st_uid, st.st_gid)
            assert st.st_mode & 0o077 == 0, "%s mode %o" % (p, st.st_mode)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    log = (base / "stderr.log").read_text()
    shutil.rmtree(base, ignore_errors=True)
    assert rc == 0, log
    assert "switched to the configured user" in log


def test_every_suggestion_of_the_start_banner_works_as_written(tmp_path):
    """The banner's first suggestion was an anonymous search of the suffix,
    which answers 32 by design (issue 37, item 8). Each "Try:" line is run
    as printed, from the directory the server was started in."""
    port = free_port()
    out = open(tmp_path / "stdout.log", "wb")
    proc = subprocess.Popen([PANDO_BIN, "serve", "--demo", "--listen", "ldap://127.0.0.1:%d" % port,
                             "--listen", "ldapi://"], cwd=tmp_path, stdout=out, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while b"is serving:" not in (tmp_path / "stdout.log").read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, "pando did not start"
            time.sleep(0.05)
        banner = (tmp_path / "stdout.log").read_text()
        tries = banner.split("Try:\n", 1)[1].splitlines()
        tries = [t.strip() for t in tries if t.startswith("  ") and t.strip()]
        assert len(tries) >= 3, banner
        for cmd in tries:
            r = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, "%s\n-> exit %d: %s" % (cmd, r.returncode, r.stderr)
            if "-b 'dc=example,dc=com'" in cmd:
                assert "dn: uid=alice,ou=People,dc=example,dc=com" in r.stdout, cmd
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_unknown_user_is_a_config_error(tmp_path):
    cfg = tmp_path / "pando.toml"
    cfg.write_text('user = "no-such-user-anywhere"\n')
    r = subprocess.run([PANDO_BIN, "serve", "--config", str(cfg), "--data-dir", str(tmp_path / "d"),
                        "--listen", "ldap://127.0.0.1:%d" % free_port()],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "'user'" in r.stderr and "does not exist" in r.stderr, r.stderr


# ------------------------------------------------------------ slowloris


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = make_server(tmp_path_factory, "slowloris", config=PUBLIC_READ)
    yield s
    s.stop_and_verify()


def test_thousands_of_idle_and_slow_connections(srv):
    """3,000 connections from twelve source addresses hold the server: half
    never send a byte, half send a PDU header and then trickle one byte now
    and then. Meanwhile a normal client's searches are all answered, fast."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3000 + 256
    if soft < want:
        if hard < want:
            pytest.skip("RLIMIT_NOFILE hard limit %d is below %d" % (hard, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    held = []
    try:
        search = ber.message(1, ber.search_op(PEOPLE, ber.SCOPE_SUB, ber.f_eq("uid", "alice"), ["uid"]))
        for i in range(3000):
            s = socket.socket()
            s.bind(("127.0.0.%d" % (2 + i % 12), 0))  # per-address limit: 256 by default
            s.connect(("127.0.0.1", srv.port))
            if i % 2:
                s.sendall(search[:3])  # a header promising more
            held.append(s)
        # Trickle: every slow connection sends one more byte of its PDU.
        for k, s in enumerate(held):
            if k % 2:
                s.sendall(search[3:4])
        latencies = []
        with srv.raw() as c:
            for n in range(200):
                t0 = time.monotonic()
                c.send(ber.message(n + 1, ber.search_op(PEOPLE, ber.SCOPE_SUB,
                                                        ber.f_eq("uid", "bob"), ["uid"])))
                e = c.recv_msg(timeout=10)
                d = c.recv_msg(timeout=10)
                latencies.append(time.monotonic() - t0)
                assert e and e["op"] == "entry", e
                assert d and d["op"] == "searchDone" and d["code"] == 0, d
        r = ldap("ldapsearch", "-x", "-LLL", "-H", srv.url, "-b", PEOPLE, "(uid=carol)", "uid")
        assert r.returncode == 0 and "uid: carol" in r.stdout, r.stderr
        latencies.sort()
        # Generous: this is about not stalling, not about speed on a busy box.
        assert latencies[len(latencies) // 2] < 0.5, latencies[-5:]
        assert latencies[-1] < 5.0, latencies[-5:]
        assert srv.alive()
    finally:
        for s in held:
            s.close()
