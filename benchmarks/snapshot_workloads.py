"""Issue 4 workloads: snapshots and restore against bare py-lmdb, 1,000,000
entries (20,000 in --quick) of 16-byte keys and 100-byte values.

Every timed run happens in a fresh process. Memory growth (limit: 100 MB)
is the peak of the process's anonymous memory (RssAnon, sampled every 5 ms)
during the timed part minus its value just before: LMDB maps its file, so
the pages a scan or a load touches count in RSS as page cache, for the peer as
much as for walkv; both numbers are in the JSON (``rss_growth_mb`` the limit's,
``hwm_growth_mb`` the peak-RSS one).

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

from benchmarks.child import AnonPeak, peak_rss_mb
from benchmarks.harness import Config, Contender, Context, Limit, Measurement, Target, Workload
from benchmarks.kv_workloads import WalkvKV, load
from benchmarks.peers import LMDB
from benchmarks.timing import in_child

SNAP = ("kvstore:open", "kvstore:restore", "snapshot")


def _peak_mb() -> float:
    return peak_rss_mb()


def store_prepare(entries: int, snapshot: bool, chunk_bytes: int | None = None):
    """A prepare step: a store holding ``entries`` entries (and a snapshot of
    them, in chunks of ``chunk_bytes``, when ``snapshot``)."""
    def prepare(ctx: Context) -> str:
        path = os.path.join(ctx.directory, "store")
        db = WalkvKV(path, sync=False)
        try:
            load(db, entries)
            if snapshot:
                db.db.snapshot(chunk_bytes=chunk_bytes)
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


class _Timed:
    """Time a block and measure its memory growth (see the module docstring)."""

    def __enter__(self) -> "_Timed":
        self.hwm_before = _peak_mb()
        self.anon = AnonPeak().__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.anon.__exit__(*exc)
        self.hwm_growth = _peak_mb() - self.hwm_before

    def result(self, ops: int, **extra: Any) -> dict[str, Any]:
        return {"ops": ops, "seconds": self.seconds, "rss_growth_mb": self.anon.growth_mb,
                "hwm_growth_mb": self.hwm_growth, **extra}


def child_snapshot_walkv(path: str, n: int) -> dict[str, Any]:
    import kvstore

    db = kvstore.open(path, sync="always")
    try:
        db.put(b"snapshot-bench-tick", str(time.time()).encode())
        with _Timed() as t:
            info = db.snapshot()
    finally:
        db.close()
    return t.result(n, snapshot_lsn=info.lsn)


def child_scan_lmdb(path: str) -> dict[str, Any]:
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, map_size=8 << 30)
    try:
        n = 0
        with _Timed() as t:
            with env.begin() as txn:
                for _k, _v in txn.cursor():
                    n += 1
    finally:
        env.close()
    return t.result(n)


def child_restore_walkv(source: str, target: str, n: int) -> dict[str, Any]:
    import kvstore

    with _Timed() as t:
        kvstore.restore(source, target)
    return t.result(n)


def child_putmulti_lmdb(source: str, target: str) -> dict[str, Any]:
    import lmdb

    src = lmdb.open(source, readonly=True, lock=False, map_size=8 << 30)
    dst = lmdb.open(target, map_size=8 << 30)
    try:
        with _Timed() as t:
            with src.begin() as rtxn, dst.begin(write=True) as wtxn:
                _consumed, added = wtxn.cursor().putmulti(rtxn.cursor().iternext(), append=True)
    finally:
        dst.close()
        src.close()
    return t.result(added)


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
                    prepare=store_prepare(n, snapshot=False), label="walkv db.snapshot()"),
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
                    prepare=store_prepare(n, snapshot=True), label="walkv kvstore.restore"),
                Contender("lmdb-putmulti", lambda ctx: _in_child_fresh(
                    ctx, "benchmarks.snapshot_workloads:child_putmulti_lmdb", source=ctx.state),
                    prepare=_lmdb_prepare(n), requires=LMDB.requires,
                    label="py-lmdb putmulti(append)"),
            ]),
    ]
