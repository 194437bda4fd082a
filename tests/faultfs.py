"""A fault-injecting :class:`wal.fs.FileSystem` for tests (LevelDB's
FaultInjectionTestEnv, SQLite's test VFS).

It does every operation on the real files, and remembers what a power loss
would take back:

* per file, every write and truncate since the file's last ``sync`` (an undo
  log of pre-images, so restoring costs what was written, not the file size);
* every name change (create, rename, unlink, mkdir, rmdir) since the last
  ``fsync_dir`` of the directories it touched. A name change is durable once
  *every* directory it touched was fsynced after it (a rename across two
  directories needs both).

Faults it can produce:

* :meth:`FaultFS.power_loss` puts the disk back to its durable state: every
  unsynced write is undone and every name change not covered by a directory
  fsync is reverted. Options keep a torn part of the last unsynced write
  (``tear_bytes`` = a prefix of any length, ``tear_sectors`` = any subset of its
  512-byte sectors; the other unsynced writes are dropped), any version of
  every sector touched since the last sync (``rng``: disks reorder writes),
  or a prefix of the pending name changes (``keep_dir_ops``: a journaling
  file system commits them in order).
* :meth:`FaultFS.crash_at` makes the machine "lose power" just before (or
  after) the k-th durability boundary (sync, fsync_dir, rename, unlink,
  rmdir): that operation raises :class:`SimulatedCrash` and so does every
  later one (the machine is off; nothing more reaches the disk). The test then
  closes what it had open and calls :meth:`power_loss`.
* :meth:`FaultFS.fail` makes the n-th ``write``/``sync``/``rename``/... raise
  ``OSError`` (``EIO`` by default) once, or from then on (``persistent``). A
  failed sync makes nothing durable.
* :attr:`FaultFS.space_left` (bytes): a write past the budget writes what fits
  and raises ``OSError(ENOSPC)``. ``None`` means unlimited.

Files and directories written outside this object (LMDB, ``LOCK``,
``DURABLE``) are not tracked and survive a power loss as they are. Files that
existed before the fault layer first touched them count as durable.

Operation counts (``fs.counts``) let a test do a dry run, count the
boundaries, then crash at each one in turn (see tests/test_crashpoints.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from wal.fs import File, FileSystem

SECTOR = 512
BOUNDARY_OPS = ("sync", "fsync_dir", "rename", "unlink", "rmdir")
"""The operations at which a crash point is taken: every one that makes
something durable or changes a name."""
OPS = ("open", "write", "sync", "truncate", "rename", "unlink", "makedirs", "rmdir", "fsync_dir")


class SimulatedCrash(BaseException):
    """The machine lost power. A BaseException so that no ``except Exception``
    in the code under test can swallow it and go on writing."""


@dataclass
class _Undo:
    seq: int
    offset: int
    old: bytes          # the bytes at [offset, offset+len(old)) before (short when past the end)
    old_size: int       # the file size before
    new: bytes | None   # the bytes written (None for a truncate)


@dataclass(eq=False)
class _Node:
    """One file (an inode): its current path and its unsynced changes."""

    path: str | None
    undo: list[_Undo] = field(default_factory=list)


@dataclass(eq=False)  # ops are compared by identity
class _Op:
    """One name change not yet durable."""

    kind: str                 # create | unlink | rename | mkdir | rmdir
    path: str                 # create/unlink/mkdir/rmdir: the path; rename: the source
    dst: str | None = None    # rename: the destination
    node: _Node | None = None
    saved: bytes | None = None            # unlink: the content; rename: the replaced file's content
    replaced: _Node | None = None         # rename: the node it replaced
    replaced_dir: bool = False            # rename replaced an empty directory
    is_dir: bool = False                  # rename of a directory
    dirs: set[tuple[int, int]] = field(default_factory=set)  # directories still to fsync


@dataclass
class _Rule:
    op: str
    nth: int                 # 1-based, counted from when the rule was set
    persistent: bool
    err: int
    seen: int = 0


def _norm(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def _dir_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _rebase(path: str, src: str, dst: str) -> str:
    return dst + path[len(src):]


class FaultFile(File):
    """A file opened through :class:`FaultFS`: every change is recorded."""

    def __init__(self, fs: "FaultFS", path: str, fd: int, node: _Node | None) -> None:
        super().__init__(path, fd)
        self._fs = fs
        self._node = node
        self._gen = fs._gen

    def _alive(self) -> None:
        if self._gen != self._fs._gen:
            raise SimulatedCrash(f"{self.path}: file handle from before a power loss")
        self._fs._check_alive()

    def pwrite(self, data: bytes, offset: int) -> None:
        self._alive()
        self._fs._op("write")
        data = bytes(data)
        fs = self._fs
        err = None
        if fs.space_left is not None and len(data) > fs.space_left:
            data = data[: fs.space_left]
            err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        if data:
            self._record(offset, len(data), data)
            super().pwrite(data, offset)
            if fs.space_left is not None:
                fs.space_left -= len(data)
            fs.bytes_written += len(data)
        if err is not None:
            raise err

    def pwritev(self, buffers, offset: int) -> None:
        self.pwrite(b"".join(buffers), offset)  # one recorded write, faults as for pwrite

    def preallocate(self, offset: int, length: int) -> None:
        self.write_zeros(offset, length)  # recorded writes: power loss undoes the growth, ENOSPC as for pwrite

    def _record(self, offset: int, length: int, new: bytes | None) -> None:
        if self._node is None:
            return
        size = os.fstat(self.fd).st_size
        old = os.pread(self.fd, length, offset) if offset < size else b""
        self._node.undo.append(_Undo(self._fs._next_seq(), offset, old, size, new))

    def pread(self, size: int, offset: int) -> bytes:
        self._alive()
        return super().pread(size, offset)

    def sync(self, *, full: bool = False) -> None:
        self._alive()
        self._fs._op("sync")
        if self._fs.real_sync:
            super().sync(full=full)
        if self._node is not None:
            self._node.undo.clear()
        self._fs._done()

    def size(self) -> int:
        self._alive()
        return super().size()

    def truncate(self, size: int) -> None:
        self._alive()
        self._fs._op("truncate")
        cur = os.fstat(self.fd).st_size
        if size < cur:
            self._record(size, cur - size, None)
        elif size > cur and self._node is not None:
            self._node.undo.append(_Undo(self._fs._next_seq(), cur, b"", cur, None))
        super().truncate(size)

    def close(self) -> None:
        super().close()  # always allowed: the process releases its descriptors


class FaultFS(FileSystem):
    """See the module docstring."""

    def __init__(self, *, real_sync: bool = False) -> None:
        self.real_sync = real_sync  # the durability model is simulated; real fsyncs only cost time
        self.space_left: int | None = None
        self.bytes_written = 0
        self.counts: dict[str, int] = {op: 0 for op in OPS}
        self.boundaries = 0          # BOUNDARY_OPS seen (the crash-point clock)
        self.crashed = False
        self.log: list[tuple[str, str]] | None = None  # (op, path) of boundaries, when set to a list
        self._gen = 0
        self._seq = 0
        self._nodes: dict[str, _Node] = {}
        self._ops: list[_Op] = []
        self._rules: list[_Rule] = []
        self._crash_at: int | None = None
        self._crash_after = False
        self._pending_crash = False

    # -- fault control ---------------------------------------------------------

    def fail(self, op: str, nth: int = 1, *, persistent: bool = False, err: int = errno.EIO) -> None:
        """Make the ``nth`` next ``op`` (counted from now) raise ``OSError(err)``;
        with ``persistent`` every one from then on too."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; one of {OPS}")
        self._rules.append(_Rule(op, nth, persistent, err))

    def clear_faults(self) -> None:
        self._rules.clear()
        self.space_left = None
        self._crash_at = None

    def crash_at(self, k: int, *, after: bool = False) -> None:
        """Lose power at the ``k``-th boundary op from now (1-based): just
        before it, or just after it with ``after``."""
        self._crash_at = self.boundaries + k
        self._crash_after = after

    def crash(self) -> None:
        """Lose power now: every later operation raises :class:`SimulatedCrash`."""
        self.crashed = True

    def _check_alive(self) -> None:
        if self.crashed:
            raise SimulatedCrash("the machine is off")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _op(self, op: str, path: str = "") -> None:
        """Count ``op``; raise an injected error or a crash when due."""
        self._check_alive()
        self.counts[op] += 1
        crash_now = False
        if op in BOUNDARY_OPS:
            self.boundaries += 1
            if self.log is not None:
                self.log.append((op, path))
            if self._crash_at is not None and self.boundaries == self._crash_at:
                if self._crash_after:
                    crash_now = True  # raised by _done() once the op is done
                else:
                    self.crashed = True
                    raise SimulatedCrash(f"power lost before {op} #{self.counts[op]} {path}")
        for rule in self._rules:
            if rule.op != op:
                continue
            rule.seen += 1
            if rule.seen == rule.nth or (rule.persistent and rule.seen > rule.nth):
                raise OSError(rule.err, f"injected {os.strerror(rule.err)} on {op} #{rule.seen}", path or None)
        self._pending_crash = crash_now

    def _done(self) -> None:
        if self._pending_crash:
            self._pending_crash = False
            self.crashed = True
            raise SimulatedCrash("power lost after the boundary op")

    # -- tracking helpers ------------------------------------------------------------

    def _node_for(self, path: str) -> _Node:
        key = _norm(path)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = _Node(key)
        return node

    def _record_op(self, op: _Op, dirs: Iterable[str]) -> None:
        op.dirs = {_dir_key(d) for d in dirs}
        self._ops.append(op)

    def _move_nodes(self, src: str, dst: str) -> None:
        moved = {}
        for key in list(self._nodes):
            if _under(key, src):
                node = self._nodes.pop(key)
                node.path = _rebase(key, src, dst)
                moved[node.path] = node
        self._nodes.update(moved)

    def _forget(self, path: str) -> None:
        for key in list(self._nodes):
            if _under(key, path):
                self._nodes.pop(key).path = None

    def _read_all(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    # -- FileSystem ---------------------------------------------------------------------

    def open(self, path: str, *, create: bool = False, exclusive: bool = False,
             readonly: bool = False) -> File:
        self._op("open", path)
        key = _norm(path)
        existed = os.path.exists(key)
        flags = os.O_RDONLY if readonly else os.O_RDWR
        if create:
            flags |= os.O_CREAT
        if exclusive:
            flags |= os.O_EXCL
        fd = os.open(path, flags | os.O_CLOEXEC, self.file_mode)
        if readonly:
            return FaultFile(self, path, fd, None)
        if existed:
            node = self._node_for(key)
        else:
            node = self._nodes[key] = _Node(key)
            self._record_op(_Op("create", key, node=node), [os.path.dirname(key)])
        return FaultFile(self, path, fd, node)

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", f"{src} -> {dst}")
        s, d = _norm(src), _norm(dst)
        is_dir = os.path.isdir(s)
        op = _Op("rename", s, dst=d, is_dir=is_dir)
        if os.path.lexists(d):
            if os.path.isdir(d):
                op.replaced_dir = True
            else:
                op.saved = self._read_all(d)
                op.replaced = self._node_for(d)
        os.replace(src, dst)
        if op.replaced is not None:
            self._nodes.pop(d, None)
            op.replaced.path = None
        if is_dir:
            self._move_nodes(s, d)
        else:
            op.node = self._node_for(s)
            self._nodes.pop(s, None)
            op.node.path = d
            self._nodes[d] = op.node
        self._record_op(op, [os.path.dirname(s), os.path.dirname(d)])
        self._done()

    def unlink(self, path: str) -> None:
        self._op("unlink", path)
        key = _norm(path)
        saved = self._read_all(key) if os.path.isfile(key) else None
        node = self._node_for(key)
        os.unlink(path)
        self._nodes.pop(key, None)
        node.path = None
        self._record_op(_Op("unlink", key, node=node, saved=saved), [os.path.dirname(key)])
        self._done()

    def mkdir(self, path: str) -> None:
        self._op("makedirs", path)  # the op a test fails or counts: creating directories
        key = _norm(path)
        os.mkdir(key, self.dir_mode)
        self._record_op(_Op("mkdir", key), [os.path.dirname(key)])

    def rmdir(self, path: str) -> None:
        self._op("rmdir", path)
        key = _norm(path)
        os.rmdir(path)
        self._record_op(_Op("rmdir", key), [os.path.dirname(key)])
        self._done()

    def listdir(self, path: str) -> list[str]:
        self._check_alive()
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        self._check_alive()
        return os.path.exists(path)

    def fsync_dir(self, path: str) -> None:
        self._op("fsync_dir", path)
        if self.real_sync:
            super().fsync_dir(path)
        key = _dir_key(path)
        for op in list(self._ops):
            op.dirs.discard(key)
            if not op.dirs and op in self._ops:  # (a durable rmdir may have taken it already)
                self._make_durable(op)
        self._done()

    def _make_durable(self, op: _Op) -> None:
        """``op`` survives a power loss: drop it from the journal. When it is a
        rename, earlier pending ops that name paths under its source now live
        under its destination."""
        if op.kind == "rmdir":
            # A durable rmdir means the directory was empty on disk: every
            # earlier change inside it is durable too (and can no longer be
            # covered by an fsync of the directory, which is gone).
            for earlier in list(self._ops[: self._ops.index(op)]):
                if earlier in self._ops and (
                        _under(earlier.path, op.path) or (earlier.dst is not None and _under(earlier.dst, op.path))):
                    self._make_durable(earlier)
        i = self._ops.index(op)
        del self._ops[i]
        if op.kind == "rename" and op.dst is not None:
            for earlier in self._ops[:i]:
                if _under(earlier.path, op.path):
                    earlier.path = _rebase(earlier.path, op.path, op.dst)
                if earlier.dst is not None and _under(earlier.dst, op.path):
                    earlier.dst = _rebase(earlier.dst, op.path, op.dst)

    # -- introspection -------------------------------------------------------------

    def unsynced_files(self) -> list[str]:
        return sorted(n.path for n in self._nodes.values() if n.undo and n.path)

    def pending_ops(self) -> list[tuple[str, str, str | None]]:
        return [(op.kind, op.path, op.dst) for op in self._ops]

    # -- power loss ------------------------------------------------------------------

    def power_loss(
        self,
        *,
        tear_bytes: int | None = None,
        tear_sectors: Iterable[int] | None = None,
        rng: random.Random | None = None,
        keep_dir_ops: int = 0,
    ) -> dict[str, int]:
        """Put the files back as a power loss would leave them; the file system
        is usable again afterwards (a reboot) and tracks afresh.

        * default: every write since its file's last sync is undone, and every
          name change not yet covered by directory fsyncs is reverted;
        * ``tear_bytes=n``: the first ``n`` bytes of the last unsynced write
          (over all files) reached the disk anyway;
        * ``tear_sectors={i, ...}``: those 512-byte sectors (counted from the
          sector holding the write's first byte) of the last unsynced write
          reached the disk;
        * ``rng``: each 512-byte sector touched by unsynced writes ends up,
          independently, as one random version from its history: as last
          synced, or as it was after one of the unsynced writes to it (disks
          write back sectors in any order);
        * ``keep_dir_ops=n``: the oldest ``n`` pending name changes persisted.

        Returns counts of what was undone (writes, name changes).
        """
        self.crashed = True  # handles opened before are dead from here on
        pending = self._ops
        keep_dir_ops = max(0, min(keep_dir_ops, len(pending)))
        for op in list(pending[:keep_dir_ops]):
            self._make_durable(op)
        undone_ops = list(self._ops)
        for op in reversed(undone_ops):
            self._undo_op(op)
        # Data: every node that still has a name goes back to its last sync.
        entries: list[tuple[_Undo, _Node]] = []
        nodes = {id(n): n for n in self._nodes.values()}
        for op in undone_ops:  # nodes given back their names by the undo above
            for n in (op.node, op.replaced):
                if n is not None and n.path is not None:
                    nodes[id(n)] = n
        for node in nodes.values():
            if node.path is None or not node.undo:
                continue
            fd = os.open(node.path, os.O_RDWR)
            try:
                for u in reversed(node.undo):
                    if u.old:
                        os.pwrite(fd, u.old, u.offset)
                    os.ftruncate(fd, u.old_size)
            finally:
                os.close(fd)
            entries.extend((u, node) for u in node.undo)
        writes = sorted((e for e in entries if e[0].new is not None), key=lambda e: e[0].seq)
        redo: list[tuple[_Node, int, bytes]] = []
        if rng is not None:
            # Each sector ends up as one version from its history: the durable
            # one, or as it was after some unsynced write to it (the page
            # cache writes back whole sectors with whatever they held then).
            history: dict[tuple[int, int], list[tuple[_Node, int, bytes]]] = {}
            for u, node in writes:
                for off, piece in _sectors(u.offset, u.new):
                    history.setdefault((id(node), off // SECTOR), []).append((node, off, piece))
            for key in sorted(history):
                versions = history[key]
                redo.extend(versions[: rng.randrange(len(versions) + 1)])
        if writes and (tear_bytes is not None or tear_sectors is not None):
            u, node = writes[-1]
            if tear_bytes is not None:
                redo.append((node, u.offset, u.new[: max(0, tear_bytes)]))
            if tear_sectors is not None:
                redo.extend((node, off, piece) for i, (off, piece) in enumerate(_sectors(u.offset, u.new))
                            if i in set(tear_sectors))
        for node, off, piece in redo:
            if piece and node.path is not None:
                fd = os.open(node.path, os.O_RDWR)
                try:
                    os.pwrite(fd, piece, off)
                finally:
                    os.close(fd)
        result = {"writes": len(writes), "name_changes": len(undone_ops), "torn_pieces": len(redo)}
        # A reboot: everything on disk now is durable; old handles are dead.
        self._gen += 1
        self._nodes = {}
        self._ops = []
        self._crash_at = None
        self._rules.clear()
        self.crashed = False
        return result

    def _undo_op(self, op: _Op) -> None:
        if op.kind == "create":
            if os.path.lexists(op.path):
                os.unlink(op.path)
            self._nodes.pop(op.path, None)
            if op.node is not None:
                op.node.path = None
        elif op.kind == "unlink":
            _write_new(op.path, op.saved or b"", self.file_mode)
            if op.node is not None:
                op.node.path = op.path
                self._nodes[op.path] = op.node
        elif op.kind == "rename":
            assert op.dst is not None
            os.rename(op.dst, op.path)
            if op.is_dir:
                self._move_nodes(op.dst, op.path)
            elif op.node is not None:
                self._nodes.pop(op.dst, None)
                op.node.path = op.path
                self._nodes[op.path] = op.node
            if op.replaced_dir:
                os.mkdir(op.dst, self.dir_mode)
            elif op.replaced is not None:
                _write_new(op.dst, op.saved or b"", self.file_mode)
                op.replaced.path = op.dst
                self._nodes[op.dst] = op.replaced
        elif op.kind == "mkdir":
            shutil.rmtree(op.path)
            self._forget(op.path)
        elif op.kind == "rmdir":
            os.mkdir(op.path, self.dir_mode)
        else:  # pragma: no cover
            raise AssertionError(op.kind)


def _write_new(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _sectors(offset: int, data: bytes) -> list[tuple[int, bytes]]:
    """Split a write at 512-byte sector boundaries of the file."""
    out = []
    pos = 0
    while pos < len(data):
        off = offset + pos
        n = min(len(data) - pos, SECTOR - off % SECTOR)
        out.append((off, data[pos : pos + n]))
        pos += n
    return out


def file_mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- crash-point exploration (tests/test_crashpoints*.py) ----------------------------------
#
# The method (SQLite's crash tests, ALICE's crash states): run a deterministic,
# single-threaded workload through FaultFS once and count its durability
# boundaries, n; then for each k in 1..n+1 run it again in a fresh directory,
# lose power at the k-th boundary (n+1: after the workload), put the disk back
# to its durable state (optionally with a torn or reordered write, or a prefix
# of the pending name changes), reopen with the real file system and check the
# recovered state against an oracle of what was acknowledged.

# Power-loss variants (see FaultFS.power_loss).
PLAIN = "plain"          # before the k-th boundary; every unsynced write and name change lost
TORN = "torn"            # after the k-th boundary; a torn prefix of the last write and a prefix of the name changes kept
REORDERED = "reordered"  # before the k-th boundary; each touched sector in a random version
VARIANTS = (PLAIN, TORN, REORDERED)


@dataclass
class Outcome:
    crashed: bool
    error: BaseException | None = None
    undone: dict[str, int] = field(default_factory=dict)


def run_to_crash(workload: Callable[[FaultFS], None], fs: FaultFS, k: int | None, variant: str,
                 rng: random.Random) -> Outcome:
    """Run ``workload`` losing power at boundary ``k`` (``None``: never, then
    lose power at the end); then simulate the power loss."""
    if k is not None:
        fs.crash_at(k, after=(variant == TORN))
    error: BaseException | None = None
    try:
        workload(fs)
    except (SimulatedCrash, Exception) as e:  # noqa: BLE001 - a crash shows as whatever the code made of it
        error = e
    crashed = fs.crashed
    if error is not None and not crashed:
        raise AssertionError(f"workload failed without a crash: {error!r}") from error
    fs.crash()
    if variant == TORN:
        pending = len(fs.pending_ops())
        undone = fs.power_loss(tear_bytes=rng.randrange(0, 1 << 16), keep_dir_ops=rng.randrange(pending + 1))
    elif variant == REORDERED:
        undone = fs.power_loss(rng=rng)
    else:
        undone = fs.power_loss()
    return Outcome(crashed, error, undone)


def count_boundaries(workload: Callable[[FaultFS], None]) -> int:
    fs = FaultFS()
    workload(fs)
    return fs.boundaries


def plan_points(n: int, *, budget: int | None, seed: int) -> list[tuple[int, str]]:
    """Crash points ``(k, variant)``: every k with the plain variant, and the
    torn and reordered variants at every k too when ``budget`` is None (soak),
    else at an evenly spread sample so that the total is about ``budget``."""
    points = [(k, PLAIN) for k in range(1, n + 2)]
    extra = [(k, v) for k in range(1, n + 2) for v in (TORN, REORDERED)]
    if budget is None:
        return points + extra
    room = max(0, budget - len(points))
    if room < len(extra):
        rnd = random.Random(seed)
        extra = sorted(rnd.sample(extra, room))
    return points + extra


def close_quietly(obj: object) -> None:
    """Close a log or store after the machine "lost power": the process only
    releases its descriptors and locks; every write fails."""
    try:
        obj.close()  # type: ignore[attr-defined]
    except (SimulatedCrash, Exception):  # noqa: BLE001
        pass


@contextlib.contextmanager
def scratch_dir(fallback: str | os.PathLike[str]) -> Iterator[str]:
    """A directory for crash-point runs. The durability model is simulated,
    so the files need not be on a real disk: on tmpfs (``/dev/shm``) each run
    costs a fifth. ``WALKV_CRASH_DIR=disk`` uses ``fallback`` (pytest's
    tmp_path) instead."""
    shm = "/dev/shm"
    if os.environ.get("WALKV_CRASH_DIR") != "disk" and os.path.isdir(shm) and os.access(shm, os.W_OK):
        d = tempfile.mkdtemp(prefix="walkv-crash-", dir=shm)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield os.fspath(fallback)
