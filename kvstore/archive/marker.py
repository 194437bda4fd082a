"""``STORE/ARCHIVED``: the archived LSN a sidecar archiver publishes, so that
the store's writer (another process) never trims a segment the archive does
not hold yet.

Sixteen bytes, encoded like the log's ``DURABLE`` marker (the LSN and its
complement, :func:`wal.durable.encode_durable`), replaced whole by a rename:
a reader sees an old value or the new one, never a torn one. An old value
only makes local retention keep more, never less.

Only ``walkv archive STORE URI`` (the sidecar) writes it; an archiver running
inside the writer (``kvstore.open(path, archive=...)``) bounds retention
directly. While the file exists, the writer keeps every segment with an LSN
above it: when a sidecar stops archiving a store for good, delete
``STORE/ARCHIVED`` (or local retention keeps the log from that LSN on).
"""

from __future__ import annotations

import os

from kvstore.layout import StoreLayout
from wal.durable import decode_durable, encode_durable
from wal.fs import OS_FS, FileSystem


def publish_archived(store_path: str, lsn: int, fs: FileSystem = OS_FS) -> None:
    """Replace ``STORE/ARCHIVED`` with ``lsn`` (written, fsynced, renamed; no fsync
    of the directory: a value lost in a machine crash leaves an older one, which is safe)."""
    path = StoreLayout(OS_FS, store_path).archived_path
    tmp = f"{path}.tmp-{os.getpid()}"
    fs.write_file(tmp, encode_durable(lsn))
    fs.rename(tmp, path)


def read_archived(store_path: str) -> int | None:
    """The LSN in ``STORE/ARCHIVED``, or None when there is no such file. An
    unreadable one counts as 0 (keep everything) rather than as none."""
    data = OS_FS.read_file(StoreLayout(OS_FS, store_path).archived_path)
    if data is None:
        return None
    lsn = decode_durable(data)
    return 0 if lsn is None else lsn


__all__ = ["publish_archived", "read_archived"]
