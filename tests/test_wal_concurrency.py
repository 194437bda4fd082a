"""Group commit, non-blocking appends, the on_commit hook and I/O failures
(wal/log.py, wal/commit.py; DESIGN.md section 3).

Threads append for real with ``sync="always"`` (real fsyncs). Failures are
injected through the ``fs=`` seam: a :class:`wal.fs.FileSystem` subclass whose
files fail ``sync`` with EIO or ``pwrite`` with ENOSPC after a budget. After a
failure the log must refuse every append, and everything acknowledged before
must be there when the log is reopened with the normal file system.
"""

from __future__ import annotations

import errno
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import wal
from wal.errors import ClosedError, LogFailedError
from wal.fs import File, FileSystem
from wal.segment import list_segments


def pl(t: int, i: int, size: int | None = None) -> bytes:
    size = 20 + (t * 7 + i * 13) % 300 if size is None else size
    head = b"%03d:%06d:" % (t, i)
    return (head * (size // len(head) + 1))[: max(size, len(head))]


def read_all(log: wal.Log, **kw) -> list[tuple[int, bytes]]:
    return list(log.read(**kw))


def run_threads(n: int, target, *args) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(t: int) -> None:
        try:
            target(t, *args)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "a thread hung"
    return errors


# -- a fault-injecting file system ---------------------------------------------------


class FaultFS(FileSystem):
    """Real files; ``File.sync`` raises EIO once ``syncs_left`` reaches 0, and
    ``File.pwrite`` writes what fits in ``space_left`` bytes, then raises ENOSPC."""

    def __init__(self) -> None:
        self.syncs_left: int | None = None
        self.space_left: int | None = None
        self.sync_calls = 0
        self.lock = threading.Lock()

    def open(self, path: str, **kw) -> File:  # type: ignore[override]
        f = super().open(path, **kw)
        return _FaultFile(f.path, f.fd, self)


class _FaultFile(File):
    def __init__(self, path: str, fd: int, fs: FaultFS) -> None:
        super().__init__(path, fd)
        self._fs = fs

    def sync(self, *, full: bool = False) -> None:
        fs = self._fs
        with fs.lock:
            fs.sync_calls += 1
            if fs.syncs_left is not None:
                if fs.syncs_left <= 0:
                    raise OSError(errno.EIO, "injected fsync failure", self.path)
                fs.syncs_left -= 1
        super().sync(full=full)

    def pwritev(self, buffers, offset: int) -> None:
        self.pwrite(b"".join(buffers), offset)

    def pwrite(self, data: bytes, offset: int) -> None:
        fs = self._fs
        with fs.lock:
            if fs.space_left is not None:
                if len(data) > fs.space_left:
                    fit = fs.space_left
                    fs.space_left = 0
                    if fit:
                        super().pwrite(bytes(data[:fit]), offset)
                    raise OSError(errno.ENOSPC, "injected: no space left on device", self.path)
                fs.space_left -= len(data)
        super().pwrite(data, offset)


# -- many appenders ----------------------------------------------------------------------


def test_many_threads_append_durably(tmp_path: Path) -> None:
    d = tmp_path / "log"
    threads, per = 16, 60
    got: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    with wal.open(d, segment_bytes=16384, sync="always") as log:

        def work(t: int) -> None:
            for i in range(per):
                p = pl(t, i)
                if i % 10 == 9:
                    first, last = log.append_batch([p, p + b"+"])
                    assert last == first + 1
                    got[t] += [(first, p), (last, p + b"+")]
                    assert log.durable_lsn >= last
                else:
                    lsn = log.append(p)
                    got[t].append((lsn, p))
                    assert log.durable_lsn >= lsn, "sync='always': durable on return"

        assert run_threads(threads, work) == []
        acked = {lsn: p for items in got.values() for lsn, p in items}
        total = sum(len(v) for v in got.values())
        assert len(acked) == total == threads * (per + per // 10), "every LSN unique"
        assert sorted(acked) == list(range(1, total + 1))
        # Each thread's LSNs increase: an appender's entries are in its order.
        for items in got.values():
            lsns = [lsn for lsn, _ in items]
            assert lsns == sorted(lsns)
        assert read_all(log) == sorted(acked.items())
        assert Counter(p for _, p in read_all(log)) == Counter(acked.values()), "each payload exactly once"
        st = log.stats()
        assert st["appends"] == total and st["last_lsn"] == st["durable_lsn"] == total
        assert 1 <= st["groups"] <= total and st["max_group"] >= 1
        assert st["fsyncs"] >= st["groups"] and st["rolls"] >= 1
        assert st["avg_group"] == pytest.approx(total / st["groups"])
    assert len(list_segments(str(d))) > 2
    with wal.open(d) as log:
        assert read_all(log) == sorted(acked.items())


def test_append_nowait_callbacks(tmp_path: Path) -> None:
    d = tmp_path / "log"
    calls: list[tuple[int, int, bytes, BaseException | None, int, int | None]] = []
    lock = threading.Lock()
    returned: dict[int, bytes] = {}
    with wal.open(d, segment_bytes=16384) as log:

        def callback_for(p: bytes):
            def cb(lsn: int, err: BaseException | None) -> None:
                # Durable before the callback: in memory and in the DURABLE file.
                with lock:
                    calls.append((threading.get_ident(), lsn, p, err, log.durable_lsn,
                                  wal.read_durable_lsn(str(d))))
            return cb

        def work(t: int) -> None:
            for i in range(150):
                p = pl(t, i)
                lsn = log.append_nowait(p, callback_for(p))
                with lock:
                    returned[lsn] = p

        assert run_threads(8, work) == []
        log.sync()
        assert read_all(log) == sorted(returned.items())
    assert len(calls) == len(returned) == 1200
    assert sorted(c[1] for c in calls) == sorted(returned) == list(range(1, 1201)), "each callback exactly once"
    assert all(returned[lsn] == p for _, lsn, p, *_ in calls), "each callback gets its own entry's LSN"
    assert all(err is None for _, _, _, err, _, _ in calls)
    assert all(durable >= lsn and published >= lsn for _, lsn, _, _, durable, published in calls)
    by_thread: dict[int, list[int]] = defaultdict(list)
    for ident, lsn, *_ in calls:
        by_thread[ident].append(lsn)
    for lsns in by_thread.values():
        assert lsns == sorted(lsns), "a committing thread runs its groups' callbacks in LSN order"


def test_mixed_append_kinds_and_on_commit(tmp_path: Path) -> None:
    d = tmp_path / "log"
    groups: list[list[tuple[int, bytes]]] = []
    state = {"committed": 0, "durable_ok": True}
    lock = threading.Lock()

    def on_commit(group: wal.Group) -> None:
        entries = group.entries()
        groups.append(entries)
        if wal.read_durable_lsn(str(d)) < entries[-1][0]:
            state["durable_ok"] = False
        state["committed"] = entries[-1][0]

    acked: dict[int, bytes] = {}
    late: list[tuple[int, int]] = []
    with wal.open(d, segment_bytes=16384, on_commit=on_commit) as log:
        done = threading.Semaphore(0)

        def work(t: int) -> None:
            for i in range(80):
                p = pl(t, i)
                kind = (t + i) % 3
                if kind == 0:
                    lsn = log.append(p)
                    if lsn > state["committed"]:
                        late.append((lsn, state["committed"]))
                    got = [(lsn, p)]
                elif kind == 1:
                    first, last = log.append_batch([p, p[::-1]])
                    if last > state["committed"]:
                        late.append((last, state["committed"]))
                    got = [(first, p), (last, p[::-1])]
                else:
                    def cb(lsn: int, err: BaseException | None) -> None:
                        assert err is None
                        if lsn > state["committed"]:
                            late.append((lsn, state["committed"]))
                        done.release()

                    got = [(log.append_nowait(p, cb), p)]
                with lock:
                    for lsn, q in got:
                        assert lsn not in acked
                        acked[lsn] = q

        assert run_threads(8, work) == []
        nowaits = sum(1 for t in range(8) for i in range(80) if (t + i) % 3 == 2)
        for _ in range(nowaits):
            assert done.acquire(timeout=60)
        st = log.stats()
    assert not late, "on_commit runs before the group's appenders are released"
    assert state["durable_ok"], "on_commit runs after the group is fsynced"
    flat = [e for g in groups for e in g]
    assert [lsn for lsn, _ in flat] == list(range(1, len(acked) + 1)), "every entry once, in LSN order"
    assert dict(flat) == acked
    assert all(g and [k for k, _ in g] == list(range(g[0][0], g[0][0] + len(g))) for g in groups)
    assert st["groups"] == len(groups) and st["max_group"] == max(len(g) for g in groups)
    with wal.open(d) as log:
        assert read_all(log) == sorted(acked.items())


def test_close_with_pending_nowait_entries(tmp_path: Path) -> None:
    d = tmp_path / "log"
    results: dict[int, list[BaseException | None]] = defaultdict(list)
    log = wal.open(d, segment_bytes=16384)
    for i in range(3000):
        log.append_nowait(pl(0, i), lambda lsn, err: results[lsn].append(err))
    log.close()
    assert sorted(results) == list(range(1, 3001)), "every callback ran before close returned"
    assert all(len(v) == 1 for v in results.values()), "exactly once"
    ok = sorted(lsn for lsn, v in results.items() if v[0] is None)
    failed = [v[0] for v in results.values() if v[0] is not None]
    assert all(isinstance(e, ClosedError) for e in failed)
    with wal.open(d) as log:
        # What was reported written is there, and nothing else.
        assert [lsn for lsn, _ in read_all(log)] == ok == list(range(1, len(ok) + 1))
        assert read_all(log) == [(i + 1, pl(0, i)) for i in range(len(ok))]
    with pytest.raises(ClosedError):
        log.append_nowait(b"late", lambda lsn, err: None)


def test_close_while_threads_wait_on_nowait_entries(tmp_path: Path) -> None:
    """Appenders racing close(): every entry is either acknowledged and kept, or
    refused (ClosedError at the call or in its callback) and absent."""
    d = tmp_path / "log"
    log = wal.open(d, segment_bytes=16384)
    outcome: dict[int, list[BaseException | None]] = defaultdict(list)
    refused = []
    started = threading.Barrier(5)

    def work(t: int) -> None:
        started.wait()
        for i in range(2000):
            try:
                log.append_nowait(pl(t, i), lambda lsn, err: outcome[lsn].append(err))
            except ClosedError:
                refused.append(t)
                return

    ths = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    started.wait()
    log.close()
    for th in ths:
        th.join(timeout=60)
    assert all(len(v) == 1 for v in outcome.values())
    ok = {lsn for lsn, v in outcome.items() if v[0] is None}
    with wal.open(d) as log:
        assert {lsn for lsn, _ in read_all(log)} == ok


def test_a_raising_callback_does_not_fail_the_log(tmp_path: Path, caplog) -> None:
    calls: list[int] = []

    def bad(lsn: int, err: BaseException | None) -> None:
        calls.append(lsn)
        raise RuntimeError("callback bug")

    with wal.open(tmp_path / "log") as log:
        for i in range(20):
            log.append_nowait(pl(0, i), bad)
        log.sync()
        assert log.append(b"still fine") == 21
    assert sorted(calls) == list(range(1, 21))
    assert "callback raised" in caplog.text


# -- failures ---------------------------------------------------------------------------


def test_fsync_failure_fails_the_log(tmp_path: Path) -> None:
    d = tmp_path / "log"
    fs = FaultFS()
    log = wal.open(d, segment_bytes=8192, fs=fs)
    acked = {}
    fs.syncs_left = 30
    with pytest.raises(LogFailedError) as ei:
        for i in range(1000):
            acked[log.append(pl(0, i))] = pl(0, i)
    assert 10 <= len(acked) <= 30
    msg = str(ei.value)
    assert "failed" in msg and "refuses" in msg and d.name in msg and "injected fsync failure" in msg
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.EIO
    calls = fs.sync_calls
    for call in (
        lambda: log.append(b"x"),
        lambda: log.append_batch([b"x", b"y"]),
        lambda: log.append_nowait(b"x", lambda lsn, err: None),
        log.sync,
        lambda: log.truncate_after(1),
    ):
        with pytest.raises(LogFailedError):
            call()
    assert fs.sync_calls == calls, "a failed log never retries an fsync"
    # Acknowledged entries are still readable from the failed log, and after reopen.
    assert read_all(log)[: len(acked)] == sorted(acked.items())
    log.close()
    with wal.open(d, segment_bytes=8192) as log:
        got = dict(read_all(log))
        assert list(got) == list(range(1, log.last_lsn + 1))
        for lsn, p in acked.items():
            assert got[lsn] == p
        assert log.last_lsn <= len(acked) + 1
        assert log.append(b"after") == log.last_lsn


def test_fsync_failure_with_concurrent_appenders(tmp_path: Path) -> None:
    d = tmp_path / "log"
    fs = FaultFS()
    log = wal.open(d, segment_bytes=8192, fs=fs)
    acked: dict[int, bytes] = {}
    failures: list[LogFailedError] = []
    lock = threading.Lock()
    fs.syncs_left = 40

    def work(t: int) -> None:
        for i in range(500):
            try:
                lsn = log.append(pl(t, i))
            except LogFailedError as e:
                with lock:
                    failures.append(e)
                with pytest.raises(LogFailedError):
                    log.append(b"again")
                return
            with lock:
                acked[lsn] = pl(t, i)

    assert run_threads(12, work) == []
    assert len(failures) == 12, "every appender learns of the failure"
    assert len({id(e) for e in failures}) == 1, "one failure, reported to all"
    log.close()
    with wal.open(d) as log:
        got = dict(read_all(log))
        assert list(got) == list(range(1, log.last_lsn + 1))
        assert all(got.get(lsn) == p for lsn, p in acked.items())


def test_fsync_failure_fails_nowait_callbacks(tmp_path: Path) -> None:
    d = tmp_path / "log"
    fs = FaultFS()
    log = wal.open(d, fs=fs)
    results: dict[int, list[BaseException | None]] = defaultdict(list)
    fs.syncs_left = 3
    n = 0
    done = threading.Semaphore(0)

    def cb(lsn: int, err: BaseException | None) -> None:
        results[lsn].append(err)
        done.release()

    for rnd in range(100):  # rounds of 20 entries, each round waited for
        try:
            for i in range(20):
                log.append_nowait(pl(0, n), cb)
                n += 1
        except LogFailedError:
            break
        for i in range(20):
            assert done.acquire(timeout=60)
    assert rnd >= 2
    log.close()
    assert sorted(results) == list(range(1, n + 1)) and all(len(v) == 1 for v in results.values())
    ok = [lsn for lsn in sorted(results) if results[lsn][0] is None]
    assert ok == list(range(1, len(ok) + 1)), "acknowledged entries are a prefix"
    assert len(ok) < n
    assert all(isinstance(results[lsn][0], LogFailedError) for lsn in range(len(ok) + 1, n + 1))
    with wal.open(d) as log:
        got = dict(read_all(log))
        assert all(got[lsn] == pl(0, lsn - 1) for lsn in ok)


def test_disk_full_fails_the_log(tmp_path: Path, caplog) -> None:
    d = tmp_path / "log"
    fs = FaultFS()
    log = wal.open(d, segment_bytes=1 << 20, fs=fs)
    assert log.append(b"first") == 1
    fs.space_left = 5500  # room for five 1000-byte entries and part of a sixth
    acked = {1: b"first"}
    with pytest.raises(LogFailedError) as ei:
        for i in range(100):
            acked[log.append(pl(1, i, 1000))] = pl(1, i, 1000)
    assert len(acked) == 6
    msg = str(ei.value)
    assert "disk is full" in msg and "after freeing space" in msg
    assert ei.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(LogFailedError):
        log.append(b"x")
    log.close()
    with wal.open(d) as log:
        assert read_all(log) == sorted(acked.items())
        assert log.stats()["dropped_bytes_at_open"] > 0, "the partial write was a torn tail"
        assert log.append(b"room again") == 7


def test_failure_while_rolling_a_segment(tmp_path: Path) -> None:
    """A sync fails inside a roll (sealing the old segment or creating the new one)."""
    for budget in range(0, 4):
        d = tmp_path / f"log{budget}"
        fs = FaultFS()
        log = wal.open(d, segment_bytes=4096, fs=fs, sync="none")
        acked = {}
        for i in range(30):
            acked[log.append(pl(0, i, 100))] = pl(0, i, 100)
        assert log.stats()["rolls"] == 0
        # The next append must roll: the sealing fsync, the index file's, the new segment's.
        while log.stats()["rolls"] == 0:
            fs.syncs_left = budget
            try:
                acked[log.append(pl(0, len(acked), 2000))] = pl(0, len(acked), 2000)
            except LogFailedError:
                break
            fs.syncs_left = None
        log.close()
        with wal.open(d, segment_bytes=4096) as log:
            got = dict(read_all(log))
            assert list(got) == list(range(1, log.last_lsn + 1))
            assert all(got[lsn] == p for lsn, p in acked.items())
            assert log.append(b"z") == log.last_lsn


def test_batch_flusher_failure_fails_the_log(tmp_path: Path) -> None:
    d = tmp_path / "log"
    fs = FaultFS()
    log = wal.open(d, sync="batch", sync_interval=5, fs=fs)
    fs.syncs_left = 0
    acked = {}
    failed = None
    for i in range(100_000):
        try:
            acked[log.append(pl(0, i))] = pl(0, i)
        except LogFailedError as e:
            failed = e
            break
        if i % 50 == 0:
            threading.Event().wait(0.005)
    assert failed is not None, "the flusher's failed fsync fails the log"
    with pytest.raises(LogFailedError):
        log.sync()
    log.close()
    with wal.open(d) as log:
        # The process did not crash: everything written reached the page cache.
        assert read_all(log) == sorted(acked.items())


def test_on_commit_that_raises_fails_the_log(tmp_path: Path) -> None:
    d = tmp_path / "log"
    seen: list[int] = []

    def on_commit(group: wal.Group) -> None:
        entries = group.entries()
        seen.extend(lsn for lsn, _ in entries)
        if entries[-1][0] >= 5:
            raise RuntimeError("state machine rejected the group")

    log = wal.open(d, on_commit=on_commit)
    for i in range(1, 5):
        assert log.append(b"e%d" % i) == i
    with pytest.raises(LogFailedError) as ei:
        log.append(b"e5")
    assert isinstance(ei.value.__cause__, RuntimeError) and "rejected" in str(ei.value)
    with pytest.raises(LogFailedError):
        log.append(b"e6")
    errs = []
    with pytest.raises(LogFailedError):
        log.append_nowait(b"e6", lambda lsn, err: errs.append(err))
    assert seen == [1, 2, 3, 4, 5]
    log.close()
    with wal.open(d) as log:
        got = read_all(log)
        assert got[:4] == [(i, b"e%d" % i) for i in range(1, 5)]
        assert got[4:] in ([], [(5, b"e5")])
        assert log.append(b"next") == len(got) + 1


# -- appenders racing sync, close and truncation --------------------------------------------


def test_sync_racing_appends(tmp_path: Path) -> None:
    d = tmp_path / "log"
    stop = threading.Event()
    synced: list[int] = []
    with wal.open(d, sync="batch", sync_interval=3_600_000, segment_bytes=16384) as log:

        def syncer() -> None:
            while not stop.is_set():
                n = log.sync()
                assert log.durable_lsn >= n and wal.read_durable_lsn(str(d)) >= n
                assert [k for k, _ in log.read(max(1, n - 3), n)] == list(range(max(1, n - 3), n + 1))
                synced.append(n)

        s = threading.Thread(target=syncer)
        s.start()
        got: dict[int, bytes] = {}

        def work(t: int) -> None:
            for i in range(150):
                got[log.append(pl(t, i))] = pl(t, i)

        try:
            errors = run_threads(6, work)
        finally:
            stop.set()
            s.join(timeout=60)
        assert errors == []
        assert synced == sorted(synced) and len(synced) > 1
        assert log.sync() == 900
        assert read_all(log) == sorted(got.items())


def test_blocking_appends_racing_close(tmp_path: Path) -> None:
    """Each append racing close() either returns an LSN that holds its payload
    after reopen, or raises ClosedError."""
    for rep in range(5):
        d = tmp_path / f"log{rep}"
        log = wal.open(d, segment_bytes=8192)
        results: list[tuple[int, bytes]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(5)

        def work(t: int) -> None:
            start.wait()
            i = 0
            while True:
                p = pl(t, i)
                try:
                    results.append((log.append(p), p))
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    return
                i += 1

        ths = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in ths:
            th.start()
        start.wait()
        threading.Event().wait(0.01)
        log.close()
        for th in ths:
            th.join(timeout=60)
        assert all(isinstance(e, ClosedError) for e in errors), errors
        with wal.open(d) as log:
            got = dict(read_all(log))
        assert all(got.get(lsn) == p for lsn, p in results)


def test_appends_racing_truncate_after(tmp_path: Path) -> None:
    """Appenders that queue while truncate_after holds the log: each append
    either returns the LSN that holds its payload, or raises a walkv error;
    never a TypeError (`raise None` in GroupCommit.submit), and no entry is
    written under an LSN other than the one its appender was given."""
    d = tmp_path / "log"
    log = wal.open(d, segment_bytes=8192)
    for i in range(300):
        log.append(pl(99, i))
    results: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(t: int) -> None:
        i = 0
        while not stop.is_set():
            p = pl(t, i)
            try:
                results.append((log.append(p), p))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                return
            i += 1

    ths = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    try:
        threading.Event().wait(0.03)
        log.truncate_after(150)
        threading.Event().wait(0.03)
    finally:
        stop.set()
        for th in ths:
            th.join(timeout=60)
    assert all(isinstance(e, wal.WalkvError) for e in errors), errors
    claimed = set(results)
    after = [(lsn, p) for lsn, p in read_all(log) if lsn > 150]
    assert after, "appends went on after the truncation"
    assert all(item in claimed for item in after), "an entry sits under an LSN its appender was not given"
    log.close()


def test_on_commit_sees_its_group_durable_and_readable(tmp_path: Path) -> None:
    d = tmp_path / "log"
    problems: list[str] = []
    holder: dict[str, wal.Log] = {}

    def on_commit(group: wal.Group) -> None:
        entries = group.entries()
        log = holder.get("log")
        if log is None:
            return
        first, last = entries[0][0], entries[-1][0]
        if log.durable_lsn < last:
            problems.append(f"group {first}..{last} not durable")
        if list(log.read(first, last)) != entries:
            problems.append(f"group {first}..{last} not readable")

    with wal.open(d, on_commit=on_commit, segment_bytes=8192) as log:
        holder["log"] = log

        def work(t: int) -> None:
            for i in range(60):
                log.append(pl(t, i))

        assert run_threads(6, work) == []
    assert problems == []
