"""Record framing: LevelDB's log format, byte for byte.

This module is the one framing implementation in walkv. Log segments and
snapshot files are both sequences of these records.

Format (LevelDB ``db/log_format.h``)::

    file      := block*
    block     := fragment* trailer?          (exactly BLOCK_SIZE = 32768 bytes,
                                              except the last block of a file)
    fragment  := checksum:uint32le  length:uint16le  type:uint8  payload[length]
    trailer   := 0x00{0..6}                  (a block tail too short for a header)

* ``type`` is FULL=1 (a whole record), or FIRST=2, MIDDLE=3, LAST=4 for the
  pieces of a record that does not fit in the rest of the block. 0 is reserved
  for zero-filled space: a header of type 0 and length 0 is padding (LevelDB
  skips the rest of the block; walkv's log, which preallocates with zeros, reads
  it as the end of the written data).
* ``checksum`` is CRC-32C of the type byte followed by the payload, masked
  (:func:`wal.crc.mask`): a CRC stored inside data that is itself CRC'd is
  weak, so it is rotated and offset.
* A fragment never crosses a block boundary, so a reader that lost its place
  (a corrupt length, or starting at an arbitrary block) finds it again at the
  next block. When fewer than 7 bytes remain in a block they are zero-filled;
  with exactly 7 left, an empty FIRST fragment goes there (as LevelDB does).

Reader rules (the reason for each: a crash can only tear the end of a file):

* A truncated header or payload at the end of the file, or a FIRST with no LAST
  before the end of the file, is a torn tail: the normal result of a crash. It
  ends iteration cleanly; :attr:`wal.record_reader.RecordReader.end_offset` is where valid data
  ends and :attr:`RecordReader.torn_tail` says why.
* Anything else (CRC mismatch, a length past the block, MIDDLE or LAST with no
  FIRST, FIRST or FULL inside an unfinished record, an unknown type, a record
  over ``max_record_bytes``) is corruption: :class:`~wal.errors.CorruptionError`
  naming the file and offset. With ``skip_corrupt=True`` the reader skips it
  instead and appends each skipped byte range to :attr:`RecordReader.skipped`.
* Lengths are bounded before memory is allocated: a fragment is at most one
  block, and a reassembled record over ``max_record_bytes`` is corruption.
  A reader takes its limit from the file it reads (a log segment's header,
  a snapshot's manifest), never more than :data:`MAX_RECORD_LIMIT`.
* A reader may start at any record start or any block boundary. Starting on a
  block boundary, MIDDLE and LAST fragments before the first FULL or FIRST are
  skipped silently (they belong to a record that began earlier).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import BinaryIO, Final

from wal.crc import MASK_DELTA, BytesLike, crc32c, extend, extend_bytes, mask
from wal.errors import RecordTooLargeError

BLOCK_SIZE: Final = 32768
HEADER_SIZE: Final = 7

ZERO_TYPE: Final = 0
FULL: Final = 1
FIRST: Final = 2
MIDDLE: Final = 3
LAST: Final = 4
_MAX_TYPE: Final = LAST

DEFAULT_MAX_RECORD_BYTES: Final = 64 << 20
"""The record limit of a log or snapshot that states none (and the default)."""
MAX_RECORD_LIMIT: Final = 1 << 30
"""The largest record limit any file may state (1 GiB): readers bound memory
by the limit a file's header states, so a header claiming more is refused as
corruption rather than trusted with an allocation."""

FRAGMENT_HEADER: Final = struct.Struct("<IHB")  # masked CRC, payload length, type
_pack_header: Final = FRAGMENT_HEADER.pack
_unpack_header: Final = FRAGMENT_HEADER.unpack_from
# CRC-32C of the single type byte, the start of every fragment's checksum.
_TYPE_CRC: Final = [crc32c(bytes([t])) for t in range(256)]
_ZEROS: Final = bytes(HEADER_SIZE)
_FULL_CRC: Final = _TYPE_CRC[FULL]


def fragment_crc(fragment_type: int, payload: bytes) -> int:
    """The masked checksum stored in a fragment's header."""
    return mask(extend(_TYPE_CRC[fragment_type], payload))


