"""A bulk group's LMDB write overlapped with its log write and fsync
(wal/log_writer.py's ``on_stage``, :class:`kvstore.state.staged.StagedApply`):
it runs while they do, is visible only once the fsync returned, and a failed
or killed fsync leaves LMDB without the group; a reopen replays it when the
log has it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import kvstore
from kvstore.state.machine import DIRECT_OPS
from tests.faultfs import FaultFS, close_quietly, scratch_dir
from tests.test_crash_kill import log_model
from wal.errors import LogFailedError
from wal.fs import File, FileSystem

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "staged_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BULK = DIRECT_OPS + 100  # operations in a batch that is staged


def bulk(db: kvstore.KVStore, tag: bytes, n: int = BULK) -> int:
    with db.batch() as b:
        for i in range(n):
            b.put(b"%s%06d" % (tag, i), b"%s-value-%d" % (tag, i))
    assert b.lsn is not None
    return b.lsn


class _SeenFile(File):
    def __init__(self, path: str, fd: int, on_sync) -> None:
        super().__init__(path, fd)
        self.on_sync = on_sync

    def sync(self, *, full: bool = False) -> None:
        super().sync(full=full)
        if self.path.endswith(".wal"):
            self.on_sync()


class SeenFS(FileSystem):
    """The real file system; ``on_sync()`` runs after each fsync of a log segment."""

    def __init__(self, on_sync) -> None:
        self.on_sync = on_sync

    def open(self, path: str, *, create: bool = False, exclusive: bool = False, readonly: bool = False) -> File:
        f = super().open(path, create=create, exclusive=exclusive, readonly=readonly)
        return _SeenFile(f.path, f.fd, self.on_sync)


def test_a_bulk_group_is_written_to_lmdb_while_it_syncs_and_shown_after(tmp_path) -> None:
    """The write and fsync of a bulk batch run on a helper thread (the caller
    writes LMDB meanwhile), and a read during the fsync sees none of the batch; a single
    put syncs on the caller's thread, as before."""
    seen: list[tuple[str, bytes | None, bytes | None, int]] = []
    db: kvstore.KVStore | None = None

    def on_sync() -> None:
        if db is not None:
            state = db._state
            seen.append((threading.current_thread().name, db.get(b"a000000"), db.get(b"small"),
                         state.commits.applied_lsn))

    db = kvstore.open(str(tmp_path / "s"), fs=SeenFS(on_sync))
    with db:
        seen.clear()
        small = db.put(b"small", b"1")  # into the overlay, frozen into the batch's transaction
        assert seen == [(threading.current_thread().name, None, None, 0)]
        seen.clear()
        lsn = bulk(db, b"a")
        assert lsn == small + 1
        (thread, during, small_during, lmdb_lsn_during), = seen
        assert thread == "walkv-write"
        assert during is None and small_during == b"1" and lmdb_lsn_during < lsn
        assert db.get(b"a000000") == b"a-value-0" and db.get(b"a%06d" % (BULK - 1)) is not None
        assert db._state.commits.applied_lsn == lsn == db.applied_lsn
        assert len(db._state.overlay) == 0  # the overlay went to LMDB with it
        assert db.get(b"small") == b"1"
    with kvstore.open(str(tmp_path / "s")) as db2:
        assert db2.replayed == 0 and db2.get(b"a000007") == b"a-value-7" and len(db2) == BULK + 1


