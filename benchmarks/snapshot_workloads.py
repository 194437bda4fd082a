"""Issue 4 workloads: snapshots and restore against bare py-lmdb, 1,000,000
entries (20,000 in --quick) of 16-byte keys and 100-byte values.

Every timed run happens in a fresh process, which reports its peak RSS
before the timed part and after it; the difference is the memory growth
(limit: 100 MB).

* ``snap.create``: ``db.snapshot()`` of a store holding N entries (one put
  first so each repeat snapshots a new LSN) vs a py-lmdb cursor scan of an
  LMDB holding the same N items: >= 0.25x entries/s.
* ``snap.restore``: ``kvstore.restore(store, target)`` of that snapshot (no
  log tail) vs py-lmdb ``putmulti(append=True)`` of the same N items, streamed
  from a cursor over the source LMDB into a new environment: >= 0.25x.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Context, Contender, Limit, Measurement, Target, Workload
from benchmarks.kv_workloads import WalkvKV, load
from benchmarks.peers import LMDB
from benchmarks.child import peak_rss_mb
from benchmarks.timing import in_child

SNAP = ("kvstore:open", "kvstore:restore", "snapshot")


def _peak_mb() -> float:
    return peak_rss_mb()


def take_snapshot(db: Any) -> Any:
    """``db.snapshot()`` (DESIGN section 9), or kvstore.snapshots.take(db)
    while the method is not on KVStore yet."""
    method = getattr(db, "snapshot", None)
    if method is not None:
        return method()
    from kvstore.snapshots import take

    return take(db)


def _store_prepare(entries: int, snapshot: bool):
    def prepare(ctx: Context) -> str:
        path = os.path.join(ctx.directory, "store")
        db = WalkvKV(path, sync=False)
        try:
            load(db, entries)
            if snapshot:
                take_snapshot(db.db)
        finally:
            db.close()
        return path

    return prepare


def _lmdb_prepare(entries: int):
    def prepare(ctx: Context) -> str:
        path = os.path.join(ctx.directory, "lmdb")
        db = LMDB(path, sync=False)
        try:
            load(db, entries)
        finally:
            db.close()
        return path

    return prepare


def child_snapshot_walkv(path: str, n: int) -> dict[str, Any]:
    import kvstore

    db = kvstore.open(path, sync="always")
    try:
        db.put(b"snapshot-bench-tick", str(time.time()).encode())
        before = _peak_mb()
        t0 = time.perf_counter()
        info = take_snapshot(db)
        seconds = time.perf_counter() - t0
        after = _peak_mb()
    finally:
        db.close()
    return {"ops": n, "seconds": seconds, "rss_growth_mb": after - before,
            "snapshot_lsn": getattr(info, "lsn", None)}


def child_scan_lmdb(path: str) -> dict[str, Any]:
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, map_size=8 << 30)
    try:
        before = _peak_mb()
        t0 = time.perf_counter()
        n = 0
        with env.begin() as txn:
            for _k, _v in txn.cursor():
                n += 1
        seconds = time.perf_counter() - t0
        after = _peak_mb()
    finally:
        env.close()
    return {"ops": n, "seconds": seconds, "rss_growth_mb": after - before}


def child_restore_walkv(source: str, target: str, n: int) -> dict[str, Any]:
    import kvstore

    before = _peak_mb()
    t0 = time.perf_counter()
    kvstore.restore(source, target)
    seconds = time.perf_counter() - t0
    after = _peak_mb()
    return {"ops": n, "seconds": seconds, "rss_growth_mb": after - before}


def child_putmulti_lmdb(source: str, target: str) -> dict[str, Any]:
    import lmdb

    src = lmdb.open(source, readonly=True, lock=False, map_size=8 << 30)
    dst = lmdb.open(target, map_size=8 << 30)
    try:
        before = _peak_mb()
        t0 = time.perf_counter()
        with src.begin() as rtxn, dst.begin(write=True) as wtxn:
            consumed, added = wtxn.cursor().putmulti(rtxn.cursor().iternext(), append=True)
        seconds = time.perf_counter() - t0
        after = _peak_mb()
    finally:
        dst.close()
        src.close()
    return {"ops": added, "seconds": seconds, "rss_growth_mb": after - before}


def _in_child_fresh(ctx: Context, function: str, **kwargs: Any) -> Measurement:
    out = os.path.join(ctx.fresh_dir("restore"), "target")
    try:
        return in_child(function, target=out, **kwargs)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def workloads(cfg: Config) -> list[Workload]:
    n = cfg.size(full=1_000_000, quick=20_000)
    growth = [Limit("rss_growth_mb", 100.0)]
    return [
        Workload(
            name="snap.create", issue=4, unit="entries/s",
            title=f"snapshot creation of {n:,} entries vs py-lmdb cursor scan", requires=SNAP,
            targets=[Target("lmdb-scan", 0.25)], limits=growth, params={"entries": n},
            contenders=[
                Contender("walkv", lambda ctx: in_child(
                    "benchmarks.snapshot_workloads:child_snapshot_walkv", path=ctx.state, n=n),
                    prepare=_store_prepare(n, snapshot=False), label="walkv db.snapshot()"),
                Contender("lmdb-scan", lambda ctx: in_child(
                    "benchmarks.snapshot_workloads:child_scan_lmdb", path=ctx.state),
                    prepare=_lmdb_prepare(n), requires=LMDB.requires, label="py-lmdb cursor scan"),
            ]),
        Workload(
            name="snap.restore", issue=4, unit="entries/s",
            title=f"restore of {n:,} entries vs py-lmdb putmulti", requires=SNAP,
            targets=[Target("lmdb-putmulti", 0.25)], limits=growth, params={"entries": n},
            contenders=[
                Contender("walkv", lambda ctx: _in_child_fresh(
                    ctx, "benchmarks.snapshot_workloads:child_restore_walkv", source=ctx.state, n=n),
                    prepare=_store_prepare(n, snapshot=True), label="walkv kvstore.restore"),
                Contender("lmdb-putmulti", lambda ctx: _in_child_fresh(
                    ctx, "benchmarks.snapshot_workloads:child_putmulti_lmdb", source=ctx.state),
                    prepare=_lmdb_prepare(n), requires=LMDB.requires,
                    label="py-lmdb putmulti(append)"),
            ]),
    ]
