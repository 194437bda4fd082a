"""Snapshots as the Spark data source reads them: the snapshot reader over the store's file seam.

Finding, opening and checking snapshots is the :mod:`snapshot` package's
job (a snapshot is usable when its MANIFEST is valid, names its directory's
LSN, and every chunk it names is there with its size); this module picks the
one a query starts from and reads one chunk per task, through the file
system that holds the store, so a store on HDFS or S3 is read as a local one.
Chunk contents are checked as executors read them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import snapshot
from kvstore.spark.arrow import MAX_BATCH_BYTES
from kvstore.spark.files import StoreFiles
from wal.errors import CorruptionError, Damage, SnapshotError


def choose(files: StoreFiles, snapshot_lsn: int | None, ending_lsn: int | None) -> snapshot.Snapshot | None:
    """The snapshot a read starts from: the one at exactly ``snapshot_lsn``
    (``0``: none), else the newest at or before ``ending_lsn`` (when given),
    else the newest; ``None`` when the store has none."""
    if snapshot_lsn == 0:
        return None
    layout = files.layout
    if snapshot_lsn is None:
        return snapshot.newest(layout.snapshots_dir, max_lsn=ending_lsn, fs=layout.fs)
    path = layout.fs.join(layout.snapshots_dir, snapshot.snapshot_dir_name(snapshot_lsn))
    try:
        return snapshot.open(path, fs=layout.fs)
    except (CorruptionError, SnapshotError) as exc:
        have = ", ".join(str(s.lsn) for s in snapshot.list_snapshots(layout.snapshots_dir, fs=layout.fs))
        raise ValueError(
            f"{files.display()} has no usable snapshot at LSN {snapshot_lsn} (snapshots at LSNs: {have or 'none'}); "
            "leave snapshotLsn out to use the newest"
        ) from exc


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
    columns = snapshot.read_chunk_file(files.layout.fs, directory, chunk)
    keys: list[Sequence[bytes]] = []
    values: list[Sequence[bytes]] = []
    n = 0
    try:
        for k, v in columns:
            keys.append(k)
            values.append(v)
            n += len(k)
            if n >= limit:
                yield keys, values
                keys, values, n = [], [], 0
    except CorruptionError as exc:
        if exc.kind is not Damage.MISSING or files.layout.fs.list_dir(directory):
            raise
        # Planned, then gone with its directory: retention deleted it while the query ran.
        raise SnapshotError(
            f"snapshot chunk {exc.path} is gone (the snapshot at LSN {chunk.lsn} was deleted by retention "
            "while the query ran); rerun the query"
        ) from exc
    if keys:
        yield keys, values
