"""Issue 5 workloads (slow: only with ``--only spark``): the walkv Spark data
source against Spark's own Parquet reader, in ``local[2]``.

* ``spark.snapshot``: count the rows and sum the value lengths of a snapshot
  of N entries (1,000,000; 20,000 in --quick) read with
  ``spark.read.format("walkv").option("table", "snapshot")`` vs the same rows
  written as Parquet (pyarrow, untimed) read with ``spark.read.parquet``:
  >= 0.8x rows/s. All share one SparkSession, started before timing, and
  each reader runs its query :data:`WARM_UPS` times untimed first (Python
  workers, and the JVM's JIT: the CPU its compiler threads use during one
  query, ``jit_s`` in the report, was measured on 2 cores at 2.3 s for the
  first walkv query, 1.0 s for the second, 0.4-0.5 s for the next three and
  0.1-0.3 s after a dozen queries of both readers; with one warm-up each,
  the timed queries carried the JIT's work, walkv's, which run first, the
  most). A third contender, ``pyfloor``
  (:mod:`benchmarks.spark_floor`), is a Python data source that yields the
  same rows from memory: what Spark spends on any Python data source, so
  walkv/pyfloor is how close walkv's reader is to it.
* ``spark.pushdown``: a query for 1% of the keys (``key >= a AND key < b``)
  of a ``state`` table of N entries (1,000,000; 20,000 in --quick) whose
  snapshot is in 1 MiB chunks, with filter pushdown
  (``spark.sql.python.filterPushdown.enabled``) vs the same query without
  it: >= 5x queries/s; ``bytes_read`` is the snapshot bytes the planned
  tasks open (issue 14: at most 5% of the store's).
* ``spark.write``: rows/s of ``df.write.format("walkv").mode("append")``
  of N rows (400,000: one atomic batch holds at most the store's 64 MiB
  ``max_record_bytes``, about 500,000 such rows; 20,000 in --quick) into a
  new store vs Spark writing the same DataFrame as Parquet; reported
  without a target. The DataFrame is built and cached untimed.
* ``spark.export``: rows/s of ``walkv export STORE OUT --table snapshot`` as a
  command (JVM start-up included), reported without a target.
* ``spark.tail``: rows/s of count + sum(length(value)) of a ``changes`` read
  of a log tail of N rows (1,000,000; 20,000 in --quick: 1,000-row batches,
  all in the active segment, no snapshot) with ``minPartitions`` 1, 2 and 4
  (``maxPartitionBytes`` 1g, so that the count is the option's): the active
  segment split at probed points (issue 38); ``partitions`` is the count
  Spark ran. Reported without a target (``p1`` is main's one task).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.snapshot_workloads import store_prepare

SPARK = ("pyspark", "kvstore.spark.source:register", "snapshot")
WARM_UPS = 5
"""Untimed queries per ``spark.snapshot`` contender before timing (see the module docstring)."""
_session: list[Any] = []
_jvm_pid: list[int] = []


def session() -> Any:
    """One local[2] SparkSession for the workload (started untimed)."""
    if not _session:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        s = (SparkSession.builder.master("local[2]").appName("walkv-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
        s.sparkContext.setLogLevel("ERROR")
        from benchmarks.spark_floor import FloorSource
        from kvstore.spark import register

        register(s)
        s.dataSource.register(FloorSource)
        _session.append(s)
        jvm: Any = s.sparkContext._jvm
        _jvm_pid[:] = [int(jvm.java.lang.ProcessHandle.current().pid())]
    return _session[0]


def compiler_seconds() -> float | None:
    """CPU seconds the session's JVM has spent in its JIT compiler threads so
    far (from ``/proc``; None where there is none)."""
    task_dir = f"/proc/{_jvm_pid[0]}/task" if _jvm_pid else ""
    if not task_dir or not os.path.isdir(task_dir):
        return None
    ticks = 0
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                if "Compiler" not in f.read():  # "C1 CompilerThre", "C2 CompilerThre"
                    continue
            with open(f"{task_dir}/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_session(_state: Any = None) -> None:
    while _session:
        _session.pop().stop()


def _count(df: Any) -> tuple[int, int]:
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
    return int(row["n"]), int(row["b"] or 0)


def _timed_count(load: Any) -> Measurement:
    """Time ``_count(load())``, with the JIT's CPU meanwhile (``jit_s``)."""
    jit0 = compiler_seconds()
    t0 = time.perf_counter()
    rows, nbytes = _count(load())
    seconds = time.perf_counter() - t0
    jit1 = compiler_seconds()
    jit = round(jit1 - jit0, 3) if jit0 is not None and jit1 is not None else None
    return Measurement(ops=rows, seconds=seconds, extra={"value_bytes": nbytes, "jit_s": jit})


def _warm_up(read: Any, ctx: Context, state: Any) -> None:
    for _ in range(WARM_UPS):
        read(Context(ctx.config, ctx.directory, state))


