"""The ``changes`` of a store (or an archive) as a Spark stream (``spark.readStream.format("walkv")``).

Offsets are ``{"lsn": n, "store": id, "timelines": h}``, ``n`` the last LSN
the micro-batch includes and ``h`` the log's timeline history up to it
(:mod:`wal.timeline`); a checkpoint taken against another store is refused,
and one whose history the log left at or before ``n`` (a repair cut, a
truncation, a failover: the rows delivered past the fork are of a history
gone) fails with :class:`~wal.errors.ForkedHistoryError` naming both
timelines and the fork LSN, rather than go on with the other history's
entries (an offset without ``timelines``, written before them, is on
timeline 1). A micro-batch
from ``{"lsn": a}`` to ``{"lsn": b}`` holds the rows of LSNs ``a+1 .. b``, so
a query restarted from its checkpoint resumes at the LSN after the last
committed micro-batch: none is read twice or skipped. With
``startingFrom=snapshot`` the initial offset is ``{"lsn": s, "snapshot": s}``
(the snapshot at LSN ``s`` not yet read): the first micro-batch holds its rows
and the log after it.

Controls (the options in :mod:`kvstore.spark.options`):

* ``maxRecordsPerTrigger`` and ``maxBytesPerTrigger`` cap each micro-batch.
  Where PySpark has admission control (4.2+) they are the source's default
  read limit (``ReadMaxRows``; ``ReadMaxBytes`` when only bytes are given)
  and Spark's limit is obeyed (``ReadAllAvailable``, Trigger.Once: no cap);
  the options are applied here too (both caps when both are given, and on
  PySpark before 4.2, which passes no limit). Bytes are the entries' payload bytes,
  counted by reading the entries past the start on the driver (at most the
  cap plus one entry); an entry larger than the cap is a micro-batch alone.
* ``Trigger.AvailableNow`` ends at the LSN durable when the query started
  (in as many capped micro-batches as it takes).
* ``failOnDataLoss``: when retention deleted LSNs the stream still needs,
  the default fails with :class:`~wal.errors.LogGapError` naming them;
  ``false`` logs a warning naming them and goes on from the oldest LSN the
  log holds.

A stream never reads past the durable LSN (an archive's: its last LSN).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader

from kvstore.spark import debezium, delta_cdf, images
from kvstore.spark import snapshots as ss
from kvstore.spark.archive import open_files
from kvstore.spark.arrow import ALL_KEYSPACES
from kvstore.spark.compat import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow
from kvstore.spark.files import LogSlice, normalize_location
from kvstore.spark.options import Options
from kvstore.spark.partitions import LogPartition, SnapshotChangesPartition, read_partition, starting_lsn
from wal.timeline import ROOT, History, check_follows, history_from_json, history_to_json, history_until

log = logging.getLogger("walkv.spark")

SNAPSHOT_KEY = "snapshot"
HISTORY_KEY = "timelines"


def _offset(lsn: int, store_id: str | None, history: History, snapshot_lsn: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"lsn": int(lsn), "store": store_id or "",
                           HISTORY_KEY: history_to_json(history_until(history, lsn))}
    if snapshot_lsn is not None:
        out[SNAPSHOT_KEY] = int(snapshot_lsn)
    return out


class WalkvStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``changes`` of a store as a stream; offsets are LSNs (see the module docstring)."""

    def __init__(self, opts: Options) -> None:
        self.opts = replace(opts, path=normalize_location(opts.path))
        self.files = open_files(self.opts.path)
        self.files.check_store()
        self.store_id = self.files.store_id()
        self._available_now: int | None = None
        self._last: dict[str, Any] | None = None  # the last offset handed to Spark (PySpark < 4.2)
        self._say_other_keyspaces()

    def _say_other_keyspaces(self) -> None:
        """A stream reads one keyspace unless told ``keyspace=*`` (the
        default one: a query checkpointed before keyspaces must not begin to
        deliver other rows); say so when the newest snapshot holds others."""
        if self.opts.keyspace == ALL_KEYSPACES:
            return
        snap = ss.choose(self.files, None, None)
        others = [ks for ks in ss.keyspaces_of(snap, None) if ks != self.opts.keyspace] if snap is not None else []
        if others:
            log.warning("the stream of %s reads keyspace %r only; its snapshot at LSN %d also holds keyspace%s %s: "
                        "give option keyspace=* for every keyspace (each row names its own)", self.files.display(),
                        self.opts.keyspace, snap.lsn if snap is not None else 0, "s" if len(others) > 1 else "",
                        ", ".join(repr(ks) for ks in others))

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
        lsn = int(offset["lsn"])
        # An offset is an LSN on a timeline: one the log's history left at or before it is of a history gone.
        mine = history_from_json(offset[HISTORY_KEY], f"the stream's {what} offset") if HISTORY_KEY in offset \
            else ROOT  # an offset written before timelines: timeline 1's
        check_follows(mine, lsn, self.files.history(), what=f"the stream's {what} offset", source=self.files.display(),
                      hint="the rows the stream delivered past that LSN are not in the store's history any more: "
                           "undo them downstream, then restart the query with a new checkpointLocation and "
                           "startingLsn at the LSN after the fork")
        return lsn

    def initialOffset(self) -> dict[str, Any]:
        durable = self.files.durable_lsn()
        if self.store_id is None:
            self.store_id = self.files.store_id()
        if self.opts.starting_from_snapshot:
            snap = ss.choose(self.files, None, None)
            if snap is not None:
                self._last = _offset(snap.lsn, self.store_id, self.files.history(), snap.lsn)
                return self._last
            start = 1  # no snapshot: the whole log
        elif self.opts.starting_timestamp_us is not None:
            start = self.files.last_lsn_at(self.opts.starting_timestamp_us - 1, durable) + 1
        else:
            start = starting_lsn(self.files, self.opts.starting_lsn, durable)
            if start > durable + 1:
                raise ValueError(
                    f"startingLsn {start} is past the end of the log of {self.files.display()} (durable LSN "
                    f"{durable}); give at most {durable + 1}, or 'latest'"
                )
        self._last = _offset(start - 1, self.store_id, self.files.history())
        return self._last

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch:
            return ReadMaxRows(self.opts.max_records_per_batch)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.files.durable_lsn()

    def _target(self, durable: int) -> int:
        if self._available_now is not None:
            return min(durable, self._available_now)
        return durable

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        start = start if start is not None else self._last  # PySpark < 4.2 passes neither
        if start is None:
            start = self.initialOffset()
        begin = self._check(start, "start")
        durable = self.files.durable_lsn()
        if begin > durable:
            raise ValueError(
                f"the stream's checkpoint is at LSN {begin}, past the end of the log of {self.files.display()} "
                f"(durable LSN {durable}); the store was restored or replaced: use a new checkpointLocation"
            )
        first = max(begin + 1, self.files.first_held(durable))  # a gap fails or is skipped in partitions()
        end = max(begin, self._target(durable))
        # Spark's limit: the default one below, or ReadAllAvailable (Trigger.Once): no cap.
        everything = isinstance(limit, ReadAllAvailable)
        max_rows = [None if everything else self.opts.max_records_per_batch]
        max_bytes = [None if everything else self.opts.max_bytes_per_trigger]
        if isinstance(limit, ReadMaxRows):
            max_rows.append(int(limit.max_rows))
        if isinstance(limit, ReadMaxBytes):
            max_bytes.append(int(limit.max_bytes))
        rows_cap = min((n for n in max_rows if n), default=None)
        bytes_cap = min((n for n in max_bytes if n), default=None)
        if rows_cap is not None:
            end = min(end, first - 1 + max(1, rows_cap))
        if bytes_cap is not None and end >= first:
            end = self._bytes_cut(first, end, durable, bytes_cap)
        self._last = _offset(end, self.store_id, self.files.history())
        return self._last

    def _bytes_cut(self, first: int, end: int, durable: int, cap: int) -> int:
        """The last LSN of ``first..end`` such that the entries from
        ``first`` hold at most ``cap`` payload bytes (at least ``first``)."""
        total, last = 0, first
        for piece in self.files.plan_log(first, end, durable, self.opts.max_partition_bytes):
            for entry in self.files.iter_slice(piece):
                total += len(entry.payload)
                if total > cap and entry.lsn > first:
                    return last
                last = entry.lsn
        return last

    def reportLatestOffset(self) -> dict[str, Any]:
        return _offset(self.files.durable_lsn(), self.store_id, self.files.history())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        a = self._check(start, "start")
        b = self._check(end, "end")
        if self.opts.needs_images:
            return self._event_partitions(start, a, b)
        out: list[Any] = []
        if start.get(SNAPSHOT_KEY) is not None:
            snap = ss.choose(self.files, int(start[SNAPSHOT_KEY]), None)
            if snap is not None:
                out.extend(SnapshotChangesPartition(snap.path, c, snap.created_us, ks)
                           for ks in ss.keyspaces_of(snap, self.opts.keyspaces) for c in ss.keyspace_chunks(snap, ks))
        if b <= a:
            return out
        first = self._first(a, b)
        pieces: list[LogSlice] = self.files.plan_log(first, b, b, *self.opts.log_split()) if first <= b else []
        out.extend(LogPartition(piece, self.opts.keyspaces) for piece in pieces)
        return out

    def _first(self, a: int, b: int) -> int:
        """The first LSN of the micro-batch ``a+1 .. b`` (``failOnDataLoss``)."""
        first = a + 1
        held = self.files.first_held(b)
        if first < held and not self.opts.fail_on_data_loss:
            log.warning("failOnDataLoss=false: LSNs %d..%d are no longer in the log of %s (retention deleted "
                        "them); the stream goes on from LSN %d", first, min(b, held - 1), self.files.display(),
                        held)
            first = held
        return first

    def _event_partitions(self, start: dict[str, Any], a: int, b: int) -> list[Any]:
        """``format=debezium`` or ``changeVocabulary=delta``: the changes of
        ``a+1 .. b``, each key's previous value rebuilt from the newest
        snapshot at or before ``a`` (:mod:`kvstore.spark.images`)."""
        if start.get(SNAPSHOT_KEY) is not None:
            base = ss.choose(self.files, int(start[SNAPSHOT_KEY]), None)
            return list(images.partitions_from(self.files, self.opts, base, a + 1, b, b, True))
        if b <= a:
            return []
        first = self._first(a, b)
        base = images.base_before(self.files, None, first)
        return list(images.partitions_from(self.files, self.opts, base, first, b, b, False))

    def read(self, partition: Any) -> Iterator[Any]:
        if isinstance(partition, images.ImagePartition):
            return images.read(self.files, self.opts, partition,
                               debezium.Events if self.opts.debezium else delta_cdf.Rows)
        return read_partition(self.files, self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._check(end, "committed")
