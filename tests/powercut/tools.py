"""Power cuts during the offline tools (used by scripts/powercut):

  import   `pando import` into a data directory on cutfs. After the cut the
           store must be refused by serve (interrupted import: incomplete),
           or be complete (every entry, verify clean); an empty store that
           serve accepts counts as "not started" (nothing reached the disk).
           An import that had exited 0 before the cut must be complete.
  backup   `pando backup` of a store (outside the mount) into a directory on
           cutfs. After the cut the backup directory is either complete
           (`pando restore` accepts it, and the restored store verifies and
           holds every entry) or refused by restore with a message. A backup
           that had exited 0 before the cut must be complete.
  restore  `pando restore` of backup B over store A, the data directory on
           cutfs. After the cut the store is A or B exactly (same export),
           never a mix, never missing. A restore that had exited 0 must have
           left B.
  first-start  the first `pando serve` on an empty data directory on cutfs
           (durability none, the harshest): creating the store, the
           administrator password and the suffix. After the cut a fresh
           serve must serve; a password announced before the cut (banner
           printed) must be kept and work; whatever admin-password is left
           must work; no admin-password.new may remain.

Each case: a calibration run without a cut measures how long the tool takes
through cutfs; cuts then fall uniformly in [0, 2 x that], so some land
after the tool finished (checking that what it reported done is durable).
"""

import hashlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import cutfs
import workload


