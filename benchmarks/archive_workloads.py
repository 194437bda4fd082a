"""Issue 12 workloads: the archive.

* ``archive.put.durable.8t``: durable puts/s from 8 threads for a fixed time
  with ``archive=`` (a local directory, shipping every second) vs the same
  store without: >= 0.95x (archiving runs beside the writers, off their
  commit path).
* ``archive.restore``: ``kvstore.restore`` of N entries (1,000,000; 20,000
  with --quick; 16-byte keys, 100-byte values, loaded in batches, no
  snapshot) from a ``file://`` archive vs from the local store it was
  shipped from: >= 0.5x entries/s.

Every restore runs in a fresh process (:func:`benchmarks.timing.in_child`).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.kv_workloads import WalkvKV, load
from benchmarks.timing import in_child, threaded

ARCH = ("kvstore:open", "kvstore:restore", "kvstore.archive:Archiver", "kvstore.archiving:restore")


def _puts(archive: bool, threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        d = ctx.fresh_dir("archive" if archive else "plain")
        options: dict[str, Any] = {"archive": os.path.join(d, "arch")} if archive else {}
        db = kvstore.open(os.path.join(d, "store"), sync="always", **options)
        try:
            v = data.value(0)

            def make(i: int):
                put, key = db.put, data.key
                return lambda n: put(key(n, i), v)

            m = threaded(threads, seconds, make)
            if archive:
                m.extra["archived_lsn"] = db.flush_archive(timeout=60)
            return m
        finally:
            db.close()
            shutil.rmtree(d, ignore_errors=True)

    return run


def _prepare_archived(n: int):
    def prepare(ctx: Context) -> dict[str, str]:
        from kvstore.archive import Archiver

        store = os.path.join(ctx.directory, "store")
        arch = os.path.join(ctx.directory, "arch")
        db = WalkvKV(store, sync=False)
        try:
            load(db, n)
            db.db.sync()
        finally:
            db.close()
        archiver = Archiver(store, arch)
        archiver.ship_once()
        archiver.stop()
        return {"store": store, "uri": "file://" + os.path.abspath(arch)}

    return prepare


def child_restore(source: str, target: str, n: int) -> dict[str, Any]:
    import kvstore

    t0 = time.perf_counter()
    info = kvstore.restore(source, target)
    return {"ops": info.count, "seconds": time.perf_counter() - t0, "lsn": info.lsn}


def _restore(ctx: Context, which: str, n: int) -> Measurement:
    out = os.path.join(ctx.fresh_dir("restore"), "target")
    try:
        return in_child("benchmarks.archive_workloads:child_restore", source=ctx.state[which], target=out, n=n)
    finally:
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    n = cfg.size(full=1_000_000, quick=20_000)
    prepare = _prepare_archived(n)
    return [
        Workload(
            name="archive.put.durable.8t", issue=12, unit="puts/s",
            title="durable puts, 8 threads, archive= (local directory) on vs off", requires=ARCH,
            targets=[Target("no-archive", 0.95)], params={"threads": 8, "seconds": secs},
            contenders=[
                Contender("walkv", _puts(True, 8, secs), label="walkv put x8, archive= on"),
                Contender("no-archive", _puts(False, 8, secs), label="walkv put x8, no archive"),
            ]),
        Workload(
            name="archive.restore", issue=12, unit="entries/s",
            title=f"restore of {n:,} entries from a file:// archive vs from the local store", requires=ARCH,
            targets=[Target("local-store", 0.5)], params={"entries": n},
            contenders=[
                Contender("walkv", lambda ctx: _restore(ctx, "uri", n), prepare=prepare,
                          label="kvstore.restore(file:// archive)"),
                Contender("local-store", lambda ctx: _restore(ctx, "store", n), prepare=prepare,
                          label="kvstore.restore(local store)"),
            ]),
    ]
