"""The durable LSN, shared with readers in other processes: the ``DURABLE`` file.

Sixteen bytes: ``"<QQ"`` the durable LSN and its complement, so that a read
racing the writer's update shows as a mismatch (and is retried) rather than
as a wrong LSN. The writer maps the file in memory and updates it only after
the fsync it reports, so whatever of it reaches the disk never overstates what
is durable.
"""

from __future__ import annotations

import mmap
import os
import struct

from wal.fs import OS_FS
from wal.readfs import ReadFS

DURABLE_NAME = "DURABLE"
_DURABLE = struct.Struct("<QQ")  # durable LSN, its complement (a torn read shows as a mismatch)
_ALL_ONES = 0xFFFFFFFFFFFFFFFF


def encode_durable(lsn: int) -> bytes:
    return _DURABLE.pack(lsn, lsn ^ _ALL_ONES)


def decode_durable(data: bytes) -> int | None:
    """The LSN in a ``DURABLE`` file's bytes, or ``None`` when they are not
    whole (a read racing the writer's update: read again)."""
    if len(data) != _DURABLE.size:
        return None
    lsn, check = _DURABLE.unpack(data)
    return lsn if check == lsn ^ _ALL_ONES else None


class DurableMarker:
    """The writer's side of ``DURABLE``: the file mapped in memory, so that
    publishing after each fsync is a 16-byte store, not a system call."""

    def __init__(self, directory: str) -> None:
        fd = os.open(os.path.join(directory, DURABLE_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _DURABLE.size)
            self._map = mmap.mmap(fd, _DURABLE.size)
        finally:
            os.close(fd)

    def publish(self, lsn: int) -> None:
        self._map[: _DURABLE.size] = encode_durable(lsn)

    def close(self) -> None:
        self._map.close()


def read_durable_lsn(directory: str, fs: ReadFS = OS_FS) -> int | None:
    """The durable LSN published by the log's writer, or ``None`` when there is
    no (readable) ``DURABLE`` file. Entries up to it are fsynced; a reader in
    another process (a Spark job) reads no further."""
    for _ in range(10):  # a read racing the writer's update shows as a mismatch: retry
        try:
            data = fs.read_file(fs.join(directory, DURABLE_NAME))
        except OSError:
            return None
        if data is None or len(data) != _DURABLE.size:
            return None
        lsn = decode_durable(data)
        if lsn is not None:
            return lsn
    return None
