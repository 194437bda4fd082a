"""``walkv demo``: the main job, end to end, on a throw-away directory.

Steps (each prints what it did; a check that fails stops the demo, exit 1):

1. Workload: several threads write a small shop (users, orders, atomic
   batches, deletes) with ``sync="always"``; they share fsyncs (group commit).
   The store must then equal the model each thread kept of its own keys.
   Every open of the store in the demo archives it (``archive=DIR/archive``,
   a local directory: the embedded default), in a thread of the store.
2. Crash: a writer subprocess writes from several threads, printing each
   write once ``put`` returned (acknowledged, so fsynced); it is killed with
   SIGKILL mid-stream. Reopening recovers (a torn tail is cut, unapplied
   entries are replayed) and every acknowledged write must be there, each
   thread's writes a gap-free prefix.
3. Machine crash: LMDB is thrown away, as if a power loss had damaged it;
   reopening rebuilds it from the log alone (a full replay), and it must
   equal the store before.
4. Snapshot: ``db.snapshot()`` at one LSN, and the log segments it covers
   (and the archive holds) are trimmed; the snapshot is archived too.
5. Point-in-time restore from the archive: more writes, then an accidental
   ``delete_range`` of every order; the store is closed (which ships the
   rest to the archive) and its directory deleted, as if the disk were lost.
   ``kvstore.restore(archive, new, to_time=T)`` to a time just before the
   accident must give back the store exactly as it was then; a restore of
   the whole archive must give back the store as it was at close: every
   acknowledged write.
6. Spark (when pyspark and Java are there, and not ``--no-spark``): export
   snapshot, changes and state as Parquet in local mode; the state table
   must hold exactly the store's keys.

Directory (``./demo-store`` by default; wiped first, but only if it is empty
or a previous demo made it, which the marker file says)::

    DIR/.walkv-demo   marker
    DIR/store/        the store (in the end: restored from the archive)
    DIR/archive/      its archive (log objects and snapshots)
    DIR/restored/     the point-in-time restore (from the archive, by time)
    DIR/export/       Parquet (snapshot/, changes/, state/)

``--small`` (or ``WALKV_DEMO_SMALL=1``) sizes it for CI: well under a minute
without Spark, under two with it.

The workload and the crash child are :mod:`kvstore.cli.demo_work`; what the
demo prints as it goes and the closing table are :mod:`kvstore.cli.demo_report`.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import logging
import os
import random
import shutil
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from kvstore.cli.admin import export_rows, spark_env, spark_missing
from kvstore.cli.common import EXIT_OK, EXIT_USAGE, CliError, dir_bytes, human_bytes
from kvstore.cli.demo_report import DemoReport
from kvstore.cli.demo_work import FULL, SMALL, DemoFailed, Size, crash_values, digest, new_user, run_and_kill, worker
from kvstore.cli.progress import Reporter
from kvstore.layout import StoreLayout

if TYPE_CHECKING:
    from kvstore.store.store import KVStore
    from snapshot import SnapshotInfo

DESCRIPTION = (
    "The main job, end to end: a multi-threaded durable workload with group commit, a writer "
    "process killed with SIGKILL and recovered, LMDB rebuilt from the log, a snapshot that trims "
    "the log, an archive the store ships itself to, the store deleted and restored from the archive to a "
    "time before an accidental delete, and (with pyspark and Java) a Spark export to Parquet. "
    "Ends with a table of what it measured. DIR (default ./demo-store) is wiped first if a "
    "previous demo made it."
)
MARKER = ".walkv-demo"
STEPS = 6
FEED_CHANGES = 20
"""Writes step 6 makes after the restore, for the change feed to export."""
SEED = 20240601


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", nargs="?", default="demo-store",
                   help="working directory (default ./demo-store; wiped first if a demo made it)")
    p.add_argument("--small", action="store_true", default=bool(os.environ.get("WALKV_DEMO_SMALL")),
                   help="CI sizing (also WALKV_DEMO_SMALL=1)")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark export step")
    p.add_argument("--threads", type=int, help="writer threads in step 1 (default 8, 4 with --small)")
    p.add_argument("--master", default="local[2]", help="Spark master for step 6 (default local[2])")
    p.add_argument("--json", metavar="FILE", help="also write the summary as JSON")


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


def cmd_demo(args: argparse.Namespace, rep: Reporter) -> int:
    size = SMALL if args.small else FULL
    threads = args.threads or size.threads
    if threads < 1:
        raise CliError("--threads must be at least 1", EXIT_USAGE)
    spark_why = "--no-spark" if args.no_spark else spark_missing()
    root = _prepare_dir(args.dir)
    store = os.path.join(root, "store")
    report = DemoReport(STEPS)
    t_demo = time.monotonic()
    print(f"walkv demo in {root} ({'small' if args.small else 'full'} size)")

    archive = os.path.join(root, "archive")
    model = _workload(store, archive, size, threads, report, rep)
    before, last = _crash(store, archive, size, model, report, rep)
    db = _rebuild(store, archive, size, before, last, report, rep)
    try:
        info = _snapshot(db, store, report, rep)
        accident = _accident(db, size, threads, report)
        final = digest(db)
    finally:
        db.close()  # ships the rest to the archive
    _restore(store, archive, os.path.join(root, "restored"), info, accident, final, report, rep)

    report.step(6, "Spark: export snapshot, changes and state to Parquet (local mode)")
    if spark_why:
        report.say(f"skipped: {spark_why}")
        report.add("rows_exported", None, f"skipped ({spark_why})", "rows exported")
    else:
        _spark_export(store, os.path.join(root, "export"), args.master, report, rep, fed=_feed_changes(store, report))

    total_s = time.monotonic() - t_demo
    report.add("demo_time_s", round(total_s, 1), f"{total_s:.1f} s", "total time")
    report.print_summary()
    print(f"\nfiles are in {root} (try: walkv stats {store}; walkv verify {store}; "
          f"walkv archive-ls {archive})")
    if args.json:
        report.write_json(args.json)
    return EXIT_OK


def _workload(store: str, archive: str, size: Size, threads: int, report: DemoReport,
              rep: Reporter) -> dict[bytes, bytes]:
    """Step 1: the shop from several threads; returns the model of the store."""
    import kvstore

    ops = size.ops_per_thread
    report.step(1, f"workload: {threads} threads, {threads * ops} operations, sync=\"always\" (group commit)")
    models: list[dict[bytes, bytes]] = [{} for _ in range(threads)]
    counters = {"puts": 0, "batches": 0, "deletes": 0, "reads": 0}
    errors: list[BaseException] = []
    with kvstore.open(store, sync="always", segment_bytes=size.segment_bytes, archive=archive) as db:
        with rep.task("workload", threads * ops, "ops") as progress:
            done = [0]
            lock = threading.Lock()

            def tick(n: int) -> None:
                with lock:
                    done[0] += n
                    progress(done[0], threads * ops)

            workers = [threading.Thread(target=worker, args=(db, t, threads, ops, SEED, models[t], counters,
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
        report.say(f"{counters['puts']} puts, {counters['batches']} batches, {counters['deletes']} deletes, "
                   f"{counters['reads']} reads in {elapsed:.2f} s")
        report.say(f"{writes} durable writes ({writes / elapsed:,.0f}/s) shared {st['fsyncs']} fsyncs: "
                   f"{st['avg_group']:.1f} writes per fsync on average, {st['max_group']} at most, "
                   f"fsync p50 {st['fsync_p50_ms']:.2f} ms")
        report.check(dict(db.scan()) == model, f"the store holds exactly the {len(model)} keys the threads wrote")
        report.add("entries", writes, f"{writes} from the workload (LSN 1..{db.last_lsn}; one per put, "
                   "delete or batch)", "entries")
    report.add("durable_writes_per_s", round(writes / elapsed), f"{writes / elapsed:,.0f} durable writes/s "
               f"({threads} threads, sync=always, each fsynced before it returned)", "durable puts/s")
    report.add("fsyncs", st["fsyncs"], f"{st['fsyncs']} for {writes} writes (p50 {st['fsync_p50_ms']:.2f} ms, "
               f"p99 {st['fsync_p99_ms']:.2f} ms)", "fsyncs")
    report.add("avg_group", round(st["avg_group"], 2), f"{st['avg_group']:.1f} writes per fsync "
               f"(group commit; {st['max_group']} at most)", "average group size")
    return model


def _crash(store: str, archive: str, size: Size, model: dict[bytes, bytes], report: DemoReport,
           rep: Reporter) -> tuple[tuple[int, str], int]:
    """Step 2: SIGKILL a writer process, recover, check every acknowledged
    write; adds them to ``model``; returns the store's digest and last LSN."""
    import kvstore

    report.step(2, f"crash: a writer process with {size.crash_threads} threads, killed with SIGKILL mid-stream")
    acked = run_and_kill(store, size, SEED, rep)
    report.say(f"killed the writer after {sum(acked.values())} acknowledged writes")
    t0 = time.perf_counter()
    with rep.task("recovering", unit="entries") as progress:
        db = kvstore.open(store, sync="always", segment_bytes=size.segment_bytes, progress=progress,
                          archive=archive)
    recovery_s = time.perf_counter() - t0
    with db:
        st = db.stats()
        cut, replayed = st["log"]["dropped_bytes_at_open"], st["replayed_at_open"]
        report.say(f"reopened in {recovery_s * 1000:.0f} ms: replayed {replayed} entries, "
                   f"cut a torn tail of {cut} bytes; log ends at LSN {db.last_lsn}")
        expected = crash_values(size.crash_threads, SEED, acked)
        present = dict(db.scan(prefix=b"crash:"))
        lost = [k for k, v in expected.items() if present.get(k) != v]
        report.check(not lost, f"all {len(expected)} acknowledged writes survived"
                     + (f" (lost: {lost[:3]})" if lost else ""))
        prefix_ok = True
        for t in range(size.crash_threads):
            mine = sorted(int(k.split(b":")[2]) for k in present if k.startswith(f"crash:{t:02d}:".encode()))
            prefix_ok &= mine == list(range(len(mine)))
        report.check(prefix_ok, "each writer thread's surviving writes are a gap-free prefix of what it sent "
                                f"({len(present) - len(expected)} more were durable but not yet acknowledged)")
        report.check({k: v for k, v in db.scan() if not k.startswith(b"crash:")} == model,
                     "the workload's keys are untouched")
        model.update(present)
        report.add("recovery_time_s", round(recovery_s, 4), f"{recovery_s * 1000:.0f} ms to reopen after SIGKILL "
                   f"({replayed} entries replayed, {cut} torn bytes cut, "
                   f"{len(expected)} acknowledged writes checked)", "recovery time")
        return digest(db), db.last_lsn


