"""``walkv demo``: the main job, end to end, on a throw-away directory.

Steps (each prints what it did; a check that fails stops the demo, exit 1):

1. Workload: several threads write a small shop (users, orders, atomic
   batches, deletes) with ``sync="always"``; they share fsyncs (group commit).
   The store must then equal the model each thread kept of its own keys.
2. Crash: a writer subprocess writes from several threads, printing each
   write once ``put`` returned (acknowledged, so fsynced); it is killed with
   SIGKILL mid-stream. Reopening recovers (a torn tail is cut, unapplied
   entries are replayed) and every acknowledged write must be there, each
   thread's writes a gap-free prefix.
3. Machine crash: LMDB is thrown away, as if a power loss had damaged it;
   reopening rebuilds it from the log alone (a full replay), and it must
   equal the store before.
4. Snapshot: ``db.snapshot()`` at one LSN, and the log segments it covers
   are trimmed.
5. Point-in-time restore: more writes, then an accidental ``delete_range``
   of every order; ``kvstore.restore(store, new, to_lsn=N)`` to the LSN just
   before it must give back the store exactly as it was then.
6. Spark (when pyspark and Java are there, and not ``--no-spark``): export
   snapshot, changes and state as Parquet in local mode; the state table
   must hold exactly the store's keys.

Directory (``./demo-store`` by default; wiped first, but only if it is empty
or a previous demo made it, which the marker file says)::

    DIR/.walkv-demo   marker
    DIR/store/        the store
    DIR/restored/     the point-in-time restore
    DIR/export/       Parquet (snapshot/, changes/, state/)

``--small`` (or ``WALKV_DEMO_SMALL=1``) sizes it for CI: well under a minute
without Spark, under two with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvstore.cli.common import EXIT_OK, CliError, human_bytes
from kvstore.cli.admin import export_rows, spark_available, spark_env, take_snapshot
from kvstore.cli.demo_work import (
    FULL,
    SMALL,
    DemoFailed,
    crash_values,
    digest,
    dir_bytes,
    new_user,
    run_and_kill,
    worker,
)
from kvstore.cli.progress import Reporter

DESCRIPTION = (
    "The main job, end to end: a multi-threaded durable workload with group commit, a writer "
    "process killed with SIGKILL and recovered, LMDB rebuilt from the log, a snapshot that trims "
    "the log, a point-in-time restore, and (with pyspark and Java) a Spark export to Parquet. "
    "Ends with a table of what it measured. DIR (default ./demo-store) is wiped first if a "
    "previous demo made it."
)
MARKER = ".walkv-demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", nargs="?", default="demo-store",
                   help="working directory (default ./demo-store; wiped first if a demo made it)")
    p.add_argument("--small", action="store_true", default=bool(os.environ.get("WALKV_DEMO_SMALL")),
                   help="CI sizing (also WALKV_DEMO_SMALL=1)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark export step")
    p.add_argument("--threads", type=int, help="writer threads in step 1 (default 8, 4 with --small)")
    p.add_argument("--master", default="local[2]", help="Spark master for step 6 (default local[2])")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")


# -- the demo -----------------------------------------------------------------------------------


@dataclass
class Summary:
    rows: list[tuple[str, str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: Any, text: str, label: str | None = None) -> None:
        self.data[name] = value
        self.rows.append((label or name.replace("_", " "), text))


def _prepare_dir(path: str) -> str:
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise CliError(f"{path} exists and is not a directory")
        entries = os.listdir(path)
        if entries and MARKER not in entries:
            raise CliError(f"{path} is not empty and was not made by `walkv demo`; give an empty or new "
                           "directory (the demo wipes its directory first)")
        shutil.rmtree(path)
    os.makedirs(path, mode=0o700)
    with open(os.path.join(path, MARKER), "w") as fh:
        fh.write("made by `walkv demo`; the next demo run wipes this directory\n")
    return path


def _step(n: int, total: int, text: str) -> None:
    print(f"\n[{n}/{total}] {text}", flush=True)


def _say(text: str) -> None:
    print(f"      {text}", flush=True)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise DemoFailed(f"demo check failed: {what}")
    _say(f"ok: {what}")


def cmd_demo(args: argparse.Namespace, rep: Reporter) -> int:
    import kvstore

    size = SMALL if args.small else FULL
    threads = args.threads or size.threads
    if threads < 1:
        raise CliError("--threads must be at least 1", 2)
    spark_why = "--no-spark" if args.no_spark else spark_available()
    steps = 6
    root = _prepare_dir(args.dir)
    store = os.path.join(root, "store")
    summary = Summary()
    seed = 20240601
    t_demo = time.monotonic()
    print(f"walkv demo in {root} ({'small' if args.small else 'full'} size)")

    # 1. workload ---------------------------------------------------------------------
    ops = size.ops_per_thread
    _step(1, steps, f"workload: {threads} threads, {threads * ops} operations, sync=\"always\" (group commit)")
    models: list[dict[bytes, bytes]] = [{} for _ in range(threads)]
    counters = {"puts": 0, "batches": 0, "deletes": 0, "reads": 0}
    errors: list[BaseException] = []
    db = kvstore.open(store, sync="always", segment_bytes=size.segment_bytes)
    try:
        with rep.task("workload", threads * ops, "ops") as progress:
            done = [0]
            lock = threading.Lock()

            def tick(n: int) -> None:
                with lock:
                    done[0] += n
                    progress(done[0], threads * ops)

            workers = [threading.Thread(target=worker, args=(db, t, threads, ops, seed, models[t], counters,
                                                              errors, tick)) for t in range(threads)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - t0
        if errors:
            raise DemoFailed(f"workload thread failed: {errors[0]!r}")
        st = db.stats()["log"]
        writes = st["appends"]
        model = {k: v for m in models for k, v in m.items()}
        _say(f"{counters['puts']} puts, {counters['batches']} batches, {counters['deletes']} deletes, "
             f"{counters['reads']} reads in {elapsed:.2f} s")
        _say(f"{writes} durable writes ({writes / elapsed:,.0f}/s) shared {st['fsyncs']} fsyncs: "
             f"{st['avg_group']:.1f} writes per fsync on average, {st['max_group']} at most, "
             f"fsync p50 {st['fsync_p50_ms']:.2f} ms")
        _check(dict(db.scan()) == model, f"the store holds exactly the {len(model)} keys the threads wrote")
        summary.add("entries", writes, f"{writes} from the workload (LSN 1..{db.last_lsn}; one per put, "
                    "delete or batch)", "entries")
        summary.add("durable_writes_per_s", round(writes / elapsed), f"{writes / elapsed:,.0f} durable writes/s "
                    f"({threads} threads, sync=always, each fsynced before it returned)", "durable puts/s")
        summary.add("fsyncs", st["fsyncs"], f"{st['fsyncs']} for {writes} writes (p50 {st['fsync_p50_ms']:.2f} ms, "
                    f"p99 {st['fsync_p99_ms']:.2f} ms)", "fsyncs")
        summary.add("avg_group", round(st["avg_group"], 2), f"{st['avg_group']:.1f} writes per fsync "
                    f"(group commit; {st['max_group']} at most)", "average group size")
    finally:
        db.close()

    # 2. crash a writer process ---------------------------------------------------------
    _step(2, steps, f"crash: a writer process with {size.crash_threads} threads, killed with SIGKILL mid-stream")
    acked = run_and_kill(store, size, seed, rep)
    ack_count = sum(acked.values())
    _say(f"killed the writer after {ack_count} acknowledged writes")
    t0 = time.perf_counter()
    with rep.task("recovering", unit="entries") as progress:
        db = kvstore.open(store, sync="always", segment_bytes=size.segment_bytes, progress=progress)
    recovery_s = time.perf_counter() - t0
    try:
        lst = db.stats()
        cut = lst["log"].get("dropped_bytes_at_open", 0)
        _say(f"reopened in {recovery_s * 1000:.0f} ms: replayed {lst.get('replayed_at_open', 0)} entries, "
             f"cut a torn tail of {cut} bytes; log ends at LSN {db.last_lsn}")
        expected = crash_values(size.crash_threads, seed, acked)
        present = {k: v for k, v in db.scan(prefix=b"crash:")}
        lost = [k for k, v in expected.items() if present.get(k) != v]
        _check(not lost, f"all {len(expected)} acknowledged writes survived"
               + (f" (lost: {lost[:3]})" if lost else ""))
        prefix_ok = True
        for t in range(size.crash_threads):
            mine = sorted(int(k.split(b":")[2]) for k in present if k.startswith(f"crash:{t:02d}:".encode()))
            prefix_ok &= mine == list(range(len(mine)))
        _check(prefix_ok, "each writer thread's surviving writes are a gap-free prefix of what it sent "
                          f"({len(present) - len(expected)} more were durable but not yet acknowledged)")
        _check({k: v for k, v in db.scan() if not k.startswith(b"crash:")} == model,
               "the workload's keys are untouched")
        model.update(present)
        summary.add("recovery_time_s", round(recovery_s, 4), f"{recovery_s * 1000:.0f} ms to reopen after SIGKILL "
                    f"({lst.get('replayed_at_open', 0)} entries replayed, {cut} torn bytes cut, "
                    f"{len(expected)} acknowledged writes checked)", "recovery time")
        before = digest(db)
        last = db.last_lsn
    finally:
        db.close()

    # 3. machine crash: LMDB lost, rebuilt from the log --------------------------------
    _step(3, steps, "machine crash: throw LMDB away and rebuild it from the log alone")
    shutil.rmtree(os.path.join(store, "lmdb"))
    store_log = logging.getLogger("walkv.store")
    level = store_log.level
    store_log.setLevel(logging.ERROR)  # its "rebuilding LMDB" warning is what this step expects
    try:
        t0 = time.perf_counter()
        with rep.task("replaying the whole log", last, "entries") as progress:
            db = kvstore.open(store, sync="always", segment_bytes=size.segment_bytes, progress=progress)
        rebuild_s = time.perf_counter() - t0
    finally:
        store_log.setLevel(level)
    try:
        _say(f"rebuilt LMDB from {last} log entries in {rebuild_s:.2f} s ({last / rebuild_s:,.0f} entries/s)")
        _check(digest(db) == before, f"the rebuilt store equals the store before ({before[0]} keys)")
        summary.add("full_replay_entries_per_s", round(last / rebuild_s), f"{last / rebuild_s:,.0f} entries/s "
                    f"(LMDB rebuilt from {last} log entries in {rebuild_s:.2f} s)", "full replay")

        # 4. snapshot and trim -----------------------------------------------------------
        _step(4, steps, "snapshot: one consistent copy at an LSN; the log it covers is trimmed")
        wal_before = dir_bytes(os.path.join(store, "wal"))
        segs_before = len([n for n in os.listdir(os.path.join(store, "wal")) if n.endswith(".wal")])
        t0 = time.perf_counter()
        with rep.task("writing snapshot", unit="pairs") as progress:
            info = take_snapshot(db, progress)
        snap_s = time.perf_counter() - t0
        wal_after = dir_bytes(os.path.join(store, "wal"))
        segs_after = len([n for n in os.listdir(os.path.join(store, "wal")) if n.endswith(".wal")])
        trimmed = max(0, wal_before - wal_after)
        _say(f"snapshot at LSN {info.lsn}: {getattr(info, 'count', '?')} pairs, "
             f"{human_bytes(getattr(info, 'bytes', 0))}, {getattr(info, 'chunks', '?')} chunks in {snap_s:.2f} s")
        _say(f"log: {segs_before} segments ({human_bytes(wal_before)}) -> {segs_after} "
             f"({human_bytes(wal_after)}), {human_bytes(trimmed)} trimmed")
        import snapshot as snapshot_pkg

        snap = snapshot_pkg.open(info.path)
        snap.verify()
        _check(snap.lsn == info.lsn and dict(snap) == dict(db.scan()),
               "the snapshot verifies and equals the store at its LSN")
        _check(segs_after < segs_before, "whole segments covered by the snapshot were deleted")
        summary.add("bytes_trimmed", trimmed, f"{human_bytes(trimmed)} of log ({segs_before - segs_after} "
                    f"segments) after the snapshot at LSN {info.lsn}", "bytes trimmed")

        # 5. point-in-time restore ----------------------------------------------------------
        _step(5, steps, "point-in-time restore: undo an accidental delete of every order")
        rng = random.Random(seed + 99)
        for i in range(size.after_snapshot):
            uid = rng.randrange(threads * 200)
            db.put(f"user:{uid:06d}".encode(), new_user(uid, rng))
        good_lsn = db.last_lsn
        good = digest(db)
        orders = sum(1 for _ in db.scan(prefix=b"order:"))
        bad_lsn = db.delete_range(b"order:", b"order;")
        db.put(b"deploy:last", b"v2.0.1 (the one with the bug)")
        _say(f"{size.after_snapshot} more writes up to LSN {good_lsn}; LSN {bad_lsn} deleted all {orders} orders "
             f"({sum(1 for _ in db.scan(prefix=b'order:'))} left)")
    finally:
        db.close()
    restore = getattr(kvstore, "restore", None)
    if restore is None:
        raise DemoFailed("step 5 is not available yet: kvstore.restore() is missing in this build")
    target = os.path.join(root, "restored")
    t0 = time.perf_counter()
    with rep.task("restoring", unit="") as progress:
        _call(restore, store, target, to_lsn=good_lsn, progress=progress)
    restore_s = time.perf_counter() - t0
    with kvstore.open(target, readonly=True) as rdb:
        restored = digest(rdb)
        r_orders = sum(1 for _ in rdb.scan(prefix=b"order:"))
        r_applied = rdb.applied_lsn
    _say(f"restored to LSN {good_lsn} in {restore_s:.2f} s: snapshot at LSN {info.lsn} + "
         f"{good_lsn - info.lsn} log entries")
    _check(restored == good and r_orders == orders and r_applied == good_lsn,
           f"the restored store equals the store at LSN {good_lsn} ({good[0]} keys, all {orders} orders back)")
    summary.add("restore_time_s", round(restore_s, 3), f"{restore_s:.2f} s to LSN {good_lsn} "
                f"(snapshot + {good_lsn - info.lsn} entries)", "point-in-time restore")

    # 6. Spark export -------------------------------------------------------------------------
    _step(6, steps, "Spark: export snapshot, changes and state to Parquet (local mode)")
    if spark_why:
        _say(f"skipped: {spark_why}")
        summary.add("rows_exported", None, f"skipped ({spark_why})", "rows exported")
    else:
        _spark_step(store, os.path.join(root, "export"), args.master, summary, rep)

    total_s = time.monotonic() - t_demo
    summary.add("demo_time_s", round(total_s, 1), f"{total_s:.1f} s", "total time")
    print("\nsummary")
    width = max(len(k) for k, _ in summary.rows)
    for k, v in summary.rows:
        print(f"  {k:<{width}}  {v}")
    print(f"\nfiles are in {root} (try: walkv stats {store}; walkv verify {store})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary.data, fh, indent=2)
    return EXIT_OK


def _call(fn: Any, *args: Any, progress: Any = None, **kwargs: Any) -> Any:
    """Call a teammate's API, passing ``progress`` only if it takes one."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "progress" in params:
        kwargs["progress"] = progress
    return fn(*args, **kwargs)


def _spark_step(store: str, out: str, master: str, summary: Summary, rep: Reporter) -> None:
    import kvstore

    try:
        from kvstore.spark.export import export
    except ImportError as e:
        raise DemoFailed(f"step 6 is not available yet: kvstore.spark.export.export is missing ({e})") from None
    spark_env(master)
    t0 = time.perf_counter()
    with rep.task("Spark export", unit="") as progress:
        result = _call(export, store, out, master=master, table="all", incremental=False, progress=progress)
    spark_s = time.perf_counter() - t0
    rows = export_rows(result)
    with kvstore.open(store, readonly=True) as db:
        keys = len(db)
    for table, n in rows.items():
        _say(f"{table}: {n} rows")
    if "state" in rows:
        _check(rows["state"] == keys, f"the exported state has exactly the store's {keys} keys")
    total = sum(rows.values())
    summary.add("rows_exported", total, f"{total} rows ({', '.join(f'{k} {v}' for k, v in rows.items())}) "
                f"in {spark_s:.1f} s", "rows exported")
