"""Snapshots as the Spark data source sees them: found and read through ``pyarrow.fs``.

The formats belong to the :mod:`snapshot` package (MANIFEST:
:func:`snapshot.manifest.decode_manifest`; chunk files:
:func:`snapshot.read_chunk_columns`); this module only finds the files on
whatever file system holds the store and hands their bytes over, so that a
store on HDFS or S3 is read the same way as a local one.

A snapshot is usable when its directory is named ``snap-<20-digit LSN>``, its
MANIFEST is valid and names that LSN, and every chunk file it names exists
with the size it gives (what :func:`snapshot.open` checks). Unusable ones are
skipped with a logged warning, as :func:`snapshot.list_snapshots` does;
chunk contents are checked as executors read them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator

from wal.errors import CorruptionError, SnapshotError

from kvstore.spark.files import StoreFiles

log = logging.getLogger("walkv.spark")


@dataclass(frozen=True)
class SnapshotRef:
    """A usable snapshot: its LSN, directory and chunks (``snapshot.ChunkInfo``,
    which pickle, in key order)."""

    lsn: int
    path: str
    store_id: str | None
    chunks: tuple[Any, ...]

    @property
    def count(self) -> int:
        return sum(c.pairs for c in self.chunks)


def open_ref(files: StoreFiles, path: str, dir_lsn: int) -> SnapshotRef:
    """Check one snapshot directory and describe it (CorruptionError or
    SnapshotError when it is not usable)."""
    from snapshot.layout import CORRUPTION_HINT, MANIFEST_NAME
    from snapshot.manifest import MAX_MANIFEST_FILE_BYTES, decode_manifest

    mpath = path + "/" + MANIFEST_NAME
    shown = files.display(mpath)
    entries = {name: (size, is_dir) for name, _, size, is_dir in files.listdir(path)}
    if MANIFEST_NAME not in entries:
        raise CorruptionError("snapshot has no MANIFEST (incomplete or damaged)", path=shown, hint=CORRUPTION_HINT)
    if entries[MANIFEST_NAME][0] > MAX_MANIFEST_FILE_BYTES:
        raise CorruptionError(
            f"manifest is {entries[MANIFEST_NAME][0]} bytes, over the limit of {MAX_MANIFEST_FILE_BYTES}",
            path=shown, hint=CORRUPTION_HINT,
        )
    data = files.read_bytes(mpath)
    if data is None:
        raise CorruptionError("snapshot has no MANIFEST (incomplete or damaged)", path=shown, hint=CORRUPTION_HINT)
    manifest = decode_manifest(data, shown)
    if manifest.lsn != dir_lsn:
        raise CorruptionError(
            f"manifest says LSN {manifest.lsn} but the directory is named for LSN {dir_lsn}",
            path=shown, hint=CORRUPTION_HINT,
        )
    for c in manifest.chunks:
        got = entries.get(c.name)
        cshown = files.display(path + "/" + c.name)
        if got is None or got[1]:
            raise CorruptionError("snapshot chunk file is missing", path=cshown, hint=CORRUPTION_HINT)
        if got[0] != c.bytes:
            raise CorruptionError(
                f"chunk file is {got[0]} bytes, the manifest says {c.bytes} (truncated or overwritten)",
                path=cshown, hint=CORRUPTION_HINT,
            )
    return SnapshotRef(manifest.lsn, path, manifest.store_id, tuple(manifest.chunks))


def list_snapshots(files: StoreFiles) -> list[SnapshotRef]:
    """The usable snapshots of a store, oldest first."""
    out = []
    for lsn, path in files.snapshot_dirs():
        try:
            out.append(open_ref(files, path, lsn))
        except (CorruptionError, SnapshotError) as exc:
            log.warning("ignoring unusable snapshot %s: %s", files.display(path), exc)
    return out


def choose(files: StoreFiles, snapshot_lsn: int | None, ending_lsn: int | None) -> SnapshotRef | None:
    """The snapshot a read starts from: the one at exactly ``snapshot_lsn``
    (``0``: none), else the newest at or before ``ending_lsn`` (when given),
    else the newest; ``None`` when the store has none."""
    if snapshot_lsn == 0:
        return None
    snaps = list_snapshots(files)
    if snapshot_lsn is not None:
        for s in snaps:
            if s.lsn == snapshot_lsn:
                return s
        have = ", ".join(str(s.lsn) for s in snaps) or "none"
        raise ValueError(
            f"{files.location} has no usable snapshot at LSN {snapshot_lsn} (snapshots at LSNs: {have}); "
            "leave snapshotLsn out to use the newest"
        )
    if ending_lsn is not None:
        snaps = [s for s in snaps if s.lsn <= ending_lsn]
    return snaps[-1] if snaps else None


def where(files: StoreFiles, snap: SnapshotRef, chunk: Any) -> str:
    return f"{files.display(snap.path + '/' + chunk.name)}, snapshot at LSN {snap.lsn}"


def read_chunk(files: StoreFiles, snap: SnapshotRef, chunk: Any, rows: int) -> Iterator[tuple[list, list]]:
    """A chunk's keys and values in key order, as runs of whole data records
    ``(key_parts, value_parts)`` (lists of sequences of bytes) of about
    ``rows`` pairs, or fewer when the pairs are large (about
    :data:`~kvstore.spark.arrow.MAX_BATCH_BYTES` per run)."""
    from snapshot import read_chunk_columns

    from kvstore.spark.arrow import MAX_BATCH_BYTES

    path = snap.path + "/" + chunk.name
    shown = files.display(path)
    per_pair = max(1, chunk.bytes // max(1, chunk.pairs))
    limit = max(1, min(rows, MAX_BATCH_BYTES // per_pair))
    try:
        f = files.open(path)
    except FileNotFoundError:
        raise SnapshotError(
            f"snapshot chunk {shown} is gone (the snapshot at LSN {snap.lsn} was deleted by retention "
            "while the query ran); rerun the query"
        ) from None
    with f:
        keys: list = []
        values: list = []
        n = 0
        for k, v in read_chunk_columns(f, chunk, path=shown):
            keys.append(k)
            values.append(v)
            n += len(k)
            if n >= limit:
                yield keys, values
                keys, values, n = [], [], 0
        if keys:
            yield keys, values
