"""Reading records back: :class:`RecordReader`, strict by default, block by
block. The format and the reader's rules are described once, in
:mod:`wal.record`.

The reader has two layers: :meth:`RecordReader._blocks` splits each block into
its fragments and events (padding, end of data, torn tail, damage) in one
pass, checking every fragment's CRC; :meth:`RecordReader.batches` assembles
them into records. A block holding only whole (FULL) records, the common case,
is handed on as it is, without a step per record.

Each record's bytes are copied once from the blocks read: a FULL fragment's
payload is a slice of its block, and a record in fragments (FIRST, MIDDLE...,
LAST) is one join of views into the blocks that hold its fragments (checking
a view's CRC with ``google_crc32c``, which takes only ``bytes``, copies it
to a short-lived buffer, reused for the next one: that copy stays in the
cache). The blocks are the ``bytes`` the file's ``read`` returned
(immutable, so a view into one stays valid while a record is assembled
across blocks), and every payload the reader yields is ``bytes`` of its
own: a caller may keep it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO, Final, NamedTuple

from wal.crc import MASK_DELTA, extend, extend_bytes
from wal.errors import REPAIR_HINT, CorruptionError, Damage
from wal.record import (
    _FULL_CRC,
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


# Events from the physical layer (besides fragment types 1..4). An event has
# payload b"", and _TORN and _BAD their problem in the block's ``problems``.
_EOF: Final = -1  # clean end of data
_TORN: Final = -2  # truncated header or payload at end of file: problem is (offset, reason, FRAMING)
_BAD: Final = -3  # corrupt fragment: problem is (end of the bad bytes, reason, kind)
_PAD: Final = -4  # zero-filled space: the rest of the block is unused


class _Block(NamedTuple):
    """The fragments and events of one block, in order: item ``i`` is at
    ``offsets[i]``; its type is ``others[i]``, or FULL when ``i`` is not in
    ``others`` (so a run of FULL records is a slice). A FULL fragment's
    payload is ``payloads[i]`` (a copy: it is the record); a FIRST, MIDDLE or
    LAST fragment's is ``pieces[i]``, a view into the block (``payloads[i]``
    is then ``b""``, as for an event)."""

    offsets: list[int]
    payloads: list[bytes]
    others: dict[int, int]  # index: type, for every item that is not a FULL fragment (ascending)
    problems: dict[int, tuple[int, str, Damage]]  # index of a _TORN or _BAD event: its problem
    pieces: dict[int, memoryview]  # index of a FIRST, MIDDLE or LAST fragment: its payload

    def event(self, kind: int, at: int, problem: tuple[int, str, Damage] | None = None) -> None:
        """Add an event (an end, padding, damage) at file offset ``at``."""
        if problem is not None:
            self.problems[len(self.offsets)] = problem
        self.others[len(self.offsets)] = kind
        self.offsets.append(at)
        self.payloads.append(b"")


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
        # Reassembly state (:meth:`_step`).
        self._resyncing = False  # started on a block boundary, inside a record begun before it
        self._record_start = -1  # >= 0 while inside a fragmented record
        self._holed = -1  # start of a fragmented record cut by zero-filled space
        self._parts: list[memoryview] = []  # the fragments of the record being assembled (views)
        self._size = 0

    def __iter__(self) -> Iterator[bytes]:
        for _, payload in self.records():
            yield payload

    # -- physical layer: the fragments of one block at a time ---------------

    def _blocks(self) -> Iterator[_Block]:
        """Each block's fragments and events; the last block read ends with
        _EOF or _TORN. A block is the ``bytes`` ``read`` returned: the views
        in ``pieces`` keep it, unchanged, until their record is joined."""
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
            view = memoryview(buf)
            full_block = len(buf) == BLOCK_SIZE
            i = pos - block_start
            n = len(buf)
            block = _Block([], [], {}, {}, {})
            offsets, payloads, others, problems, pieces = block
            add_offset, add_payload = offsets.append, payloads.append
            event = block.event

            ended = False
            last_header = n - HEADER_SIZE
            while True:
                if i > last_header:  # too few bytes left for a header
                    rem = n - i
                    if full_block:
                        break  # trailer: next block
                    if rem > 0 and buf.count(0, i) != rem:
                        event(_TORN, block_start + i, (block_start + i, "truncated header at end of file",
                                                       Damage.FRAMING))
                    else:
                        event(_EOF, block_start + i)
                    ended = True
                    break
                crc, length, ftype = _unpack_header(buf, i)
                start = i + HEADER_SIZE
                end = start + length
                if end > n:
                    if full_block:
                        event(_BAD, block_start + i, (block_start + n, f"bad record length {length} (past the end "
                                                      "of the block)", Damage.FRAMING))
                    else:
                        event(_TORN, block_start + i, (block_start + i, "truncated record at end of file",
                                                       Damage.FRAMING))
                        ended = True
                    break
                if ftype == FULL:  # the common case: the payload is the record, copied once
                    payload = buf[start:end]
                    c = extend_bytes(_FULL_CRC, payload)
                else:  # a view: a fragmented record is copied once, when its pieces are joined
                    payload = b""
                    piece = view[start:end]
                    c = extend(_TYPE_CRC[ftype], piece)
                if crc == (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF:  # mask() inlined: once per fragment
                    if ftype == FULL:
                        add_offset(block_start + i)
                        add_payload(payload)
                        i = end
                        continue
                    if 0 < ftype <= _MAX_TYPE:
                        others[len(offsets)] = ftype
                        pieces[len(offsets)] = piece
                        add_offset(block_start + i)
                        add_payload(payload)
                        i = end
                        continue
                if ftype == ZERO_TYPE and length == 0:
                    if self.zeros_end or not full_block:
                        event(_EOF, block_start + i)
                        ended = True
                    else:
                        event(_PAD, block_start + i)  # padding: the rest of this block is unused
                    break
                if crc != (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF:
                    # The length may be the corrupt field, so nothing after it
                    # in this block can be trusted.
                    event(_BAD, block_start + i, (block_start + n, "checksum mismatch", Damage.CHECKSUM))
                    break
                event(_BAD, block_start + i, (block_start + end, f"unknown record type {ftype}", Damage.FRAMING))
                i = end
            if not ended and not full_block:
                event(_EOF, block_start + n)
                ended = True
            yield block
            if ended:
                return
            block_start += BLOCK_SIZE
            pos = block_start

    def fragments(self) -> Iterator[Fragment]:
        """Every physical fragment from ``start_offset``, for inspection
        tools: valid ones with their type and payload length, damaged ones
        with type 0 and the problem; stops at the end of data or a torn tail
        (reported as a last fragment with its problem)."""
        for offsets, payloads, others, problems, pieces in self._blocks():
            for j, offset in enumerate(offsets):
                ftype = others.get(j, FULL)
                if ftype > 0:
                    yield Fragment(offset, ftype, len(pieces[j]) if j in pieces else len(payloads[j]), None)
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
        for offsets, payloads, end in self.batches():
            last = len(offsets) - 1
            for i in range(last):  # one FULL fragment each (see RecordBatch)
                payload = payloads[i]
                self.end_offset = offsets[i] + HEADER_SIZE + len(payload)
                yield offsets[i], payload
            self.end_offset = end
            yield offsets[last], payloads[last]

    def batches(self) -> Iterator[RecordBatch]:
        """The complete, valid records, a block at a time (see
        :class:`RecordBatch`); :attr:`end_offset` is set to each batch's end
        as it is yielded. Corruption is raised once the valid records before
        it have been yielded, so a caller that stops early (at the last LSN
        it wants) never sees damage past them."""
        self._resyncing = self.start_offset % BLOCK_SIZE == 0 and self.start_offset > 0
        bulk = self.max_record_bytes >= BLOCK_SIZE  # a FULL fragment is under the limit
        for offsets, payloads, others, problems, pieces in self._blocks():
            got = RecordBatch([], [], -1)
            run = 0  # the next item to take: items run..j-1 are FULL fragments
            damage: CorruptionError | None = None
            try:
                for j in (*others, len(offsets)):
                    if run < j and bulk and self._record_start < 0 and self._holed < 0:
                        got.offsets.extend(offsets[run:j])  # the common case: whole records as they are
                        got.payloads.extend(payloads[run:j])
                        got = got._replace(end=offsets[j - 1] + HEADER_SIZE + len(payloads[j - 1]))
                        self._resyncing = False
                        run = j
                    for k in range(run, min(j + 1, len(offsets))):
                        record = self._step(others.get(k, FULL), offsets[k], payloads[k], pieces.get(k),
                                            problems.get(k))
                        if record is not None:
                            got.offsets.append(record[0])
                            got.payloads.append(record[1])
                            got = got._replace(end=record[2])
                            if others.get(k) == LAST:  # an assembled record ends its batch
                                self.end_offset = got.end
                                yield got
                                got = RecordBatch([], [], -1)
                    run = j + 1
            except CorruptionError as e:
                damage = e
            if damage is not None:
                # Not yielded inside the ``except``: compiled (mypyc 2.4), a generator
                # that yields in an except block leaves the exception as the caller's
                # sys.exc_info(), and every later exception chains to it.
                if got.offsets:  # the valid records before the damage come first
                    self.end_offset = got.end
                    yield got
                raise damage
            if got.offsets:
                self.end_offset = got.end
                yield got

    def _step(self, ftype: int, offset: int, item: bytes, piece: memoryview | None,
              problem: tuple[int, str, Damage] | None) -> tuple[int, bytes, int] | None:
        """Take one fragment or event (a FULL fragment's payload is ``item``;
        a FIRST, MIDDLE or LAST fragment's is ``piece``, a view into its
        block); return the record it completes as ``(offset, payload, end)``,
        if any."""
        if self._holed >= 0 and ftype != _PAD and ftype != _EOF and ftype != _TORN:
            # Data after the zeros: the record was damaged, not torn.
            self._corrupt(self._holed, offset, "zero-filled space in the middle of a fragmented record")
            self._holed = -1
        if ftype == FULL:
            self._resyncing = False
            if self._record_start >= 0:
                self._corrupt(self._record_start, offset, "partial record without end (FULL inside a fragmented record)")
                self._record_start = -1
                self._parts = []
            end = offset + HEADER_SIZE + len(item)
            if len(item) > self.max_record_bytes:
                self._corrupt(offset, end, f"record over the limit of {self.max_record_bytes} bytes", Damage.TOO_LARGE)
                return None
            return offset, item, end
        if ftype == FIRST:
            assert piece is not None
            self._resyncing = False
            if self._record_start >= 0:
                self._corrupt(self._record_start, offset,
                              "partial record without end (FIRST inside a fragmented record)")
            self._record_start = offset
            self._parts = [piece]
            self._size = len(piece)
        elif ftype == MIDDLE or ftype == LAST:
            assert piece is not None
            end = offset + HEADER_SIZE + len(piece)
            if self._record_start < 0:
                if self._resyncing:
                    # LevelDB: the LAST of the record we started inside
                    # ends the resync; a later orphan is corruption.
                    self._resyncing = ftype == MIDDLE
                else:
                    name = "MIDDLE" if ftype == MIDDLE else "LAST"
                    self._corrupt(offset, end, f"missing start of fragmented record ({name} without FIRST)")
                return None
            self._size += len(piece)
            if self._size > self.max_record_bytes:
                self._corrupt(self._record_start, end, f"record over the limit of {self.max_record_bytes} bytes",
                              Damage.TOO_LARGE)
                self._record_start = -1
                self._parts = []
                return None
            self._parts.append(piece)
            if ftype == LAST:  # the record's one copy
                start, payload = self._record_start, b"".join(self._parts)
                self._record_start = -1
                self._parts = []
                return start, payload, end
        elif ftype == _PAD:
            if self._record_start >= 0:  # LevelDB: an error in the middle of a record,
                self._holed = self._record_start  # unless only zeros follow (a torn tail)
                self._record_start = -1
                self._parts = []
        elif ftype == _BAD:
            assert problem is not None
            bad_end, reason, kind = problem
            if self._record_start >= 0:
                # An error between fragments must not join them: the
                # unfinished record is dropped with the bad fragment.
                self._corrupt(self._record_start, bad_end, reason, kind)
                self._record_start = -1
                self._parts = []
            else:
                self._corrupt(offset, bad_end, reason, kind)
        elif self._holed >= 0:  # _EOF or _TORN: the end
            self.torn_tail = (self._holed, "fragmented record followed only by zeros at end of file")
        elif self._record_start >= 0:
            self.torn_tail = (self._record_start, "fragmented record without its LAST fragment at end of file")
        elif ftype == _TORN:
            assert problem is not None
            self.torn_tail = (offset, problem[1])
        return None
