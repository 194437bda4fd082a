"""The ``pyfloor`` contender of ``spark.snapshot`` (benchmarks.spark_floor)
yields the rows walkv's reader yields for the same entries, batch for batch:
otherwise its rate says nothing about walkv's. No JVM needed: the readers
are called as a Spark worker calls them."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from benchmarks import data  # noqa: E402
from benchmarks.harness import Config, Context  # noqa: E402
from benchmarks.snapshot_workloads import store_prepare  # noqa: E402
from benchmarks.spark_floor import FloorReader, FloorSource  # noqa: E402
from kvstore.spark import arrow as sa  # noqa: E402
from kvstore.spark.options import parse  # noqa: E402
from kvstore.spark.source import WalkvReader, spark_schema  # noqa: E402

ROWS = 2 * sa.ROWS_PER_BATCH + 4_321  # two partitions, each a full batch and a short one


def _read(reader) -> list[pa.RecordBatch]:
    return [batch for partition in reader.partitions() for batch in reader.read(partition)]


def test_floor_yields_walkvs_rows_in_walkvs_batches(tmp_path):
    path = store_prepare(ROWS, snapshot=True)(Context(Config(), str(tmp_path)))  # the benchmark's store
    walkv = pa.Table.from_batches(_read(WalkvReader(parse({"path": path, "table": "snapshot"}))))
    floor_batches = _read(FloorReader(ROWS))
    floor = pa.Table.from_batches(floor_batches)

    assert floor.num_rows == walkv.num_rows == ROWS
    assert floor.schema == walkv.schema == sa.arrow_schema(sa.SNAPSHOT)
    assert floor.column("key").equals(walkv.column("key"))
    assert floor.column("value").equals(walkv.column("value"))
    assert floor.column("key")[ROWS - 1].as_py() == data.key(ROWS - 1)
    assert max(b.num_rows for b in floor_batches) == sa.ROWS_PER_BATCH
    assert len(FloorReader(ROWS).partitions()) == 2


def test_floor_source_declares_the_snapshot_schema():
    source = FloorSource({"rows": "10"})
    assert source.schema() == spark_schema(sa.SNAPSHOT)
    assert source.reader(source.schema()).rows == 10
