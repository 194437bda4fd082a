"""The key-value store (``kvstore.open`` / ``open_async``) against LevelDB,
LMDB, RocksDB and SQLite; 16-byte keys, 100-byte values. The targets are
issue 21's bars (the workloads without one there keep issue 15's):

* ``kv.put.durable.8t`` / ``.1t``: durable puts/s from 8 threads / 1 thread for
  a fixed time; targets vs plyvel ``put(sync=True)`` from as many threads:
  >= 1.2x (8 threads), >= 0.9x (1 thread).
* ``kv.put.async256``: durable puts/s from 256 coroutines on one event loop
  through ``open_async`` vs plyvel ``put(sync=True)`` from 32 threads: >= 4x.
* ``kv.put.nosync.1t``: ``sync="none"`` puts of N pre-built items vs plyvel
  ``put()`` >= 0.5x (py-lmdb, one write transaction per put, ``sync=False``:
  an extra column).
* ``kv.batch.100k``: one durable batch of 100,000 puts vs plyvel
  ``write_batch(sync=True)`` >= 1x.
* ``kv.get``: gets/s of existing keys in a shuffled order vs py-lmdb ``get`` on
  one read transaction >= 1x.
* ``kv.get.before-overlay``: the same gets, each tree in a fresh process, vs
  the tree before the overlay (commit ``e7c0cec^``, checked out where
  :data:`BEFORE_OVERLAY_ENV` says; without it, walkv's column only): >= 1.1x.
* ``kv.recovery``: reopening a store whose log holds N entries not yet applied
  to LMDB (made by appending them with ``wal`` to a closed, empty store) in a
  fresh process (the LMDB rebuild), vs LevelDB's reopen replay of N puts:
  >= 0.6x records/s, peak RSS < 200 MB.
* ``kv.rebuild.random``: the same after the LMDB directory was lost, of a
  log of N single puts whose keys come in a random order (as most real keys
  do), vs LevelDB's reopen replay of the same puts: >= 0.8x (issue 37).

SQLite (WAL, synchronous=FULL when durable) and RocksDB (rocksdict) are extra
columns (no target) wherever they fit.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any, Callable

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Limit, Measurement, Target, Workload
from benchmarks.log_workloads import _leveldb_replay, _leveldb_replay_prepare
from benchmarks.peers import KV_PEERS, LMDB, LevelDB
from benchmarks.timing import coroutines, counted, counted_puts, in_child, in_child_on_copy, threaded_puts

KV = ("kvstore:open",)
LOAD_CHUNK = 10_000  # items per batch when loading data (untimed)
BEFORE_OVERLAY_ENV = "WALKV_BENCH_BEFORE"
"""The environment variable naming a checkout of the tree before the overlay
(``git worktree add /tmp/before-overlay e7c0cec^``) for ``kv.get.before-overlay``."""


class WalkvKV:
    """kvstore behind the same face as the peers (see :mod:`benchmarks.peers`)."""

    name = "walkv"
    requires = KV

    def __init__(self, path: str, sync: bool) -> None:
        import kvstore

        self.db = kvstore.open(path, sync="always" if sync else "none")

    def writer(self) -> Callable[[bytes, bytes], object]:
        return self.db.put

    def reader(self) -> Callable[[bytes], object]:
        return self.db.get

    def write_batch(self, items: Any) -> None:
        with self.db.batch() as b:
            put = b.put
            for k, v in items:
                put(k, v)

    def close(self) -> None:
        self.db.close()


SYSTEMS: dict[str, Any] = {"walkv": WalkvKV, **KV_PEERS}
LABELS = {"walkv": "walkv", "leveldb": "LevelDB", "rocksdb": "RocksDB", "lmdb": "LMDB",
          "sqlite": "SQLite WAL"}


def _open(system: str | type, ctx: Context, sync: bool) -> Any:
    """Open ``system``: a name in :data:`SYSTEMS`, or a class with their face."""
    cls: Any = SYSTEMS[system] if isinstance(system, str) else system
    return cls(ctx.fresh_dir(cls.name), sync)


# ---- generic runs --------------------------------------------------------

def _puts_timed(system: str | type, threads: int, seconds: float, sync: bool = True):
    def run(ctx: Context) -> Measurement:
        db = _open(system, ctx, sync)
        try:
            return threaded_puts(db.writer(), threads, seconds, data.value(0))
        finally:
            db.close()

    return run


def _puts_counted(system: str | type, n: int, sync: bool = False):
    def run(ctx: Context) -> Measurement:
        items = data.items(n)
        db = _open(system, ctx, sync)
        try:
            return counted_puts(db.writer(), items)
        finally:
            db.close()

    return run


def _one_batch(system: str, n: int):
    def run(ctx: Context) -> Measurement:
        items = data.items(n)
        db = _open(system, ctx, sync=True)
        try:
            return counted(lambda: db.write_batch(items) or len(items))
        finally:
            db.close()

    return run


def _async_puts(tasks: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        path = ctx.fresh_dir("walkv")
        v = data.value(0)
        key = data.key

        async def open_() -> Any:
            return await kvstore.open_async(path, sync="always")

        async def op(db: Any, i: int, n: int) -> None:
            await db.put(key(n, i), v)

        async def close(db: Any) -> None:
            await db.close()

        return coroutines(tasks, seconds, open_, op, close)

    return run


def load(db: Any, n: int) -> None:
    """Put keys 0..n-1 in chunks of one batch each (untimed set-up)."""
    for start in range(0, n, LOAD_CHUNK):
        db.write_batch((data.key(i), data.value(i)) for i in range(start, min(n, start + LOAD_CHUNK)))


def _gets(system: str | type, n_keys: int, n_gets: int, per_get_txn: bool = False):
    def prepare(ctx: Context) -> Any:
        db = (SYSTEMS[system] if isinstance(system, str) else system)(os.path.join(ctx.directory, "db"), False)
        load(db, n_keys)
        rnd = random.Random(42)
        order = [data.key(rnd.randrange(n_keys)) for _ in range(n_gets)]
        return db, order

    def run(ctx: Context) -> Measurement:
        db, order = ctx.state
        get = db.reader_txn_per_get() if per_get_txn else db.reader()
        found = get(order[0])
        if found is None or bytes(found) != data.value(int.from_bytes(order[0][8:], "big")):
            raise AssertionError(f"{system}: get returned {found!r} for a loaded key")

        def block() -> int:
            for k in order:
                get(k)
            return len(order)

        return counted(block)

    return prepare, run, (lambda state: state[0].close())


def _walkv_get_many(n_keys: int, n_gets: int):
    """walkv's ``get_many`` over the same random keys as :func:`_gets`."""
    prepare, _run, cleanup = _gets("walkv", n_keys, n_gets)

    def run(ctx: Context) -> Measurement:
        db, order = ctx.state
        values = db.db.get_many(order[:10])
        if values != [data.value(int.from_bytes(k[8:], "big")) for k in order[:10]]:
            raise AssertionError("walkv: get_many returned wrong values for loaded keys")
        return counted(lambda: len(db.db.get_many(order)))

    return prepare, run, cleanup


