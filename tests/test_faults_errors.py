"""Error paths: failed writes, fsyncs, renames and unlinks, and a full disk.

The rules (DESIGN.md section 3, wal/log.py): after a failed fsync or write (a
full disk included) the log refuses every further append with
:class:`LogFailedError` (retrying an fsync and trusting the data is wrong),
nothing acknowledged is lost, the message says what happened and what to do,
and once the cause is gone (space freed) the log reopens cleanly. Only
walkv's own errors reach the caller.

Besides targeted tests, an *error-point explorer* fails the n-th ``write``,
``sync``, ``truncate``, ``rename``, ``unlink``, ``fsync_dir`` and ``open``
of a log workload (once, and persistently), for every n, and checks the
rules above after a power loss.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import threading

import pytest

import kvstore
import kvstore.store.recovery
import wal
from tests.faultfs import FaultFS, close_quietly, scratch_dir
from tests.test_crashpoints import SEGMENT_BYTES, LogOracle, check_log
from wal.errors import LogFailedError, WalkvError

FAILABLE = ("write", "sync", "truncate", "rename", "unlink", "fsync_dir", "open")


@pytest.fixture
def scratch(tmp_path):
    with scratch_dir(tmp_path) as d:
        yield d




def _payload(i: int, size: int = 100) -> bytes:
    return (f"entry-{i}-".encode() * (size // 8 + 1))[:size]


def _open(d: str, fs: FaultFS, **kw) -> wal.Log:
    os.makedirs(d, exist_ok=True)
    return wal.open(d, fs=fs, segment_bytes=SEGMENT_BYTES, **kw)


# -- the log: fsync failure ------------------------------------------------------------


def test_failed_fsync_fails_the_log_and_loses_nothing_acknowledged(scratch):
    d = os.path.join(scratch, "log")
    fs = FaultFS()
    log = _open(d, fs)
    acked = [log.append(_payload(i)) for i in range(10)]
    fs.fail("sync")
    with pytest.raises(LogFailedError) as e:
        log.append(b"never acknowledged")
    msg = str(e.value)
    assert d in msg and "refuses every further append" in msg and "LSN 11" in msg
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EIO
    # Refused from now on, even though the fault was one-off: never retry an fsync.
    for _ in range(3):
        with pytest.raises(LogFailedError):
            log.append(b"x")
    with pytest.raises(LogFailedError):
        log.append_batch([b"x", b"y"])
    with pytest.raises(LogFailedError):
        log.sync()
    # Reads of what was acknowledged still work.
    assert [lsn for lsn, _ in log.read()] == acked
    log.close()
    fs.power_loss()
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as again:
        got = list(again.read())
        assert [p for _, p in got[:10]] == [_payload(i) for i in range(10)]
        assert again.last_lsn in (10, 11)
        assert again.append(b"next") == again.last_lsn


def test_failed_fsync_fails_waiting_appenders_and_callbacks(scratch):
    """Appenders queued behind a failed group, and append_nowait callbacks,
    all get LogFailedError; none is told its entry is durable."""
    d = os.path.join(scratch, "log")
    fs = FaultFS()
    log = _open(d, fs)
    log.append(b"first")
    fs.fail("sync", persistent=True)
    results: list[BaseException | int] = []
    callbacks: list[tuple[int, BaseException | None]] = []
    lock = threading.Lock()
    submitted = refused = 0

    def cb(lsn, err):
        with lock:
            callbacks.append((lsn, err))

    for i in range(5):
        try:
            log.append_nowait(b"nowait %d" % i, cb)
            submitted += 1
        except LogFailedError:  # the log already failed: refused at once, also fine
            refused += 1
    assert submitted >= 1

    def appender(i: int) -> None:
        try:
            results.append(log.append(b"thread %d" % i))
        except BaseException as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=appender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for _ in range(1000):
        if len(callbacks) == submitted:
            break
        threading.Event().wait(0.01)
    assert len(callbacks) == submitted, (callbacks, submitted)
    assert all(isinstance(r, LogFailedError) for r in results), results
    assert all(isinstance(err, LogFailedError) for _, err in callbacks), callbacks
    log.close()
    fs.power_loss()
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as again:
        assert list(again.read()) == [(1, b"first")]


# -- the log: a full disk ---------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, 1, 100, 3000, 33000, 70000])
def test_full_disk_fails_the_log_then_reopens_once_space_is_back(scratch, budget):
    """ENOSPC at any point of the appends (in a record, in the zeros ahead of
    the tail, in a segment roll): LogFailedError saying the disk is full;
    every acknowledged entry survives a power loss; with space back the log
    reopens and appends."""
    d = os.path.join(scratch, "log")
    fs = FaultFS()
    log = _open(d, fs)
    fs.space_left = budget
    acked: dict[int, bytes] = {}
    error = None
    for i in range(300):
        p = _payload(i, 40000 if i % 17 == 5 else 300)
        try:
            acked[log.append(p)] = p
        except WalkvError as e:
            error = e
            break
    assert isinstance(error, LogFailedError), error
    assert "disk is full" in str(error) and "freeing space" in str(error)
    with pytest.raises(LogFailedError):
        log.append(b"still full")
    close_quietly(log)
    fs.power_loss()
    # Space is back: reopen with the real file system.
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as again:
        got = dict(again.read())
        assert {k: got.get(k) for k in acked} == acked
        assert again.last_lsn <= max(acked, default=0) + 1
        lsn = again.append(b"space is back")
        assert list(again.read(lsn)) == [(lsn, b"space is back")]
    assert wal.verify(d) == []


def test_full_disk_during_open_is_a_clear_error(scratch):
    """A new log needs a segment: with no space, open fails with walkv's
    error (not a traceback from deep inside) and leaves nothing half-made
    that stops a later open."""
    d = os.path.join(scratch, "log")
    os.makedirs(d)
    fs = FaultFS()
    fs.space_left = 10
    try:
        with pytest.raises(WalkvError, match="full|space"):
            wal.open(d, fs=fs, segment_bytes=SEGMENT_BYTES)
    finally:
        fs.power_loss()
        with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
            assert log.append(b"ok") == 1


# -- the error-point explorer ---------------------------------------------------------------------


def _log_workload(fs: FaultFS, d: str, oracle: LogOracle, errors: list[tuple[str, BaseException]]) -> None:
    """Appends with rolls, a batch, a truncate_before and a reopen. Every
    error must be walkv's; after an append failed, appends are refused."""
    rnd = random.Random(1)
    try:
        log = _open(d, fs)
    except BaseException as e:  # noqa: BLE001
        errors.append(("open", e))
        return
    failed = False
    try:
        for i in range(40):
            what = "append"
            try:
                if i == 20:
                    what = "truncate_before"
                    target = max(1, oracle.acked - 3)
                    oracle.truncate_before = max(oracle.truncate_before, target)
                    log.truncate_before(target)
                elif i == 30:
                    what = "reopen"
                    log.close()
                    log = _open(d, fs)
                    failed = False
                elif i % 7 == 3:
                    ps = [_payload(i * 10 + j, rnd.randint(0, 500)) for j in range(3)]
                    first = log.last_lsn + 1
                    for j, p in enumerate(ps):
                        oracle.model[first + j] = p
                    oracle.acked = log.append_batch(ps)[1]
                    assert not failed, "an append succeeded after the log failed"
                else:
                    p = _payload(i, rnd.choice([10, 300, 1500, 40000]))
                    oracle.model[log.last_lsn + 1] = p
                    oracle.acked = log.append(p)
                    assert not failed, "an append succeeded after the log failed"
            except AssertionError:
                raise
            except BaseException as e:  # noqa: BLE001
                errors.append((what, e))
                if what == "append":
                    assert isinstance(e, LogFailedError), f"append raised {e!r}, not LogFailedError"
                    failed = True
                if what == "reopen":
                    return  # the log could not be opened: nothing to close
        try:
            log.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(("close", e))
    finally:
        close_quietly(log)