def _walkv_prepare(n: int):
    store = store_prepare(n, snapshot=True)

    def prepare(ctx: Context) -> str:
        path = store(ctx)
        _warm_up(_walkv_read, ctx, path)
        return path

    return prepare


def _walkv_read(ctx: Context) -> Measurement:
    spark = session()
    return _timed_count(lambda: spark.read.format("walkv").option("table", "snapshot").load(ctx.state))


def _floor_prepare(n: int):
    def prepare(ctx: Context) -> int:
        _warm_up(_floor_read, ctx, n)  # the first read in each Python worker builds its rows
        return n

    return prepare


def _floor_read(ctx: Context) -> Measurement:
    from benchmarks.spark_floor import NAME

    spark = session()
    return _timed_count(lambda: spark.read.format(NAME).option("rows", ctx.state).load())


def _parquet_prepare(n: int):
    def prepare(ctx: Context) -> str:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = os.path.join(ctx.directory, "snapshot.parquet")
        os.makedirs(path)
        chunk = 100_000
        for part, start in enumerate(range(0, n, chunk)):
            idx = range(start, min(n, start + chunk))
            table = pa.table({"key": pa.array([data.key(i) for i in idx], pa.binary()),
                              "value": pa.array([data.value(i) for i in idx], pa.binary()),
                              "lsn": pa.array([i + 1 for i in idx], pa.int64())})
            pq.write_table(table, os.path.join(path, f"part-{part:05d}.parquet"))
        _warm_up(_parquet_read, ctx, path)
        return path

    return prepare


def _parquet_read(ctx: Context) -> Measurement:
    spark = session()
    return _timed_count(lambda: spark.read.parquet(ctx.state))


def _export(n: int):
    def run(ctx: Context) -> Measurement:
        out = os.path.join(ctx.fresh_dir("export"), "out")
        walkv = shutil.which("walkv") or os.path.join(os.path.dirname(sys.executable), "walkv")
        t0 = time.perf_counter()
        proc = subprocess.run([walkv, "export", ctx.state, out, "--table", "snapshot",
                               "--master", "local[2]"], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"walkv export exited {proc.returncode}: "
                               + " | ".join(proc.stderr.strip().splitlines()[-3:]))
        shutil.rmtree(out, ignore_errors=True)
        return Measurement(ops=n, seconds=seconds)

    return run