def export(binary, data_dir, timeout=120):
    """(kind, number of entries, sha256 of the LDIF) of `pando export`."""
    try:
        r = subprocess.run([binary, "export", "--data-dir", str(data_dir)], capture_output=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "hang", None, None
    if r.returncode != 0:
        return ("signal" if r.returncode < 0 else "error"), None, r.stderr.decode(errors="replace")[-300:]
    n = sum(1 for l in r.stdout.splitlines() if l.startswith(b"dn:"))
    return "ok", n, hashlib.sha256(r.stdout).hexdigest()


class Prepared:
    """What the tool cases share: LDIF files and reference stores, made once
    (outside any mount) in `root`."""

    def __init__(self, root, binary, import_users=3000, store_users=20000, other_users=4000):
        self.root = Path(root)
        self.binary = binary
        self.root.mkdir(parents=True, exist_ok=True)
        self.import_ldif = self.root / "import.ldif"
        self._gen(import_users, 1, self.import_ldif)
        self.import_entries = sum(1 for l in self.import_ldif.read_bytes().splitlines() if l.startswith(b"dn:"))
        # A: the store a restore replaces; also the source of backups
        self.store_a = self.root / "store-a"
        self._store(self.store_a, store_users, 2)
        k, self.a_entries, self.a_sha = export(binary, self.store_a)
        assert k == "ok", (k, self.a_sha)
        # B: a backup of another store, what a restore puts in place
        store_b = self.root / "store-b"
        self._store(store_b, other_users, 3)
        k, self.b_entries, self.b_sha = export(binary, store_b)
        assert k == "ok", (k, self.b_sha)
        self.backup_b = self.root / "backup-b"
        if not self.backup_b.exists():
            self._run(["backup", "--data-dir", str(store_b), str(self.backup_b)])

    def _gen(self, users, seed, out):
        if not out.exists():
            self._run(["gen", "-D", "numusers=%d" % users, "--seed", str(seed), "-o", str(out)])

    def _store(self, data_dir, users, seed):
        if (data_dir / "db" / "data.mdb").exists():
            return
        ldif = self.root / ("users-%d-%d.ldif" % (users, seed))
        self._gen(users, seed, ldif)
        self._run(["import", "--data-dir", str(data_dir), "-f", str(ldif)])

    def _run(self, args):
        r = subprocess.run([self.binary] + args, capture_output=True, text=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError("pando %s failed:\n%s" % (" ".join(args), r.stdout + r.stderr))


def _run_with_cut(binary, args, workdir, mount, delay):
    """Start `pando ARGS` on the mount, cut the power `delay` s later (whether
    or not it has finished), kill -9 it. Returns (it had exited 0 before the
    cut, it was still running at the cut, exit code, output, seconds)."""
    out = open(workdir / "tool.out", "wb")
    t0 = time.monotonic()
    p = subprocess.Popen([binary] + args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = t0 + delay
    while time.monotonic() < deadline:
        time.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
    done = p.poll() == 0
    running = p.poll() is None
    mount.cut()
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        pass
    out.close()
    return done, running, p.returncode, (workdir / "tool.out").read_text(errors="replace")[-2000:], \
        time.monotonic() - t0


def calibrate(prep, case, workdir):
    """How long the tool takes through cutfs (no cut: the mount is left at the end)."""
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    res = run_case(prep, case, workdir, "drop", 0, delay=None)
    return max(res["duration"], 0.05)


def _admin_bind(port, password):
    import ldap3
    server = ldap3.Server("127.0.0.1", port=port, get_info=ldap3.NONE, connect_timeout=10)
    c = ldap3.Connection(server, user=workload.ADMIN_DN, password=password, raise_exceptions=False)
    ok = c.bind()
    c.unbind()
    return ok


def _first_start(prep, workdir, backing, mnt, fs_mode, seed, delay, res):
    """The first-start case (see the module's text)."""
    binary = prep.binary
    port = workload.free_port()
    cfg = workdir / "first.toml"
    cfg.write_text(workload.config_text(mnt / "data", port, "none"))
    m = cutfs.Mount(backing, mnt, mode=fs_mode, seed=seed, log=workdir / "cutfs.log").mount()
    try:
        s = workload.Serve(binary, cfg, workdir, "first").start()
        t0 = time.monotonic()
        if delay is None:
            if s.wait(30) != "serving":
                raise RuntimeError("calibration: first start failed:\n" + s.stderr())
            res["duration"] = time.monotonic() - t0
            s.stop()
            return res
        while time.monotonic() < t0 + delay:
            time.sleep(0.002)
        announced = b"is serving:" in s.out_path.read_bytes()
        m.cut()
        s.kill9()
    finally:
        res["cutfs"] = m.unmount()
    data = backing / "data"
    pw_file = data / "admin-password"
    # What the banner announced lives in the file the banner names.
    before = pw_file.read_text() if announced and pw_file.exists() else None
    res["tool_done"] = announced
    if announced and before is None:
        res["violations"].append("the banner was printed but admin-password did not survive the cut")
    port2 = workload.free_port()
    cfg2 = workdir / "again.toml"
    cfg2.write_text(workload.config_text(data, port2, "durable"))
    s2 = workload.Serve(binary, cfg2, workdir, "again").start()
    outcome = s2.wait(30)
    res["serve"] = outcome
    if outcome != "serving":
        res["result"] = "not served"
        res["violations"].append("serve after a cut during the first start: %s (rc %r)\n%s" % (
            outcome, s2.rc, s2.stderr()[-1000:]))
        return res
    try:
        after = pw_file.read_text() if pw_file.exists() else None
        if after is None:
            res["violations"].append("no admin-password after the restart")
        elif not _admin_bind(port2, after):
            res["violations"].append("the admin-password left after the restart does not bind")
        if before is not None and after != before:
            res["violations"].append("the announced admin-password was replaced")
        if (data / "admin-password.new").exists():
            res["violations"].append("admin-password.new left behind")
        res["result"] = "kept" if before is not None else ("recovered" if after else "none")
    finally:
        s2.stop()
    return res


def _serve_attempt(binary, data_dir, workdir):
    port = workload.free_port()
    cfg = workdir / "serve.toml"
    cfg.write_text(workload.config_text(data_dir, port, "durable"))
    s = workload.Serve(binary, cfg, workdir, "serve").start()
    outcome = s.wait(30)
    err = s.stderr()
    s.stop() if outcome == "serving" else s.kill9()
    return outcome, s.rc, err


def run_case(prep, case, workdir, fs_mode, seed, delay):
    """One cut during `case` (import | backup | restore); delay None = no
    cut (calibration). Returns a result dict with violations."""
    binary = prep.binary
    workdir = Path(workdir)
    backing, mnt = workdir / "backing", workdir / "mnt"
    backing.mkdir(parents=True, exist_ok=True)
    res = {"case": case, "fs_mode": fs_mode, "seed": seed, "violations": [], "delay": delay}
    if case == "first-start":
        return _first_start(prep, workdir, backing, mnt, fs_mode, seed, delay, res)
    if case == "restore":
        shutil.copytree(prep.store_a, backing / "data", symlinks=True)
        lock = backing / "data" / "pando.lock"
        if lock.exists():
            lock.unlink()
    if case == "import":
        args = ["import", "--data-dir", str(mnt / "data"), "-f", str(prep.import_ldif)]
    elif case == "backup":
        args = ["backup", "--data-dir", str(prep.store_a), str(mnt / "bk")]
    else:
        args = ["restore", "--data-dir", str(mnt / "data"), str(prep.backup_b)]
    m = cutfs.Mount(backing, mnt, mode=fs_mode, seed=seed, log=workdir / "cutfs.log").mount()
    try:
        if delay is None:
            t0 = time.monotonic()
            r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
            res["duration"] = time.monotonic() - t0
            if r.returncode != 0:
                raise RuntimeError("calibration: pando %s failed:\n%s" % (" ".join(args), r.stdout + r.stderr))
            return res
        done, running, rc, out, dur = _run_with_cut(binary, args, workdir, m, delay)
    finally:
        res["cutfs"] = m.unmount()
    res["tool_done"] = done
    res["tool_rc"] = rc
    res["tool_out"] = out[-500:]
    # The cut comes before the kill: a tool still running then may touch a
    # mapped file on the file system that is gone, and die of SIGBUS in
    # that window, as it would die of the power cut itself. Any other
    # signal, or one before the cut, is a defect.
    cut_short = running and rc == -signal.SIGBUS
    if rc is not None and rc < 0 and rc != -signal.SIGKILL and not cut_short:
        res["violations"].append("pando %s died by signal %d before the cut was over" % (case, -rc))

    if case == "import":
        data = backing / "data"
        vkind, vrc, vout = workload.verify(binary, data)
        ekind, n, sha = export(binary, data)
        outcome, src, err = _serve_attempt(binary, data, workdir)
        res.update(verify=vkind, verify_err=workload.last_error_line(vout) if vkind != "clean" else "",
                   export=ekind, entries=n, serve=outcome, serve_rc=src,
                   serve_err=workload.last_error_line(err) if outcome != "serving" else "",
                   serve_err_kind=workload.error_kind(err) if outcome == "refused" else "")
        for what, kind in (("verify", vkind), ("export", ekind)):
            if kind in ("signal", "hang"):
                res["violations"].append("pando %s %s on the store after the cut" % (what, kind))
        if outcome in ("signal", "hang", "exit0"):
            res["violations"].append("serve: %s (rc %r)\n%s" % (outcome, src, err[-1000:]))
        complete = vkind == "clean" and n == prep.import_entries
        if outcome == "serving":
            if complete:
                res["result"] = "complete"
            elif n == 0 and vkind == "clean" and not done:
                res["result"] = "not started"
            elif n is None and "no store in" in res["verify_err"] and not done:
                # Cut before the import made its store: nothing of it is
                # on the disk, and serve starts a new one (as on an
                # empty data directory).
                res["result"] = "not started"
            else:
                res["result"] = "partial store served"
                res["violations"].append("serve served an incomplete import: %r entries of %d, verify %s: %s" % (
                    n, prep.import_entries, vkind, res["verify_err"]))
        elif outcome == "refused":
            res["result"] = "refused"
            if str(data) not in err:
                res["violations"].append("serve refused without naming the store:\n" + err[-1000:])
        if done and res.get("result") != "complete":
            res["violations"].append("the import had finished (exit 0) before the cut but the store is %s "
                                     "(serve %s: %s)" % (res.get("result"), outcome, res["serve_err"]))
    elif case == "backup":
        bk = backing / "bk"
        if not bk.exists():
            res["result"] = "absent"
        else:
            target = workdir / "restored"
            kind, rrc, rout = workload.run_tool(binary, ["restore", "--data-dir", str(target), str(bk)])
            res["restore"] = kind
            res["restore_err"] = workload.last_error_line(rout) if kind != "ok" else ""
            res["restore_err_kind"] = workload.error_kind(rout) if kind != "ok" else ""
            if kind in ("signal", "hang"):
                res["violations"].append("pando restore %s on the backup after the cut:\n%s" % (kind, rout[-1000:]))
                res["result"] = "restore " + kind
            elif kind == "error":
                res["result"] = "refused by restore"
                if not rout.strip():
                    res["violations"].append("restore refused the backup with no message")
            else:
                vkind, vrc, vout = workload.verify(binary, target)
                ekind, n, sha = export(binary, target)
                res.update(verify=vkind, entries=n)
                if vkind == "clean" and n == prep.a_entries and sha == prep.a_sha:
                    res["result"] = "complete"
                else:
                    res["result"] = "restored incomplete"
                    res["violations"].append("restore accepted a backup that is not whole: verify %s, %r of %d "
                                             "entries" % (vkind, n, prep.a_entries))
        if done and res.get("result") != "complete":
            res["violations"].append("the backup had finished (exit 0) before the cut but is %s: %s" % (
                res.get("result"), res.get("restore_err", "")))
    else:
        data = backing / "data"
        vkind, vrc, vout = workload.verify(binary, data)
        ekind, n, sha = export(binary, data)
        res.update(verify=vkind, export=ekind, entries=n,
                   verify_err=workload.last_error_line(vout) if vkind != "clean" else "")
        res["leftovers"] = sorted(p.name for p in data.iterdir() if p.name.startswith("db."))
        if ekind == "ok" and sha == prep.a_sha:
            res["result"] = "old store"
        elif ekind == "ok" and sha == prep.b_sha:
            res["result"] = "new store"
        else:
            res["result"] = "neither"
            res["violations"].append("after a cut during restore the store is neither the old one nor the new "
                                     "one: verify %s, export %s, %r entries (old %d, new %d); %s" % (
                                         vkind, ekind, n, prep.a_entries, prep.b_entries,
                                         sorted(p.name for p in data.iterdir())))
        if vkind != "clean" and res["result"] != "neither":
            res["violations"].append("verify after a cut during restore: %s\n%s" % (vkind, vout[-1000:]))
        if done and res["result"] != "new store":
            res["violations"].append("the restore had finished (exit 0) before the cut but the store is the %s"
                                     % res["result"])
    return res


def pick_delay(rng, duration):
    """When to cut: anywhere in the tool's run, or up to as long again after
    (runs vary; a cut after the end checks that what it reported is durable)."""
    return rng.uniform(0.0, 2.0 * duration)