def _explore_errors(base: str, persistent: bool, ops: tuple[str, ...] = FAILABLE) -> tuple[int, list[str]]:
    dry = FaultFS()
    _log_workload(dry, os.path.join(base, "dry"), LogOracle(), [])
    counts = dict(dry.counts)
    shutil.rmtree(os.path.join(base, "dry"))
    points = 0
    escaped: list[str] = []
    for op in ops:
        n = counts[op]
        step = 1 if n <= 60 else n // 60 + 1
        for nth in range(1, n + 1, step):
            d = os.path.join(base, f"{op}-{nth}")
            fs = FaultFS()
            fs.fail(op, nth, persistent=persistent)
            oracle = LogOracle()
            errors: list[tuple[str, BaseException]] = []
            _log_workload(fs, d, oracle, errors)
            for what, e in errors:
                if not isinstance(e, WalkvError):
                    escaped.append(f"{op} #{nth} failing: {what} raised {type(e).__name__}: {e}")
            fs.crash()
            fs.power_loss()
            check_log(d, oracle, f"{op} #{nth} failing ({'persistent' if persistent else 'once'})")
            shutil.rmtree(d)
            points += 1
    return points, escaped


POINTS = [pytest.param(op, p, id=f"{op}-{'persistent' if p else 'once'}")
          for op in FAILABLE for p in (False, True)]