def child_gets(n_keys: int, n_gets: int, path: str, tree: str | None = None) -> dict[str, Any]:
    """In a benchmark child: the gets of :func:`_gets` against the walkv of
    ``tree`` (a checkout; None: this one), loaded untimed in ``path``."""
    if tree is not None:
        sys.path.insert(0, tree)  # before kvstore is first imported
    db = WalkvKV(path, False)
    try:
        load(db, n_keys)
        rnd = random.Random(42)
        order = [data.key(rnd.randrange(n_keys)) for _ in range(n_gets)]
        get = db.reader()
        if get(order[0]) != data.value(int.from_bytes(order[0][8:], "big")):
            raise AssertionError(f"walkv of {tree or 'this tree'}: a loaded key was not found")

        def gets() -> int:
            for k in order:
                get(k)
            return n_gets
        timed = counted(gets)
    finally:
        db.close()
    return {"ops": timed.ops, "seconds": timed.seconds,
            "kvstore": os.path.dirname(sys.modules["kvstore"].__file__ or "")}


def _gets_in_child(n_keys: int, n_gets: int, tree: str | None) -> Callable[[Context], Measurement]:
    def run(ctx: Context) -> Measurement:
        return in_child("benchmarks.kv_workloads:child_gets", n_keys=n_keys, n_gets=n_gets,
                        path=os.path.join(ctx.fresh_dir("gets"), "db"), tree=tree)
    return run


# ---- recovery ------------------------------------------------------------

