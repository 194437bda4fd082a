"""The one place that knows which PySpark is installed (4.0 and later are supported).

* Admission control for Python streaming sources (``ReadLimit``,
  ``ReadMaxRows``, ``ReadMaxBytes``, ``SupportsTriggerAvailableNow`` in
  ``pyspark.sql.streaming.datasource``) arrived in PySpark 4.2. Before it,
  the names below are stand-ins with the same fields, Spark never passes a
  limit, and :mod:`kvstore.spark.stream` applies ``maxRecordsPerTrigger`` /
  ``maxBytesPerTrigger`` itself (the same caps, from its options).
* Filter pushdown for Python data sources (``DataSourceReader.pushFilters``
  and the ``Filter`` classes) arrived in PySpark 4.1, behind the session
  setting :data:`PUSHDOWN_CONF`; a reader that implements ``pushFilters``
  while it is off fails every query, so :func:`kvstore.spark.register`
  turns it on when it was left unset, and registers the pushing reader only
  when the setting is on.

Nothing else in walkv tests the version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyspark.sql.datasource as _ds

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
HAS_FILTER_PUSHDOWN: bool = hasattr(_ds, "Filter")

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # PySpark 4.0 / 4.1: stand-ins Spark never passes
    HAS_ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        max_bytes: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        def prepareForTriggerAvailableNow(self) -> None:
            raise NotImplementedError


def enable_pushdown(spark: Any) -> None:
    """Turn :data:`PUSHDOWN_CONF` on in ``spark`` unless it was set (on or off) already."""
    if HAS_FILTER_PUSHDOWN and spark.conf.get(PUSHDOWN_CONF, None) is None:
        spark.conf.set(PUSHDOWN_CONF, "true")


def pushdown_enabled(spark: Any) -> bool:
    """Whether ``spark`` lets Python data sources take filters."""
    if not HAS_FILTER_PUSHDOWN:
        return False
    return str(spark.conf.get(PUSHDOWN_CONF, "false")).strip().lower() == "true"


__all__ = [
    "HAS_ADMISSION_CONTROL", "HAS_FILTER_PUSHDOWN", "PUSHDOWN_CONF", "ReadAllAvailable", "ReadLimit",
    "ReadMaxBytes", "ReadMaxRows", "SupportsTriggerAvailableNow", "enable_pushdown", "pushdown_enabled",
]
