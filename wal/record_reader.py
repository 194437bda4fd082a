"""Reading records back: :class:`RecordReader`, strict by default, block by
block. The format and the reader's rules are described once, in
:mod:`wal.record`.

The reader has two layers: :meth:`RecordReader._blocks` splits each block into
its fragments and events (padding, end of data, torn tail, damage) in one
pass, checking every fragment's CRC; :meth:`RecordReader.batches` assembles
them into records. A block holding only whole (FULL) records, the common case,
is handed on as it is, without a step per record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from wal.crc import MASK_DELTA, extend_bytes
from wal.errors import REPAIR_HINT, CorruptionError, Damage
from wal.record import (
    _MAX_TYPE,
    _TYPE_CRC,
    BLOCK_SIZE,
    DEFAULT_MAX_RECORD_BYTES,
    FIRST,
    FULL,
    HEADER_SIZE,
    LAST,
    MIDDLE,
    ZERO_TYPE,
    _unpack_header,
)


class Fragment(NamedTuple):
    """One physical fragment, as :meth:`RecordReader.fragments` reports it."""

    offset: int
    type: int  # FULL, FIRST, MIDDLE, LAST; ZERO_TYPE for a damaged one
    length: int  # payload bytes
    problem: str | None  # why it is damaged, or None


class RecordBatch(NamedTuple):
    """The complete records :meth:`RecordReader.batches` found in one block,
    in order. Every record but the last is one FULL fragment (a record
    assembled from fragments always ends its batch), so record ``i`` ends at
    :meth:`record_end`."""

    offsets: list[int]
    payloads: list[bytes]
    end: int  # the offset just after the last record

    def record_end(self, i: int) -> int:
        """The offset just after record ``i``."""
        if i == len(self.offsets) - 1:
            return self.end
        return self.offsets[i] + HEADER_SIZE + len(self.payloads[i])


# Events from the physical layer (besides fragment types 1..4). A fragment
# comes with its payload; an event with b"", and _TORN and _BAD with their
# problem in the block's ``problems``.
_EOF = -1  # clean end of data
_TORN = -2  # truncated header or payload at end of file: problem is (offset, reason, FRAMING)
_BAD = -3  # corrupt fragment: problem is (end of the bad bytes, reason, kind)
_PAD = -4  # zero-filled space: the rest of the block is unused


class _Block(NamedTuple):
    """The fragments and events of one block, in order, as parallel lists."""

    offsets: list[int]
    types: list[int]
    payloads: list[bytes]
    problems: dict[int, tuple[int, str, Damage]]  # index of a _TORN or _BAD event: its problem


class RecordReader:
    """Reads records back, strict by default.

    Iterating yields each record's payload; :meth:`records` yields
    ``(offset, payload)``, :meth:`batches` the records of a block at a time
    (the bulk path of log replay). After iteration, :attr:`end_offset` is the
    offset just after the last complete record (where a writer may continue),
    and :attr:`torn_tail` is ``None`` or ``(offset, reason)`` when the file
    ended in a torn record.

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

    def __iter__(self) -> Iterator[bytes]:
        for _, payload in self.records():
            yield payload

    # -- physical layer: the fragments of one block at a time ---------------

    def _blocks(self) -> Iterator[_Block]:
        """Each block's fragments and events; the last block read ends with
        _EOF or _TORN."""
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
            block = _Block([], [], [], {})
            offsets, types, payloads, problems = block
            add_offset, add_type, add_payload = offsets.append, types.append, payloads.append
            ended = False
            while True:
                rem = n - i
                if rem < HEADER_SIZE:
                    if full_block:
                        break  # trailer: next block
                    if rem > 0 and buf.count(0, i) != rem:
                        problems[len(types)] = (block_start + i, "truncated header at end of file", Damage.FRAMING)
                        add_type(_TORN)
                    else:
                        add_type(_EOF)
                    ended = True
                    break
                crc, length, ftype = _unpack_header(buf, i)
                end = i + HEADER_SIZE + length
                if end > n:
                    if full_block:
                        problems[len(types)] = (block_start + n, f"bad record length {length} (past the end of "
                                                "the block)", Damage.FRAMING)
                        add_type(_BAD)
                    else:
                        problems[len(types)] = (block_start + i, "truncated record at end of file", Damage.FRAMING)
                        add_type(_TORN)
                        ended = True
                    add_offset(block_start + i)
                    add_payload(b"")
                    break
                payload = buf[i + HEADER_SIZE : end]
                c = extend_bytes(_TYPE_CRC[ftype], payload)  # mask() inlined: once per fragment
                if crc == (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF and 0 < ftype <= _MAX_TYPE:
                    add_offset(block_start + i)  # the common case: a valid fragment
                    add_type(ftype)
                    add_payload(payload)
                    i = end
                    continue
                add_offset(block_start + i)
                add_payload(b"")
                if ftype == ZERO_TYPE and length == 0:
                    if self.zeros_end or not full_block:
                        add_type(_EOF)
                        ended = True
                    else:
                        add_type(_PAD)  # padding: the rest of this block is unused
                    break
                if crc != (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF:
                    # The length may be the corrupt field, so nothing after it
                    # in this block can be trusted.
                    problems[len(types)] = (block_start + n, "checksum mismatch", Damage.CHECKSUM)
                    add_type(_BAD)
                    break
                problems[len(types)] = (block_start + end, f"unknown record type {ftype}", Damage.FRAMING)
                add_type(_BAD)
                i = end
            if ended:
                if len(offsets) < len(types):  # an end found between fragments
                    add_offset(block_start + min(i, n))
                    add_payload(b"")
                yield block
                return
            block_start += BLOCK_SIZE
            pos = block_start
            if not full_block:
                add_offset(block_start - BLOCK_SIZE + n)
                add_payload(b"")
                add_type(_EOF)
                yield block
                return
            yield block

    def fragments(self) -> Iterator[Fragment]:
        """Every physical fragment from ``start_offset``, for inspection
        tools: valid ones with their type and payload length, damaged ones
        with type 0 and the problem; stops at the end of data or a torn tail
        (reported as a last fragment with its problem)."""
        for offsets, types, payloads, problems in self._blocks():
            for j, ftype in enumerate(types):
                offset = offsets[j]
                if ftype > 0:
                    yield Fragment(offset, ftype, len(payloads[j]), None)
                elif ftype == _BAD:
                    end, reason, _ = problems[j]
                    yield Fragment(offset, ZERO_TYPE, max(0, end - offset - HEADER_SIZE), reason)
                elif ftype == _TORN:
                    yield Fragment(offset, ZERO_TYPE, 0, f"torn tail: {problems[j][1]}")
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
        for batch in self.batches():
            offsets, payloads = batch.offsets, batch.payloads
            for i in range(len(offsets)):
                self.end_offset = batch.record_end(i)
                yield offsets[i], payloads[i]

    def batches(self) -> Iterator[RecordBatch]:
        """The complete, valid records, a block at a time (see
        :class:`RecordBatch`); :attr:`end_offset` is set to each batch's end
        as it is yielded. Corruption is raised once the valid records before
        it have been yielded, so a caller that stops early (at the last LSN
        it wants) never sees damage past them."""
        resyncing = self.start_offset % BLOCK_SIZE == 0 and self.start_offset > 0
        record_start = -1  # >= 0 while inside a fragmented record
        holed = -1  # start of a fragmented record cut by zero-filled space
        max_bytes = self.max_record_bytes
        checked_size = max_bytes >= BLOCK_SIZE  # a fragment is smaller than a block
        parts: list[bytes] = []  # the fragments of the record being assembled
        size = 0
        for offsets, types, payloads, problems in self._blocks():
            if (record_start < 0 and holed < 0 and not resyncing and types.count(FULL) == len(types)
                    and (checked_size or max(map(len, payloads), default=0) <= max_bytes)):
                if offsets:  # the common case: whole records only, in one pass
                    self.end_offset = offsets[-1] + HEADER_SIZE + len(payloads[-1])
                    yield RecordBatch(offsets, payloads, self.end_offset)
                continue
            got_offsets: list[int] = []
            got_payloads: list[bytes] = []
            got_end = -1
            try:
                for j, ftype in enumerate(types):
                    offset, item = offsets[j], payloads[j]
                    if holed >= 0 and ftype != _PAD and ftype != _EOF and ftype != _TORN:
                        # Data after the zeros: the record was damaged, not torn.
                        self._corrupt(holed, offset, "zero-filled space in the middle of a fragmented record")
                        holed = -1
                    if ftype == FULL:
                        resyncing = False
                        if record_start >= 0:
                            self._corrupt(record_start, offset,
                                          "partial record without end (FULL inside a fragmented record)")
                            record_start = -1
                            parts = []
                        end = offset + HEADER_SIZE + len(item)
                        if len(item) > max_bytes:
                            self._corrupt(offset, end, f"record over the limit of {max_bytes} bytes", Damage.TOO_LARGE)
                            continue
                        got_offsets.append(offset)
                        got_payloads.append(item)
                        got_end = end
                    elif ftype == FIRST:
                        resyncing = False
                        if record_start >= 0:
                            self._corrupt(record_start, offset,
                                          "partial record without end (FIRST inside a fragmented record)")
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
                            self._corrupt(record_start, end, f"record over the limit of {max_bytes} bytes",
                                          Damage.TOO_LARGE)
                            record_start = -1
                            parts = []
                            continue
                        parts.append(item)
                        if ftype == LAST:
                            got_offsets.append(record_start)
                            got_payloads.append(b"".join(parts))
                            record_start = -1
                            parts = []
                            self.end_offset = end
                            yield RecordBatch(got_offsets, got_payloads, end)  # an assembled record ends its batch
                            got_offsets, got_payloads = [], []
                    elif ftype == _PAD:
                        if record_start >= 0:  # LevelDB: an error in the middle of a record,
                            holed = record_start  # unless only zeros follow (a torn tail)
                            record_start = -1
                            parts = []
                    elif ftype == _BAD:
                        bad_end, reason, kind = problems[j]
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
                        elif record_start >= 0:
                            self.torn_tail = (record_start, "fragmented record without its LAST fragment at end of file")
                        elif ftype == _TORN:
                            self.torn_tail = (offset, problems[j][1])
            except CorruptionError:
                if got_offsets:  # the valid records before the damage come first
                    self.end_offset = got_end
                    yield RecordBatch(got_offsets, got_payloads, got_end)
                raise
            if got_offsets:
                self.end_offset = got_end
                yield RecordBatch(got_offsets, got_payloads, got_end)
