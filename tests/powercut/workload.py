"""The power-cut cycle shared by tests/integration/test_powercut.py and
scripts/powercut: Pando serving from a cutfs mount under a write load whose
every operation is recorded in a model; a power cut; then the disk as the
cut left it (the BACKING directory, not through FUSE) is checked with
`pando verify`, a fresh `pando serve`, and the model.

The load: writer threads, each with its own entries under one ou, doing adds,
modifies (sn and description replaced by the same token, so a half-applied
modify shows as sn != description), modrdn renames and deletes, one at a
time on one connection each. Every operation is recorded with its DNs, token,
the time its answer came, and its outcome: acked, failed (an LDAP error that
refuses the operation: not applied) or unknown (the connection dropped, or
a result that cannot tell, like a storage error after the cut: the commit
may have reached the disk before its sync failed; may go either way; the
thread stops there).

An entry's history ("lineage") gives the states it may be found in after the
cut: for each prefix of its operations, the states with the prefix's acked
operations applied, its failed ones not, its unknown ones either way. The
state found must be one of them (anything else: corruption or a half-applied
change); the acked operations after the longest such prefix are the lost
writes. durable allows none; batched only those acknowledged within
batched_max_ms (+ SLACK) of the cut; none any (but see run_cut).
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cutfs  # noqa: E402

REPO = HERE.parents[1]
SUFFIX = "dc=example,dc=com"
ADMIN_DN = "cn=admin," + SUFFIX
OU = "ou=Cut," + SUFFIX
# batched: losses only among writes acknowledged within batched_max_ms of the
# cut, plus this much slack (the sync timer, scheduling).
SLACK = 0.25
# LDAP results that do not say whether the write happened: operationsError,
# busy, unavailable, other (storage errors: the sync after a commit failed).
MAYBE_CODES = {1, 51, 52, 80}


def pando_bin():
    return os.environ.get("PANDO_BIN", str(REPO / "target" / "release" / "pando"))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(data_dir, port, durability, batched_max_ms=1000):
    return "\n".join([
        'data_dir = "%s"' % data_dir,
        'listen = ["ldap://127.0.0.1:%d"]' % port,
        'suffixes = ["%s"]' % SUFFIX,
        'root_dn = "%s"' % ADMIN_DN,
        'log_level = "info"',
        "[store]",
        'durability = "%s"' % durability,
        "batched_max_ms = %d" % batched_max_ms,
        "warm_start = false",
        "",
    ])


# ------------------------------------------------------------------ processes


class Serve:
    """One `pando serve` run: start(), then wait() for the banner or an exit."""

    def __init__(self, binary, config, workdir, name, args=()):
        self.binary = binary
        self.config = Path(config)
        self.workdir = Path(workdir)
        self.name = name
        self.args = list(args)
        self.proc = None
        self.outcome = None     # serving | refused | signal | hang
        self.rc = None

    @property
    def out_path(self):
        return self.workdir / (self.name + ".out")

    @property
    def err_path(self):
        return self.workdir / (self.name + ".err")

    def start(self):
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([self.binary, "serve", "--config", str(self.config)] + self.args,
                                     stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err)
        return self

    def wait(self, timeout=30.0):
        """Wait until serving (banner on stdout) or exited; classify."""
        deadline = time.monotonic() + timeout
        while True:
            if b"is serving:" in self.out_path.read_bytes():
                self.outcome = "serving"
                return self.outcome
            rc = self.proc.poll()
            if rc is not None:
                self.rc = rc
                self.outcome = "signal" if rc < 0 else ("refused" if rc > 0 else "exit0")
                self._close()
                return self.outcome
            if time.monotonic() > deadline:
                self.kill9()
                self.outcome = "hang"
                return self.outcome
            time.sleep(0.02)

    def stderr(self):
        try:
            return self.err_path.read_text(errors="replace")
        except OSError:
            return ""

    def stdout(self):
        try:
            return self.out_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.rc = self.proc.returncode if self.proc else None
        self._close()

    def stop(self, timeout=30.0):
        """SIGTERM, bounded wait (then SIGKILL); returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                return None
        self.rc = self.proc.returncode if self.proc else None
        self._close()
        return self.rc

    def _close(self):
        for f in ("_out", "_err"):
            h = getattr(self, f, None)
            if h is not None and not h.closed:
                h.close()


