"""Power cuts: Pando serving from cutfs (tests/powercut/cutfs.c), a FUSE file
system that keeps unsynced writes in memory and, at the cut, drops them all
or lets a random half reach the disk (a torn writeback). After each cut the
disk as it was left is checked: `pando verify`, a fresh `pando serve`, and
the acknowledged writes (tests/powercut/workload.py has the model).

What each durability promises:
  durable  verify clean, serve serves, no acknowledged write lost, nothing
           half-applied;
  batched  the same, except that writes acknowledged within batched_max_ms
           (+0.25 s) of the cut may be lost;
  none     the store may be damaged, but serve refuses it cleanly (exit code
           and a message naming the store) or serves it when verify finds it
           clean.
Always: serve never dies by a signal or hangs, and never writes a new
admin-password.

Seeds: PANDO_POWERCUT_SEED=N fixes the seed (delays, writers, which
sectors survive a torn cut); otherwise a random one is printed on failure.
The long campaign is scripts/powercut."""

import errno
import mmap
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "powercut"))
import cutfs  # noqa: E402
import workload  # noqa: E402

from conftest import PANDO_BIN  # noqa: E402

BASE_SEED = int(os.environ.get("PANDO_POWERCUT_SEED") or random.randrange(1, 10**6))

# (durability, what the cut does to unsynced sectors); tear for most.
CASES = [
    ("durable", "drop"), ("durable", "tear"), ("durable", "tear"),
    ("batched", "drop"), ("batched", "tear"), ("batched", "tear"),
    ("none", "drop"), ("none", "tear"), ("none", "tear"),
]


@pytest.fixture(scope="module")
def cutfs_binary(tmp_path_factory):
    """cutfs built and able to mount here. The test command installs what
    it needs and runs as root with /dev/fuse (as CI does): failing to mount
    is a failure, not a reason to skip the power-cut checks."""
    try:
        binary = cutfs.build()
        probe = tmp_path_factory.mktemp("cutfs-probe")
        with cutfs.Mount(probe / "backing", probe / "mnt"):
            pass
        return binary
    except cutfs.Unavailable as e:
        pytest.fail("cutfs cannot run here (needs root, /dev/fuse, libfuse3-dev): %s" % e)


