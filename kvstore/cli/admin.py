"""``walkv snapshot``, ``restore``, ``export`` and ``bench``: the jobs.

``snapshot`` opens the store for writing; ``restore`` builds a new store
(:func:`kvstore.restore`); ``export`` runs the Spark job of
:mod:`kvstore.spark.export` (its console kept to errors, see
:func:`spark_env`); ``bench`` runs the harness in the source checkout's
``benchmarks/``.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvstore.cli.archive import timeline_arg
from kvstore.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    AddCommand,
    CliError,
    dir_bytes,
    human_bytes,
    open_store,
    require_store,
)
from kvstore.cli.progress import Reporter

# The source checkout holding kvstore/ (and benchmarks/, in a checkout).
_REPO = Path(__file__).resolve().parents[2]


def add_commands(add: AddCommand) -> None:
    p = add("snapshot", "take a snapshot now and trim the log it covers", cmd_snapshot)
    p.add_argument("store", metavar="STORE")

    p = add("restore", "build a new store from a store, a snapshot or an archive, to an LSN or a time",
            cmd_restore)
    p.add_argument("src", metavar="SRC", help="a store, a snapshot directory (restored at its own LSN unless "
                                              "--to-lsn asks for a later one), or an archive (a URI such as "
                                              "s3://bucket/prefix?..., file:///..., or an archive directory)")
    p.add_argument("dst", metavar="DST", help="the new store (must not exist or be empty)")
    p.add_argument("--allow-empty", action="store_true",
                   help="with --to-time before the source's first entry: build an empty store (without it, "
                        "that is an error naming the first entry's commit time)")
    timeline_arg(p)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--to-lsn", type=int, metavar="N", help="point-in-time: stop after LSN N")
    when.add_argument("--to-time", type=_utc_time, metavar="TIME",
                      help="point-in-time: the last entry committed at or before TIME (ISO 8601, e.g. "
                           "2026-11-23T10:00:00Z; no zone means UTC; or unix seconds)")

    p = add("export", "write snapshot, changes and state as Parquet with Spark", cmd_export)
    p.add_argument("store", metavar="STORE")
    p.add_argument("out", metavar="OUT", help="output directory (one sub-directory per table)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--table", choices=("snapshot", "changes", "state", "all"), default="all")
    p.add_argument("--incremental", action="store_true",
                   help="export only what is new since the last run (a checkpoint under OUT)")
    p.add_argument("--keyspace", metavar="NAME", default="*",
                   help="export this keyspace only ('' the default one; default: every keyspace, "
                        "each row naming its own in the keyspace column)")
    p.add_argument("--merge", action="store_true",
                   help="write state as MERGE rows (OUT/state_merge/: the keys changed since the last run, "
                        "_deleted for tombstones) instead of rewriting it")

    p = add("bench", "run the benchmarks against LevelDB, RocksDB, LMDB and SQLite", cmd_bench)
    p.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    p.add_argument("--only", help="comma-separated workload names or prefixes (log, kv, snap, spark)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the ratios against the peers (matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--dir", metavar="DIR", help="where the benchmark data goes")


# -- snapshot / restore ----------------------------------------------------------------


def cmd_snapshot(args: argparse.Namespace, rep: Reporter) -> int:
    wal_dir = require_store(args.store).wal_dir
    with open_store(args.store, reporter=rep) as db:
        before = dir_bytes(wal_dir, allocated=True)
        with rep.task("writing snapshot", unit="pairs") as progress:
            info = db.snapshot(progress=progress)
        after = dir_bytes(wal_dir, allocated=True)
        first = db.stats()["log"].get("first_lsn")
    print(f"snapshot at LSN {info.lsn}: {info.path}")
    print(f"  {info.count} pairs, {human_bytes(info.bytes)} in {info.chunks} chunks")
    print(f"  log: {human_bytes(max(0, before - after))} trimmed"
          + (f"; it now starts at LSN {first}" if first else ""))
    return EXIT_OK


def _utc_time(text: str) -> datetime.datetime:
    """``--to-time``: ISO 8601 (``Z`` or an offset; none: UTC) or unix seconds."""
    try:
        return datetime.datetime.fromtimestamp(float(text), datetime.timezone.utc)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO 8601, e.g. 2026-11-23T10:00:00Z, "
                                         "or unix seconds)") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.timezone.utc)


def cmd_restore(args: argparse.Namespace, rep: Reporter) -> int:
    import kvstore
    from kvstore.replica.point_in_time import is_archive
    from kvstore.replica.restore import check_target
    from wal.readfs import redact

    archive = is_archive(args.src)
    if not archive and not os.path.exists(args.src):
        raise CliError(f"no store, snapshot or archive at {args.src}")
    check_target(args.dst)
    shown = redact(args.src) if archive else args.src
    with rep.task(f"restoring from {shown}", unit="entries") as progress:
        info = kvstore.restore(args.src, args.dst, to_lsn=args.to_lsn, to_time=args.to_time,
                               allow_empty=args.allow_empty, progress=progress, timeline=args.timeline)
    print(f"restored {shown} to {args.dst} at LSN {info.lsn}: snapshot at LSN {info.snapshot_lsn} + "
          f"{info.replayed} log entries, {info.count} keys ({info.seconds:.2f} s)")
    return EXIT_OK


# -- export ------------------------------------------------------------------------------


def spark_missing() -> str | None:
    """None when Spark can run here, else what is missing (pyspark and pyarrow
    are the optional ``spark`` extra; Java is outside Python)."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'walkv[spark]')"
    if importlib.util.find_spec("pyarrow") is None:
        return "pyarrow is not installed (pip install 'walkv[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and shutil.which("java") is None:
        return "Java is not installed (Spark needs Java 17 or newer on PATH or in JAVA_HOME)"
    return None