_explored: dict[str, int] = {}


@pytest.mark.parametrize("op,persistent", POINTS)
def test_error_points_lose_nothing_acknowledged(scratch, op, persistent, capsys):
    """Fail the n-th ``op`` of the workload, for each n in turn (once, or
    from then on): after a power loss every acknowledged append is there and
    the log is a prefix of what was attempted."""
    points, _escaped = _explore_errors(scratch, persistent, (op,))
    _explored[f"{op}-{persistent}"] = points
    with capsys.disabled():
        print(f"\nlog error points explored ({op}, {'persistent' if persistent else 'once'}): {points} "
              f"(total so far {sum(_explored.values())})")
    assert points >= 2


def test_reopen_after_failed_roll_makes_the_new_segment_durable(scratch):
    d = os.path.join(scratch, "log")
    fs = FaultFS()
    log = _open(d, fs)
    fs.fail("fsync_dir")  # the roll's directory fsync
    with pytest.raises(LogFailedError):
        for i in range(100):
            log.append(_payload(i, 300))
    acked = log.durable_lsn
    log.close()
    log = _open(d, fs)  # same boot, the fault is gone
    lsn = log.append(b"acknowledged after the reopen")
    fs.crash()
    close_quietly(log)
    fs.power_loss()
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as again:
        assert again.last_lsn >= lsn > acked
        assert list(again.read(lsn)) == [(lsn, b"acknowledged after the reopen")]


def test_error_points_raise_only_walkv_errors(scratch):
    """Every error the workload meets is walkv's (a sample of the error points:
    writes cover open, roll and close; unlinks cover truncate_before and recovery)."""
    _points, escaped = _explore_errors(scratch, persistent=False, ops=("write", "unlink"))
    assert not escaped, "\n".join(escaped[:10])


# -- the store ----------------------------------------------------------------------------------------


STORE_OPTIONS = {"segment_bytes": SEGMENT_BYTES, "map_size": 1 << 20}


