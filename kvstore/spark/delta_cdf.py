"""``changes`` in Delta Lake's change types (the option ``changeVocabulary=delta``).

::

    spark.read.format("walkv").option("changeVocabulary", "delta").load(path)
    spark.readStream.format("walkv").option("changeVocabulary", "delta").load(path)

The columns are the ``changes`` table's (:mod:`kvstore.spark.arrow`: key,
value, end_key, _change_type, _commit_version, _commit_timestamp, _op_index);
``_change_type`` takes the values of Delta Lake's change data feed, and
``value`` is the image that type names, as in Delta. From walkv's types
(``changeVocabulary=walkv``, the default):

* ``upsert`` of a key that did not exist: ``insert`` (value: the new value)
* ``upsert`` of a key that existed: ``update_preimage`` (value: the old
  value), then ``update_postimage`` (the new value), both with the same
  ``_commit_version`` and ``_op_index``
* ``delete`` of a key that existed: ``delete`` (value: the value it deleted)
* ``delete`` of a key that did not exist: no row
* ``delete_range`` [key, end_key): one ``delete`` per key it deleted, in key
  order, each with the value it deleted and the range delete's ``_op_index``
* a conditional write whose conditions failed: no row (as in walkv's types)
* ``startingFrom=snapshot``: the snapshot's rows are ``insert`` rows at its
  LSN and time, ``_op_index`` -1

``end_key`` is always null. A put of the value a key already has is an
update (it was written). Insert or update, and every pre-image, are exact:
they come from :mod:`kvstore.spark.images`, the mechanism ``format=debezium``
uses (each task rebuilds its key range's state from a snapshot at or before
the first LSN read plus the log after it; a read whose history retention
deleted fails with :class:`~wal.errors.LogGapError` rather than guess).

Why an option on ``changes`` and not a table of before/after columns: Delta's
change data feed is rows, one per image, told apart by ``_change_type``, so
what is written for it (apply with ``MERGE`` after dropping
``update_preimage`` rows, or pair the two images of an update by
``_commit_version`` and ``_op_index``) works on these rows unchanged; the
before/after shape is ``format=debezium``'s already. (``format=delta`` names
the default columns, Delta's, with walkv's types.)

Order: tasks are the key ranges of the base snapshot's chunks (one without a
snapshot), so a key's rows come from one task, in (``_commit_version``,
``_op_index``) order, a pre-image before its post-image; sort by
``_commit_version`` and ``_op_index`` for one order across keys. Filters are
not pushed down (a key's pre-image needs its key range's whole history).
"""

from __future__ import annotations

import pyarrow as pa

from kvstore.spark import arrow as sa
from kvstore.spark.images import Image
from kvstore.spark.options import Options

INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
CHANGE_TYPES = (INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE)

_NAMES = pa.array(CHANGE_TYPES, pa.string())
_INSERT, _PRE, _POST, _DELETE = range(4)


class Rows:
    """``changes`` rows in Delta's change types, collected into record batches
    of the table's schema (an :class:`~kvstore.spark.images.Shape`)."""

    def __init__(self, opts: Options, store_id: str | None, where: str) -> None:
        self.kf, self.vf, self.where = opts.key_format, opts.value_format, where
        self.schema = sa.arrow_schema(sa.CHANGES, self.kf, self.vf)
        self.keys: list[bytes] = []
        self.values: list[bytes | None] = []
        self.types: list[int] = []
        self.lsns: list[int] = []
        self.stamps: list[int] = []
        self.idxs: list[int] = []
        self.spaces: list[str] = []

    def _row(self, key: bytes, value: bytes | None, kind: int, lsn: int, ts_us: int, index: int,
             keyspace: str) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.types.append(kind)
        self.lsns.append(lsn)
        self.stamps.append(ts_us)
        self.idxs.append(index)
        self.spaces.append(keyspace)

    def add(self, image: Image) -> None:
        key, before, after, lsn, ts_us, index, _, ks = image
        if before is None:
            self._row(key, after, _INSERT, lsn, ts_us, index, ks)
        elif after is None:
            self._row(key, before, _DELETE, lsn, ts_us, index, ks)
        else:
            self._row(key, before, _PRE, lsn, ts_us, index, ks)
            self._row(key, after, _POST, lsn, ts_us, index, ks)

    def __len__(self) -> int:
        return len(self.keys)

    def flush(self) -> pa.RecordBatch:
        lsns = self.lsns

        def where() -> str:
            return f"{self.where}, LSNs {lsns[0]}..{lsns[-1]}"

        k = sa.as_format(pa.array(self.keys, pa.binary()), self.kf, "key", where)
        batch = pa.RecordBatch.from_arrays(
            [k, sa.as_format(pa.array(self.values, pa.binary()), self.vf, "value", where), pa.nulls(len(k), k.type),
             _NAMES.take(pa.array(self.types, pa.int8())), pa.array(lsns, pa.int64()),
             pa.array(self.stamps, pa.timestamp("us", tz="UTC")), pa.array(self.idxs, pa.int32()),
             pa.array(self.spaces, pa.string())],
            schema=self.schema,
        )
        for col in (self.keys, self.values, self.types, self.lsns, self.stamps, self.idxs, self.spaces):
            col.clear()
        return batch