def run_tool(binary, args, timeout=120.0):
    """Run a pando subcommand to completion; returns (kind, rc, output) with
    kind: ok (exit 0) | error (exit > 0) | signal | hang."""
    try:
        r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return "hang", None, out
    kind = "ok" if r.returncode == 0 else ("signal" if r.returncode < 0 else "error")
    return kind, r.returncode, r.stdout + r.stderr


def verify(binary, data_dir, timeout=120.0):
    """`pando verify`: (kind, rc, output); kind: clean | failed (exit > 0:
    problems found, or the store does not open) | signal | hang."""
    kind, rc, out = run_tool(binary, ["verify", "--data-dir", str(data_dir)], timeout)
    if kind == "ok":
        kind = "clean" if "consistent" in out else "failed"
    elif kind == "error":
        kind = "failed"
    return kind, rc, out


def error_kind(text):
    """A short name for the kind of problem a refusal names (for tallies):
    LMDB's error code when there is one, else a keyword."""
    import re
    m = re.search(r"MDB_[A-Z_]+", text)
    if m:
        return m.group(0)
    t = text.lower()
    for key, name in (("incomplete", "incomplete"), ("interrupted", "incomplete"),
                      ("checksum", "checksum"), ("not a pando store", "not a Pando store"),
                      ("has format", "format"), ("not a pando backup", "not a backup"),
                      ("corrupt", "corrupted"), ("damaged", "damaged"), ("version", "version"),
                      ("format", "format"), ("no such file", "missing file"), ("in use", "locked")):
        if key in t:
            return name
    return "other"


def last_error_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for l in reversed(lines):
        if "error" in l.lower() or "refus" in l.lower() or ":" in l:
            return l[:300]
    return lines[-1][:300] if lines else ""


# ------------------------------------------------------------------ the model


class Model:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = []          # dicts: lineage, kind, dn, new_dn, token, t_send, t_ack, outcome
        self.lineages = {}     # lineage id -> [op indices]
        self.names = {}        # dn (lower) -> lineage id

    def begin(self, lineage, kind, dn, token, new_dn=None):
        with self.lock:
            op = {"lineage": lineage, "kind": kind, "dn": dn, "new_dn": new_dn, "token": token,
                  "t_send": time.monotonic(), "t_ack": None, "outcome": "pending"}
            self.ops.append(op)
            self.lineages.setdefault(lineage, []).append(len(self.ops) - 1)
            self.names[dn.lower()] = lineage
            if new_dn:
                self.names[new_dn.lower()] = lineage
            return op

    def end(self, op, outcome, result=None):
        with self.lock:
            op["outcome"] = outcome
            op["t_end"] = time.monotonic()
            if outcome == "acked":
                op["t_ack"] = op["t_end"]
            if result is not None:
                op["code"] = result.get("result")
                op["message"] = result.get("message")

    def counts(self):
        with self.lock:
            c = {"acked": 0, "failed": 0, "unknown": 0, "pending": 0}
            for op in self.ops:
                c[op["outcome"]] += 1
            return c


