"""Filters Spark pushes to the ``walkv`` source, as key and LSN bounds that prune a read.

Spark (4.1+, with ``spark.sql.python.filterPushdown.enabled``; see
:mod:`kvstore.spark.compat`) offers a scan the conjuncts of its ``WHERE``.
Those this source understands become :class:`Bounds`:

* on ``key``: ``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN`` and ``LIKE 'p%'``
  (``StringStartsWith``) narrow a key range ``[lo, hi)`` and, for ``=``/``IN``,
  a set of keys. Snapshot chunks (``snapshot`` and ``state``) whose
  ``[first_key, last_key]`` cannot hold a wanted key are never opened, and a
  task keeps only the rows in the range (the ``state`` tail included);
* on ``_commit_version`` (``changes``): the same comparisons and ``IN``
  narrow the LSN range, so the log segments (or sparse-index slices) outside
  it are never opened;
* on ``keyspace``: ``=`` and ``IN`` narrow the keyspaces read, so the
  snapshot sections of the others are never opened (``changes`` rows of
  other keyspaces are dropped as they are decoded: a log segment holds
  every keyspace).

The filters a read applies exactly (:func:`pushed`: ``keyspace``; ``key`` on
``snapshot`` and ``state``, whose tasks keep only the rows in the bounds;
``_commit_version`` but ``IN``) are taken: Spark does not evaluate them again,
and ``explain()`` lists them as the scan's ``PushedFilters``. The rest (a key
range on ``changes``, which has no key index; an LSN ``IN``, read as a range)
only prune and are handed back, so Spark still evaluates them on the rows.
Keys compare as bytes; a ``string`` key is its UTF-8 bytes, whose order is
Spark's string order. No pyspark here beyond the ``Filter`` classes passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import snapshot

KEY = ("key",)
COMMIT_VERSION = ("_commit_version",)
KEYSPACE = ("keyspace",)


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return None


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key after every key starting with ``prefix`` (``None``: none)."""
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes([p[-1] + 1]) if p else None


@dataclass(frozen=True)
class Bounds:
    """Keys in ``[lo, hi)`` (``None``: unbounded) and, when ``keys`` is set,
    only those; LSNs in ``[min_lsn, max_lsn]``; keyspaces in ``keyspaces``
    (None: any). ``empty``: nothing matches."""

    lo: bytes | None = None
    hi: bytes | None = None
    keys: frozenset[bytes] | None = None
    min_lsn: int | None = None
    max_lsn: int | None = None
    keyspaces: frozenset[str] | None = None

    def within(self, keyspaces: frozenset[str] | None) -> frozenset[str] | None:
        """The keyspaces both ``keyspaces`` (a read's option) and these bounds keep."""
        if keyspaces is None or self.keyspaces is None:
            return keyspaces if self.keyspaces is None else self.keyspaces
        return keyspaces & self.keyspaces

    @property
    def empty(self) -> bool:
        if self.keyspaces is not None and not self.keyspaces:
            return True
        if self.lo is not None and self.hi is not None and self.lo >= self.hi:
            return True
        if self.keys is not None and not any(self.key_in(k) for k in self.keys):
            return True
        return self.min_lsn is not None and self.max_lsn is not None and self.min_lsn > self.max_lsn

    @property
    def on_keys(self) -> bool:
        return self.lo is not None or self.hi is not None or self.keys is not None

    def key_in(self, key: bytes) -> bool:
        return (self.lo is None or key >= self.lo) and (self.hi is None or key < self.hi)

    def chunk_may_match(self, chunk: snapshot.ChunkInfo) -> bool:
        """Whether a snapshot chunk (keys ``first_key..last_key``) can hold a wanted key."""
        if self.empty:
            return False
        if self.lo is not None and chunk.last_key < self.lo:
            return False
        if self.hi is not None and chunk.first_key >= self.hi:
            return False
        if self.keys is not None:
            return any(chunk.first_key <= k <= chunk.last_key and self.key_in(k) for k in self.keys)
        return True

    def key_mask(self, keys: pa.Array) -> pa.Array | None:
        """A boolean mask of the wanted ``keys`` (binary), or ``None``: all."""
        mask = None
        if self.lo is not None:
            mask = pc.greater_equal(keys, pa.scalar(self.lo, pa.binary()))
        if self.hi is not None:
            m = pc.less(keys, pa.scalar(self.hi, pa.binary()))
            mask = m if mask is None else pc.and_(mask, m)
        if self.keys is not None:
            m = pc.is_in(keys, value_set=pa.array(sorted(self.keys), pa.binary()))
            mask = m if mask is None else pc.and_(mask, m)
        return mask

    def lsn_range(self, first: int, last: int) -> tuple[int, int]:
        """``first..last`` narrowed to the LSN bounds (empty: ``last < first``)."""
        lo = first if self.min_lsn is None else max(first, self.min_lsn)
        hi = last if self.max_lsn is None else min(last, self.max_lsn)
        return lo, hi


