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
  ends iteration cleanly; :attr:`RecordReader.end_offset` is where valid data
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

import os
import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from wal.crc import MASK_DELTA, crc32c, extend, extend_bytes, mask
from wal.errors import REPAIR_HINT, CorruptionError, Damage, RecordTooLargeError

BLOCK_SIZE = 32768
HEADER_SIZE = 7

ZERO_TYPE = 0
FULL = 1
FIRST = 2
MIDDLE = 3
LAST = 4
_MAX_TYPE = LAST

DEFAULT_MAX_RECORD_BYTES = 64 << 20
"""The record limit of a log or snapshot that states none (and the default)."""
MAX_RECORD_LIMIT = 1 << 30
"""The largest record limit any file may state (1 GiB): readers bound memory
by the limit a file's header states, so a header claiming more is refused as
corruption rather than trusted with an allocation."""

FRAGMENT_HEADER = struct.Struct("<IHB")  # masked CRC, payload length, type
_pack_header = FRAGMENT_HEADER.pack
_unpack_header = FRAGMENT_HEADER.unpack_from
# CRC-32C of the single type byte, the start of every fragment's checksum.
_TYPE_CRC = [crc32c(bytes([t])) for t in range(256)]
_ZEROS = bytes(HEADER_SIZE)
_FULL_CRC = _TYPE_CRC[FULL]


def fragment_crc(fragment_type: int, payload: bytes) -> int:
    """The masked checksum stored in a fragment's header."""
    return mask(extend(_TYPE_CRC[fragment_type], payload))


