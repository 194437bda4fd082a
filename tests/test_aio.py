"""The asyncio front's write path (kvstore/store/aio.py and aio_writes.py, issue 15): writes issued in
one loop turn are queued with the log as one run (``Log.append_many_nowait``),
get one callback and one wake-up of the loop, and each write's future still
resolves on its own: with its own LSN, only once durable and applied, with the
error that concerns it, and unharmed by a neighbour's cancellation.

The general asyncio API is tested in tests/test_kvstore.py."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import kvstore
import wal
from kvstore.entry.codec import decode
from kvstore.store.aio_writes import PendingWrites
from tests.faultfs import FaultFS, scratch_dir
from wal.errors import LogFailedError


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store")


def _logged_keys(store: str) -> dict[int, bytes]:
    """LSN -> the key its (single-put) entry wrote, read back from the log."""
    with wal.open(os.path.join(store, "wal")) as lg:
        return {lsn: decode(bytes(p) if not isinstance(p, bytes) else p)[0][1] for lsn, p in lg.read()}


def test_each_put_gets_the_lsn_of_its_own_entry(store) -> None:
    """Many coroutines, several loop turns: the LSNs are distinct and
    contiguous, and the log entry at each returned LSN is that put's."""
    async def main() -> dict[bytes, int]:
        async with kvstore.open_async(store) as adb:
            async def writer(t: int) -> dict[bytes, int]:
                got = {}
                for i in range(20):
                    key = b"t%03d-%03d" % (t, i)
                    got[key] = await adb.put(key, b"v")
                    if i % 7 == 3:
                        await asyncio.sleep(0)  # shift this writer to another turn
                return got

            per = await asyncio.gather(*(writer(t) for t in range(100)))
            return {k: v for d in per for k, v in d.items()}

    lsn_of = asyncio.run(main())
    assert sorted(lsn_of.values()) == list(range(1, 2001))
    logged = _logged_keys(store)
    assert {logged[lsn]: lsn for lsn in logged} == lsn_of


def test_a_put_resolves_only_once_durable_and_applied(store) -> None:
    async def main() -> None:
        async with kvstore.open_async(store) as adb:
            async def one(i: int) -> None:
                key = b"%04d" % i
                lsn = await adb.put(key, b"x%d" % i)
                assert adb.durable_lsn >= lsn and adb.applied_lsn >= lsn
                assert adb.store.get(key) == b"x%d" % i

            await asyncio.gather(*(one(i) for i in range(1000)))

    asyncio.run(main())


class CountingLog:
    """A store's log, counting the runs it calls back for (by first LSN)."""

    def __init__(self, log: wal.Log) -> None:
        self.log = log
        self.calls: list[int] = []

    def append_many_nowait(self, payloads, callback, contexts) -> int:
        def counting(first: int, error: BaseException | None) -> None:
            self.calls.append(first)
            callback(first, error)

        return self.log.append_many_nowait(payloads, counting, contexts)


def test_writes_issued_in_one_turn_are_one_group(store) -> None:
    """One run per loop turn: 300 puts issued before the loop runs again are
    written with one fsync, and make one cross-thread callback."""
    async def main() -> None:
        async with kvstore.open_async(store) as adb:
            await adb.put(b"warm", b"up")
            log = adb.store._log
            counting = CountingLog(log)
            writes = PendingWrites(asyncio.get_running_loop(), counting, adb.store.max_value_bytes, adb._refusal)
            fsyncs = adb.stats()["log"]["fsyncs"]
            lsns = await asyncio.gather(*(writes.put(b"k%03d" % i, b"v") for i in range(300)))
            assert lsns == list(range(2, 302))
            assert counting.calls == [2]
            assert adb.stats()["log"]["fsyncs"] == fsyncs + 1
            assert log.durable_lsn == 301

    asyncio.run(main())


def test_append_many_nowait_is_one_run_one_callback(tmp_path) -> None:
    seen: list[tuple[int, BaseException | None]] = []
    groups: list[tuple[int, int]] = []
    done = threading.Event()

    def cb(first: int, err: BaseException | None) -> None:
        seen.append((first, err))
        done.set()

    with wal.open(str(tmp_path / "log"), on_commit=lambda g: groups.append((g.first_lsn, g.last_lsn))) as lg:
        lg.append(b"zero")
        first = lg.append_many_nowait([b"a", b"b", (b"c", b"d")], cb, ["ca", "cb", "cc"])
        assert first == 2
        assert done.wait(10)
        assert seen == [(2, None)] and lg.durable_lsn >= 4
        assert any(g[0] <= 2 and g[1] >= 4 for g in groups)  # never split between groups
        with pytest.raises(ValueError):
            lg.append_many_nowait([b"x"], cb, [])
        with pytest.raises(kvstore.RecordTooLargeError):
            lg.append_many_nowait([b"ok", b"x" * (lg.max_record_bytes + 10)], cb, [None, None])
        assert lg.last_lsn == 4  # nothing of a refused run was queued
        assert [p for _, p in lg.read()] == [b"zero", b"a", b"b", b"cd"]


