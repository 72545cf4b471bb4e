"""Fixtures for Pando integration tests: start the real server, talk to it
with real clients (OpenLDAP ldap-utils, python ldap3, raw BER sockets).

Every server fixture, at teardown, sends SIGTERM, asserts a clean exit (0)
and then runs `pando verify` on the data directory and asserts it is
consistent.  Module-scoped servers therefore give one consistency check
after each write-path test module.
"""

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ber  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PANDO_BIN = os.environ.get("PANDO_BIN", str(REPO / "target" / "release" / "pando"))
SUFFIX = "dc=example,dc=com"
ADMIN_DN = "cn=admin,dc=example,dc=com"
PEOPLE = "ou=People," + SUFFIX
GROUPS = "ou=Groups," + SUFFIX
DEMO_UIDS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]


def _port_pool():
    """Ports below the kernel's ephemeral range, starting at a place set by
    the process ID so two suites on one machine rarely meet."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = max(1024, low - 12000)
    size = low - first
    start = os.getpid() % size
    return first, size, start


_POOL = _port_pool()
_NEXT = [0]


def free_port():
    """A port for a server a test starts: free now, not handed out before in
    this run, and outside the ephemeral range.  A port the kernel picked
    (bind to 0) comes from the range it also gives to client sockets, so
    between this call and the server's bind, or while a server is down to be
    restarted on the same port, a peer's outgoing connection could take it."""
    first, size, start = _POOL
    for _ in range(size):
        port = first + (start + _NEXT[0]) % size
        _NEXT[0] += 1
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` (e.g. "8m") mounted at `path` for the block, to fill
    a filesystem for real; the test is skipped where mounting is not allowed."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: %s" % r.stderr.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def terminate(pid, grace):
    """SIGTERM a daemon we started (slapd, ns-slapd) and wait up to
    `grace` seconds for it to exit; SIGKILL it after that."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_port(port, proc=None, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


# ------------------------------------------------------------------ LDIF


def parse_ldif(text):
    """Parse ldapsearch -LLL output into a list of (dn, {attr: [values]}).

    Attribute names keep their case; base64 values are decoded (utf-8 with
    replacement).  Handles folded lines too."""
    lines = []
    for line in text.splitlines():
        if line.startswith(" ") and lines:
            lines[-1] += line[1:]
        else:
            lines.append(line)
    entries, cur = [], None
    for line in lines + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur is not None:
                entries.append(cur)
                cur = None
            continue
        if ":" not in line:  # should not happen in -LLL output
            k, v = line, ""
        else:
            i = line.index(":")
            k = line[:i]
            if line[i + 1:i + 2] == ":":
                v = base64.b64decode(line[i + 2:].strip()).decode("utf-8", "replace")
            else:
                v = line[i + 1:]
                v = v[1:] if v.startswith(" ") else v
        if k.lower() == "dn":
            cur = (v, {})
        elif cur is not None:
            cur[1].setdefault(k, []).append(v)
    return entries


def ldif_entry(dn, attrs):
    out = ["dn: " + dn]
    for k, vals in attrs.items():
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(v, bytes) or not v.isascii() or v.startswith((" ", ":", "<")):
                b = v if isinstance(v, bytes) else v.encode("utf-8")
                out.append("%s:: %s" % (k, base64.b64encode(b).decode()))
            else:
                out.append("%s: %s" % (k, v))
    return "\n".join(out) + "\n"


def person_attrs(uid, i=0, extra=None):
    a = {
        "objectClass": ["top", "person", "organizationalPerson", "inetOrgPerson"],
        "uid": [uid],
        "cn": ["User %s" % uid],
        "sn": ["Sn%d" % i],
        "mail": ["%s@example.com" % uid],
    }
    if extra:
        a.update(extra)
    return a


# ------------------------------------------------------------------ server


class Pando:
    def __init__(self, base_dir, demo=False, config=None, name="pando", ldaps=False, args=()):
        """ldaps: also listen on ldaps://127.0.0.1:<ldaps_port>; args: extra
        `pando serve` arguments (e.g. "--tls-self-signed")."""
        self.base = Path(base_dir)
        self.data_dir = self.base / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.demo = demo
        self.config = config
        self.name = name
        self.ldaps = ldaps
        self.args = list(args)
        self.port = None
        self.ldaps_port = None
        self.proc = None
        self.admin_dn = ADMIN_DN
        self.admin_pw = None

    # --- lifecycle
    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    @property
    def ldaps_url(self):
        return "ldaps://127.0.0.1:%d" % self.ldaps_port

    @property
    def ldapi_url(self):
        return "ldapi://" + urllib.parse.quote(str((self.data_dir / "ldapi").resolve()), safe="")

    def start(self, timeout=30.0, keep_port=False):
        """keep_port: listen where the last start did (peers have the URL)."""
        if not Path(PANDO_BIN).exists():
            pytest.fail("pando binary not found at %s (build: cargo build --release -p pando, "
                        "or set PANDO_BIN)" % PANDO_BIN)
        if not (keep_port and self.port):
            self.port = free_port()
        cmd = [PANDO_BIN, "serve", "--data-dir", str(self.data_dir),
               "--listen", self.url, "--listen", "ldapi://"]
        if self.ldaps:
            self.ldaps_port = free_port()
            cmd += ["--listen", self.ldaps_url]
        if self.demo:
            cmd.append("--demo")
        if self.config:
            cfg = self.base / "pando.toml"
            cfg.write_text(self.config)
            cmd += ["--config", str(cfg)]
            # What verify() runs with (written now: a test may fill the
            # disk or rewrite pando.toml before the teardown check).
            (self.base / "pando-started.toml").write_text(self.config)
        cmd += self.args
        # Logs are appended across restarts: only this start's banner counts.
        out = self.base / "stdout.log"
        banner_from = out.stat().st_size if out.exists() else 0
        self.out = open(out, "ab")
        self.err = open(self.base / "stderr.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL)
        for port in [self.port] + ([self.ldaps_port] if self.ldaps else []):
            if not wait_port(port, self.proc, timeout):
                self.proc.kill()
                self.proc.wait()
                pytest.fail("pando did not start listening on port %d:\n%s" % (port, self.logs()))
        # Ports are bound before the store opens; the banner on stdout says
        # the server is fully up.
        deadline = time.monotonic() + timeout
        while b"is serving:" not in out.read_bytes()[banner_from:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                pytest.fail("pando did not finish starting:\n%s" % self.logs())
            time.sleep(0.02)
        pwfile = self.data_dir / "admin-password"
        self.admin_pw = pwfile.read_text() if pwfile.exists() else None
        return self

    def logs(self, tail=4000):
        out = []
        for n in ("stdout.log", "stderr.log"):
            p = self.base / n
            if p.exists():
                out.append("--- %s ---\n%s" % (n, p.read_text(errors="replace")[-tail:]))
        return "\n".join(out)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=30.0):
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                return None
        rc = self.proc.returncode
        self.proc = None
        self.out.close()
        self.err.close()
        return rc

    def verify(self):
        # With the configuration the server was started with (its schema
        # files and indexes; a test may have rewritten pando.toml since).
        cmd = [PANDO_BIN, "verify", "--data-dir", str(self.data_dir)]
        if self.config:
            cmd += ["--config", str(self.base / "pando-started.toml")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def stop_and_verify(self):
        """Teardown check: graceful exit 0, then `pando verify` exit 0."""
        was_alive = self.alive()
        rc = self.stop()
        vrc, vout = self.verify()
        assert was_alive, "server %s had died before teardown:\n%s" % (self.name, self.logs())
        assert rc == 0, "server did not exit 0 on SIGTERM (rc=%r):\n%s" % (rc, self.logs())
        assert vrc == 0, "pando verify failed (rc=%d):\n%s" % (vrc, vout)
        assert "consistent" in vout, "pando verify output lacks 'consistent': %s" % vout

    # --- clients
    def ldap(self, tool, *args, auth="admin", input=None, timeout=120, url=None):
        """Run an ldap-utils tool with -x -H; auth: "admin", None (anonymous)
        or (dn, password). Returns (rc, stdout, stderr)."""
        cmd = [tool, "-x", "-H", url or self.url]
        if auth == "admin":
            cmd += ["-D", self.admin_dn, "-w", self.admin_pw]
        elif auth is not None:
            cmd += ["-D", auth[0], "-w", auth[1]]
        cmd += list(args)
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def search(self, base, *args, scope="sub", auth="admin"):
        """ldapsearch -LLL; returns (rc, entries, stderr)."""
        rc, out, err = self.ldap("ldapsearch", "-LLL", "-o", "ldif-wrap=no", "-b", base,
                                 "-s", scope, *args, auth=auth)
        return rc, parse_ldif(out), err

    def conn(self, user=None, password=None, admin=True, **kw):
        """A bound ldap3 Connection (admin by default; anonymous if admin=False and no user)."""
        import ldap3
        server = ldap3.Server("127.0.0.1", port=self.port, get_info=ldap3.NONE, connect_timeout=10)
        if user is None and admin:
            user, password = self.admin_dn, self.admin_pw
        c = ldap3.Connection(server, user=user, password=password, raise_exceptions=False,
                             receive_timeout=60, **kw)
        if user is None:
            c.open()
        else:
            assert c.bind(), "bind as %s failed: %s" % (user, c.result)
        return c

    def raw(self, timeout=10.0, rcvbuf=None):
        return ber.Conn("127.0.0.1", self.port, timeout=timeout, rcvbuf=rcvbuf)

    def bulk_add(self, entries, window=256, timeout=300.0):
        """Add many entries fast: pipelined AddRequests over one raw
        connection bound as admin. entries: iterable of (dn, attrs dict).
        The server may process pipelined requests in any order (RFC 4511
        allows it), so entries are sent in waves by DN depth: parents are
        acknowledged before their children are sent.
        Returns the number added; fails on any non-success result."""
        entries = list(entries)
        waves = {}
        for dn, attrs in entries:
            waves.setdefault(dn.count(","), []).append((dn, attrs))
        deadline = time.monotonic() + timeout
        with self.raw(timeout=60) as c:
            assert ber.simple_bind(c, self.admin_dn, self.admin_pw) == 0, "admin bind failed"
            next_id = 2
            for depth in sorted(waves):
                wave = waves[depth]
                first_id = next_id
                sent = done = 0
                failures = []
                while done < len(wave):
                    assert time.monotonic() < deadline, "bulk_add timed out after %d/%d" % (done, len(wave))
                    batch = []
                    while sent < len(wave) and sent - done < window:
                        dn, attrs = wave[sent]
                        batch.append(ber.message(next_id, ber.add_op(dn, attrs)))
                        next_id += 1
                        sent += 1
                    if batch:
                        c.send(b"".join(batch))
                    m = c.recv_msg(timeout=60)
                    assert m is not None, "server closed the connection during bulk_add:\n" + self.logs()
                    assert m["op"] == "add", "unexpected response during bulk_add: %r" % m
                    if m["code"] != 0:
                        failures.append((wave[m["id"] - first_id][0], m["code"], m["diag"]))
                    done += 1
                assert not failures, "bulk_add failures (first 5): %r" % failures[:5]
            c.send(ber.message(next_id, ber.unbind_op()))
        return len(entries)


# The built-in access rules let only authenticated users read the tree
# (test_security.py checks them). Modules about the protocol and clients read
# anonymously, as against a slapd with its default "read by *": these rules
# are the defaults plus anonymous read.
PUBLIC_READ = """
[[access]]
attrs = ["userPassword"]
by = [{ who = "admins", rights = "all" }, { who = "self", rights = ["auth", "write"] }, { who = "*", rights = "auth" }]

[[access]]
by = [{ who = "admins", rights = "all" }, { who = "*", rights = "read" }]
"""


def server_with(base, name, config, entries):
    """A server without demo data holding `entries` ((dn, attrs) pairs,
    parents first), added with ldapadd."""
    s = Pando(base, demo=False, config=config, name=name).start()
    ldif = base / "entries.ldif"
    ldif.write_text("\n".join(ldif_entry(dn, a) for dn, a in entries))
    rc, _, err = s.ldap("ldapadd", "-f", str(ldif))
    assert rc == 0, err
    return s


def make_server(tmp_path_factory, name, demo=True, config=PUBLIC_READ, **kw):
    base = tmp_path_factory.mktemp(name)
    return Pando(base, demo=demo, config=config, name=name, **kw).start()


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory, request):
    """One server with the demo tree per test module; verified at teardown."""
    name = request.module.__name__.split(".")[-1]
    s = make_server(tmp_path_factory, name, demo=True)
    yield s
    s.stop_and_verify()


@pytest.fixture
def fresh_server(tmp_path_factory):
    """A fresh (demo) server for a single test; verified at teardown."""
    s = make_server(tmp_path_factory, "fresh", demo=True)
    yield s
    s.stop_and_verify()


def have(tool):
    return shutil.which(tool) is not None
