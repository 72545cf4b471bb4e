"""Build and drive cutfs (cutfs.c beside this file): a FUSE pass-through file
system that keeps unsynced writes in memory and loses them at a power cut.

    with Mount(backing, mountpoint, mode="tear", seed=7) as m:
        ... run a program on `mountpoint` ...
        m.cut()          # power lost: from now on every operation fails (EIO)
        ... kill the program ...
    # unmounted; m.stats has the counters, BACKING is the disk after the cut

Needs /dev/fuse, fusermount3, libfuse3's headers and pkg-config (scripts/test
installs them) and root (or a user allowed to mount FUSE)."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "cutfs.c"
REPO = HERE.parents[1]
BUILD_DIR = REPO / "target" / "cutfs"
BINARY = BUILD_DIR / "cutfs"


class Unavailable(Exception):
    """cutfs cannot run here (no FUSE, no compiler or headers)."""


def build():
    """Compile cutfs when missing or older than its source; returns its path."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    if not os.path.exists("/dev/fuse"):
        raise Unavailable("/dev/fuse is missing")
    for tool in ("gcc", "pkg-config", "fusermount3"):
        if shutil.which(tool) is None:
            raise Unavailable("%s is not installed (scripts/test installs fuse3, libfuse3-dev, pkg-config)" % tool)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0:
        raise Unavailable("pkg-config does not know fuse3 (libfuse3-dev): " + flags.stderr.strip())
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = BUILD_DIR / ("cutfs.tmp.%d" % os.getpid())
    r = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(tmp), str(SOURCE)] + flags.stdout.split(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("building cutfs failed:\n" + r.stdout + r.stderr)
    os.replace(tmp, BINARY)
    return BINARY


def _run(cmd, timeout):
    """Run a command with a bounded wait; its exit code (None: timed out)."""
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return None


def is_mounted(mountpoint):
    mp = os.path.realpath(str(mountpoint))
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and parts[1].replace("\\040", " ") == mp:
                    return True
    except OSError:
        pass
    return False


def parse_stats(text):
    """The counters of the last 'cutfs: stats' and 'cutfs: cut done' lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("cutfs: stats ") or line.startswith("cutfs: cut done"):
            for word in line.split():
                if "=" in word:
                    k, v = word.split("=", 1)
                    try:
                        out[k] = int(v)
                    except ValueError:
                        out[k] = v
    return out


class Mount:
    """cutfs BACKING on MOUNTPOINT for the duration of a with block (or
    mount()/unmount()). Unmounting is robust: fusermount3 -u, then a lazy
    umount, then the process is killed; every wait is bounded."""

    def __init__(self, backing, mountpoint, mode="drop", seed=0, log=None):
        assert mode in ("drop", "tear"), mode
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.mode = mode
        self.seed = int(seed)
        self.log_path = Path(log) if log else self.mountpoint.parent / (self.mountpoint.name + ".cutfs.log")
        self.proc = None
        self.cut_at = None
        self.stats = {}

    def mount(self, timeout=10.0):
        binary = build()
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log_from = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [str(binary), str(self.backing), str(self.mountpoint), "--mode", self.mode, "--seed", str(self.seed)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._kill()
                raise Unavailable("cutfs did not mount %s:\n%s" % (self.mountpoint, self.log()))
            time.sleep(0.01)
        return self

    def log(self):
        try:
            return self.log_path.read_bytes()[self._log_from:].decode("utf-8", "replace")
        except (OSError, AttributeError):
            return ""

    def cut(self, timeout=10.0):
        """Lose power now; returns once cutfs has done it (time.monotonic()
        of the cut). Every later operation on the mount fails with EIO."""
        assert self.proc is not None and self.proc.poll() is None, "cutfs is not running:\n" + self.log()
        self.cut_at = time.monotonic()
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while "cutfs: cut done" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("cutfs did not report the cut:\n" + self.log())
            time.sleep(0.005)
        return self.cut_at

    def unmount(self, timeout=10.0):
        """Unmount (lazily if busy), wait for cutfs to exit, kill it if it
        does not; returns its counters."""
        if self.proc is None:
            return self.stats
        mp = str(self.mountpoint)
        if is_mounted(mp):
            if _run(["fusermount3", "-u", mp], timeout) != 0 and is_mounted(mp):
                _run(["fusermount3", "-u", "-z", mp], timeout)
                if is_mounted(mp):
                    _run(["umount", "-l", mp], timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        if is_mounted(mp):  # the process is gone: clear a dead mount
            _run(["umount", "-l", mp], timeout)
        self.proc = None
        self._log.close()
        self.stats = parse_stats(self.log())
        return self.stats

    def _kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if is_mounted(self.mountpoint):
            _run(["umount", "-l", str(self.mountpoint)], 10)

    def __enter__(self):
        return self.mount()

    def __exit__(self, *exc):
        self.unmount()
        return False
