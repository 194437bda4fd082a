"""Expiry's API edges (the model test, tests/test_expiry_model.py, drives the
semantics): arguments, the entry format, leases too big for one entry, the
background sweeper and keep-alive threads, the asyncio front, Spark's
``changes`` rows."""

from __future__ import annotations

import asyncio
import threading

import pytest

import kvstore
from kvstore.entry.codec import encode, parse
from kvstore.spark.arrow import change_batches

START_US = 1_700_000_000_000_000


def open_store(path, clock=None, **options):
    return kvstore.open(str(path), sync="none", clock=clock or kvstore.ManualClock(START_US),
                        **{"sweep_interval": None, **options})


def test_arguments_are_checked(tmp_path) -> None:
    with open_store(tmp_path / "s") as db:
        lease = db.grant(10)
        for bad in (0, -1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="ttl must be a positive number"):
                db.put(b"k", b"v", ttl=bad)
            with pytest.raises(ValueError, match="ttl must be a positive number"):
                db.grant(bad)
        for bad in (True, "5"):  # not numbers of seconds (a ValueError before issue 33)
            with pytest.raises(TypeError, match="ttl must be a number of seconds"):
                db.put(b"k", b"v", ttl=bad)
            with pytest.raises(TypeError, match="ttl must be a number of seconds"):
                db.grant(bad)
        with pytest.raises(ValueError, match="not both"):
            db.put(b"k", b"v", ttl=1, lease=lease)
        with pytest.raises(TypeError, match="lease must be a Lease"):
            db.put(b"k", b"v", lease="lease")
        with pytest.raises(TypeError, match="key must be bytes"):
            db.put("k", b"v", ttl=1)
        assert db.get(b"k") is None and db.ttl(b"k") is None
        with pytest.raises(kvstore.LeaseNotFoundError) as info:
            db.revoke(12345)
        assert info.value.lease_id == 12345
        with pytest.raises(kvstore.LeaseNotFoundError):
            db.lease(12345)


def test_entry_format_is_strict() -> None:
    ok = [[8, b"k", b"v", START_US], [9, b"k", b"v", 7], [11, 7, 10, START_US], [12, 7, START_US],
          [13, 7], [14, b"k"]]
    for op in ok:
        assert parse(encode([op])) == [op]
    assert parse(encode([[7, 0], [10, 7]])) == [[7, 0], [10, 7]]
    for op in ([8, b"k", b"v", -1], [8, b"k", b"v"], [9, b"k", b"v", 0], [9, b"k", b"v", b"7"],
               [11, 7, 0, START_US], [12, 1 << 63, 5], [13], [14, b""], [15, b"k"], [10, 7]):
        with pytest.raises(ValueError, match="not a walkv batch"):
            parse(encode([op] if op[0] != 10 else [[1, b"k", b"v"], op]))


def test_write_copies_puts_and_refuses_what_the_writer_decides(tmp_path) -> None:
    with open_store(tmp_path / "s") as db:
        db.write(encode([[8, b"a", b"1", START_US + 1_000_000]]))
        assert db.ttl(b"a") == 1.0
        for op in ([11, 7, 10, START_US], [13, 7], [14, b"a"]):
            with pytest.raises(ValueError, match="decided by the writer"):
                db.write(encode([op]))
        with pytest.raises(kvstore.LeaseNotFoundError):
            db.write(encode([[9, b"b", b"2", 7]]))
        assert db.get(b"b") is None and db.get(b"a") == b"1"


def test_a_transaction_under_a_dead_lease_applies_nothing(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock) as db:
        lease = db.grant(1)
        with db.transaction() as t:  # a lock that dies with its holder: a CAS put under a lease
            t.require(b"lock", absent=True)
            t.put(b"lock", b"me", lease=lease)
        assert t.succeeded and db.get(b"lock") == b"me"
        clock.advance(1)
        assert db.get(b"lock") is None  # absent at once, before any sweep
        t = db.transaction()
        t.require(b"lock", absent=True)
        t.put(b"lock", b"you", lease=lease)
        with pytest.raises(kvstore.LeaseNotFoundError):
            t.commit()
        assert t.succeeded is False and db.get(b"lock") is None
        other = db.grant(5)
        assert db.compare_and_set(b"lock", None, b"them")  # the expired key is absent to conditions
        with db.batch() as b:
            b.put(b"x", b"1", lease=other)
            b.put(b"y", b"2", ttl=2)
        assert db.ttl(b"x") == 5.0 and db.ttl(b"y") == 2.0 and db.ttl(b"lock") is None


def test_a_lease_too_big_for_one_entry(tmp_path) -> None:
    """A revoke lists what fits in one record and ends the lease at once;
    the sweeper deletes the rest in bounded entries."""
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock, max_record_bytes=4096) as db:
        lease = db.grant(60)
        keys = [b"k%04d-" % i + b"x" * 40 for i in range(200)]
        for k in keys:
            db.put(k, b"v", lease=lease)
        db.put(b"plain", b"v")
        first = db.last_lsn + 1
        db.revoke(lease)
        assert list(db.scan()) == [(b"plain", b"v")] and len(db) == 1  # all of them at once
        deleted = 0
        while n := db.sweep_expired(max_keys=30):
            assert n <= 30
            deleted += n
        db.sync()
        changes = list(db.watch(from_lsn=first, timeout=0.01))
        gone = [c.key for c in changes if c.op in ("delete", "expire")]
        assert sorted(gone) == keys and deleted == len([c for c in changes if c.op == "expire"]) > 0
        assert lease.ttl() is None and db.sweep_expired() == 0
        stats = db.stats()
        assert (stats["expiring_keys"], stats["expired_swept"]) == (0, deleted)
        assert f"walkv_expired_swept_total{{store=\"{db.path}\"}} {deleted}" in kvstore.prometheus_text(stats)
        with pytest.raises(kvstore.LeaseNotFoundError):
            db.revoke(lease)