def _writer(url_port, password, tid, model, stop, rng, max_ops=100000):
    import ldap3
    from ldap3.core.exceptions import LDAPException
    try:
        server = ldap3.Server("127.0.0.1", port=url_port, get_info=ldap3.NONE, connect_timeout=10)
        c = ldap3.Connection(server, user=ADMIN_DN, password=password, raise_exceptions=False,
                             receive_timeout=30)
        if not c.bind():
            return
    except LDAPException:
        return
    live = []   # [lineage, current dn, renames]
    n = 0
    while not stop.is_set() and n < max_ops:
        n += 1
        token = "t%d-%d" % (tid, n)
        r = rng.random()
        if not live or r < 0.4:
            lin = "w%d-%d" % (tid, n)
            dn = "cn=%s,%s" % (lin, OU)
            op = model.begin(lin, "add", dn, token)
            call = lambda: c.add(dn, ["person"], {"cn": lin, "sn": token, "description": token})  # noqa: E731
            after = lambda: live.append([lin, dn, 0])  # noqa: E731
        elif r < 0.7:
            item = rng.choice(live)
            op = model.begin(item[0], "modify", item[1], token)
            call = lambda: c.modify(item[1], {"sn": [(ldap3.MODIFY_REPLACE, [token])],  # noqa: E731
                                              "description": [(ldap3.MODIFY_REPLACE, [token])]})
            after = lambda: None  # noqa: E731
        elif r < 0.85:
            item = rng.choice(live)
            rdn = "cn=%s-r%d" % (item[0], item[2] + 1)
            new_dn = "%s,%s" % (rdn, OU)
            op = model.begin(item[0], "rename", item[1], token, new_dn=new_dn)
            call = lambda: c.modify_dn(item[1], rdn, delete_old_dn=True)  # noqa: E731

            def after(item=item, new_dn=new_dn):
                item[1] = new_dn
                item[2] += 1
        else:
            item = rng.choice(live)
            op = model.begin(item[0], "delete", item[1], token)
            call = lambda: c.delete(item[1])  # noqa: E731
            after = lambda: live.remove(item)  # noqa: E731
        try:
            ok = call()
        except (LDAPException, OSError):
            model.end(op, "unknown")   # the connection dropped: either way
            return
        if ok:
            model.end(op, "acked")
            after()
        elif c.result.get("result") in MAYBE_CODES:
            # The server could not tell (a storage error: the commit may have
            # reached the disk before the sync failed): either way. Stop here.
            model.end(op, "unknown", c.result)
            return
        else:
            model.end(op, "failed", c.result)
            if c.closed:
                return


ABSENT = (False, None, None)


def _apply(op, state):
    """The state after `op` applied to `state`, or None when it could not
    have been applied there (the server would have refused it)."""
    kind = op["kind"]
    if kind in ("add", "ou"):
        return None if state[0] else (True, op["dn"].lower(), op["token"])
    if not state[0] or state[1] != op["dn"].lower():
        return None
    if kind == "modify":
        return (True, state[1], op["token"])
    if kind == "rename":
        return (True, op["new_dn"].lower(), state[2])
    if kind == "delete":
        return ABSENT
    raise ValueError(kind)


def reachable(model, lineage):
    """For each prefix of the entry's operations (0, 1, ... n of them), the
    set of states the entry may be in had the store kept exactly that
    prefix: acked operations of the prefix applied, failed ones not, unknown
    ones either way. Returns [(op index or None, set of states)]."""
    out = [(None, {ABSENT})]
    cur = {ABSENT}
    for i in model.lineages[lineage]:
        op = model.ops[i]
        if op["outcome"] == "acked":
            cur = {t for t in (_apply(op, s) for s in cur) if t is not None}
        elif op["outcome"] in ("unknown", "pending"):
            cur = cur | {t for t in (_apply(op, s) for s in cur) if t is not None}
        out.append((i, set(cur)))
    return out


