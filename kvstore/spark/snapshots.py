"""Snapshots as the Spark data source reads them: the snapshot reader over the store's file seam.

Finding, opening and checking snapshots is the :mod:`snapshot` package's
job (a snapshot is usable when its MANIFEST is valid, names its directory's
LSN, and every chunk it names is there with its size); this module picks the
one a query starts from and reads one chunk per task, through the file
system that holds the store, so a store on HDFS or S3 is read as a local one.
Chunk contents are checked as executors read them.

Only a snapshot of this store is used: one whose manifest names a store id
other than the log's (the newest segment's header) was left by another
store at the same path, and is skipped with a logged warning naming both
ids (asked for by ``snapshotLsn``: refused), never merged with this log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pyarrow as pa

import snapshot
from kvstore.entry.codec import KEYSPACE_SECTION
from kvstore.spark.arrow import MAX_BATCH_BYTES
from kvstore.spark.columnar import read_chunk_arrays as read_chunk_arrays_of
from kvstore.spark.files import StoreFiles
from snapshot.reader import open_chunk
from wal.errors import CorruptionError, Damage, SnapshotError

log = logging.getLogger("walkv.spark")


def choose(files: StoreFiles, snapshot_lsn: int | None, ending_lsn: int | None) -> snapshot.Snapshot | None:
    """The snapshot of this store a read starts from: the one at exactly
    ``snapshot_lsn`` (``0``: none), else the newest at or before
    ``ending_lsn`` (when given), else the newest; ``None`` when the store has
    none. Snapshots of another store are skipped (see the module docstring)."""
    if snapshot_lsn == 0:
        return None
    layout = files.layout
    ours = files.store_id()
    if snapshot_lsn is None:
        max_lsn = ending_lsn
        while True:
            snap = snapshot.newest(layout.snapshots_dir, max_lsn=max_lsn, fs=layout.fs)
            if snap is None or _belongs(snap, ours):
                return snap
            log.warning("skipping snapshot %s: it belongs to store %s, not to this store %s (left by a store "
                        "deleted or replaced at the same path?)", files.display(snap.path), snap.store_id, ours)
            if snap.lsn == 0:
                return None
            max_lsn = snap.lsn - 1
    path = layout.fs.join(layout.snapshots_dir, snapshot.snapshot_dir_name(snapshot_lsn))
    try:
        snap = snapshot.open(path, fs=layout.fs)
    except (CorruptionError, SnapshotError) as exc:
        have = ", ".join(str(s.lsn) for s in snapshot.list_snapshots(layout.snapshots_dir, fs=layout.fs))
        raise ValueError(
            f"{files.display()} has no usable snapshot at LSN {snapshot_lsn} (snapshots at LSNs: {have or 'none'}); "
            "leave snapshotLsn out to use the newest"
        ) from exc
    if not _belongs(snap, ours):
        raise ValueError(
            f"the snapshot at LSN {snapshot_lsn} in {files.display()} belongs to store {snap.store_id}, not to "
            f"this store {ours} (its log's); it was left by another store at the same path and is not used"
        )
    return snap


def _belongs(snap: snapshot.Snapshot, store_id: str | None) -> bool:
    """Whether ``snap`` may be read with the log of store ``store_id`` (a
    log with no segment, or a snapshot naming no store, cannot tell)."""
    return store_id is None or snap.store_id is None or snap.store_id == store_id


def where(files: StoreFiles, directory: str, chunk: snapshot.ChunkInfo) -> str:
    """A chunk, named for messages."""
    return f"{files.display(files.layout.fs.join(directory, chunk.name))}, snapshot at LSN {chunk.lsn}"


def read_chunk(files: StoreFiles, directory: str, chunk: snapshot.ChunkInfo,
               rows: int) -> Iterator[tuple[list[Sequence[bytes]], list[Sequence[bytes]]]]:
    """The chunk of the snapshot ``directory`` in key order, as runs of whole
    data records ``(key_parts, value_parts)`` (lists of sequences of bytes)
    of about ``rows`` pairs, or fewer when the pairs are large (about
    :data:`~kvstore.spark.arrow.MAX_BATCH_BYTES` per run)."""
    per_pair = max(1, chunk.bytes // max(1, chunk.pairs))
    limit = max(1, min(rows, MAX_BATCH_BYTES // per_pair))
    keys: list[Sequence[bytes]] = []
    values: list[Sequence[bytes]] = []
    n = 0
    with _gone_is_retention(files, directory, chunk):
        for k, v in snapshot.read_chunk_file(files.layout.fs, directory, chunk):
            keys.append(k)
            values.append(v)
            n += len(k)
            if n >= limit:
                yield keys, values
                keys, values, n = [], [], 0
    if keys:
        yield keys, values


def read_chunk_arrays(files: StoreFiles, directory: str, chunk: snapshot.ChunkInfo,
                      rows: int) -> Iterator[tuple[pa.Array, pa.Array]]:
    """The chunk of the snapshot ``directory`` in key order as ``binary``
    Arrow arrays ``(keys, values)`` of about ``rows`` pairs, or fewer when
    the pairs are large (about :data:`~kvstore.spark.arrow.MAX_BATCH_BYTES`
    per batch); the same rows, checked the same way, as :func:`read_chunk`
    (see :mod:`kvstore.spark.columnar`)."""
    fs = files.layout.fs
    with _gone_is_retention(files, directory, chunk):
        with open_chunk(fs, directory, chunk) as f:
            yield from read_chunk_arrays_of(f, chunk, fs.display(fs.join(directory, chunk.name)), rows,
                                            MAX_BATCH_BYTES)


@contextmanager
def _gone_is_retention(files: StoreFiles, directory: str, chunk: snapshot.ChunkInfo) -> Iterator[None]:
    try:
        yield
    except CorruptionError as exc:
        if exc.kind is not Damage.MISSING or files.layout.fs.list_dir(directory):
            raise
        # Planned, then gone with its directory: retention deleted it while the query ran.
        raise SnapshotError(
            f"snapshot chunk {exc.path} is gone (the snapshot at LSN {chunk.lsn} was deleted by retention "
            "while the query ran); rerun the query"
        ) from exc


def keyspaces_of(snap: snapshot.Snapshot, wanted: frozenset[str] | None) -> list[str]:
    """The keyspaces ``snap`` holds ("" always; the others as sections
    ``ks:<name>``), of ``wanted`` (None: every one)."""
    held = [""] + [n[len(KEYSPACE_SECTION):] for n in snap.section_names() if n.startswith(KEYSPACE_SECTION)]
    return [ks for ks in held if wanted is None or ks in wanted]


def keyspace_chunks(snap: snapshot.Snapshot, keyspace: str) -> tuple[snapshot.ChunkInfo, ...]:
    """The chunks of ``keyspace`` in ``snap`` (none when it holds no section of it)."""
    if not keyspace:
        return snap.chunks
    section = KEYSPACE_SECTION + keyspace
    return snap.section_chunks(section) if section in snap.section_names() else ()