def _store(path: str, fs: FaultFS | None = None):
    for sub in ("wal", "lmdb"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    return kvstore.open(path, fs=fs, **STORE_OPTIONS)


def test_store_fsync_failure_refuses_writes_keeps_reads(scratch, reboot):
    path = os.path.join(scratch, "store")
    fs = FaultFS()
    db = _store(path, fs)
    for i in range(20):
        db.put(b"k%02d" % i, b"v%d" % i)
    fs.fail("sync")
    with pytest.raises(LogFailedError) as e:
        db.put(b"lost", b"maybe")
    assert "refuses every further append" in str(e.value)
    with pytest.raises(LogFailedError):
        db.delete(b"k00")
    with pytest.raises(LogFailedError):
        with db.batch() as b:
            b.put(b"a", b"b")
    assert db.get(b"k05") == b"v5" and db.get(b"lost") is None
    close_quietly(db)
    fs.power_loss()
    reboot()
    with kvstore.open(path, **STORE_OPTIONS) as db:
        for i in range(20):
            assert db.get(b"k%02d" % i) == b"v%d" % i
        db.put(b"after", b"ok")
    with kvstore.open(path, **STORE_OPTIONS) as db:
        assert db.get(b"after") == b"ok"


def test_store_full_disk_then_space_back(scratch, reboot):
    path = os.path.join(scratch, "store")
    fs = FaultFS()
    db = _store(path, fs)
    fs.space_left = 50_000
    acked = {}
    with pytest.raises(LogFailedError) as e:
        for i in range(10_000):
            k, v = b"key%05d" % (i % 50), os.urandom(300)
            db.put(k, v)
            acked[k] = v
    assert "disk is full" in str(e.value)
    close_quietly(db)
    fs.power_loss()
    reboot()
    with kvstore.open(path, **STORE_OPTIONS) as db:
        assert dict(db.scan()) == acked
        db.put(b"space", b"back")


def test_store_snapshot_failure_leaves_no_half_snapshot(scratch, reboot):
    """A snapshot whose writing fails (EIO on an fsync, ENOSPC) raises a walkv
    error, leaves no snapshot a reader would use, does not fail the log, and
    deletes no log segment."""
    import snapshot

    for fault, nth in (("sync", 2), ("enospc", 0), ("rename", 1), ("fsync_dir", 2), ("write", 3)):
        path = os.path.join(scratch, f"store-{fault}")
        fs = FaultFS()
        db = _store(path, fs)
        for i in range(200):
            db.put(b"k%03d" % i, os.urandom(100))
        first_before = db._log.first_lsn
        if fault == "enospc":
            fs.space_left = 5000
        else:
            fs.fail(fault, nth)
        with pytest.raises(WalkvError):
            db.snapshot(chunk_bytes=4096)
        fs.clear_faults()
        assert snapshot.list_snapshots(os.path.join(path, "snapshots")) == [], fault
        assert db._log.first_lsn == first_before
        lsn = db.put(b"after", b"snapshot failure")  # the log is not failed
        db.close()
        with kvstore.open(path, **STORE_OPTIONS) as again:
            assert again.last_lsn == lsn and len(again) == 201
            info = again.snapshot(chunk_bytes=4096)  # and a later snapshot works
            assert snapshot.open(info.path).verify() is None


def test_store_open_failing_after_the_lock_leaks_nothing(scratch):
    """An open that fails after taking the lock (here: removing a leftover
    snapshot.tmp- directory fails) releases the log, LMDB and the lock, so
    the next open in the same process works. (Found by the store crash
    explorer as LockedError after a crash during recovery; fixed in kvstore.)"""
    path = os.path.join(scratch, "store")
    with _store(path) as db:
        db.put(b"k", b"v")
    leftover = os.path.join(path, "snapshots", "snap-00000000000000000001.tmp-0123abcd")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "chunk-000000.wkc"), "wb") as f:
        f.write(b"half a snapshot")
    fs = FaultFS()
    fs.fail("rmdir")  # removing the leftover fails once (nothing else rmdirs at open)
    with pytest.raises(WalkvError):
        kvstore.open(path, fs=fs, **STORE_OPTIONS)
    with kvstore.open(path, **STORE_OPTIONS) as db:  # same process: nothing may still hold the store
        assert db.get(b"k") == b"v"
