"""System files and processes the client tests (SSSD, nslcd) touch:
saving the files a test rewrites and putting them back, and finding
daemons already running."""

import os
import shutil
import socket
import stat
from pathlib import Path


def running(comm):
    """PIDs of processes whose command name is `comm`."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == comm:
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def answers(path):
    """Something accepts connections on the Unix socket `path`."""
    if not Path(path).is_socket():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        return s.connect_ex(str(path)) == 0


def walk(root):
    """root and everything below it, not following symbolic links."""
    root = Path(root)
    if not os.path.lexists(root):
        return []
    out = [root]
    if root.is_dir() and not root.is_symlink():
        for d, dirs, files in os.walk(root):
            out += [Path(d) / n for n in dirs + files]
    return out


class SystemFiles:
    """The files below `roots` as they are now, to put back: regular files by
    content, mode and owner, directories by mode and owner; whatever appears
    below the roots later is removed by restore()."""

    def __init__(self, roots):
        self.roots = roots
        self.saved = {}
        for p in [p for r in roots for p in walk(r)]:
            st = os.lstat(p)
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
            self.saved[p] = (stat.S_IFMT(st.st_mode), data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)

    def restore(self):
        """Put everything back; raises if something could not be (after
        trying the rest)."""
        errors = []
        now = [p for r in self.roots for p in walk(r)]
        for p in sorted(now, key=lambda p: len(p.parts), reverse=True):
            if p not in self.saved:
                try:
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p)
                    elif os.path.lexists(p):
                        p.unlink()
                except OSError as e:
                    errors.append("%s: %s" % (p, e))
        for p, (kind, data, mode, uid, gid) in sorted(self.saved.items(), key=lambda kv: len(kv[0].parts)):
            try:
                if kind == stat.S_IFDIR:
                    p.mkdir(exist_ok=True)
                elif kind == stat.S_IFREG:
                    if os.path.lexists(p) and (p.is_symlink() or not p.is_file()):
                        p.unlink()
                    if not p.exists() or p.read_bytes() != data:
                        p.write_bytes(data)
                else:
                    continue  # a socket or a link a daemon left: nothing to rewrite
                os.chown(p, uid, gid)
                os.chmod(p, mode)
            except OSError as e:
                errors.append("%s: %s" % (p, e))
        assert not errors, "could not put system files back: %s" % "; ".join(errors)


def nsswitch_with(text, service):
    """nsswitch.conf text with `passwd` and `group` answered by files, then
    `service` (sss, ldap)."""
    out, done = [], set()
    for line in text.splitlines():
        db = line.split(":", 1)[0].strip()
        if db in ("passwd", "group") and ":" in line and not line.lstrip().startswith("#"):
            out.append("%s: files %s" % (db, service))
            done.add(db)
        else:
            out.append(line)
    out += ["%s: files %s" % (db, service) for db in ("passwd", "group") if db not in done]
    return "\n".join(out) + "\n"
