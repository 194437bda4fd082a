"""walkv snapshots: a sorted map of bytes at one LSN, in chunk files plus a manifest.

Knows nothing of LMDB or the store; uses ``wal.record`` for framing,
``wal.fs`` for every durable write and ``wal.readfs`` (the read-only file
seam) for every read. On-disk formats: :mod:`snapshot.layout`
(the directory and its commit protocol), :mod:`snapshot.chunk` (chunk
files; read by :mod:`snapshot.chunk_reader`, written by
:mod:`snapshot.chunk_writer`), :mod:`snapshot.manifest` (the MANIFEST).

::

    info = snapshot.write(parent, lsn, sorted_pairs)     # durable on return
    snap = snapshot.open(info.path)                       # .lsn .count .chunks
    for key, value in snap: ...
    for key, value in snap.items(b"a", b"m"): ...
    snap.verify()                                          # every section
    snapshot.copy(snap, other_parent, store_id=new_id)    # the same chunks, another store's name

    # named sections beside the default one, each its own sorted run of chunks
    snapshot.write(parent, lsn, default_pairs, sections={"ks:users": user_pairs})
    snap.section_names(); snap.section_items("ks:users"); snap.section_chunks("ks:users")
    snapshot.list_snapshots(parent); snapshot.newest(parent)
    snapshot.prune(parent, keep=2); snapshot.cleanup_incomplete(parent)

    # on HDFS or S3: any read-only file seam (wal.readfs)
    snap = snapshot.open(path, fs=wal.readfs.ArrowFS(...))

    # a Spark executor, given one ChunkInfo:
    for keys, values in snapshot.read_chunk_file(fs, snapshot_dir, chunk_info): ...
    for keys, values in snapshot.read_chunk_columns(any_binary_file, chunk_info): ...
"""

from __future__ import annotations

import os

from snapshot.catalog import cleanup_incomplete, list_snapshots, newest, prune
from snapshot.chunk import MAX_RECORD_BYTES, ChunkInfo
from snapshot.chunk_reader import read_chunk, read_chunk_columns
from snapshot.layout import chunk_file_name, parse_snapshot_dir_name, snapshot_dir_name
from snapshot.manifest import SnapshotInfo
from snapshot.reader import Snapshot, open_snapshot, read_chunk_file, verify
from snapshot.writer import DEFAULT_CHUNK_BYTES, DEFAULT_RECORD_BYTES, copy, write
from wal.fs import OS_FS
from wal.readfs import ReadFS

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MAX_RECORD_BYTES",
    "DEFAULT_RECORD_BYTES",
    "ChunkInfo",
    "Snapshot",
    "SnapshotInfo",
    "chunk_file_name",
    "cleanup_incomplete",
    "copy",
    "list_snapshots",
    "newest",
    "open",
    "open_snapshot",
    "parse_snapshot_dir_name",
    "prune",
    "read_chunk",
    "read_chunk_columns",
    "read_chunk_file",
    "snapshot_dir_name",
    "verify",
    "write",
]


def open(path: str | os.PathLike[str], *, fs: ReadFS = OS_FS) -> Snapshot:
    """Open the snapshot directory ``path`` through ``fs``; see :func:`snapshot.reader.open_snapshot`."""
    return open_snapshot(path, fs=fs)
