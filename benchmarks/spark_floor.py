"""The floor of ``spark.snapshot``: a Python data source that does no work of its own.

:class:`FloorSource` (format ``pyfloor``) yields the rows of walkv's
``snapshot`` table over the benchmark's entries (:func:`benchmarks.data.key`,
:func:`benchmarks.data.value`, all at LSN 0, keyspace "") in two partitions,
as the Arrow record batches walkv's reader yields (65,536 rows each, built by
:func:`kvstore.spark.arrow.snapshot_batch`). Each Python worker builds its
batches once, on its first read, and keeps them in memory, so a query over it
pays only what Spark spends on any Python data source: planning in a Python
worker, starting the tasks, the Arrow stream from the worker to the JVM and
the JVM's conversion of each row. Its rate over Parquet's is the most any
Python data source reaches for this query on the machine; walkv's rate over
its rate is how much of the rest is walkv's reading and decoding.

Spark workers import this module by name, as they import :mod:`kvstore.spark`:
run the benchmarks from the source checkout (``python -m benchmarks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from benchmarks import data
from kvstore.spark import arrow as sa
from kvstore.spark.source import spark_schema

NAME = "pyfloor"
PARTITIONS = 2  # as many as walkv plans for the benchmark's snapshot (two chunks)

_built: dict[tuple[int, int], list[pa.RecordBatch]] = {}


def batches(start: int, stop: int) -> list[pa.RecordBatch]:
    """The snapshot rows of entries ``start..stop-1`` as record batches (built once per process)."""
    if (start, stop) not in _built:
        out = []
        for lo in range(start, stop, sa.ROWS_PER_BATCH):
            idx = range(lo, min(stop, lo + sa.ROWS_PER_BATCH))
            out.append(sa.snapshot_batch([data.key(i) for i in idx], [data.value(i) for i in idx], 0,
                                         sa.BINARY, sa.BINARY, lambda: NAME))
        _built[(start, stop)] = out
    return _built[(start, stop)]


class FloorPartition(InputPartition):
    def __init__(self, start: int, stop: int) -> None:
        super().__init__((start, stop))
        self.start, self.stop = start, stop


class FloorReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[Any]:
        cut = [self.rows * i // PARTITIONS for i in range(PARTITIONS + 1)]
        return [FloorPartition(lo, hi) for lo, hi in zip(cut, cut[1:])]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        yield from batches(partition.start, partition.stop)


class FloorSource(DataSource):
    """``spark.read.format("pyfloor").option("rows", N).load()``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        return spark_schema(sa.SNAPSHOT)

    def reader(self, schema: Any) -> FloorReader:
        return FloorReader(int(self.options["rows"]))