def frame(payload: BytesLike, offset: int) -> tuple[bytes, int]:
    """The bytes of one record written at file ``offset``, and the offset
    just after it. (One FULL fragment, the common case, costs one concat.)"""
    if type(payload) is not bytes:
        payload = bytes(payload)
    n = len(payload)
    if n + HEADER_SIZE <= BLOCK_SIZE - offset % BLOCK_SIZE:
        crc = extend_bytes(_FULL_CRC, payload)  # mask() inlined: this is the hot path
        # FRAGMENT_HEADER as one int's 7 little-endian bytes (compiled: no call into struct)
        masked = (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF
        return (masked | n << 32 | FULL << 48).to_bytes(HEADER_SIZE, "little") + payload, offset + HEADER_SIZE + n
    parts: list[bytes | memoryview] = []
    end = frame_into(parts, payload, offset)
    return b"".join(parts), end


def frame_into(out: list[bytes | memoryview], payload: BytesLike, offset: int) -> int:
    """Append the bytes of one record written at file ``offset`` to ``out``.

    Returns the file offset just after the record. Used by
    :class:`RecordWriter` and by the log's group commit, which frames a whole
    group in memory and writes it with one call.
    """
    if type(payload) is not bytes:
        payload = bytes(payload)
    n = len(payload)
    if n + HEADER_SIZE <= BLOCK_SIZE - offset % BLOCK_SIZE:  # the common case: one FULL fragment
        crc = extend_bytes(_FULL_CRC, payload)  # mask() inlined: this is the hot path
        out.append(_pack_header((((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF, n, FULL))
        out.append(payload)
        return offset + HEADER_SIZE + n
    return frame_pieces(out, (payload,), offset)


def frame_pieces(out: list[bytes | memoryview], pieces: Sequence[bytes | memoryview], offset: int) -> int:
    """Append the bytes of one record, whose payload is the concatenation of
    ``pieces``, written at file ``offset`` to ``out``, without copying the
    payload: ``out`` gets fragment headers and memoryviews into ``pieces``
    (for a gathered write, ``os.pwritev``). The bytes are those
    :func:`frame_into` produces for the joined payload (which calls this for
    a record of several fragments: the one fragmenting loop). Returns the
    file offset just after the record."""
    views = [memoryview(p).cast("B") for p in pieces]
    n = sum(map(len, views))
    left = BLOCK_SIZE - offset % BLOCK_SIZE
    piece = 0  # the piece, and the position in it, the next fragment starts at
    at = 0
    pos = 0
    begin = True
    while True:
        if left < HEADER_SIZE:
            if left:
                out.append(_ZEROS[:left])
            offset += left
            left = BLOCK_SIZE
        size = min(left - HEADER_SIZE, n - pos)
        end = pos + size == n
        ftype = (FULL if end else FIRST) if begin else (LAST if end else MIDDLE)
        header_at = len(out)
        out.append(b"")  # the header, once the CRC is known
        crc = _TYPE_CRC[ftype]
        want = size
        while want:
            view = views[piece]
            take = min(want, len(view) - at)
            part = view[at : at + take]
            crc = extend(crc, part)  # extend takes any bytes-like object
            out.append(part)
            want -= take
            at += take
            if at == len(view):
                piece += 1
                at = 0
        out[header_at] = _pack_header(mask(crc), size, ftype)
        offset += HEADER_SIZE + size
        left -= HEADER_SIZE + size
        pos += size
        begin = False
        if end:
            return offset


class RecordWriter:
    """Appends records to a binary file.

    ``offset`` is the file position the next record starts at; by default
    ``f.tell()``, so a reopened file (opened for appending) continues where it
    ended, mid-block or not. The writer only writes: making the data durable
    (``flush`` and ``os.fsync``) is the caller's decision.
    """

    def __init__(
        self,
        f: BinaryIO,
        offset: int | None = None,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self._f = f
        self.offset = f.tell() if offset is None else offset
        self.max_record_bytes = max_record_bytes

    def add_record(self, payload: object) -> int:
        """Write one record; return the offset it starts at."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"record payload must be bytes, not {type(payload).__name__}")
        payload = bytes(payload)
        if len(payload) > self.max_record_bytes:
            raise RecordTooLargeError(
                f"record of {len(payload)} bytes is over the limit of "
                f"{self.max_record_bytes} bytes; split it or raise max_record_bytes"
            )
        start = self.offset
        if start % BLOCK_SIZE > BLOCK_SIZE - HEADER_SIZE:
            start += BLOCK_SIZE - start % BLOCK_SIZE
        framed, end = frame(payload, self.offset)
        data = memoryview(framed)
        while data:  # a raw file may write less than it was given
            # Not `data[self._f.write(data):]`: mypyc 2.4 evaluates a call as the start of
            # a memoryview slice twice (it tries its bytes/list slice op first): two writes.
            written = self._f.write(data)
            data = data[written:]
        self.offset = end  # only once the whole record is in the file
        return start