@pytest.mark.parametrize("power_loss", [False, True], ids=["log-kept", "power-loss"])
def test_a_failed_fsync_leaves_lmdb_without_the_bulk_group(tmp_path, reboot, power_loss) -> None:
    """The fsync of a staged group fails: the batch raises, no read ever sees
    it, LMDB's applied LSN stays before it, the overlay's older writes stay
    readable; a reopen replays it if the log still has it (the write reached
    the file), and has none of it after a power loss."""
    with scratch_dir(tmp_path) as d:
        path = os.path.join(d, "store")
        fs = FaultFS()
        db = kvstore.open(path, fs=fs)
        first = bulk(db, b"a")
        db.put(b"b000001", b"from the overlay")  # the failed batch overwrites it
        fs.fail("sync")
        with pytest.raises(LogFailedError):
            bulk(db, b"b")
        state = db._state
        assert state.commits.applied_lsn == first and db.applied_lsn == first + 1
        assert db.get(b"b000000") is None and db.get(b"b%06d" % (BULK - 1)) is None
        assert db.get(b"b000001") == b"from the overlay"
        assert db.get(b"a000003") == b"a-value-3"
        with pytest.raises(LogFailedError):
            db.put(b"later", b"x")
        close_quietly(db)
        if power_loss:
            fs.power_loss()
            reboot()
        fs.clear_faults()
        model, last = log_model(path)
        with kvstore.open(path, fs=fs) as db:
            assert dict(db.scan()) == model
            assert db.last_lsn == last == (first + 1 if power_loss else first + 2)
            if power_loss:
                assert db.get(b"b000000") is None and db.get(b"b000001") == b"from the overlay"
            else:
                assert db.replayed >= 1
                assert db.get(b"b000000") == b"b-value-0" and db.get(b"b000001") == b"b-value-1"
            assert db.get(b"a%06d" % (BULK - 1)) is not None


def test_a_failed_write_of_a_bulk_group_leaves_lmdb_without_it(tmp_path) -> None:
    """The write of a bulk group (before or while it is staged) fails: the
    batch raises, LMDB never shows it, and a reopen has none of it."""
    with scratch_dir(tmp_path) as d:
        path = os.path.join(d, "store")
        fs = FaultFS()
        db = kvstore.open(path, fs=fs)
        first = bulk(db, b"a")
        fs.fail("write")
        with pytest.raises(LogFailedError):
            bulk(db, b"b")
        assert db._state.commits.applied_lsn == first
        assert db.get(b"b000000") is None and db.get(b"b%06d" % (BULK - 1)) is None
        assert db.get(b"a000003") == b"a-value-3"
        close_quietly(db)
        fs.clear_faults()
        with kvstore.open(path, fs=fs) as db:
            assert db.last_lsn == first and db.get(b"b000000") is None
            assert db.get(b"a%06d" % (BULK - 1)) is not None


def test_sync_modes_without_fsync_do_not_stage(tmp_path) -> None:
    """With no fsync per group there is nothing to overlap: a bulk batch is
    applied at once, and nothing syncs."""
    synced: list[str] = []
    with kvstore.open(str(tmp_path / "s"), sync="none",
                      fs=SeenFS(lambda: synced.append(threading.current_thread().name))) as db:
        synced.clear()
        lsn = bulk(db, b"a")
        assert synced == [] and db.get(b"a000001") == b"a-value-1" and db._state.commits.applied_lsn == lsn


def test_sigkill_while_a_staged_group_syncs_leaves_lmdb_a_prefix(tmp_path) -> None:
    """SIGKILL a writer whose bulk batch is staged in LMDB (its transaction
    written, not committed) while the batch's fsync has not returned: LMDB as
    the dead process left it is the log without that batch, and the reopen
    replays it from the log (the write reached the file)."""
    store = str(tmp_path / "store")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, CHILD, store, str(BULK)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT, env=env)  # this tree's walkv
    lines = []
    for line in child.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line == b"staged\n":
            break
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    assert lines[-1:] == [b"staged\n"], (lines, out, err.decode(errors="replace"))
    acked = [int(x.split()[1]) for x in lines if x.startswith(b"acked ")]
    assert len(acked) == 2
    with kvstore.open(store, readonly=True) as ro:  # nothing replayed: LMDB as it was left
        assert ro.applied_lsn == acked[-1]
        left = dict(ro.scan())
    prefix, last = log_model(store, acked[-1])
    assert left == prefix and b"c000000" not in left
    model, last = log_model(store)
    assert last == acked[-1] + 1  # the staged batch is in the log
    with kvstore.open(store) as db:
        assert db.replayed == 1 and db.last_lsn == db.applied_lsn == last
        assert dict(db.scan()) == model and db.get(b"c%06d" % (BULK - 1)) is not None