def _rebuild(store: str, archive: str, size: Size, before: tuple[int, str], last: int, report: DemoReport,
             rep: Reporter) -> KVStore:
    """Step 3: throw LMDB away and rebuild it from the log; returns the
    store, open (the caller closes it)."""
    import kvstore

    report.step(3, "machine crash: throw LMDB away and rebuild it from the log alone")
    shutil.rmtree(StoreLayout.of(store).lmdb_dir)
    store_log = logging.getLogger("walkv.store")
    level = store_log.level
    store_log.setLevel(logging.ERROR)  # its "rebuilding LMDB" warning is what this step expects
    try:
        t0 = time.perf_counter()
        with rep.task("replaying the whole log", last, "entries") as progress:
            db = kvstore.open(store, sync="always", segment_bytes=size.segment_bytes, progress=progress,
                              archive=archive)
        rebuild_s = time.perf_counter() - t0
    finally:
        store_log.setLevel(level)
    try:
        report.say(f"rebuilt LMDB from {last} log entries in {rebuild_s:.2f} s ({last / rebuild_s:,.0f} entries/s)")
        report.check(digest(db) == before, f"the rebuilt store equals the store before ({before[0]} keys)")
    except BaseException:
        db.close()
        raise
    report.add("full_replay_entries_per_s", round(last / rebuild_s), f"{last / rebuild_s:,.0f} entries/s "
               f"(LMDB rebuilt from {last} log entries in {rebuild_s:.2f} s)", "full replay")
    return db


