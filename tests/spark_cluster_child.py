"""Child process of tests/test_spark_cluster.py: a Spark session whose
executors are separate JVMs (``local-cluster[2,1,1024]``: a master, a worker
and two executor processes, each with its own Python workers) reading the
walkv tables from a URI.

    python tests/spark_cluster_child.py OUT.json URI [URI ...]

Once both executors have registered it writes ``{"up": ...}`` to OUT.json
(so the test can tell "the cluster did not start" from "the read failed");
then, for each URI, the ``state`` and ``changes`` tables (keys and values as
hex), and rewrites OUT.json. The executors get this checkout on PYTHONPATH
and the S3 client settings of this process's environment.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTORS = 2
PASSED_ENV = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION",
              "AWS_EC2_METADATA_DISABLED")


def _hex(v: object) -> str | None:
    return None if v is None else bytes(v).hex()  # type: ignore[call-overload]


def _write(path: str, out: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    out_path, uris = sys.argv[1], sys.argv[2:]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local-cluster[{EXECUTORS},1,1024]")
        .appName("walkv-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYTHONPATH", ROOT)
        # Executor JVMs that start fast (a short-lived test cluster on a busy machine).
        .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    )
    for name in PASSED_ENV:
        if name in os.environ:
            builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        jsc = spark.sparkContext._jsc.sc()
        deadline = time.monotonic() + 60
        # getExecutorMemoryStatus counts the driver too.
        while jsc.getExecutorMemoryStatus().size() < EXECUTORS + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        executors = jsc.getExecutorMemoryStatus().size() - 1
        out: dict = {"up": {"master": spark.sparkContext.master, "executors": executors}}
        _write(out_path, out)

        from kvstore.spark import register

        register(spark)
        for uri in uris:
            def load(table: str, **options: str):
                r = spark.read.format("walkv").option("table", table)
                for k, v in options.items():
                    r = r.option(k, v)
                return r.load(uri)

            state = [[_hex(r.key), _hex(r.value), r.lsn] for r in load("state").collect()]
            changes_df = load("changes", startingLsn="earliest")
            changes = [[_hex(r.key), _hex(r.value), _hex(r.end_key), r._change_type, r._commit_version,
                        r._op_index] for r in changes_df.collect()]
            out[uri] = {"state": state, "changes": changes,
                        "partitions": changes_df.rdd.getNumPartitions()}
        _write(out_path, out)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
