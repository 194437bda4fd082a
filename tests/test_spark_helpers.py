"""Stores for the Spark tests, built through the real APIs, with a model of
what they must hold (shared by test_spark_unit.py and test_spark.py)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import kvstore
import wal
from kvstore.entry.codec import END_OF_KEYS


@dataclass
class Built:
    path: str
    batches: list[tuple[int, list[list]]] = field(default_factory=list)  # (lsn, ops) of every batch
    snapshots: dict[int, dict[bytes, bytes]] = field(default_factory=dict)  # lsn -> contents
    states: dict[int, dict[bytes, bytes]] = field(default_factory=dict)  # lsn -> contents after it
    model: dict[bytes, bytes] = field(default_factory=dict)  # current contents
    first_lsn: int = 1  # first LSN the log still holds
    last_lsn: int = 0

    def state_at(self, lsn: int) -> dict[bytes, bytes]:
        return self.states.get(lsn, {}) if lsn else {}

    def change_rows(self, start: int = 1, end: int | None = None) -> list[tuple]:
        """(key, value, end_key, type, lsn, index) of every op, LSN order."""
        end = self.last_lsn if end is None else end
        rows = []
        for lsn, ops in self.batches:
            if start <= lsn <= end:
                for i, op in enumerate(ops):
                    if op[0] == 1:
                        rows.append((op[1], op[2], None, "upsert", lsn, i))
                    elif op[0] == 2:
                        rows.append((op[1], None, None, "delete", lsn, i))
                    else:
                        rows.append((op[1], None, op[2], "delete_range", lsn, i))
        return rows


CHANGE_COLS = ["key", "value", "end_key", "_change_type", "_commit_version", "_op_index"]
"""The columns of the ``changes`` table most tests compare."""


def as_bytes(v):
    """A binary column's value as ``bytes`` (Spark gives bytearray)."""
    return bytes(v) if isinstance(v, (bytearray, memoryview)) else v


def apply(model: dict[bytes, bytes], ops: list[list]) -> None:
    for op in ops:
        if op[0] == 1:
            model[op[1]] = op[2]
        elif op[0] == 2:
            model.pop(op[1], None)
        else:
            for k in [k for k in model if op[1] <= k < op[2]]:
                del model[k]


def random_ops(rng: random.Random, keyspace: int, text: bool) -> list[list]:
    def key() -> bytes:
        if text:
            return b"k%03d" % rng.randrange(keyspace)
        return bytes([rng.randrange(256) for _ in range(rng.randint(1, 3))]) if rng.random() < 0.2 \
            else b"k%03d" % rng.randrange(keyspace)

    ops: list[list] = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.7:
            value = b"" if rng.random() < 0.05 else (b"v%d-" % rng.randrange(1000)) * rng.randint(1, 8)
            ops.append([1, key(), value])
        elif r < 0.9:
            ops.append([2, key()])
        else:
            i = rng.randrange(keyspace)
            a, b = b"k%03d" % i, b"k%03d" % (i + rng.randint(1, 6))
            if rng.random() < 0.04:
                a, b = b"", END_OF_KEYS if rng.random() < 0.3 else b
            ops.append([3, a, b])
    return ops


def write_ops(batch: Any, ops: list[list]) -> None:
    """Add ``random_ops``' operations to a batch or a transaction."""
    for op in ops:
        if op[0] == 1:
            batch.put(op[1], op[2])
        elif op[0] == 2:
            batch.delete(op[1])
        else:
            batch.delete_range(op[1], op[2])


def take_snapshot(db: kvstore.KVStore, chunk_bytes: int = 200) -> int:
    """A snapshot of the store at its applied LSN, in several small chunks,
    taken the way the store takes them (with its retention: the log is kept
    back to the oldest of the newest 3 snapshots)."""
    return db.snapshot(chunk_bytes=chunk_bytes, keep=3).lsn


def build_store(
    path: str,
    seed: int,
    n_batches: int = 120,
    *,
    segment_bytes: int = 4096,
    snapshot_after: tuple[int, ...] = (40, 80),
    trim: bool = True,
    keyspace: int = 60,
    text: bool = False,
    sync: str = "always",
) -> Built:
    """A store written through kvstore (puts, deletes, range deletes), with
    snapshots after the given batch numbers and, with ``trim``, the log
    segments the newest snapshot covers deleted."""
    rng = random.Random(seed)
    built = Built(path)
    db = kvstore.open(path, segment_bytes=segment_bytes, sync=sync)
    try:
        for i in range(n_batches):
            ops = random_ops(rng, keyspace, text)
            with db.batch() as b:
                write_ops(b, ops)
            assert b.lsn is not None
            apply(built.model, ops)
            built.batches.append((b.lsn, ops))
            built.states[b.lsn] = dict(built.model)
            built.last_lsn = b.lsn
            if i + 1 in snapshot_after:
                lsn = take_snapshot(db)
                built.snapshots[lsn] = dict(built.model)
        assert dict(db.scan()) == built.model
    finally:
        db.close()
    with wal.open(os.path.join(path, "wal"), segment_bytes=segment_bytes) as log:
        if trim and built.snapshots:
            log.truncate_before(max(built.snapshots) + 1)
        built.first_lsn = log.first_lsn
    return built


def log_timestamps(path: str) -> dict[int, int]:
    """LSN -> commit timestamp (us) as the log says (the store is closed)."""
    with wal.open(os.path.join(path, "wal")) as log:
        return {e.lsn: e.timestamp_us for e in log.read_entries(log.first_lsn)}
