"""walkv's Spark side: a PySpark data source and export that read a store's files.

    from kvstore.spark import register
    register(spark)                       # then spark.read.format("walkv") ...

:mod:`kvstore.spark.source` is the data source (it imports pyspark),
:mod:`kvstore.spark.partitions` plans a read and reads one partition,
:mod:`kvstore.spark.stream` is the stream reader,
:mod:`kvstore.spark.images` each change with its key's value before and after
it (the one mechanism the next two share), :mod:`kvstore.spark.debezium` the
``format=debezium`` events, :mod:`kvstore.spark.delta_cdf` the changes in Delta's
change types (``changeVocabulary=delta``), :mod:`kvstore.spark.files`
and :mod:`kvstore.spark.snapshots` plan and read the store's log and
snapshots through the ``wal`` and ``snapshot`` readers,
:mod:`kvstore.spark.archive` reads an archive as a store,
:mod:`kvstore.spark.pushdown` turns pushed-down filters into key and LSN
bounds, :mod:`kvstore.spark.writer` is ``df.write.format("walkv")``,
:mod:`kvstore.spark.compat` is the one place that knows the PySpark version,
:mod:`kvstore.spark.arrow` turns entries into Arrow batches,
:mod:`kvstore.spark.tail_state` merges a log tail into a snapshot for the ``state`` table,
:mod:`kvstore.spark.options` parses the reader options and
:mod:`kvstore.spark.export` writes the tables as Parquet (it imports pyspark
too), :mod:`kvstore.spark.merge` the MERGE rows of ``export --merge``. Importing this package does not import pyspark; :func:`register` and
:func:`read_state` do. Imports point one way: ``arrow`` and ``files``
import no other module here; ``options`` imports ``arrow``; ``archive``
imports ``files``; ``pushdown`` none; ``snapshots`` imports ``arrow`` and
``files``; ``tail_state`` imports ``arrow``; ``partitions`` those, ``options`` and ``pushdown``; ``images`` imports ``partitions``;
``debezium`` and ``delta_cdf`` import ``images``; ``stream`` imports ``debezium``,
``delta_cdf``, ``images``, ``partitions``, ``archive`` and ``compat``; ``writer`` imports
``archive``; ``source`` imports ``debezium``, ``delta_cdf``, ``images``, ``stream`` and
``writer``; ``merge`` imports ``arrow``; ``export``
imports ``source`` and ``merge``.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``walkv`` data source with a ``SparkSession``."""
    from kvstore.spark.source import register as _register

    _register(spark)


def read_state(spark: Any, path: str, **options: Any) -> Any:
    """The state table computed with DataFrame operations; see
    :func:`kvstore.spark.source.read_state`."""
    from kvstore.spark.source import read_state as _read_state

    return _read_state(spark, path, **options)


__all__ = ["read_state", "register"]