def _tighten(b: dict[str, Any], name: str, value: Any, pick: Any) -> None:
    b[name] = value if b[name] is None else pick(b[name], value)


def pushed(filters: Iterable[Any], lsn_column: tuple[str, ...] | None) -> tuple[Bounds, list[Any]]:
    """The :class:`Bounds` the understood ``filters`` imply, and those of
    them a read with these bounds applies exactly (Spark need not evaluate
    them again): every one on ``keyspace``; on ``key`` those of a table
    with a key index (``lsn_column`` None: ``snapshot``, ``state``); on the
    LSN all but ``IN`` (read as the range from its least to its greatest)."""
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
        StringStartsWith,
    )

    b: dict[str, Any] = {"lo": None, "hi": None, "keys": None, "min_lsn": None, "max_lsn": None, "keyspaces": None}
    exact: list[Any] = []
    key_exact = lsn_column is None
    for f in filters:
        col = tuple(getattr(f, "attribute", ()))
        if col == KEYSPACE and isinstance(f, (EqualTo, In)):
            names = list(f.value) if isinstance(f, In) else [f.value]
            if all(isinstance(n, str) for n in names):
                _tighten(b, "keyspaces", frozenset(names), frozenset.intersection)
                exact.append(f)
            continue
        if col == KEY:
            if isinstance(f, In):
                wanted = [_bytes(v) for v in f.value]
                if any(w is None for w in wanted):
                    continue
                keys = frozenset(w for w in wanted if w is not None)
                b["keys"] = keys if b["keys"] is None else b["keys"] & keys
                if key_exact:
                    exact.append(f)
                continue
            v = _bytes(f.value)
            if v is None or not isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual,
                                                StringStartsWith)):
                continue
            if key_exact:
                exact.append(f)
            if isinstance(f, EqualTo):
                b["keys"] = frozenset([v]) if b["keys"] is None else b["keys"] & {v}
            elif isinstance(f, GreaterThan):
                _tighten(b, "lo", v + b"\x00", max)
            elif isinstance(f, GreaterThanOrEqual):
                _tighten(b, "lo", v, max)
            elif isinstance(f, LessThan):
                _tighten(b, "hi", v, min)
            elif isinstance(f, LessThanOrEqual):
                _tighten(b, "hi", v + b"\x00", min)
            elif isinstance(f, StringStartsWith):
                _tighten(b, "lo", v, max)
                end = prefix_end(v)
                if end is not None:
                    _tighten(b, "hi", end, min)
        elif lsn_column is not None and col == lsn_column:
            values = list(f.value) if isinstance(f, In) else [f.value]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or not values:
                continue
            if isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
                exact.append(f)
            if isinstance(f, (EqualTo, In)):
                _tighten(b, "min_lsn", min(values), max)
                _tighten(b, "max_lsn", max(values), min)
            elif isinstance(f, GreaterThan):
                _tighten(b, "min_lsn", values[0] + 1, max)
            elif isinstance(f, GreaterThanOrEqual):
                _tighten(b, "min_lsn", values[0], max)
            elif isinstance(f, LessThan):
                _tighten(b, "max_lsn", values[0] - 1, min)
            elif isinstance(f, LessThanOrEqual):
                _tighten(b, "max_lsn", values[0], min)
    return Bounds(**b), exact


__all__ = ["Bounds", "prefix_end", "pushed"]