def _pushdown_query(n: int, pushdown: bool):
    lo, hi = data.key(n // 2), data.key(n // 2 + max(1, n // 100))
    where = f"key >= X'{lo.hex()}' AND key < X'{hi.hex()}'"

    def bytes_read(path: str) -> tuple[int, int]:
        from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

        from kvstore.spark.options import parse
        from kvstore.spark.source import WalkvPushdownReader

        reader = WalkvPushdownReader(parse({"path": path, "table": "state"}))
        total = sum(c.bytes for c in reader.plan.snapshot.chunks) if reader.plan.snapshot else 0
        if pushdown:
            reader.pushFilters([GreaterThanOrEqual(("key",), lo), LessThan(("key",), hi)])
        planned = sum(p.chunk.bytes for p in reader.partitions() if p.chunk is not None)
        return planned, total

    def run(ctx: Context) -> Measurement:
        from kvstore.spark.compat import PUSHDOWN_CONF
        from kvstore.spark.source import register

        spark = session()
        spark.conf.set(PUSHDOWN_CONF, "true" if pushdown else "false")
        register(spark)
        t0 = time.perf_counter()
        rows = spark.read.format("walkv").option("table", "state").load(ctx.state).where(where).count()
        seconds = time.perf_counter() - t0
        planned, total = bytes_read(ctx.state)
        return Measurement(ops=1, seconds=seconds, extra={"rows": rows, "bytes_read": planned,
                                                          "bytes_fraction": round(planned / max(1, total), 4)})

    def prepare(ctx: Context) -> str:
        path = store_prepare(n, snapshot=True, chunk_bytes=1 << 20)(ctx)
        run(Context(ctx.config, ctx.directory, path))  # warm-up: JVM, Python workers
        return path

    return run, prepare


_frames: dict[int, Any] = {}


def _frame(n: int) -> Any:
    if n not in _frames:
        from pyspark.sql import functions as F

        spark = session()
        df = spark.range(n, numPartitions=2).select(
            F.unhex(F.lpad(F.hex("id"), 32, "0")).alias("key"),
            F.sha2(F.col("id").cast("string"), 512).cast("binary").substr(1, 100).alias("value"))
        df = df.cache()
        df.count()
        _frames[n] = df
    return _frames[n]


def _write(n: int, fmt: str):
    def run(ctx: Context) -> Measurement:
        df = _frame(n)
        out = os.path.join(ctx.fresh_dir("write"), "out")
        t0 = time.perf_counter()
        if fmt == "walkv":
            df.write.format("walkv").mode("append").save(out)
        else:
            df.write.mode("overwrite").parquet(out)
        seconds = time.perf_counter() - t0
        shutil.rmtree(out, ignore_errors=True)
        return Measurement(ops=n, seconds=seconds)

    def prepare(ctx: Context) -> None:
        run(ctx)  # warm-up: JVM, Python workers, the cached DataFrame

    return run, prepare


def _tail_prepare(n: int, pieces: int):
    def prepare(ctx: Context) -> str:
        import kvstore

        path = os.path.join(ctx.directory, "tail-store")
        if not os.path.isdir(path):
            with kvstore.open(path, segment_bytes=1 << 30, sync="batch") as db:
                for i in range(0, n, 1000):
                    db.update({data.key(j): data.value(j) for j in range(i, min(n, i + 1000))})
        _tail_read(pieces)(Context(ctx.config, ctx.directory, path))  # warm-up: JVM, Python workers
        return path

    return prepare


def _tail_read(pieces: int):
    def run(ctx: Context) -> Measurement:
        spark = session()

        def load() -> Any:
            return (spark.read.format("walkv").option("minPartitions", pieces).option("maxPartitionBytes", "1g")
                    .load(ctx.state))

        m = _timed_count(load)
        m.extra["partitions"] = load().rdd.getNumPartitions()
        return m

    return run


def workloads(cfg: Config) -> list[Workload]:
    n = cfg.size(full=1_000_000, quick=20_000)
    w = cfg.size(full=400_000, quick=20_000)
    return [
        Workload(
            name="spark.snapshot", issue=21, unit="rows/s", slow=True,
            title=f"Spark local[2]: count + sum(length(value)) of a {n:,}-row snapshot",
            requires=SPARK, targets=[Target("parquet", 0.8)], params={"rows": n}, report=("jit_s",),
            contenders=[
                Contender("walkv", _walkv_read, prepare=_walkv_prepare(n),
                          label="walkv data source"),
                Contender("pyfloor", _floor_read, prepare=_floor_prepare(n), requires=("pyarrow", "pyspark"),
                          label="any Python data source (rows from memory)"),
                Contender("parquet", _parquet_read, prepare=_parquet_prepare(n),
                          cleanup=stop_session, requires=("pyarrow", "pyspark"),
                          label="Spark Parquet reader"),
            ]),
        Workload(
            name="spark.pushdown", issue=14, unit="queries/s", slow=True,
            title=f"Spark local[2]: 1% of the keys of a {n:,}-row state table, filter pushdown on vs off",
            requires=SPARK + ("kvstore.spark.pushdown:pushed",), targets=[Target("no-pushdown", 5.0)],
            params={"rows": n},
            contenders=[
                Contender("walkv", _pushdown_query(n, True)[0], prepare=_pushdown_query(n, True)[1],
                          label="walkv, pushdown"),
                Contender("no-pushdown", _pushdown_query(n, False)[0], prepare=_pushdown_query(n, False)[1],
                          cleanup=stop_session, label="walkv, no pushdown"),
            ]),
        Workload(
            name="spark.write", issue=14, unit="rows/s", slow=True,
            title=f"Spark local[2]: write {w:,} rows (16-byte keys, 100-byte values), walkv vs Parquet",
            requires=SPARK + ("kvstore.spark.writer:WalkvWriter",), params={"rows": w},
            contenders=[
                Contender("walkv", _write(w, "walkv")[0], prepare=_write(w, "walkv")[1],
                          label="walkv writer (one atomic batch)"),
                Contender("parquet", _write(w, "parquet")[0], prepare=_write(w, "parquet")[1],
                          cleanup=stop_session, label="Spark Parquet writer"),
            ]),
        Workload(
            name="spark.tail", issue=38, unit="rows/s", slow=True,
            title=f"Spark local[2]: count + sum(length(value)) of a {n:,}-row changes tail, 1/2/4 partitions",
            requires=SPARK + ("kvstore.spark.files:StoreFiles",), params={"rows": n}, report=("partitions",),
            contenders=[
                Contender("p1", _tail_read(1), prepare=_tail_prepare(n, 1), label="minPartitions=1"),
                Contender("p2", _tail_read(2), prepare=_tail_prepare(n, 2), label="minPartitions=2"),
                Contender("p4", _tail_read(4), prepare=_tail_prepare(n, 4), cleanup=stop_session,
                          label="minPartitions=4"),
            ]),
        Workload(
            name="spark.export", issue=5, unit="rows/s", slow=True, repeats=1,
            title=f"`walkv export --table snapshot` of {n:,} rows (JVM start included)",
            requires=SPARK + ("kvstore.cli:main",), params={"rows": n},
            contenders=[Contender("walkv", _export(n), prepare=store_prepare(n, snapshot=True),
                                  label="walkv export")]),
    ]