def check_model(model, found, ou_present, durability, cut_at, window):
    """Compare what the restarted server returned with the model.

    found: {dn lower: (sn list, description list)} under the ou.
    Returns a dict: violations (strings), lost (acked ops not present, with
    their age at the cut), anomalies (for `none`, where damage is allowed)."""
    violations, anomalies, lost = [], [], []
    seen = set()
    for lineage in model.lineages:
        prefixes = reachable(model, lineage)
        if lineage == "ou":
            f = (True, OU.lower(), None) if ou_present else (False, None, None)
        else:
            names = {model.ops[i]["dn"].lower() for i in model.lineages[lineage]}
            names |= {model.ops[i]["new_dn"].lower() for i in model.lineages[lineage] if model.ops[i]["new_dn"]}
            present = [d for d in names if d in found]
            seen.update(present)
            if len(present) > 1:
                violations.append("%s present under several names: %s" % (lineage, sorted(present)))
                continue
            if not present:
                f = (False, None, None)
            else:
                d = present[0]
                sn, desc = found[d]
                if sn != desc or len(sn) != 1:
                    violations.append("half-applied modify on %s: sn=%r description=%r" % (d, sn, desc))
                    continue
                f = (True, d, sn[0])
        match = [j for j, (_, states) in enumerate(prefixes) if f in states]
        if not match:
            violations.append("%s found as %r, which no sequence of its operations gives (ops: %s)" % (
                lineage, f, [(model.ops[i]["kind"], model.ops[i]["token"], model.ops[i]["outcome"])
                             for i in model.lineages[lineage]]))
            continue
        j = max(match)
        for i, _ in prefixes[j + 1:]:
            op = model.ops[i]
            if op["outcome"] == "acked":
                lost.append({"lineage": lineage, "kind": op["kind"], "dn": op["dn"], "token": op["token"],
                             "age": cut_at - op["t_ack"]})
    for d in found:
        if d not in seen and d not in model.names:
            violations.append("entry %s was never written" % d)
    if durability == "durable":
        for l in lost:
            violations.append("acknowledged %s of %s (token %s, acked %.3f s before the cut) lost" % (
                l["kind"], l["dn"], l["token"], l["age"]))
    elif durability == "batched":
        for l in lost:
            if l["age"] > window + SLACK:
                violations.append("acknowledged %s of %s (token %s) lost though acked %.3f s before the cut "
                                  "(window %.2f s + %.2f s)" % (l["kind"], l["dn"], l["token"], l["age"],
                                                                window, SLACK))
    else:
        anomalies, violations = violations, []
    return {"violations": violations, "anomalies": anomalies, "lost": lost,
            "oldest_loss_age": max((l["age"] for l in lost), default=None)}


# ------------------------------------------------------------------ one cut


def read_back(port, password):
    """Every person under the ou: ({dn lower: (sn, description)}, ou present)."""
    import ldap3
    server = ldap3.Server("127.0.0.1", port=port, get_info=ldap3.NONE, connect_timeout=10)
    c = ldap3.Connection(server, user=ADMIN_DN, password=password, raise_exceptions=False,
                         receive_timeout=60)
    if not c.bind():
        raise RuntimeError("admin bind with the recorded password failed: %s" % c.result)
    found = {}
    ok = c.search(OU, "(objectClass=person)", search_scope=ldap3.LEVEL,
                  attributes=["sn", "description"], paged_size=500)
    if not ok and c.result.get("result") == 32:
        c.unbind()
        return {}, False
    if not ok and c.result.get("result") != 0:
        raise RuntimeError("search under %s failed: %s" % (OU, c.result))
    cookie = True
    while True:
        for e in c.response:
            if e.get("type") != "searchResEntry":
                continue
            a = e["raw_attributes"]
            found[e["dn"].lower()] = ([v.decode() for v in a.get("sn", [])],
                                      [v.decode() for v in a.get("description", [])])
        cookie = c.result.get("controls", {}).get("1.2.840.113556.1.4.319", {}).get("value", {}).get("cookie")
        if not cookie:
            break
        c.search(OU, "(objectClass=person)", search_scope=ldap3.LEVEL,
                 attributes=["sn", "description"], paged_size=500, paged_cookie=cookie)
    c.unbind()
    return found, True


