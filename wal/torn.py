"""Telling a crash's torn tail from damage, in the active segment.

An invalid record is a *torn tail* (the normal result of a crash: cut it)
when no later entry follows it, or when its bytes include an all-zero
512-byte sector: a write that never reached the disk reads back as the
preallocated zeros (etcd's rule). Anything else is damage, which open refuses
and :func:`wal.repair` cuts.
"""

from __future__ import annotations

from wal.fs import File
from wal.record import (
    BLOCK_SIZE,
    DEFAULT_MAX_RECORD_BYTES,
    FIRST,
    FRAGMENT_HEADER,
    FULL,
    HEADER_SIZE,
    fragment_crc,
)
from wal.record_reader import RecordReader
from wal.segment import ENTRY_HEADER_SIZE

SECTOR = 512
_ZERO_SECTOR = bytes(SECTOR)
_MAX_ENTRIES_PER_BLOCK = BLOCK_SIZE // (HEADER_SIZE + ENTRY_HEADER_SIZE) + 1


def _has_zero_sector(f: File, start: int, end: int) -> bool:
    first = (start + SECTOR - 1) // SECTOR * SECTOR
    data = f.pread(max(0, end - first), first)
    return any(data[i : i + SECTOR] == _ZERO_SECTOR for i in range(0, len(data) - SECTOR + 1, SECTOR))


def _later_entry(payload: bytes, min_lsn: int) -> bool:
    """Does a (FULL or FIRST) fragment's payload start a log entry at or after
    ``min_lsn``? Bytes that merely look like a record (inside a value, say)
    do not carry the next LSNs."""
    if len(payload) < ENTRY_HEADER_SIZE:
        return False
    lsn = int.from_bytes(payload[:8], "little")
    return min_lsn <= lsn < min_lsn + _MAX_ENTRIES_PER_BLOCK


def _valid_record_after(path: str, start: int, min_lsn: int, max_record_bytes: int) -> int | None:
    """Offset of the first valid entry (a FULL or FIRST fragment holding an
    LSN from ``min_lsn`` on) after the bad record at ``start``, or ``None``.
    The bad header's length may be the damaged field, so every offset of the
    rest of its block is tried, then later blocks are read with
    resynchronisation (zeros read as padding)."""
    with open(path, "rb") as fh:
        block = start - start % BLOCK_SIZE
        fh.seek(block)
        buf = fh.read(BLOCK_SIZE)
        for j in range(start - block + 1, len(buf) - HEADER_SIZE + 1):
            crc, length, ftype = FRAGMENT_HEADER.unpack_from(buf, j)
            if (ftype == FULL or ftype == FIRST) and j + HEADER_SIZE + length <= len(buf):
                payload = buf[j + HEADER_SIZE : j + HEADER_SIZE + length]
                if fragment_crc(ftype, payload) == crc and _later_entry(payload, min_lsn):
                    return block + j
        reader = RecordReader(fh, path=path, start_offset=block + BLOCK_SIZE, skip_corrupt=True,
                              max_record_bytes=max_record_bytes)
        for offset, payload in reader.records():
            if _later_entry(payload, min_lsn):
                return offset
    return None


def is_torn(f: File, path: str, bad_offset: int, min_lsn: int,
            max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> tuple[bool, int | None]:
    """Is the invalid record at ``bad_offset`` a torn tail? Also returns the
    offset of the next valid entry (LSN ``min_lsn`` or later), if any;
    ``max_record_bytes`` is the limit the segment's header states (a later
    entry up to it is found, whatever its size)."""
    nxt = _valid_record_after(path, bad_offset, min_lsn, max_record_bytes)
    return nxt is None or _has_zero_sector(f, bad_offset, nxt), nxt