def frame(payload: bytes, offset: int) -> tuple[bytes, int]:
    """The bytes of one record written at file ``offset``, and the offset
    just after it. (One FULL fragment, the common case, costs one concat.)"""
    if type(payload) is not bytes:
        payload = bytes(payload)
    n = len(payload)
    if n + HEADER_SIZE <= BLOCK_SIZE - offset % BLOCK_SIZE:
        crc = extend_bytes(_FULL_CRC, payload)  # mask() inlined: this is the hot path
        header = _pack_header((((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF, n, FULL)
        return header + payload, offset + HEADER_SIZE + n
    parts: list[bytes] = []
    end = frame_into(parts, payload, offset)
    return b"".join(parts), end


def frame_into(out: list[bytes], payload: bytes, offset: int) -> int:
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
    left = BLOCK_SIZE - offset % BLOCK_SIZE
    view = memoryview(payload)
    pos = 0
    begin = True
    while True:
        if left < HEADER_SIZE:
            if left:
                out.append(_ZEROS[:left])
            offset += left
            left = BLOCK_SIZE
        avail = left - HEADER_SIZE
        size = min(avail, n - pos)
        end = pos + size == n
        if begin:
            ftype = FULL if end else FIRST
        else:
            ftype = LAST if end else MIDDLE
        piece = bytes(view[pos : pos + size])
        out.append(_pack_header(mask(extend(_TYPE_CRC[ftype], piece)), size, ftype))
        out.append(piece)
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

    def add_record(self, payload: bytes) -> int:
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
            data = data[self._f.write(data) :]
        self.offset = end  # only once the whole record is in the file
        return start


class Fragment(NamedTuple):
    """One physical fragment, as :meth:`RecordReader.fragments` reports it."""

    offset: int
    type: int  # FULL, FIRST, MIDDLE, LAST; ZERO_TYPE for a damaged one
    length: int  # payload bytes
    problem: str | None  # why it is damaged, or None


# Events from the physical layer (besides fragment types 1..4). A fragment
# comes with its payload; an event with b"", and _TORN and _BAD with the
# reader's ``_problem`` set first.
_EOF = -1  # clean end of data
_TORN = -2  # truncated header or payload at end of file: _problem is (offset, reason, FRAMING)
_BAD = -3  # corrupt fragment: _problem is (end of the bad bytes, reason, kind)
_PAD = -4  # zero-filled space: the rest of the block is unused


class RecordReader:
    """Reads records back, strict by default.

    Iterating yields each record's payload; :meth:`records` yields
    ``(offset, payload)``. After iteration, :attr:`end_offset` is the offset just
    after the last complete record (where a writer may continue), and
    :attr:`torn_tail` is ``None`` or ``(offset, reason)`` when the file ended in
    a torn record.

    ``start_offset`` (default ``f.tell()``) is a record start or a block
    boundary. ``end_offset`` bounds the bytes read (for the durable part of a
    file still being written). ``zeros_end=True`` reads a zero header as the
    end of the data (walkv's preallocated segments); by default it is padding,
    as in LevelDB. ``skip_corrupt=True`` skips corruption and records each
    skipped ``(start, end, reason)`` in :attr:`skipped`.
    """

    def __init__(
        self,
        f: BinaryIO,
        *,
        path: str | os.PathLike[str] | None = None,
        start_offset: int | None = None,
        end_offset: int | None = None,
        skip_corrupt: bool = False,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        zeros_end: bool = False,
    ) -> None:
        self._f = f
        self.path = os.fspath(path) if path is not None else getattr(f, "name", None)
        if not isinstance(self.path, str):
            self.path = None
        self.start_offset = f.tell() if start_offset is None else start_offset
        self._limit = end_offset
        self.skip_corrupt = skip_corrupt
        self.max_record_bytes = max_record_bytes
        self.zeros_end = zeros_end
        self.end_offset = self.start_offset
        self.torn_tail: tuple[int, str] | None = None
        self.skipped: list[tuple[int, int, str]] = []
        self._problem: tuple[int, str, Damage] = (0, "", Damage.FRAMING)

    def __iter__(self) -> Iterator[bytes]:
        for _, payload in self.records():
            yield payload

    # -- physical layer: fragments of one block at a time -----------------

    def _fragments(self) -> Iterator[tuple[int, int, bytes]]:
        f = self._f
        limit = self._limit
        delta = MASK_DELTA  # a local: mask() is inlined below, once per fragment
        pos = self.start_offset
        block_start = pos - pos % BLOCK_SIZE
        f.seek(block_start)
        while True:
            want = BLOCK_SIZE
            if limit is not None:
                want = max(0, min(BLOCK_SIZE, limit - block_start))
            buf = f.read(want) if want else b""
            full_block = len(buf) == BLOCK_SIZE
            i = pos - block_start
            n = len(buf)
            while True:
                rem = n - i
                if rem < HEADER_SIZE:
                    if full_block:
                        break  # trailer: next block
                    if rem > 0 and buf.count(0, i) != rem:
                        self._problem = (block_start + i, "truncated header at end of file", Damage.FRAMING)
                        yield block_start + i, _TORN, b""
                    else:
                        yield block_start + i, _EOF, b""
                    return
                crc, length, ftype = _unpack_header(buf, i)
                if ftype == ZERO_TYPE and length == 0:
                    if self.zeros_end or not full_block:
                        yield block_start + i, _EOF, b""
                        return
                    yield block_start + i, _PAD, b""
                    break  # padding: the rest of this block is unused
                end = i + HEADER_SIZE + length
                if end > n:
                    if not full_block:
                        self._problem = (block_start + i, "truncated record at end of file", Damage.FRAMING)
                        yield block_start + i, _TORN, b""
                        return
                    self._problem = (block_start + n, f"bad record length {length} (past the end of the block)",
                                     Damage.FRAMING)
                    yield block_start + i, _BAD, b""
                    break
                payload = buf[i + HEADER_SIZE : end]
                c = extend_bytes(_TYPE_CRC[ftype], payload)  # mask() inlined: once per fragment
                if crc != (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF:
                    # The length may be the corrupt field, so nothing after it
                    # in this block can be trusted.
                    self._problem = (block_start + n, "checksum mismatch", Damage.CHECKSUM)
                    yield block_start + i, _BAD, b""
                    break
                if ftype > _MAX_TYPE or ftype == ZERO_TYPE:
                    self._problem = (block_start + end, f"unknown record type {ftype}", Damage.FRAMING)
                    yield block_start + i, _BAD, b""
                else:
                    yield block_start + i, ftype, payload
                i = end
            block_start += BLOCK_SIZE
            pos = block_start
            if not full_block:
                yield block_start - BLOCK_SIZE + n, _EOF, b""
                return

    def fragments(self) -> Iterator[Fragment]:
        """Every physical fragment from ``start_offset``, for inspection
        tools: valid ones with their type and payload length, damaged ones
        with type 0 and the problem; stops at the end of data or a torn tail
        (reported as a last fragment with its problem)."""
        for offset, ftype, payload in self._fragments():
            if ftype > 0:
                yield Fragment(offset, ftype, len(payload), None)
            elif ftype == _BAD:
                end, reason, _ = self._problem
                yield Fragment(offset, ZERO_TYPE, max(0, end - offset - HEADER_SIZE), reason)
            elif ftype == _TORN:
                yield Fragment(offset, ZERO_TYPE, 0, f"torn tail: {self._problem[1]}")
                return
            elif ftype == _EOF:
                return

    # -- logical layer: reassembly -----------------------------------------

    def _corrupt(self, start: int, end: int, reason: str, kind: Damage = Damage.FRAMING) -> None:
        if not self.skip_corrupt:
            raise CorruptionError(reason, kind=kind, path=self.path, offset=start, hint=REPAIR_HINT)
        self.skipped.append((start, end, reason))

    def records(self) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, payload)`` for each complete, valid record."""
        resyncing = self.start_offset % BLOCK_SIZE == 0 and self.start_offset > 0
        parts: list[bytes] = []
        size = 0
        record_start = -1  # >= 0 while inside a fragmented record
        max_bytes = self.max_record_bytes
        holed = -1  # start of a fragmented record cut by zero-filled space
        for offset, ftype, item in self._fragments():
            if holed >= 0 and ftype != _PAD and ftype != _EOF and ftype != _TORN:
                # Data after the zeros: the record was damaged, not torn.
                self._corrupt(holed, offset, "zero-filled space in the middle of a fragmented record")
                holed = -1
            if ftype == FULL:
                resyncing = False
                if record_start >= 0:
                    self._corrupt(record_start, offset, "partial record without end (FULL inside a fragmented record)")
                    record_start = -1
                    parts = []
                end = offset + HEADER_SIZE + len(item)
                if len(item) > max_bytes:
                    self._corrupt(offset, end, f"record over the limit of {max_bytes} bytes", Damage.TOO_LARGE)
                    continue
                self.end_offset = end
                yield offset, item
            elif ftype == FIRST:
                resyncing = False
                if record_start >= 0:
                    self._corrupt(record_start, offset, "partial record without end (FIRST inside a fragmented record)")
                record_start = offset
                parts = [item]
                size = len(item)
            elif ftype == MIDDLE or ftype == LAST:
                end = offset + HEADER_SIZE + len(item)
                if record_start < 0:
                    if resyncing:
                        # LevelDB: the LAST of the record we started inside
                        # ends the resync; a later orphan is corruption.
                        resyncing = ftype == MIDDLE
                    else:
                        name = "MIDDLE" if ftype == MIDDLE else "LAST"
                        self._corrupt(offset, end, f"missing start of fragmented record ({name} without FIRST)")
                    continue
                size += len(item)
                if size > max_bytes:
                    self._corrupt(record_start, end, f"record over the limit of {max_bytes} bytes", Damage.TOO_LARGE)
                    record_start = -1
                    parts = []
                    continue
                parts.append(item)
                if ftype == LAST:
                    start = record_start
                    record_start = -1
                    payload = b"".join(parts)
                    parts = []
                    self.end_offset = end
                    yield start, payload
            elif ftype == _PAD:
                if record_start >= 0:  # LevelDB: an error in the middle of a record,
                    holed = record_start  # unless only zeros follow (a torn tail)
                    record_start = -1
                    parts = []
            elif ftype == _BAD:
                bad_end, reason, kind = self._problem
                if record_start >= 0:
                    # An error between fragments must not join them: the
                    # unfinished record is dropped with the bad fragment.
                    self._corrupt(record_start, bad_end, reason, kind)
                    record_start = -1
                    parts = []
                else:
                    self._corrupt(offset, bad_end, reason, kind)
            else:  # _EOF or _TORN
                if holed >= 0:
                    self.torn_tail = (holed, "fragmented record followed only by zeros at end of file")
                    return
                if record_start >= 0:
                    self.torn_tail = (record_start, "fragmented record without its LAST fragment at end of file")
                elif ftype == _TORN:
                    self.torn_tail = (offset, self._problem[1])
                return