def _snapshot(db: KVStore, store: str, report: DemoReport, rep: Reporter) -> SnapshotInfo:
    """Step 4: a snapshot, and the log segments it covers trimmed."""
    import snapshot
    import wal

    report.step(4, "snapshot: one consistent copy at an LSN; the log it covers is trimmed")
    wal_dir = StoreLayout.of(store).wal_dir
    archived = db.flush_archive(timeout=60)  # local retention never trims what the archive lacks
    report.say(f"the archive holds LSNs up to {archived}: local retention may trim what it covers")
    wal_before, segs_before = dir_bytes(wal_dir), len(wal.list_segments(wal_dir))
    t0 = time.perf_counter()
    with rep.task("writing snapshot", unit="pairs") as progress:
        info = db.snapshot(progress=progress)
    snap_s = time.perf_counter() - t0
    wal_after, segs_after = dir_bytes(wal_dir), len(wal.list_segments(wal_dir))
    trimmed = max(0, wal_before - wal_after)
    report.say(f"snapshot at LSN {info.lsn}: {info.count} pairs, {human_bytes(info.bytes)}, "
               f"{info.chunks} chunks in {snap_s:.2f} s")
    report.say(f"log: {segs_before} segments ({human_bytes(wal_before)}) -> {segs_after} "
               f"({human_bytes(wal_after)}), {human_bytes(trimmed)} trimmed")
    snap = snapshot.open(info.path)
    snap.verify()
    report.check(snap.lsn == info.lsn and dict(snap) == dict(db.scan()),
                 "the snapshot verifies and equals the store at its LSN")
    report.check(segs_after < segs_before, "whole segments covered by the snapshot were deleted")
    report.add("bytes_trimmed", trimmed, f"{human_bytes(trimmed)} of log ({segs_before - segs_after} "
               f"segments) after the snapshot at LSN {info.lsn}", "bytes trimmed")
    return info


