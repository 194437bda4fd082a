"""The ``state`` table's merge inside one partition (one key range, one
keyspace): what a run of log entries after a snapshot does to its keys
(:class:`TailState`), so that the snapshot's rows it leaves alone and the
keys it last put make the table (:mod:`kvstore.spark.partitions`). The
writes of each entry are :func:`kvstore.spark.arrow.keyspace_writes`'."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kvstore.entry.codec import OP_DELETE, OP_EXPIRE, OP_PUT
from kvstore.entry.groups import ReadBack
from kvstore.spark.arrow import keyspace_writes


class TailState:
    """The effect of a run of log entries on the keys in ``[lo, hi)``: the
    last put/delete of each key and every range delete, with their positions
    ``(lsn, op index)``. Built entry by entry, in LSN order (:meth:`add`)."""

    def __init__(self, lo: bytes | None = None, hi: bytes | None = None, keyspace: str = "") -> None:
        self.lo, self.hi = lo, hi
        self.keyspaces = frozenset([keyspace])  # the one keyspace it follows
        self.latest: dict[bytes, tuple[int, int, bytes | None]] = {}
        self.ranges: list[tuple[bytes, bytes, int, int]] = []

    def add(self, lsn: int, ops: list[Any], path: str | None = None, read_back: ReadBack | None = None) -> None:
        for i, _keyspace, op in keyspace_writes(ops, self.keyspaces, lsn, path, read_back):
            self.add_write(lsn, i, op)

    def add_write(self, lsn: int, i: int, op: Any) -> None:
        """One write of its keyspace (as :func:`keyspace_writes` yields it), at ``(lsn, i)``."""
        lo, hi = self.lo, self.hi
        code = op[0]
        if code == OP_PUT or code == OP_DELETE or code == OP_EXPIRE:
            key = op[1]
            if (lo is None or key >= lo) and (hi is None or key < hi):
                self.latest[key] = (lsn, i, op[2] if code == OP_PUT else None)
        else:
            start, end = op[1], op[2]
            if start < end and (hi is None or start < hi) and (lo is None or end > lo):
                self.ranges.append((start, end, lsn, i))

    def merged_ranges(self) -> list[tuple[bytes, bytes]]:
        """The union of the range deletes as disjoint sorted ``[start, end)``."""
        out: list[list[bytes]] = []
        for start, end, _, _ in sorted(self.ranges):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return [(s, e) for s, e in out]

    def filter_snapshot(self, keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Snapshot rows (all older than the tail) that the tail leaves alone."""
        mask = None
        if self.latest:
            touched = pc.is_in(keys, value_set=pa.array(list(self.latest), pa.binary()))
            mask = pc.invert(touched)
        for start, end in self.merged_ranges():
            inside = pc.and_(
                pc.greater_equal(keys, pa.scalar(start, pa.binary())), pc.less(keys, pa.scalar(end, pa.binary()))
            )
            keep = pc.invert(inside)
            mask = keep if mask is None else pc.and_(mask, keep)
        if mask is None:
            return keys, values
        return keys.filter(mask), values.filter(mask)

    def survivors(self) -> tuple[list[bytes], list[bytes], list[int]]:
        """Keys whose last write in the tail is a put not followed by a range
        delete covering them: (keys, values, lsns), sorted by key."""
        ranges = sorted(self.ranges)
        keys, values, lsns = [], [], []
        for key in sorted(self.latest):
            lsn, idx, value = self.latest[key]
            if value is None:
                continue
            dead = False
            for start, end, rlsn, ridx in ranges:
                if start > key:
                    break
                if key < end and (rlsn, ridx) > (lsn, idx):
                    dead = True
                    break
            if not dead:
                keys.append(key)
                values.append(value)
                lsns.append(lsn)
        return keys, values, lsns