def test_cutfs_semantics(tmp_path, cutfs_binary):
    """The file system itself: unsynced data is dropped or torn at the cut,
    synced and O_DSYNC data is kept, mmap'ed reads see writes, sizes count
    unsynced writes, renames carry dirty data, and after the cut everything
    fails with EIO."""
    results = {}
    for mode in ("drop", "tear", "tear"):
        run = len(results)
        backing, mnt = tmp_path / ("b%d" % run), tmp_path / ("m%d" % run)
        with cutfs.Mount(backing, mnt, mode=mode, seed=42) as m:
            pat = bytes(range(256)) * 256                         # 64 KiB, 128 sectors
            # unsynced, in a new file
            fd = os.open(mnt / "unsynced", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(fd, pat, 0)
            assert os.fstat(fd).st_size == len(pat)
            assert os.stat(mnt / "unsynced").st_size == len(pat)
            assert os.stat(backing / "unsynced").st_size == 0
            # mmap'ed reads (another descriptor, read-only, shared) see writes
            rd = os.open(mnt / "unsynced", os.O_RDONLY)
            mm = mmap.mmap(rd, len(pat), mmap.MAP_SHARED, mmap.PROT_READ)
            assert mm[:len(pat)] == pat
            os.pwrite(fd, b"X" * 100, 1000)
            assert mm[990:1110] == pat[990:1000] + b"X" * 100 + pat[1100:1110]
            mm.close()
            os.close(rd)
            os.close(fd)                                          # close is not a sync
            # synced
            fd = os.open(mnt / "synced", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(fd, pat, 0)
            os.fsync(fd)
            assert (backing / "synced").read_bytes() == pat
            # a partial sector over synced content merges with it; unsynced
            os.pwrite(fd, b"YY", 510)
            assert os.pread(fd, 8, 506) == pat[506:510] + b"YY" + pat[512:514]
            os.close(fd)
            # O_DSYNC writes go through at once
            fd = os.open(mnt / "dsync", os.O_RDWR | os.O_CREAT | os.O_DSYNC, 0o600)
            os.pwrite(fd, b"D" * 700, 0)
            os.close(fd)
            assert (backing / "dsync").read_bytes() == b"D" * 700
            # dirty data follows a rename, and is synced under the new name
            fd = os.open(mnt / "old", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(fd, b"R" * 1024, 0)
            os.rename(mnt / "old", mnt / "new")
            os.fsync(fd)
            os.close(fd)
            assert (backing / "new").read_bytes() == b"R" * 1024
            # truncate applies at once and trims dirty data
            fd = os.open(mnt / "trunc", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(fd, b"T" * 2000, 0)
            os.ftruncate(fd, 700)
            assert os.fstat(fd).st_size == 700 and os.stat(backing / "trunc").st_size == 700
            assert os.pread(fd, 2000, 0) == b"T" * 700
            os.close(fd)
            m.cut()
            for op in (lambda: os.stat(mnt / "never-looked-up"),
                       lambda: os.open(mnt / "x", os.O_CREAT | os.O_WRONLY), lambda: os.listdir(mnt)):
                with pytest.raises(OSError) as e:
                    op()
                assert e.value.errno == errno.EIO
        st = m.stats
        # 128 sectors of "unsynced" + 1 dirtied again by the X write (same ones),
        # 1 of "synced" (the YY merge), 2 of "trunc": 131 unsynced at the cut.
        assert st["dirty"] == 131, st
        assert (backing / "synced").read_bytes()[:510] == pat[:510]
        assert (backing / "dsync").read_bytes() == b"D" * 700
        assert (backing / "new").read_bytes() == b"R" * 1024
        assert not (backing / "old").exists()
        data = (backing / "unsynced").read_bytes()
        if mode == "drop":
            assert st["kept"] == 0 and st["dropped"] == 131, st
            assert data == b""
            assert (backing / "synced").read_bytes() == pat
            assert (backing / "trunc").read_bytes() == b"\0" * 700
        else:
            assert st["kept"] in (65, 66) and st["kept"] + st["dropped"] == 131, st
            want = bytearray(pat)
            want[1000:1100] = b"X" * 100
            sectors = [data[i:i + 512] for i in range(0, len(data), 512)]
            kept = sum(1 for i, s in enumerate(sectors) if s == bytes(want[i * 512:(i + 1) * 512]))
            lost = sum(1 for s in sectors if s == b"\0" * 512)
            assert kept + lost == len(sectors), "sectors neither kept nor zero"
            assert 20 < kept < 110, kept
            # the YY sector of "synced" is either the merged one or the old one
            assert (backing / "synced").read_bytes()[510:512] in (b"YY", pat[510:512])
        results[run] = (data, (backing / "synced").read_bytes(), (backing / "trunc").read_bytes())
    # the same seed and the same writes tear the same way
    assert results[1] == results[2]


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=["%s-%s-%d" % (d, f, i) for i, (d, f) in enumerate(CASES)])
def test_power_cut(tmp_path, cutfs_binary, case):
    durability, fs_mode = CASES[case]
    seed = BASE_SEED * 100 + case
    res = workload.run_cut(tmp_path, durability, fs_mode, seed, binary=PANDO_BIN)
    report = workload.describe(res)
    print(report)
    assert res["acked"] > 50, "too few writes acknowledged to mean anything:\n" + report
    assert not res["violations"], "power cut (PANDO_POWERCUT_SEED=%d, seed %d):\n%s" % (BASE_SEED, seed, report)


def test_power_cut_during_first_start(tmp_path, cutfs_binary):
    """Cuts while the first `pando serve` creates the store, the
    administrator password and the suffix (durability none, torn writeback):
    the next start serves, keeps a password it had announced, and leaves an
    admin-password that works (tests/powercut/tools.py, first-start)."""
    import tools  # noqa: E402

    class Prep:
        binary = PANDO_BIN

    took = tools.calibrate(Prep, "first-start", tmp_path / "calibrate")
    for i, share in enumerate((0.2, 0.5, 0.8, 1.5)):
        seed = BASE_SEED * 100 + 50 + i
        d = tmp_path / ("cut%d" % i)
        d.mkdir()
        res = tools.run_case(Prep, "first-start", d, "tear", seed, share * took)
        assert not res["violations"], "first start cut at %.3f s (PANDO_POWERCUT_SEED=%d, seed %d): %s" % (
            share * took, BASE_SEED, seed, res["violations"])


@pytest.mark.parametrize("tool", ["import", "backup", "restore"])
def test_power_cut_during_tools(tmp_path_factory, cutfs_binary, tool):
    """Cuts during `pando import`, `backup` and `restore` (small stores; the
    campaign uses larger ones): an import is complete or refused as
    interrupted, a backup is complete or absent, a restore leaves the old
    store or the new one (tests/powercut/tools.py)."""
    import tools  # noqa: E402

    prep = tools.Prepared(tmp_path_factory.mktemp("prep-" + tool), PANDO_BIN,
                          import_users=400, store_users=600, other_users=300)
    took = tools.calibrate(prep, tool, tmp_path_factory.mktemp("calibrate-" + tool))
    for i, (share, fs_mode) in enumerate(((0.3, "tear"), (0.7, "tear"), (1.0, "drop"), (1.6, "tear"))):
        seed = BASE_SEED * 100 + 60 + i
        d = tmp_path_factory.mktemp("%s-cut%d" % (tool, i))
        res = tools.run_case(prep, tool, d, fs_mode, seed, share * took)
        assert not res["violations"], "%s cut at %.3f s (PANDO_POWERCUT_SEED=%d, seed %d): %s" % (
            tool, share * took, BASE_SEED, seed, res["violations"])
