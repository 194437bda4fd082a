"""The ``changes`` of a store as a Spark stream (``spark.readStream.format("walkv")``).

Offsets are ``{"lsn": n, "store": id}``, ``n`` the last LSN the micro-batch
includes; a checkpoint taken against another store is refused. A stream never
reads past the durable LSN, and if retention deleted the segments holding
LSNs it still needs it fails with :class:`~wal.errors.LogGapError` naming
them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kvstore.spark.archive import open_files
from kvstore.spark.files import normalize_location
from kvstore.spark.options import EARLIEST, LATEST, Options
from kvstore.spark.partitions import LogPartition, read_partition


def _offset(lsn: int, store_id: str | None) -> dict[str, Any]:
    return {"lsn": int(lsn), "store": store_id or ""}


class WalkvStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``changes`` of a store as a stream; offsets are LSNs.

    A micro-batch from offset ``{"lsn": a}`` to ``{"lsn": b}`` holds the rows
    of LSNs ``a+1 .. b``, in LSN order within each partition.
    """

    def __init__(self, opts: Options) -> None:
        self.opts = replace(opts, path=normalize_location(opts.path))
        self.files = open_files(self.opts.path)
        self.files.check_store()
        self.store_id = self.files.store_id()
        self._available_now: int | None = None

    # -- offsets -------------------------------------------------------------

    def _check(self, offset: dict[str, Any], what: str) -> int:
        if not isinstance(offset, dict) or "lsn" not in offset:
            raise ValueError(f"{what} offset {offset!r} is not a walkv offset ({{'lsn': n, 'store': id}})")
        store = offset.get("store") or ""
        if self.store_id is None:
            self.store_id = self.files.store_id()
        if store and self.store_id and store != self.store_id:
            raise ValueError(
                f"the stream's checkpoint belongs to walkv store {store}, but {self.files.display()} is store "
                f"{self.store_id}; use a new checkpointLocation for this store"
            )
        return int(offset["lsn"])

    def initialOffset(self) -> dict[str, Any]:
        durable = self.files.durable_lsn()
        start = self.opts.starting_lsn if self.opts.starting_lsn is not None else EARLIEST
        if start == EARLIEST:
            lsn = self.files.first_held(durable) - 1
        elif start == LATEST:
            lsn = durable
        else:
            lsn = int(start) - 1
            if lsn > durable:
                raise ValueError(
                    f"startingLsn {start} is past the end of the log of {self.files.display()} (durable LSN "
                    f"{durable}); give at most {durable + 1}, or 'latest'"
                )
        if self.store_id is None:
            self.store_id = self.files.store_id()
        return _offset(lsn, self.store_id)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch:
            return ReadMaxRows(self.opts.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.files.durable_lsn()

    def _target(self) -> int:
        durable = self.files.durable_lsn()
        if self._available_now is not None:
            return min(durable, self._available_now)
        return durable

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._check(start, "start")
        target = self._target()
        if begin > self.files.durable_lsn():
            raise ValueError(
                f"the stream's checkpoint is at LSN {begin}, past the end of the log of {self.files.display()} "
                f"(durable LSN {self.files.durable_lsn()}); the store was restored or replaced: use a new checkpointLocation"
            )
        end = max(begin, target)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + max(1, int(limit.max_rows)))
        return _offset(end, self.store_id)

    def reportLatestOffset(self) -> dict[str, Any]:
        return _offset(self.files.durable_lsn(), self.store_id)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        a = self._check(start, "start")
        b = self._check(end, "end")
        if b <= a:
            return []
        pieces = self.files.plan_log(a + 1, b, b, self.opts.max_partition_bytes)
        return [LogPartition(piece) for piece in pieces]

    def read(self, partition: Any) -> Iterator[Any]:
        return read_partition(self.files, self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._check(end, "committed")