class Accident(NamedTuple):
    """Step 5's accident: the last good LSN and a time between it and the
    accident, the store's digest then, and how many orders it had."""

    good_lsn: int
    good_time: float
    good: tuple[int, str]
    orders: int


def _accident(db: KVStore, size: Size, threads: int, report: DemoReport) -> Accident:
    """Step 5, first half: more writes, then a ``delete_range`` of every order."""
    report.step(5, "the disk is lost after an accidental delete of every order: restore from the archive, by time")
    rng = random.Random(SEED + 99)
    for _ in range(size.after_snapshot):
        uid = rng.randrange(threads * 200)
        db.put(f"user:{uid:06d}".encode(), new_user(uid, rng))
    good_lsn = db.last_lsn
    good = digest(db)
    orders = sum(1 for _ in db.scan(prefix=b"order:"))
    time.sleep(0.002)  # commit timestamps are in microseconds: the time falls strictly between the two
    good_time = time.time()
    time.sleep(0.002)
    bad_lsn = db.delete_range(b"order:", b"order;")
    db.put(b"deploy:last", b"v2.0.1 (the one with the bug)")
    when = datetime.datetime.fromtimestamp(good_time, datetime.timezone.utc).isoformat(timespec="microseconds")
    report.say(f"{size.after_snapshot} more writes up to LSN {good_lsn} (committed by {when}); LSN {bad_lsn} deleted "
               f"all {orders} orders ({sum(1 for _ in db.scan(prefix=b'order:'))} left)")
    return Accident(good_lsn, good_time, good, orders)


