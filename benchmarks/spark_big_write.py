"""The 88 MiB atomic Spark write (issue 38): 800,000 rows of 16-byte keys and
100-byte values written into a walkv store (``df.write.format("walkv")``,
one staged group: parts of about 4 MiB, then a commit) against Spark's own
Parquet writer (``df.write.parquet``) on the same DataFrame, cached first, in
the same ``local[2]`` session. Prints each one's seconds and rows/s, walkv's
time over Parquet's, and the machine (CPU, ``sum(range(10**7))``, fsync
latency, load average: :func:`benchmarks.machine.describe`).

Run once, from the source checkout: ``python -m benchmarks.spark_big_write``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

ROWS = 800_000
VALUE_BYTES = 100


def main() -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import kvstore
    from benchmarks.machine import describe
    from kvstore.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = tempfile.mkdtemp(prefix="walkv-bigwrite-")
    m = describe(root)
    spark = (SparkSession.builder.master("local[2]").appName("walkv-bigwrite")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        df = spark.range(ROWS).select(
            F.format_string("key-%012d", "id").alias("key"),
            F.expr(f"repeat('v', {VALUE_BYTES})").alias("value")).repartition(2).cache()
        df.count()
        store = os.path.join(root, "store")
        kvstore.open(store).close()
        t0 = time.perf_counter()
        df.write.format("walkv").mode("append").option("txnAppId", "bench").option("txnVersion", 1).save(store)
        walkv_s = time.perf_counter() - t0
        with kvstore.open(store) as db:
            assert len(db) == ROWS, len(db)
            lsn = db.last_lsn
        t0 = time.perf_counter()
        df.write.parquet(os.path.join(root, "parquet"))
        parquet_s = time.perf_counter() - t0
        mib = ROWS * (16 + VALUE_BYTES) / (1 << 20)
        print(f"machine: {m['cpu']}, {m['cores']} cores, sum(range(10**7)) {m['python_speed_ms']} ms, "
              f"fsync {m['fsync_latency_ms']} ms, load average {os.getloadavg()[0]:.2f} "
              f"(at start {m['load_avg'][0]:.2f}), walkv {m['walkv_build']}")
        print(f"{ROWS:,} rows, {mib:.0f} MiB of keys and values, local[2], 2 partitions")
        print(f"walkv (one atomic staged group: {lsn - 1} parts, then the commit): {walkv_s:.2f} s, "
              f"{ROWS / walkv_s:,.0f} rows/s")
        print(f"parquet (df.write.parquet):                   {parquet_s:.2f} s, {ROWS / parquet_s:,.0f} rows/s")
        print(f"walkv / parquet time: {walkv_s / parquet_s:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
