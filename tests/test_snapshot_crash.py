"""snapshot/: crash safety. A writer, prune or cleanup stopped at any file
operation (the process dies: every later operation fails too) or failing at
one operation (EIO, ENOSPC: later ones work) never leaves anything that
``snapshot.open``/``list_snapshots`` accepts as valid while incomplete, and
``cleanup_incomplete`` removes what is left. Plus the write protocol's order
of fsyncs and renames, and real SIGKILLs."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

import snapshot
from wal.errors import SnapshotError
from wal.fs import File, FileSystem

OLD = [(b"k%05d" % i, b"old-%d" % i) for i in range(200)]
NEW = [(b"k%05d" % i, b"new-%d" % i * 2) for i in range(0, 500, 2)]
KW = dict(chunk_bytes=2048, record_bytes=300)  # NEW: 3 chunks, several records each


class Injected(OSError):
    def __init__(self) -> None:
        super().__init__(errno.EIO, "injected fault")


class FaultFS(FileSystem):
    """Counts every mutating operation (files and directories). At operation
    ``fail_at`` it raises; with ``crash=True`` every later one raises too (the
    process is dead: nothing it does afterwards reaches the disk)."""

    def __init__(self, fail_at: int | None = None, *, crash: bool = True) -> None:
        self.fail_at = fail_at
        self.crash = crash
        self.failed = False
        self.ops: list[tuple] = []

    def step(self, *op) -> None:
        if (self.failed and self.crash) or (self.fail_at is not None and len(self.ops) == self.fail_at
                                            and not self.failed):
            self.failed = True
            raise Injected()
        self.ops.append(op)

    def open(self, path, *, create=False, exclusive=False, readonly=False):
        self.step("open", path)
        f = super().open(path, create=create, exclusive=exclusive, readonly=readonly)
        return FaultFile(self, f.path, f.fd)

    def rename(self, src, dst):
        self.step("rename", src, dst)
        super().rename(src, dst)

    def unlink(self, path):
        self.step("unlink", path)
        super().unlink(path)

    def makedirs(self, path):
        self.step("makedirs", path)
        super().makedirs(path)

    def mkdir(self, path):
        self.step("mkdir", path)
        super().mkdir(path)

    def rmdir(self, path):
        self.step("rmdir", path)
        super().rmdir(path)

    def fsync_dir(self, path):
        self.step("fsync_dir", path)
        super().fsync_dir(path)


class FaultFile(File):
    def __init__(self, fs: FaultFS, path: str, fd: int) -> None:
        super().__init__(path, fd)
        self.fs = fs

    def pwrite(self, data, offset):
        self.fs.step("pwrite", self.path)
        super().pwrite(data, offset)

    def pwritev(self, buffers, offset):
        self.pwrite(b"".join(buffers), offset)

    def sync(self, *, full=False):
        self.fs.step("sync", self.path)
        super().sync(full=full)

    def truncate(self, size):
        self.fs.step("truncate", self.path)
        super().truncate(size)


def _committed_dirs(parent) -> list[str]:
    return sorted(n for n in os.listdir(parent) if snapshot.parse_snapshot_dir_name(n) is not None)


def _all_committed_are_whole(parent) -> None:
    """Every snap-<lsn> name in parent is a complete, fully verifiable snapshot."""
    for name in _committed_dirs(parent):
        snapshot.open(os.path.join(parent, name)).verify()


def test_write_protocol_order(tmp_path):
    fs = FaultFS()
    info = snapshot.write(tmp_path, 9, NEW, fs=fs, **KW)
    ops = fs.ops
    final = info.path
    (rename_i,) = [i for i, op in enumerate(ops) if op[0] == "rename"]
    tmp = ops[rename_i][1]
    assert ops[rename_i][2] == final and os.path.basename(tmp).startswith("snap-00000000000000000009.tmp-")
    assert ops[rename_i + 1:] == [("fsync_dir", str(tmp_path))], "parent fsynced right after the commit rename"
    assert ops[:3] == [("makedirs", str(tmp_path)), ("mkdir", tmp), ("fsync_dir", str(tmp_path))]
    manifest = os.path.join(tmp, "MANIFEST")
    m_open = ops.index(("open", manifest))
    chunks = [op[1] for op in ops if op[0] == "open" and op[1] != manifest]
    assert len(chunks) == info.chunks >= 3
    for c in chunks:
        assert ops.index(("sync", c)) < m_open, f"{c} fsynced before the manifest is written"
    last_chunk_sync = max(ops.index(("sync", c)) for c in chunks)
    assert ("fsync_dir", tmp) in ops[last_chunk_sync:m_open], "chunk names durable before the manifest"
    m_sync = ops.index(("sync", manifest))
    assert ("fsync_dir", tmp) in ops[m_sync:rename_i], "manifest name durable before the commit"
    assert not any(op[0] in ("unlink", "rmdir") for op in ops)


def _template(tmp_path, name, build) -> callable:
    """Build a starting directory once (real fsyncs); each case gets a copy."""
    src = tmp_path / f"template-{name}"
    build(src)

    def make(dst):
        shutil.copytree(src, dst)
        return dst

    return make


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "fail-once"])
def test_write_interrupted_at_every_operation(tmp_path, crash):
    make = _template(tmp_path, "old", lambda p: snapshot.write(p, 5, OLD, **KW))
    ref = FaultFS()
    snapshot.write(make(tmp_path / "ref"), 9, NEW, fs=ref, **KW)
    total = len(ref.ops)
    assert total > 15
    for n in range(total):
        parent = make(tmp_path / f"p{n}")
        (old,) = snapshot.list_snapshots(parent)
        fs = FaultFS(n, crash=crash)
        with pytest.raises(SnapshotError, match="injected fault"):
            snapshot.write(parent, 9, NEW, fs=fs, **KW)
        committed = any(op[0] == "rename" for op in fs.ops)
        listed = snapshot.list_snapshots(parent)
        if committed:  # only the parent's fsync after the rename failed: complete, whole
            assert n == total - 1
            assert [i.lsn for i in listed] == [5, 9]
            assert list(snapshot.open(listed[1].path)) == NEW
        else:
            assert listed == [old], f"interrupted at operation {n}"
            assert not os.path.exists(parent / "snap-00000000000000000009")
        _all_committed_are_whole(parent)
        assert snapshot.newest(parent).lsn == (9 if committed else 5)
        if not crash:  # the writer cleaned up after itself
            assert sorted(os.listdir(parent)) == _committed_dirs(parent)
        snapshot.cleanup_incomplete(parent)
        assert sorted(os.listdir(parent)) == _committed_dirs(parent)
        # And a retry works.
        assert snapshot.write(parent, 9, NEW, exist_ok=True, **KW).count == len(NEW)
        assert list(snapshot.newest(parent)) == NEW


def test_replacing_a_broken_snapshot_interrupted_at_every_operation(tmp_path):
    def build(parent):
        snapshot.write(parent, 5, OLD, **KW)
        broken = snapshot.write(parent, 9, OLD, **KW)
        os.unlink(os.path.join(broken.path, "chunk-000001.wkc"))

    make = _template(tmp_path, "broken", build)
    fs = FaultFS()
    snapshot.write(make(tmp_path / "ref"), 9, NEW, fs=fs, **KW)
    for n in range(len(fs.ops)):
        parent = make(tmp_path / f"p{n}")
        with pytest.raises(SnapshotError):
            snapshot.write(parent, 9, NEW, fs=FaultFS(n), **KW)
        listed = [i.lsn for i in snapshot.list_snapshots(parent)]
        assert listed in ([5], [5, 9])
        if listed == [5, 9]:
            assert list(snapshot.open(parent / "snap-00000000000000000009")) == NEW
        snapshot.cleanup_incomplete(parent)
        assert snapshot.write(parent, 9, NEW, exist_ok=True, **KW).count == len(NEW)
        assert list(snapshot.newest(parent)) == NEW


def test_prune_interrupted_at_every_operation(tmp_path):
    lsns = [1, 2, 3, 4, 5]

    def build(parent):
        for lsn in lsns:
            snapshot.write(parent, lsn, OLD[: 100 + lsn], **KW)

    make = _template(tmp_path, "five", build)
    fs = FaultFS()
    snapshot.prune(make(tmp_path / "ref"), keep=2, fs=fs)
    assert len(fs.ops) > 10
    for n in range(len(fs.ops)):
        parent = make(tmp_path / f"p{n}")
        with pytest.raises(SnapshotError):
            snapshot.prune(parent, keep=2, fs=FaultFS(n))
        listed = [i.lsn for i in snapshot.list_snapshots(parent)]
        assert listed[-2:] == [4, 5] and listed == sorted(set(listed) & set(lsns))
        _all_committed_are_whole(parent)  # never a half-deleted snapshot under a valid name
        snapshot.prune(parent, keep=2)
        assert sorted(os.listdir(parent)) == ["snap-00000000000000000004", "snap-00000000000000000005"]


def test_cleanup_interrupted_is_resumable(tmp_path):
    def build(parent):
        snapshot.write(parent, 1, OLD, **KW)
        for lsn in (2, 3):
            with pytest.raises(SnapshotError):
                snapshot.write(parent, lsn, NEW, fs=FaultFS(12), **KW)

    make = _template(tmp_path, "leftovers", build)
    fs = FaultFS()
    assert len(snapshot.cleanup_incomplete(make(tmp_path / "ref"), fs=fs)) == 2
    for n in range(len(fs.ops)):
        parent = make(tmp_path / f"p{n}")
        with pytest.raises(SnapshotError):
            snapshot.cleanup_incomplete(parent, fs=FaultFS(n))
        assert [i.lsn for i in snapshot.list_snapshots(parent)] == [1]
        snapshot.cleanup_incomplete(parent)
        assert os.listdir(parent) == ["snap-00000000000000000001"]


_WRITER = r"""
import sys, snapshot
parent = sys.argv[1]
pairs = [(b"k%07d" % i, b"v" * 100) for i in range(20000)]
lsn = 1
while True:
    snapshot.write(parent, lsn, pairs, chunk_bytes=256 << 10, record_bytes=8 << 10)
    print(lsn, flush=True)
    snapshot.prune(parent, keep=2)
    lsn += 1
"""


@pytest.mark.crash
def test_sigkill_during_writes_and_prunes(tmp_path):
    rng = random.Random(1234)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for run in range(3):
        parent = tmp_path / f"snaps{run}"
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(parent)], env=env,
                             stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.3, 1.0))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        assert p.returncode == -signal.SIGKILL
        acknowledged = [int(x) for x in out.split()]
        if not os.path.exists(parent):
            continue
        _all_committed_are_whole(parent)
        listed = [i.lsn for i in snapshot.list_snapshots(parent)]
        if acknowledged:
            assert acknowledged[-1] in listed  # a returned write survives (prune keeps it)
        snapshot.cleanup_incomplete(parent)
        assert sorted(os.listdir(parent)) == _committed_dirs(parent)