def cmd_export(args: argparse.Namespace, rep: Reporter) -> int:
    require_store(args.store)
    why = spark_missing()
    if why:
        raise CliError(f"cannot export: {why}")
    from kvstore.spark.export import describe, export

    spark_env(args.master)
    t0 = time.monotonic()
    with rep.task("exporting with Spark", unit="") as progress:
        try:
            result = export(args.store, args.out, master=args.master, table=args.table,
                            incremental=args.incremental, progress=progress, keyspace=args.keyspace,
                            merge=args.merge)
        except ValueError as exc:  # a bad --keyspace
            raise CliError(f"cannot export: {exc}") from None
    dt = time.monotonic() - t0
    print(f"exported {args.store} to {args.out} ({dt:.1f} s)")
    for line in describe(result):
        print(f"  {line}")
    return EXIT_OK


def export_rows(result: dict[str, Any]) -> dict[str, int]:
    """Rows written per table, from what :func:`kvstore.spark.export.export`
    returns (``{"tables": {name: {"rows": n, ...}}, ...}``)."""
    return {name: int(info["rows"]) for name, info in result["tables"].items()}


def spark_env(master: str) -> None:
    """Environment for a Spark job started from the CLI: this Python for the
    workers, and for a local master (unless the user has a Spark installation
    or configuration of their own: SPARK_HOME or SPARK_CONF_DIR) a log4j2
    configuration that keeps Spark's console to errors only."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not master.startswith("local"):
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if "SPARK_CONF_DIR" in os.environ or "SPARK_HOME" in os.environ:
        return
    conf = tempfile.mkdtemp(prefix="walkv-spark-conf-")  # private (0700), ours alone
    atexit.register(shutil.rmtree, conf, True)
    quiet_loggers = (("repl", "org.apache.spark.repl.Main"),
                     ("gateway", "org.apache.spark.api.python.PythonGatewayServer"),
                     ("submit", "org.apache.spark.deploy.SparkSubmit"),
                     ("context", "org.apache.spark.SparkContext"))
    with open(os.path.join(conf, "log4j2.properties"), "w") as fh:
        # The shell's loggers at the root's level: Spark then does not print
        # its "Setting default log level" banner for a PySpark driver.
        fh.write("rootLogger.level = error\n"
                 "rootLogger.appenderRef.stderr.ref = console\n"
                 "appender.console.type = Console\n"
                 "appender.console.name = console\n"
                 "appender.console.target = SYSTEM_ERR\n"
                 "appender.console.layout.type = PatternLayout\n"
                 "appender.console.layout.pattern = spark: %p %c{1}: %m%n%ex\n")
        fh.writelines(f"logger.{n}.name = {c}\nlogger.{n}.level = error\n" for n, c in quiet_loggers)
    os.environ["SPARK_CONF_DIR"] = conf


# -- bench -------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace, rep: Reporter) -> int:
    if (_REPO / "benchmarks").is_dir() and str(_REPO) not in sys.path:
        sys.path.insert(0, str(_REPO))
    try:
        import benchmarks
    except ImportError:
        raise CliError("the benchmark harness (benchmarks/) is not here: it ships with the source "
                       "checkout; run `walkv bench` from an editable install of the repository") from None
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib (pip install 'walkv[bench]')")
    try:
        report = benchmarks.run(quick=args.quick, only=args.only, json_path=args.json,
                                plot_path=args.plot, bench_dir=args.dir, verbose=not args.quiet)
    except ValueError as e:  # an unknown workload name
        raise CliError(str(e), EXIT_USAGE) from None
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_PROBLEM if report.get("summary", {}).get("errors") else EXIT_OK