def _restore(store: str, archive: str, target: str, info: SnapshotInfo, accident: Accident,
             final: tuple[int, str], report: DemoReport, rep: Reporter) -> None:
    """Step 5, second half: the store closed (the archive then holds every
    acknowledged write) and deleted; restored from the archive to the time
    before the accident, and whole."""
    import kvstore
    from kvstore.archive import ArchiveReader

    reader = ArchiveReader(archive)
    objects, snaps = reader.log_objects(), reader.snapshots()
    arch_bytes = dir_bytes(archive)
    report.say(f"store closed: the archive holds LSNs {reader.first_lsn}..{reader.last_lsn} in {len(objects)} log "
               f"objects and {len(snaps)} snapshot(s), {human_bytes(arch_bytes)}")
    report.check(not reader.verify(), "the archive verifies (every CRC, LSN, store id and snapshot checksum)")
    shutil.rmtree(store)
    report.say(f"deleted the local store {store} (the disk is lost)")
    good_lsn, good = accident.good_lsn, accident.good
    when = datetime.datetime.fromtimestamp(accident.good_time, datetime.timezone.utc)
    with rep.task("restoring from the archive, by time", unit="entries") as progress:
        restored_info = kvstore.restore(archive, target, to_time=when, progress=progress)
    restore_s = restored_info.seconds
    with kvstore.open(target, readonly=True) as rdb:
        restored = digest(rdb)
        r_orders = sum(1 for _ in rdb.scan(prefix=b"order:"))
        r_applied = rdb.applied_lsn
    report.say(f"restored to {when.isoformat(timespec='microseconds')} = LSN {restored_info.lsn} in {restore_s:.2f} s: "
               f"archived snapshot at LSN {restored_info.snapshot_lsn} + {restored_info.replayed} log entries")
    report.check(restored == good and r_orders == accident.orders and r_applied == good_lsn,
                 f"the restored store equals the store at LSN {good_lsn} ({good[0]} keys, all {accident.orders} "
                 "orders back)")
    with rep.task("restoring the whole archive", unit="entries") as progress:
        whole = kvstore.restore(archive, store, progress=progress)
    with kvstore.open(store, readonly=True) as rdb:
        report.check(digest(rdb) == final, "the whole archive restores the store as it was at close: every "
                                           f"acknowledged write, LSN {whole.lsn} ({final[0]} keys)")
    report.add("archive_bytes", arch_bytes, f"{human_bytes(arch_bytes)}: {len(objects)} log objects, "
               f"{len(snaps)} snapshot(s), LSNs up to {whole.lsn}", "archive")
    report.add("restore_time_s", round(restore_s, 3), f"{restore_s:.2f} s from the archive to a time "
               f"(LSN {good_lsn}: snapshot + {restored_info.replayed} entries)", "point-in-time restore")


def _feed_changes(store: str, report: DemoReport) -> int:
    """Step 6's writes before the export: the restored store's newest
    snapshot is at its last LSN, so the shop goes on after the restore, so
    that the change feed (the log after the snapshot) has something to show.
    Returns how many entries it wrote."""
    import kvstore

    with kvstore.open(store) as db:
        it = db.scan()
        pairs = list(itertools.islice(it, FEED_CHANGES))
        it.close()
        first = db.last_lsn + 1
        for key, value in pairs[: len(pairs) // 2]:
            db.put(key, value + b" (seen)")
        for key, _value in pairs[len(pairs) // 2:]:
            db.delete(key)
        fed = db.last_lsn - first + 1
    report.say(f"after the restore: {fed} more writes (puts and deletes), LSNs {first}..{first + fed - 1}: the change "
               "feed to export")
    return fed


def _spark_export(store: str, out: str, master: str, report: DemoReport, rep: Reporter, *, fed: int | None = None
                  ) -> None:
    """Step 6: snapshot, changes and state to Parquet; the state has the
    store's keys, and the change feed the ``fed`` entries written since its
    newest snapshot (when given: :func:`_feed_changes`)."""
    import kvstore
    from kvstore.spark.export import describe, export

    spark_env(master)
    t0 = time.perf_counter()
    with rep.task("Spark export", unit="") as progress:
        result = export(store, out, master=master, table="all", incremental=False, progress=progress)
    spark_s = time.perf_counter() - t0
    rows = export_rows(result)
    with kvstore.open(store, readonly=True) as db:
        keys = len(db)
    for line in describe(result):  # the changes line says which LSNs it covers
        report.say(line)
    report.check(rows["state"] == keys, f"the exported state has exactly the store's {keys} keys")
    if fed is not None:
        report.check(rows["changes"] == fed, f"the exported change feed has those {fed} changes, one row each")
    total = sum(rows.values())
    report.add("rows_exported", total, f"{total} rows ({', '.join(f'{k} {v}' for k, v in rows.items())}) "
               f"in {spark_s:.1f} s", "rows exported")
