"""The machine side of the SSSD tests (test_nss_memberof.py,
test_sssd_schemas.py): whether this machine can run SSSD for a test,
pointing NSS at SSSD, and running sssd in the foreground as a child of the
test (saving and putting back system files: system_files.py).

SSSD has fixed paths (/var/lib/sss for its caches and sockets, the NSS and
PAM modules talk to those sockets), so these tests need root and a machine
where no other sssd runs and no nscd caches NSS answers.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from system_files import answers, nsswitch_with, running

SSSD = "/usr/sbin/sssd"
SSS_CACHE = "/usr/sbin/sss_cache"
NSSWITCH = Path("/etc/nsswitch.conf")
# Everything sssd writes outside a test's temporary directory.
SSSD_PATHS = ["/etc/nsswitch.conf", "/etc/sssd", "/var/lib/sss", "/var/log/sssd", "/run/sssd.pid"]
# Where the shared libraries and modules may be (multiarch or not).
LIB_DIRS = ["/usr/lib/*", "/lib/*", "/usr/lib64", "/usr/lib", "/lib64", "/lib"]


def library(relative):
    """Whether `relative` (e.g. "libnss_sss.so.2") is in one of LIB_DIRS."""
    return any(any(Path("/").glob((d + "/" + relative).lstrip("/"))) for d in LIB_DIRS)


def why_not_here(pam=False):
    """Why this machine cannot run an SSSD test, or None. pam: the test also
    needs pam_sss and pamtester."""
    if os.geteuid() != 0:
        return "needs root: it points the system's NSS at SSSD"
    missing = [p for p in (SSSD, SSS_CACHE) if not Path(p).exists()]
    if not library("sssd/libsss_ldap.so"):
        missing.append("SSSD's LDAP provider")
    if not library("libnss_sss.so.2"):
        missing.append("libnss_sss")
    if pam:
        if not library("security/pam_sss.so"):
            missing.append("pam_sss")
        if shutil.which("pamtester") is None:
            missing.append("pamtester")
    if missing:
        return ("SSSD is not installed (missing %s; Debian: sssd-ldap libnss-sss sssd-tools%s, "
                "which scripts/test installs)" % (", ".join(missing), " libpam-sss pamtester" if pam else ""))
    if running("sssd"):
        return "an sssd is already running here: the test will not take over the machine's NSS"
    if answers("/var/lib/sss/pipes/nss"):
        return "something already answers on SSSD's NSS socket (socket activation?)"
    if running("nscd") or running("unscd"):
        return "nscd is running: it would answer from its own cache"
    return None


def with_sss(text):
    """nsswitch.conf text with `passwd` and `group` answered by files, then sss."""
    return nsswitch_with(text, "sss")


def run(*cmd, timeout=15, input=None, **kw):
    """(rc, stdout, stderr) of a command; kw go to subprocess.run (user=...)."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input, **kw)
    return r.returncode, r.stdout, r.stderr


class Sssd:
    """sssd in the foreground with the configuration text `conf` (kept in
    `base`), its output in base/sssd.log; start() returns once NSS answers
    for `probe` (a user name)."""

    def __init__(self, base, conf, probe):
        self.base = Path(base)
        self.conf = self.base / "sssd.conf"
        self.conf.write_text(conf)
        self.conf.chmod(0o600)
        self.log = self.base / "sssd.log"
        self.probe = probe
        self.proc = None

    def start(self, timeout=30):
        with open(self.log, "ab") as log:
            # Its own process group: stop() can end the children (sssd_be,
            # sssd_nss, sssd_pam) should the monitor not.
            self.proc = subprocess.Popen([SSSD, "-i", "-c", str(self.conf), "--logger=stderr"],
                                         stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            rc, _, _ = run("getent", "passwd", self.probe)
            if rc == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("sssd did not answer for %s (exit code %r):\n%s"
                            % (self.probe, self.proc.poll(), self.logs()))
            time.sleep(0.3)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left behind, if any
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        self.proc = None

    def logs(self, tail=6000):
        out = ["--- sssd ---\n" + (self.log.read_text(errors="replace")[-tail:] if self.log.exists() else "")]
        for f in sorted(Path("/var/log/sssd").glob("*")):
            if f.is_file() and f.stat().st_size:
                out.append("--- %s ---\n%s" % (f, f.read_text(errors="replace")[-tail:]))
        return "\n".join(out)

    def expire(self):
        """What an administrator does after changing the directory: expire
        every cached entry, so the next lookup goes to the directory."""
        rc, out, err = run(SSS_CACHE, "-E")
        assert rc == 0, "sss_cache -E failed: %s%s" % (out, err)

    def groups(self, user, want, timeout=10):
        """`id -Gn user` as a set, once it equals `want` or after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            rc, out, err = run("id", "-Gn", user)
            got = set(out.split()) if rc == 0 else {"<id failed: %s>" % err.strip()}
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.3)