def encode_puts(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """One log entry payload putting ``pairs`` (:mod:`kvstore.entry.codec`'s format)."""
    from kvstore.entry.codec import OP_PUT, pack_ops

    return pack_ops([(OP_PUT, k, v) for k, v in pairs])


def _walkv_recovery_prepare(entries: int):
    def prepare(ctx: Context) -> str:
        import kvstore
        import wal

        path = os.path.join(ctx.directory, "template")
        kvstore.open(path, sync="always").close()
        with wal.open(os.path.join(path, "wal"), sync="none") as log:
            chunk: list[bytes] = []
            for i in range(entries):
                chunk.append(encode_puts([(data.key(i), data.value(i))]))
                if len(chunk) == 1000:
                    log.append_batch(chunk)
                    chunk = []
            if chunk:
                log.append_batch(chunk)
            log.sync()
        return path

    return prepare


def _walkv_rebuild_prepare(entries: int):
    """A store of ``entries`` single puts of keys in a random order whose
    LMDB directory is gone (a machine lost it): its next open rebuilds the
    state from the log."""
    def prepare(ctx: Context) -> str:
        import shutil

        import kvstore

        path = os.path.join(ctx.directory, "template")
        with kvstore.open(path, sync="none") as db:
            put = db.put
            for i in data.shuffled(entries):
                put(data.key(i), data.value(i))
        shutil.rmtree(os.path.join(path, "lmdb"))
        return path

    return prepare


def _walkv_recovery(ctx: Context) -> Measurement:
    return in_child_on_copy(ctx, "walkv", "benchmarks.kv_workloads:child_reopen_walkv")


def child_reopen_walkv(path: str) -> dict[str, Any]:
    """In a fresh process: time kvstore.open (replay of the unapplied log),
    then count what it holds (untimed)."""
    import kvstore

    t0 = time.perf_counter()
    db = kvstore.open(path, sync="always")
    seconds = time.perf_counter() - t0
    try:
        n = len(db)
        applied = db.applied_lsn
    finally:
        db.close()
    return {"ops": n, "seconds": seconds, "applied_lsn": applied}


# ---- the workloads -------------------------------------------------------

def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    nosync_n = cfg.size(full=300_000, quick=10_000)
    batch_n = cfg.size(full=100_000, quick=10_000)
    keys_n = cfg.size(full=200_000, quick=10_000)
    gets_n = cfg.size(full=500_000, quick=20_000)
    recover_n = cfg.size(full=1_000_000, quick=20_000)
    peers = ("leveldb", "rocksdb", "sqlite", "lmdb")
    before = os.environ.get(BEFORE_OVERLAY_ENV) or None

    def durable(threads: int, target: float) -> Workload:
        return Workload(
            name=f"kv.put.durable.{threads}t", issue=21 if threads == 8 else 15, unit="puts/s",
            title=f"durable puts, {threads} thread(s)", requires=KV,
            targets=[Target("leveldb", target)], params={"threads": threads, "seconds": secs},
            contenders=[Contender(s, _puts_timed(s, threads, secs), requires=SYSTEMS[s].requires,
                                  label=f"{LABELS[s]} sync put x{threads}")
                        for s in ("walkv", *peers)])

    get_contenders = []
    for s in ("walkv", *peers):
        prep, run, clean = _gets(s, keys_n, gets_n)
        get_contenders.append(Contender(s, run, prepare=prep, cleanup=clean,
                                        requires=SYSTEMS[s].requires, label=f"{LABELS[s]} get"))
    prep, run, clean = _gets("lmdb", keys_n, gets_n, per_get_txn=True)
    get_contenders.append(Contender("lmdb-txn-per-get", run, prepare=prep, cleanup=clean,
                                    requires=LMDB.requires, label="LMDB get, txn per get"))
    prep, run, clean = _walkv_get_many(keys_n, gets_n)
    many_contenders = [Contender("walkv", run, prepare=prep, cleanup=clean, label="walkv get_many")]
    prep, run, clean = _gets("lmdb", keys_n, gets_n)
    many_contenders.append(Contender("lmdb", run, prepare=prep, cleanup=clean, requires=LMDB.requires,
                                     label="LMDB get, one read txn"))
    return [
        durable(8, 1.2),
        durable(1, 0.9),
        Workload(
            name="kv.put.async256", issue=21, unit="puts/s",
            title="durable puts from 256 coroutines (open_async) vs LevelDB from 32 threads",
            requires=("kvstore:open_async",), targets=[Target("leveldb-32t", 4.0)],
            params={"coroutines": 256, "peer_threads": 32, "seconds": secs},
            contenders=[
                Contender("walkv", _async_puts(256, secs), label="walkv async put x256"),
                Contender("leveldb-32t", _puts_timed("leveldb", 32, secs),
                          requires=LevelDB.requires, label="LevelDB sync put x32"),
                Contender("rocksdb-32t", _puts_timed("rocksdb", 32, secs),
                          requires=SYSTEMS["rocksdb"].requires, label="RocksDB sync put x32"),
            ]),
        Workload(
            name="kv.put.nosync.1t", issue=21, unit="puts/s",
            title="non-durable puts (sync=none), 1 thread", requires=KV,
            targets=[Target("leveldb", 0.5)], params={"items": nosync_n},
            contenders=[Contender(s, _puts_counted(s, nosync_n), requires=SYSTEMS[s].requires,
                                  label=f"{LABELS[s]} put" + (" (txn per put, sync=False)"
                                                               if s == "lmdb" else ""))
                        for s in ("walkv", *peers)]),
        Workload(
            name="kv.batch.100k", issue=21, unit="puts/s",
            title=f"one durable batch of {batch_n:,} puts", requires=KV,
            targets=[Target("leveldb", 1.0)], params={"items": batch_n},
            contenders=[Contender(s, _one_batch(s, batch_n), requires=SYSTEMS[s].requires,
                                  label=f"{LABELS[s]} batch") for s in ("walkv", *peers)]),
        Workload(
            name="kv.get", issue=21, unit="gets/s",
            title=f"gets of existing keys ({keys_n:,} keys, {gets_n:,} random gets)", requires=KV,
            targets=[Target("lmdb", 1.0)], params={"keys": keys_n, "gets": gets_n},
            contenders=get_contenders),
        Workload(
            name="kv.get.before-overlay", issue=21, unit="gets/s",
            title=f"gets as kv.get, in a fresh process each, vs the tree before the overlay "
                  f"(${BEFORE_OVERLAY_ENV}{'' if before else ' unset: walkv only'})",
            requires=KV, targets=[Target("before-overlay", 1.1)], params={"keys": keys_n, "gets": gets_n},
            contenders=[Contender("walkv", _gets_in_child(keys_n, gets_n, None), label="walkv get (this tree)"),
                        *([Contender("before-overlay", _gets_in_child(keys_n, gets_n, before),
                                     label=f"walkv get ({before})")] if before else [])]),
        Workload(
            name="kv.get.many", issue=15, unit="gets/s",
            title=f"get_many of existing keys ({keys_n:,} keys, {gets_n:,} random keys in one call)",
            requires=KV, targets=[Target("lmdb", 1.0)], params={"keys": keys_n, "gets": gets_n},
            contenders=many_contenders),
        Workload(
            name="kv.recovery", issue=21, unit="records/s",
            title=f"reopen with {recover_n:,} unapplied log entries vs LevelDB reopen replay",
            requires=KV + ("wal:open",), targets=[Target("leveldb-replay", 0.6)],
            limits=[Limit("rss_mb", 200.0)], params={"entries": recover_n},
            contenders=[
                Contender("walkv", _walkv_recovery, prepare=_walkv_recovery_prepare(recover_n),
                          label="walkv reopen + apply"),
                Contender("leveldb-replay", _leveldb_replay,
                          prepare=_leveldb_replay_prepare(recover_n), requires=LevelDB.requires,
                          label="LevelDB reopen replay"),
            ]),
        Workload(
            name="kv.rebuild.random", issue=37, unit="records/s",
            title=f"rebuild of LMDB lost, from a log of {recover_n:,} single puts of keys in a random order, "
                  "vs LevelDB reopen replay",
            requires=KV, targets=[Target("leveldb-replay", 0.8)], limits=[Limit("rss_mb", 300.0)],
            params={"entries": recover_n},
            contenders=[
                Contender("walkv", _walkv_recovery, prepare=_walkv_rebuild_prepare(recover_n),
                          label="walkv reopen + rebuild"),
                Contender("leveldb-replay", _leveldb_replay,
                          prepare=_leveldb_replay_prepare(recover_n, shuffled=True), requires=LevelDB.requires,
                          label="LevelDB reopen replay"),
            ]),
    ]


__all__ = ["workloads", "WalkvKV", "load"]
