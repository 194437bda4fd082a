"""Watching a store's changes (kvstore/watch/watcher.py, kvstore/watch/log_tail.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import pytest

import kvstore
from kvstore.entry.codec import DELETE, DELETE_RANGE, UPSERT
from kvstore.store.aio import AsyncKVStore
from kvstore.watch.watcher import Change
from tests.test_kvstore import fake_machine_crash
from wal.errors import LogGapError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collect(w, n: int | None = None) -> list[Change]:
    out = []
    for c in w:
        out.append(c)
        if n is not None and len(out) == n:
            break
    return out


def strip(changes: list[Change]) -> list[tuple]:
    return [(c.lsn, c.op, c.key, c.value, c.end_key) for c in changes]


def test_changes_in_log_order_with_batches_ranges_and_bounds(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        db.put(b"old", b"0")
        w = db.watch(timeout=0.2)  # from the next LSN: "old" is not shown
        db.put(b"o:1", b"a")
        with db.batch() as b:
            b.put(b"o:2", b"b")
            b.delete(b"o:1")
            b.delete_range(b"a", b"z")
        db.put(b"p:1", b"c")
        assert strip(collect(w)) == [
            (2, UPSERT, b"o:1", b"a", None),
            (3, UPSERT, b"o:2", b"b", None), (3, DELETE, b"o:1", None, None), (3, DELETE_RANGE, b"a", None, b"z"),
            (4, UPSERT, b"p:1", b"c", None)]
        assert [c.op for c in collect(db.watch(b"o:", from_lsn=1, timeout=0.1))] == [
            UPSERT, UPSERT, DELETE, DELETE_RANGE]
        assert [c.key for c in collect(db.watch(start=b"o:2", stop=b"p", from_lsn=1, timeout=0.1))] == [
            b"old", b"o:2", b"a"]
        times = [c.time for c in collect(db.watch(from_lsn=1, timeout=0.1))]
        assert times == sorted(times) and all(isinstance(t, int) and t > 1_600_000_000 * 10**6 for t in times)


def test_failed_conditional_writes_are_not_changes(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        assert db.compare_and_set(b"k", None, b"1")
        assert not db.compare_and_set(b"k", None, b"2")
        with db.transaction() as t:
            t.require(b"k", equals=b"1")
            t.put(b"j", b"x")
        assert strip(collect(db.watch(from_lsn=1, timeout=0.1))) == [
            (1, UPSERT, b"k", b"1", None), (3, UPSERT, b"j", b"x", None)]


def test_follows_live_writes_across_segment_rolls_and_wakes_on_commit(tmp_path, open_api):
    with open_api(tmp_path / "s", segment_bytes=4096) as db:
        n = 300
        got: list[Change] = []
        w = db.watch()
        t = threading.Thread(target=lambda: got.extend(collect(w, n)))
        t.start()
        for i in range(n):
            db.put(b"k%04d" % i, b"v" * 100)
        t.join(30)
        assert len(os.listdir(tmp_path / "s" / "wal")) > 5
        assert [c.lsn for c in got] == list(range(1, n + 1))


def test_progress_markers_and_close_from_another_thread(tmp_path, open_api):
    with open_api(tmp_path / "s") as db:
        db.put(b"x", b"1")
        w = db.watch(b"a", progress_every=0.05)
        db.put(b"y", b"2")  # LSN 2, not watched
        c = next(w)
        assert (c.op, c.lsn) == ("progress", 2)
        threading.Timer(0.1, w.close).start()
        assert collect(w) == [] or all(c.op == "progress" for c in collect(w))


def test_gap_error_names_the_first_lsn_and_snapshot_restart(tmp_path, open_api):
    # max_retained_bytes=0: retention does not wait for live watchers (by default it does)
    with open_api(tmp_path / "s", segment_bytes=4096, keep_snapshots=1, max_retained_bytes=0) as db:
        for i in range(100):
            db.put(b"k%03d" % i, b"v" * 100)
        db.delete(b"k000")
        db.snapshot()
        for i in range(3):
            db.put(b"n%d" % i, b"new")
        with pytest.raises(LogGapError) as e:
            next(db.watch(from_lsn=1))
        first = e.value.first_available
        assert first is not None and first > 1
        assert next(db.watch(from_lsn=first, timeout=0.1)).lsn == first
        got = collect(db.watch(from_lsn=1, on_gap="snapshot", timeout=0.1))
        snap = [c for c in got if c.op == "snapshot"]
        assert len(snap) == 99 and {c.lsn for c in snap} == {101}
        assert strip(got[99:]) == [(102 + i, UPSERT, b"n%d" % i, b"new", None) for i in range(3)]


def test_retention_under_a_slow_watcher_restarts_from_a_snapshot(tmp_path):
    """The watcher holds segment 1 open; retention deletes the segments after
    it: the roll finds the gap, and on_gap='snapshot' catches up exactly."""
    # max_retained_bytes=0: retention does not wait for live watchers (by default it does)
    with kvstore.open(tmp_path / "s", segment_bytes=4096, keep_snapshots=1, max_retained_bytes=0) as db:
        for i in range(60):
            db.put(b"k%03d" % i, b"v" * 100)
        slow = db.watch(from_lsn=1, on_gap="snapshot", timeout=0.2)
        strict = db.watch(from_lsn=1, timeout=0.2)
        mirror: dict[bytes, bytes] = {}
        first = next(slow)
        next(strict)
        mirror[first.key] = first.value  # type: ignore[assignment]
        for i in range(60):
            db.put(b"k%03d" % i, b"w" * 100)
        db.delete(b"k005")
        db.snapshot()
        db.put(b"after", b"1")
        for c in slow:
            if c.op == "snapshot" and c.lsn != getattr(slow, "_snap_seen", None):
                if not getattr(slow, "_snap_seen", None):
                    mirror.clear()
                slow._snap_seen = c.lsn  # type: ignore[attr-defined]
            if c.op in ("snapshot", UPSERT):
                mirror[c.key] = c.value  # type: ignore[assignment]
            elif c.op == DELETE:
                mirror.pop(c.key, None)
        assert getattr(slow, "_snap_seen", None)
        assert mirror == dict(db.items())
        with pytest.raises(LogGapError):
            collect(strict)


def test_outcomes_survive_a_rebuild_because_the_log_holds_them(tmp_path):
    """The decision of a conditional write is in the log, so a watcher reads
    it after LMDB was rebuilt (and never waits for, or asks, the state)."""
    path = str(tmp_path / "s")
    with kvstore.open(path, keep_snapshots=2) as db:
        assert db.compare_and_set(b"k", None, b"1")
        assert not db.compare_and_set(b"k", None, b"2")
        db.snapshot()
        db.put(b"j", b"2")
    fake_machine_crash(path)
    with kvstore.open(path) as db:
        assert db.rebuilt
        got = collect(db.watch(from_lsn=1, timeout=0.1))
        assert strip(got) == [(1, UPSERT, b"k", b"1", None), (3, UPSERT, b"j", b"2", None)]


def test_async_watch(tmp_path):
    async def main() -> list[Change]:
        db = kvstore.open(tmp_path / "s")
        adb = AsyncKVStore(db, asyncio.get_running_loop())
        out = []
        async with adb.watch(b"a") as w:
            await adb.put(b"a1", b"1")
            await adb.put(b"b1", b"1")
            await adb.put(b"a2", b"2")
            async for c in w:
                out.append(c)
                if len(out) == 2:
                    break
        await adb.close()
        return out
    assert [c.key for c in asyncio.run(main())] == [b"a1", b"a2"]


def test_an_async_watcher_ends_once_closed(tmp_path):
    async def main() -> None:
        db = kvstore.open(tmp_path / "s")
        adb = AsyncKVStore(db, asyncio.get_running_loop())
        await adb.put(b"a", b"1")
        w = adb.watch(from_lsn=1)
        assert (await w.__anext__()).key == b"a"
        await w.aclose()
        assert [c async for c in w] == []  # ends, as a closed sync watcher does (no RuntimeError)
        with pytest.raises(StopAsyncIteration):
            await w.__anext__()
        await adb.close()
    asyncio.run(main())


WRITER = r"""
import sys, time, kvstore
db = kvstore.open(sys.argv[1], segment_bytes=4096)
print("open", flush=True)
sys.stdin.readline()
for i in range(200):
    db.put(b"k%04d" % i, b"v" * 50)
    if i % 20 == 0:
        time.sleep(0.01)
db.close()
"""


@pytest.mark.crash
def test_readonly_store_follows_a_writer_in_another_process(tmp_path):
    path = str(tmp_path / "s")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "open"
        with kvstore.open(path, readonly=True) as ro:
            w = ro.watch(from_lsn=1, timeout=10)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = collect(w, 200)
        assert [c.key for c in got] == [b"k%04d" % i for i in range(200)]
        assert [c.lsn for c in got] == list(range(1, 201))
    finally:
        proc.wait(10)