def run_cut(workdir, durability, fs_mode, seed, binary=None, threads=4, delay=None,
            batched_max_ms=1000):
    """One power cut under load, `delay` s (default: 0.5 to 2.5, from the
    seed) after the writers start; cutfs drops or tears (fs_mode) the
    unsynced sectors. Returns a dict: violations (empty when the server kept
    its promises), anomalies (model mismatches where `none` allows them),
    lost (acked writes not found, with their age at the cut),
    oldest_loss_age, verify / serve outcomes and messages, the model's
    counts (acked, failed, unknown) and cutfs's counters."""
    binary = binary or pando_bin()
    rng = random.Random(seed)
    workdir = Path(workdir)
    backing, mnt = workdir / "backing", workdir / "mnt"
    data_mnt, data_bk = mnt / "data", backing / "data"
    res = {"durability": durability, "fs_mode": fs_mode, "seed": seed, "violations": [],
           "anomalies": [], "lost": [], "oldest_loss_age": None}
    window = batched_max_ms / 1000.0
    delay = rng.uniform(0.5, 2.5) if delay is None else delay
    res["delay"] = round(delay, 3)
    model = Model()
    mount = cutfs.Mount(backing, mnt, mode=fs_mode, seed=seed, log=workdir / "cutfs.log")
    mount.mount()
    srv = None
    try:
        port = free_port()
        cfg = workdir / "pando.toml"
        cfg.write_text(config_text(data_mnt, port, durability, batched_max_ms))
        srv = Serve(binary, cfg, workdir, "serve1").start()
        if srv.wait(30) != "serving":
            raise RuntimeError("pando did not start on the cutfs mount (%s):\n%s" % (srv.outcome, srv.stderr()))
        password = (data_mnt / "admin-password").read_text()
        res["admin_password_first"] = password
        import ldap3
        c = ldap3.Connection(ldap3.Server("127.0.0.1", port=port, get_info=ldap3.NONE),
                             user=ADMIN_DN, password=password, raise_exceptions=False)
        if not c.bind():
            raise RuntimeError("admin bind failed: %s" % c.result)
        op = model.begin("ou", "ou", OU, None)
        model.end(op, "acked" if c.add(OU, ["organizationalUnit"], {"ou": "Cut"}) else "failed")
        c.unbind()
        if op["outcome"] != "acked":
            raise RuntimeError("adding %s failed" % OU)
        stop = threading.Event()
        ts = [threading.Thread(target=_writer, args=(port, password, t, model, stop,
                                                      random.Random(seed * 100 + t)), daemon=True)
              for t in range(threads)]
        for t in ts:
            t.start()
        time.sleep(delay)
        cut_at = mount.cut()
        srv.kill9()
        stop.set()
        for t in ts:
            t.join(30)
        res["writers_stuck"] = sum(t.is_alive() for t in ts)
    finally:
        if srv is not None:
            srv.kill9()
        res["cutfs"] = mount.unmount()
    res.update(model.counts())
    res["ops"] = len(model.ops)
    res["failures"] = {}
    for op in model.ops:
        if op["outcome"] == "failed":
            k = "%s %s (%s the cut)" % (op.get("code"), (op.get("message") or "")[:80],
                                       "before" if op["t_end"] < cut_at else "after")
            res["failures"][k] = res["failures"].get(k, 0) + 1

    # ---- the disk after the cut
    pw_file = data_bk / "admin-password"
    pw0 = res["admin_password_first"]

    def pw_now():
        try:
            return pw_file.read_text()
        except OSError as e:
            return "<%s>" % e

    if pw_now() != pw0:
        res["violations"].append("admin-password lost at the cut (it was synced before serving): %r" % pw_now())
    vkind, vrc, vout = verify(binary, data_bk)
    res["verify"] = vkind
    res["verify_rc"] = vrc
    res["verify_out"] = vout[-2000:]
    res["verify_err_kind"] = error_kind(vout) if vkind != "clean" else ""
    if vkind in ("signal", "hang"):
        res["violations"].append("pando verify %s (rc %r):\n%s" % ("crashed" if vkind == "signal" else "hung",
                                                                    vrc, vout[-1500:]))
    port2 = free_port()
    cfg2 = workdir / "pando2.toml"
    cfg2.write_text(config_text(data_bk, port2, durability, batched_max_ms))
    srv2 = Serve(binary, cfg2, workdir, "serve2").start()
    outcome = srv2.wait(30)
    res["serve"] = outcome
    res["serve_rc"] = srv2.rc
    res["serve_err"] = last_error_line(srv2.stderr()) if outcome != "serving" else ""
    res["serve_err_kind"] = error_kind(srv2.stderr()) if outcome == "refused" else ""
    try:
        if outcome == "serving":
            try:
                found, ou_present = read_back(port2, pw0)
            except Exception as e:  # noqa: BLE001
                res["violations"].append("reading back from the restarted server failed: %s" % e)
                found, ou_present = None, None
            if found is not None:
                res["entries_found"] = len(found)
                chk = check_model(model, found, ou_present, durability, cut_at, window)
                res["violations"] += chk["violations"]
                res["anomalies"] = chk["anomalies"]
                res["lost"] = chk["lost"]
                res["oldest_loss_age"] = chk["oldest_loss_age"]
            rc = srv2.stop()
            if rc != 0:
                res["violations"].append("restarted server did not exit 0 on SIGTERM (rc %r):\n%s" % (
                    rc, srv2.stderr()[-1500:]))
        elif outcome == "refused":
            err = srv2.stderr()
            if not err.strip():
                res["violations"].append("serve exited %r with nothing on stderr" % srv2.rc)
            elif str(data_bk) not in err:
                res["violations"].append("serve refused the store without naming it (%s):\n%s" % (
                    data_bk, err[-1500:]))
        elif outcome == "signal":
            res["violations"].append("serve died by signal %d on the store after the cut:\n%s" % (
                -srv2.rc, srv2.stderr()[-1500:]))
        elif outcome == "hang":
            res["violations"].append("serve neither served nor exited within 30 s:\n%s" % srv2.stderr()[-1500:])
        else:
            res["violations"].append("serve exited 0 without serving:\n%s" % srv2.stderr()[-1500:])
    finally:
        srv2.kill9()
    if pw_now() != pw0:
        res["violations"].append("the restarted server wrote a new admin-password (the store lost its "
                                 "administrator hash): %r -> %r" % (pw0, pw_now()))
    # what each durability promises about verify and serve
    if durability in ("durable", "batched"):
        if vkind != "clean":
            res["violations"].append("verify after the cut: %s (rc %r): %s\n%s" % (
                vkind, vrc, last_error_line(vout), vout[-1500:]))
        if outcome == "refused":
            res["violations"].append("serve refused the store after the cut (rc %r): %s\n%s" % (
                srv2.rc, res["serve_err"], srv2.stderr()[-1500:]))
    else:
        if vkind == "clean" and outcome == "refused":
            res["violations"].append("verify says the store is clean but serve refused it: %s" % res["serve_err"])
        if vkind != "clean" and outcome == "serving":
            res["violations"].append("serve served a store that verify finds damaged (%s): %s\n%s" % (
                vkind, last_error_line(vout), vout[-1500:]))
    return res


def describe(res):
    """One paragraph about a cut (for failure messages and logs)."""
    lines = ["durability=%s fs=%s seed=%s delay=%.2fs ops=%d acked=%d failed=%d unknown=%d" % (
        res["durability"], res["fs_mode"], res["seed"], res.get("delay", 0), res.get("ops", 0),
        res.get("acked", 0), res.get("failed", 0), res.get("unknown", 0)),
        "cutfs: %s" % {k: v for k, v in res.get("cutfs", {}).items() if k in (
            "dirty", "kept", "dropped", "writes", "fsyncs", "sync_writes")},
        "verify=%s serve=%s %s" % (res.get("verify"), res.get("serve"), res.get("serve_err", "")),
        "lost acked writes=%d oldest loss %.3f s before the cut" % (
            len(res["lost"]), res["oldest_loss_age"]) if res["lost"] else "lost acked writes=0"]
    if res["violations"]:
        lines.append("VIOLATIONS (%d):" % len(res["violations"]))
        lines += ["  - " + v for v in res["violations"][:12]]
    if res["anomalies"]:
        lines.append("anomalies (allowed for none): %d, e.g. %s" % (len(res["anomalies"]), res["anomalies"][0]))
    return "\n".join(lines)