def test_the_sweeper_thread_logs_expiry(tmp_path) -> None:
    with kvstore.open(str(tmp_path / "s"), sweep_interval=0.01) as db:  # watchers read what is durable
        w = db.watch(from_lsn=1, timeout=30)
        db.put(b"a", b"1", ttl=0.05)
        lease = db.grant(0.05)
        db.put(b"b", b"2", lease=lease)
        seen = []
        for c in w:  # the watcher wakes on each commit: no sleep
            seen.append((c.op, c.key))
            if len([s for s in seen if s[0] == "expire"]) == 2:
                break
        w.close()
        assert sorted(k for op, k in seen if op == "expire") == [b"a", b"b"]
        assert db.get(b"a") is None and lease.ttl() is None


def test_keep_alive_in_the_background(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock) as db:
        lease = db.grant(10)
        db.put(b"svc", b"up", lease=lease)
        beat = threading.Event()

        class Beating:  # the lease, telling the test when it was kept alive
            id = lease.id

            def keepalive(self) -> float:
                out = lease.keepalive()
                beat.set()
                return out
        with kvstore.KeepAlive(Beating(), every=0.001) as ka:  # type: ignore[arg-type]
            for _ in range(3):  # each beat moves the lease to now + 10 s
                clock.advance(9)
                beat.clear()
                assert beat.wait(30)
                assert db.get(b"svc") == b"up"
        assert not ka.running and ka.error is None
        clock.advance(11)
        assert db.get(b"svc") is None
        ka = lease.keep_alive(every=0.001)  # a lease that ran out: the helper stops by itself
        ka._thread.join(30)
        assert isinstance(ka.error, kvstore.LeaseNotFoundError)


def test_a_lease_survives_a_restart(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock) as db:
        lease_id = db.grant(10).id
        db.put(b"k", b"v", lease=lease_id)
    clock.advance(5)
    with open_store(tmp_path / "s", clock) as db:
        lease = db.lease(lease_id)
        assert lease.granted_ttl == 10 and lease.ttl() == 5
        assert lease.keepalive() == 10 and db.ttl(b"k") == 10
        db.revoke(lease)
        assert db.get(b"k") is None


def test_asyncio_front(tmp_path) -> None:
    async def main() -> None:
        clock = kvstore.ManualClock(START_US)
        async with kvstore.open_async(str(tmp_path / "s"), sync="none", clock=clock,
                                      sweep_interval=None) as adb:
            await adb.put(b"a", b"1", ttl=2)
            lease = await adb.grant(3)
            await asyncio.gather(*(adb.put(b"l%d" % i, b"x", lease=lease) for i in range(5)))
            async with adb.batch() as b:
                b.put(b"b", b"2", lease=lease)
            assert await adb.ttl(b"a") == 2 and await adb.ttl(b"b") == 3
            clock.advance(2)
            assert await adb.get(b"a") is None
            assert await adb.keepalive(lease) == 3
            clock.advance(2)
            assert await adb.get(b"l0") == b"x"
            await adb.revoke(lease)
            assert await adb.count() == 0
            with pytest.raises(kvstore.LeaseNotFoundError):
                await adb.put(b"c", b"3", lease=lease)
            with pytest.raises(kvstore.LeaseNotFoundError):
                await adb.keepalive(lease)
    asyncio.run(main())


def test_spark_changes_show_expiry() -> None:
    """Puts with an expiry are upserts, an expire is ``expire``, lease ops
    change no key (kvstore/spark/arrow.py reads the log entries as Spark does)."""
    entries = [
        (1, START_US, encode([[11, 7, 10, START_US + 10]])),
        (2, START_US, encode([[8, b"a", b"1", START_US + 5], [9, b"b", b"2", 7]])),
        (3, START_US, encode([[12, 7, START_US + 20]])),
        (4, START_US, encode([[14, b"a"]])),
        (5, START_US, encode([[13, 7], [14, b"b"]])),
        (6, START_US, encode([[7, 0], [10, 7]])),
    ]
    rows = [r for batch in change_batches(entries, lambda p, lsn, path: parse(p)) for r in batch.to_pylist()]
    assert [(r["_commit_version"], r["_change_type"], r["key"], r["value"]) for r in rows] == [
        (2, "upsert", b"a", b"1"), (2, "upsert", b"b", b"2"), (4, "expire", b"a", None),
        (5, "expire", b"b", None)]


def test_a_bad_sweep_interval_is_refused_before_the_store_is_taken(tmp_path) -> None:
    """ValueError before anything is opened: the store is not left locked
    (the next open succeeds) and nothing was written; a reader ignores it."""
    path = tmp_path / "s"
    with open_store(path) as db:
        db.put(b"k", b"v")
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="sweep_interval must be a positive number"):
            open_store(path, sweep_interval=bad)
    with open_store(path, sweep_interval=0.5) as db:
        assert db.last_lsn == 1
    with kvstore.open(str(path), readonly=True, sweep_interval=0) as ro:
        assert ro.get(b"k") == b"v"
