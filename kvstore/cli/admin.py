"""``walkv stats``, ``snapshot``, ``restore``, ``export`` and ``bench``.

``stats`` reads the files only (never the lock), so it is safe beside a
running writer. ``snapshot`` opens the store for writing; ``restore`` builds a
new store; ``export`` runs the Spark job of :mod:`kvstore.spark.export` (its
console kept to errors, see :func:`spark_env`); ``bench`` runs the harness in
the source checkout's ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from kvstore.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CliError,
    human_bytes,
    open_store,
    print_table,
    require_store,
)
from kvstore.cli.progress import Reporter


def add_commands(add: Callable[..., argparse.ArgumentParser], group: str) -> None:
    """Register ``stats`` (group "stats") or the jobs (group "jobs"), so that
    ``walkv --help`` lists them in a sensible order."""
    if group == "stats":
        _add_stats(add)
    else:
        _add_jobs(add)


def _add_stats(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("stats", "LSNs, segments, snapshots and LMDB size of a store", cmd_stats)
    p.add_argument("store", metavar="STORE")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_jobs(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("snapshot", "take a snapshot now and trim the log it covers", cmd_snapshot)
    p.add_argument("store", metavar="STORE")

    p = add("restore", "build a new store from a store or snapshot, optionally to an earlier LSN",
            cmd_restore)
    p.add_argument("src", metavar="SRC", help="a store, or a snapshot directory")
    p.add_argument("dst", metavar="DST", help="the new store (must not exist or be empty)")
    p.add_argument("--to-lsn", type=int, metavar="N", help="point-in-time: stop after LSN N")

    p = add("export", "write snapshot, changes and state as Parquet with Spark", cmd_export)
    p.add_argument("store", metavar="STORE")
    p.add_argument("out", metavar="OUT", help="output directory (one sub-directory per table)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--table", choices=("snapshot", "changes", "state", "all"), default="all")
    p.add_argument("--incremental", action="store_true",
                   help="export only what is new since the last run (a checkpoint under OUT)")

    p = add("bench", "run the benchmarks against LevelDB, RocksDB, LMDB and SQLite", cmd_bench)
    p.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    p.add_argument("--only", help="comma-separated workload names or prefixes (log, kv, snap, spark)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the ratios against the peers (matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--dir", metavar="DIR", help="where the benchmark data goes")


# -- stats -------------------------------------------------------------------------


def _allocated(path: str) -> int:
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0


def _dir_bytes(path: str, allocated: bool = False) -> int:
    """Bytes of the files under ``path`` (their sizes, or the disk space
    allocated to them: preallocated segments and LMDB's map are sparse)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                total += _allocated(p) if allocated else os.lstat(p).st_size
            except OSError:
                pass
    return total


def gather_stats(path: str) -> dict[str, Any]:
    """What the files say about a store, without taking its lock (a writer
    may be running): LSNs, segments, snapshots, LMDB."""
    import snapshot
    import wal
    from wal import list_segments, read_header

    d = require_store(path)
    out: dict[str, Any] = {"path": d["root"]}
    segs = list_segments(d["wal"])
    seg_rows = []
    for s in segs:
        seg_rows.append({"file": os.path.basename(s.path), "first_lsn": s.first_lsn,
                         "bytes": os.path.getsize(s.path)})
    out["segments"] = len(segs)
    out["segment_bytes"] = sum(r["bytes"] for r in seg_rows)
    out["segment_files"] = seg_rows
    out["first_lsn"] = segs[0].first_lsn if segs else None
    out["durable_lsn"] = wal.read_durable_lsn(d["wal"])
    out["store_id"] = None
    if segs:
        try:
            with open(segs[-1].path, "rb") as fh:
                out["store_id"] = read_header(fh, segs[-1].path)[0].store_id
        except Exception:  # noqa: BLE001 - stats reports, verify judges
            pass
    lock_holder = _lock_holder(os.path.join(d["root"], "LOCK"))
    out["writer_pid"] = lock_holder
    snaps = snapshot.list_snapshots(d["snapshots"])
    out["snapshots"] = [{"lsn": s.lsn, "pairs": s.count, "bytes": s.bytes, "chunks": s.chunks,
                         "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_us / 1e6)),
                         "path": s.path} for s in snaps]
    out["lmdb_file_bytes"] = _dir_bytes(d["lmdb"]) if os.path.isdir(d["lmdb"]) else 0
    out["lmdb_disk_bytes"] = _dir_bytes(d["lmdb"], allocated=True) if os.path.isdir(d["lmdb"]) else 0
    out["segment_disk_bytes"] = sum(_allocated(s.path) for s in segs)
    try:
        with open(os.path.join(d["lmdb"], "SESSION"), encoding="utf-8") as fh:
            session = json.load(fh)
        out["closed_cleanly"] = bool(session.get("clean"))
    except (OSError, ValueError):
        out["closed_cleanly"] = None
    return out


def _lock_holder(path: str) -> int | None:
    """The pid holding a walkv lock file (from /proc/locks, so that looking
    never takes the lock and never makes a writer's open fail), or None."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:567 0 EOF" (blocked waiters have "->")
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if int(ino) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                return int(parts[4])
        except ValueError:
            continue
    return None


def cmd_stats(args: argparse.Namespace, rep: Reporter) -> int:
    st = gather_stats(args.store)
    db_stats: dict[str, Any] = {}
    if os.path.isdir(os.path.join(st["path"], "lmdb")):
        try:
            with open_store(args.store, readonly=True) as db:
                db_stats = db.stats()
        except Exception as e:  # noqa: BLE001 - the file-level stats still stand
            st["state_error"] = str(e)
    for k in ("applied_lsn", "lmdb_entries", "lmdb_used_bytes", "lmdb_map_bytes", "lmdb_depth", "lmdb_readers"):
        if k in db_stats:
            st[k] = db_stats[k]
    st["fsync_note"] = ("fsync counts and latencies are per process: see `walkv demo`, "
                        "`walkv bench`, or db.stats()['log'] in the writing process")
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return EXIT_OK
    rows = [
        ("store", st["path"]),
        ("store id", st["store_id"] or "-"),
        ("writer", f"pid {st['writer_pid']}" if st["writer_pid"] else "none (not open for writing)"),
        ("closed cleanly", {True: "yes", False: "no (crashed or still open)", None: "-"}[st["closed_cleanly"]]),
        ("first LSN in log", str(st["first_lsn"])),
        ("durable LSN", str(st["durable_lsn"])),
        ("applied LSN", str(st.get("applied_lsn", "-"))),
        ("keys", str(st.get("lmdb_entries", "-"))),
        ("log segments", f"{st['segments']} ({human_bytes(st['segment_bytes'])} in files, "
                         f"{human_bytes(st['segment_disk_bytes'])} on disk)"),
        ("LMDB", f"{human_bytes(st.get('lmdb_used_bytes', st['lmdb_file_bytes']))} used, "
                 f"{human_bytes(st['lmdb_disk_bytes'])} on disk"
                 + (f", map {human_bytes(st['lmdb_map_bytes'])}" if "lmdb_map_bytes" in st else "")),
        ("fsyncs", "counted per process: db.stats()['log'] in the writer, or `walkv demo`"),
        ("snapshots", str(len(st["snapshots"]))),
    ]
    for s in st["snapshots"]:
        rows.append((f"  LSN {s['lsn']}", f"{s['pairs']} pairs, {human_bytes(s['bytes'])}, "
                                          f"{s['chunks']} chunks, {s['created']}"))
    if "state_error" in st:
        rows.append(("state", f"unreadable: {st['state_error']}"))
    print_table(rows)
    return EXIT_OK


# -- snapshot / restore / export / bench ------------------------------------------


def _require_api(module: str, name: str, what: str) -> Callable[..., Any]:
    import importlib

    try:
        mod = importlib.import_module(module)
        fn = getattr(mod, name)
    except (ImportError, AttributeError):
        raise CliError(f"{what} is not available in this build ({module}.{name} is missing)") from None
    return fn


def cmd_snapshot(args: argparse.Namespace, rep: Reporter) -> int:
    wal_dir = os.path.join(os.path.abspath(args.store), "wal")
    with open_store(args.store, reporter=rep) as db:
        before = _dir_bytes(wal_dir, allocated=True)
        with rep.task("writing snapshot", unit="pairs") as progress:
            info = take_snapshot(db, progress)
        after = _dir_bytes(wal_dir, allocated=True)
        first = db.stats().get("log", {}).get("first_lsn")
    print(f"snapshot at LSN {info.lsn}: {info.path}")
    print(f"  {info.count} pairs, {human_bytes(info.bytes)} in {info.chunks} chunks")
    print(f"  log: {human_bytes(max(0, before - after))} trimmed"
          + (f"; it now starts at LSN {first}" if first else ""))
    return EXIT_OK


def cmd_restore(args: argparse.Namespace, rep: Reporter) -> int:
    import inspect as _inspect

    if not os.path.exists(args.src):
        raise CliError(f"no store or snapshot at {args.src}")
    restore = _require_api("kvstore", "restore", "restore")
    if os.path.exists(args.dst) and os.listdir(args.dst):
        raise CliError(f"{args.dst} exists and is not empty; restore into a new directory")
    kwargs: dict[str, Any] = {"to_lsn": args.to_lsn}
    t0 = time.monotonic()
    with rep.task("restoring", unit="") as progress:
        if "progress" in _inspect.signature(restore).parameters:
            kwargs["progress"] = progress
        result = restore(args.src, args.dst, **kwargs)
    dt = time.monotonic() - t0
    lsn = getattr(result, "lsn", None) or getattr(result, "applied_lsn", None)
    if lsn is None and isinstance(result, int):
        lsn = result
    if lsn is None:
        import kvstore
        with kvstore.open(args.dst, readonly=True) as db:
            lsn = db.applied_lsn
    print(f"restored {args.src} to {args.dst} at LSN {lsn} ({dt:.2f} s)")
    return EXIT_OK


def spark_available() -> str | None:
    """None when Spark can run here, else the reason it cannot."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'walkv[spark]')"
    if importlib.util.find_spec("pyarrow") is None:
        return "pyarrow is not installed (pip install 'walkv[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and shutil.which("java") is None:
        return "Java is not installed (Spark needs Java 17 or newer on PATH or in JAVA_HOME)"
    return None


def cmd_export(args: argparse.Namespace, rep: Reporter) -> int:
    import inspect as _inspect

    require_store(args.store)
    why = spark_available()
    if why:
        raise CliError(f"cannot export: {why}")
    export = _require_api("kvstore.spark.export", "export", "the Spark export job")
    spark_env(args.master)
    kwargs: dict[str, Any] = {"master": args.master, "table": args.table, "incremental": args.incremental}
    t0 = time.monotonic()
    with rep.task("exporting with Spark", unit="") as progress:
        if "progress" in _inspect.signature(export).parameters:
            kwargs["progress"] = progress
        result = export(args.store, args.out, **kwargs)
    dt = time.monotonic() - t0
    print(f"exported {args.store} to {args.out} ({dt:.1f} s)")
    for table, rows in export_rows(result).items():
        print(f"  {table}: {rows} rows")
    return EXIT_OK


def export_rows(result: Any) -> dict[str, int]:
    """Rows per table from the export job's result (``{"tables": {name:
    {"rows": n, ...}}, ...}``, as ``OUT/_walkv_export.json`` holds it)."""
    tables = result.get("tables") if isinstance(result, dict) else getattr(result, "tables", None)
    out: dict[str, int] = {}
    if isinstance(tables, dict):
        for name, info in tables.items():
            rows = info.get("rows") if isinstance(info, dict) else getattr(info, "rows", info)
            if isinstance(rows, int) and not isinstance(rows, bool):
                out[str(name)] = rows
    return out


def spark_env(master: str) -> None:
    """Environment for a Spark job started from the CLI: this Python for the
    workers, and for a local master (unless the user has a Spark installation
    or configuration of their own: SPARK_HOME or SPARK_CONF_DIR) a log4j2
    configuration that keeps Spark's console to errors only."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if master.startswith("local") and "SPARK_CONF_DIR" not in os.environ and "SPARK_HOME" not in os.environ:
        conf = tempfile.mkdtemp(prefix="walkv-spark-conf-")  # private (0700), ours alone
        atexit.register(shutil.rmtree, conf, True)
        with open(os.path.join(conf, "log4j2.properties"), "w") as fh:
            # The shell's loggers at the root's level: Spark then does not print
            # its "Setting default log level" banner for a PySpark driver.
            fh.write("rootLogger.level = error\n"
                     "rootLogger.appenderRef.stderr.ref = console\n"
                     "appender.console.type = Console\n"
                     "appender.console.name = console\n"
                     "appender.console.target = SYSTEM_ERR\n"
                     "appender.console.layout.type = PatternLayout\n"
                     "appender.console.layout.pattern = spark: %p %c{1}: %m%n%ex\n"
                     + "".join(f"logger.{n}.name = {c}\nlogger.{n}.level = error\n" for n, c in (
                         ("repl", "org.apache.spark.repl.Main"),
                         ("gateway", "org.apache.spark.api.python.PythonGatewayServer"),
                         ("submit", "org.apache.spark.deploy.SparkSubmit"),
                         ("context", "org.apache.spark.SparkContext"))))
        os.environ["SPARK_CONF_DIR"] = conf


def take_snapshot(db: Any, progress: Any = None) -> Any:
    """``db.snapshot()``, or the snapshot package's ``take`` behind it."""
    import inspect as _inspect

    take = getattr(db, "snapshot", None)
    if take is None:
        try:
            from kvstore.snapshots import take as _take
        except ImportError:
            raise CliError("snapshots are not available in this build (KVStore.snapshot is missing)") from None

        def take(**kw: Any) -> Any:
            return _take(db, **kw)
    kwargs = {}
    try:
        if "progress" in _inspect.signature(take).parameters:
            kwargs["progress"] = progress
    except (TypeError, ValueError):
        pass
    return take(**kwargs)


def cmd_bench(args: argparse.Namespace, rep: Reporter) -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isdir(os.path.join(repo, "benchmarks")) and repo not in sys.path:
        sys.path.insert(0, repo)
    try:
        import benchmarks
    except ImportError:
        raise CliError("the benchmark harness (benchmarks/) is not here: it ships with the source "
                       "checkout; run `walkv bench` from an editable install of the repository") from None
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib (pip install 'walkv[bench]')") from None
    try:
        report = benchmarks.run(quick=args.quick, only=args.only, json_path=args.json,
                                plot_path=args.plot, bench_dir=args.dir, verbose=not args.quiet)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    summary = report.get("summary", {})
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_PROBLEM if summary.get("errors") else EXIT_OK