def test_a_log_failure_fails_exactly_the_writes_not_yet_durable(tmp_path) -> None:
    with scratch_dir(tmp_path) as d:
        store = os.path.join(d, "store")
        fs = FaultFS()

        async def main() -> list[int]:
            adb = await kvstore.open_async(store, fs=fs)
            ok = [await adb.put(b"before%d" % i, b"v") for i in range(5)]
            fs.fail("sync", persistent=True)
            futs = [adb.put(b"after%03d" % i, b"v") for i in range(200)]
            results = await asyncio.gather(*futs, return_exceptions=True)
            assert all(isinstance(r, LogFailedError) for r in results), results
            # The log has failed: a later write is refused, through its future.
            with pytest.raises(LogFailedError):
                await adb.put(b"later", b"v")
            assert adb.stats()["async_pending"] == 0
            try:
                await adb.close()
            except kvstore.WalkvError:  # the failed log may say so again on close
                pass
            return ok

        ok = asyncio.run(main())
        assert ok == [1, 2, 3, 4, 5]
        fs.power_loss()
        fs.clear_faults()
        with kvstore.open(store, fs=fs) as db:
            assert all(db.get(b"before%d" % i) == b"v" for i in range(5))


def test_closed_store_fails_only_the_writes_after_close(store) -> None:
    async def main() -> None:
        adb = await kvstore.open_async(store)
        futs = [adb.put(b"%04d" % i, b"v") for i in range(500)]  # not flushed yet
        await adb.close()  # flushes them first: every one is written
        assert [f.result() for f in futs] == list(range(1, 501))
        with pytest.raises(kvstore.ClosedError):
            adb.put(b"late", b"v")

    asyncio.run(main())
    with kvstore.open(store) as d:
        assert len(d) == 500


def test_a_refused_batch_is_retried_write_by_write(store) -> None:
    """When the log refuses a run as a whole, each write gets its own
    answer: the writes it would accept are written, the bad one fails."""
    async def main() -> None:
        async with kvstore.open_async(store) as adb:
            class Picky:  # the store's log, refusing any run with a bad write in it
                def __init__(self, log):
                    self.log = log

                def append_many_nowait(self, payloads, callback, contexts):
                    if any(b"bad" in p for p in payloads):
                        raise kvstore.RecordTooLargeError("refused")
                    return self.log.append_many_nowait(payloads, callback, contexts)

            writes = PendingWrites(asyncio.get_running_loop(), Picky(adb.store._log), adb.store.max_value_bytes,
                                   adb._refusal)
            futs = [writes.put(b"k%d" % i, b"bad" if i == 3 else b"good") for i in range(6)]
            results = await asyncio.gather(*futs, return_exceptions=True)
            assert isinstance(results[3], kvstore.RecordTooLargeError)
            good = [r for i, r in enumerate(results) if i != 3]
            assert sorted(good) == list(range(1, 6))
            assert adb.store.get(b"k3") is None and adb.store.get(b"k5") == b"good"

    asyncio.run(main())


def test_cancelling_awaiting_coroutines_loses_nothing(store) -> None:
    """Half the writers are cancelled while they await: their writes are
    still made (the write was handed over), the others get their own LSNs,
    and nothing is left pending."""
    async def main() -> dict[bytes, int]:
        async with kvstore.open_async(store) as adb:
            async def one(i: int) -> int:
                return await adb.put(b"%04d" % i, b"v%d" % i)

            tasks = [asyncio.create_task(one(i)) for i in range(400)]
            await asyncio.sleep(0)  # every task now awaits its future
            for t in tasks[::2]:
                t.cancel()
            # (wait_for: a write left unresolved fails the test instead of hanging it)
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            assert all(isinstance(r, asyncio.CancelledError) for r in results[::2])
            kept = {b"%04d" % i: r for i, r in enumerate(results) if i % 2}
            more = await adb.put(b"after", b"x")
            assert more == 401
            assert adb.stats()["async_pending"] == 0
            return kept

    kept = asyncio.run(main())
    logged = _logged_keys(store)
    assert sorted(logged) == list(range(1, 402))
    assert all(logged[lsn] == key for key, lsn in kept.items())
    with kvstore.open(store) as d:
        assert len(d) == 401 and d.get(b"0000") == b"v0"


def test_runs_behind_a_failed_group_each_fail_once(tmp_path) -> None:
    """Every run queued when the log fails gets exactly one callback, with the
    log's failure; none is told it is durable."""
    with scratch_dir(tmp_path) as d:
        fs = FaultFS()
        os.makedirs(os.path.join(d, "log"))
        lg = wal.open(os.path.join(d, "log"), fs=fs)
        try:
            lg.append(b"first")
            fs.fail("sync", persistent=True)
            seen: list[tuple[int, BaseException | None]] = []
            lock = threading.Lock()
            all_done = threading.Event()
            firsts = []

            def cb(first: int, err: BaseException | None) -> None:
                with lock:
                    seen.append((first, err))
                    if len(seen) == len(firsts):
                        all_done.set()

            with lock:
                for r in range(5):
                    try:
                        firsts.append(lg.append_many_nowait([b"r%d-%d" % (r, i) for i in range(10)], cb,
                                                            [None] * 10))
                    except LogFailedError:  # already failed: refused at once, also fine
                        break
            assert firsts and firsts[0] == 2
            assert all_done.wait(10)
            assert sorted(f for f, _ in seen) == firsts
            assert all(isinstance(e, LogFailedError) for _, e in seen), seen
        finally:
            try:
                lg.close()
            except kvstore.WalkvError:
                pass
