"""Segment files and their entries: the log's on-disk layout, and the one way
to read a segment.

Directory (one log)::

    00000000000000000001.wal   segment holding LSNs 1.. (name: first LSN, 20 digits)
    00000000000000004097.wal   the next segment; only the newest is ever written
    00000000000000000001.idx   sparse index of a sealed segment (:mod:`wal.index`)
    LOCK                       fcntl lock of the one writer (holds its pid)
    DURABLE                    the durable LSN, for readers in other processes (:mod:`wal.durable`)

Segment (a file of :mod:`wal.record` records)::

    record 0   header: "<8sHH16sQQQ" magic b"WALKVLOG", format version (3),
               flags (0), store id (16 bytes, a UUID), first LSN, creation
               time (unix microseconds), max record bytes, then the log's
               timeline history as :mod:`wal.timeline` encodes it
               (version 2: without the history, on timeline 1;
               version 1: "<8sHH16sQQ", without the record limit either)
    record n   entry:  "<QQ" LSN, commit timestamp (unix microseconds),
               then the entry's payload (opaque to the log)
    then       zeros up to the preallocated size (read as the end of data)

Rules, and why:

* The name and the header both carry the first LSN, and every entry carries its
  own LSN, so a renamed, missing or stale segment, or a segment from another
  store (store id), is detected rather than read as if it belonged.
* Segments are named, sorted and bisected by first LSN; LSNs are consecutive
  across segments, so segment ``i+1`` starts at the last LSN of ``i`` plus one.
* A sealed segment is never written again; the active (newest) one is
  preallocated (reading as zeros) ahead of its tail (:mod:`wal.segment_writer`).
* The header carries the log's timeline history (version 3): which line of
  forks leads to the segment's entries, so that a reader never mixes two
  histories of one store. :mod:`wal.timeline` states its rules.
* The header states the largest record its segment may hold (version 2;
  version 1 segments hold records of at most the default 64 MiB), and every
  reader bounds records by it: the limit a log was written with travels with
  the log, so a store opened with a raised ``max_record_bytes`` is read
  whole by every reader (restore, verify, Spark, repair), none of which
  knows the option. Records over it are refused before memory is allocated
  for them. A header may state at most :data:`~wal.record.MAX_RECORD_LIMIT`
  (1 GiB); one claiming more is corruption, never an allocation.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import sys
import time
import uuid
from collections.abc import Iterator
from functools import partial
from itertools import chain
from operator import attrgetter, itemgetter
from typing import BinaryIO, Final, NamedTuple

from wal.errors import REPAIR_HINT, CorruptionError, Damage
from wal.fs import OS_FS
from wal.readfs import ReadFS
from wal.record import BLOCK_SIZE, DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, MAX_RECORD_LIMIT
from wal.record_reader import RecordReader
from wal.timeline import MAX_HISTORY, ROOT, History, TimelineStart, decode_history, encode_history, history_bytes

SEGMENT_MAGIC: Final = b"WALKVLOG"
FORMAT_VERSION: Final = 3
"""Written by this walkv; versions 1 (no record limit field), 2 (no timeline
history) and 3 are read."""

_SEGMENT_HEADER: Final = struct.Struct("<8sHH16sQQQ")  # versions 2 and 3, before 3's history
_SEGMENT_HEADER_V1: Final = struct.Struct("<8sHH16sQQ")
_MAX_HEADER: Final = _SEGMENT_HEADER.size + history_bytes(MAX_HISTORY)
_HEADER_READ: Final = HEADER_SIZE + _SEGMENT_HEADER.size + history_bytes(8)
"""The bytes a header read asks for first: a header with up to 8 timelines
(one more read for a longer history)."""
# Little-endian, as every field on disk. Spelled "@QQ" (native order, two aligned
# 8-byte fields: no padding) on a little-endian machine, where the bytes are the
# same and struct copies each int whole instead of byte by byte ("<Q" goes through
# _PyLong_AsByteArray): ~350 of a non-durable put's instructions (callgrind).
_ENTRY_HEADER: Final = struct.Struct("@QQ" if sys.byteorder == "little" else "<QQ")
ENTRY_HEADER_SIZE: Final = _ENTRY_HEADER.size
pack_entry_header: Final = _ENTRY_HEADER.pack
_unpack_entry_header: Final = _ENTRY_HEADER.unpack_from

_NAME: Final = re.compile(r"^(\d{20})\.wal$")


Payload = bytes | tuple[bytes, ...]
"""A log entry's payload as appended: bytes, or a tuple of pieces whose
concatenation is the payload (logged without being joined into one buffer)."""


def payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(map(len, payload))


class Entry(NamedTuple):
    lsn: int
    timestamp_us: int
    payload: bytes


class SegmentFile(NamedTuple):
    first_lsn: int
    path: str
    size: int = 0


class SegmentHeader(NamedTuple):
    version: int
    store_id: str
    first_lsn: int
    created_us: int
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    history: History = ROOT
    """The log's timelines when this segment began (:mod:`wal.timeline`)."""

    @property
    def timeline(self) -> TimelineStart:
        """The timeline this segment's first entry is on."""
        return self.history[-1]


# -- names ---------------------------------------------------------------------


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}.wal"


def index_path(segment_path: str) -> str:
    """The path of a segment's sparse index sidecar."""
    return segment_path[: -len(".wal")] + ".idx"


def segment_first_lsn(name: str) -> int | None:
    """The first LSN a segment file name promises, or ``None`` for other names."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def list_segments(directory: str, fs: ReadFS = OS_FS) -> list[SegmentFile]:
    """The segment files of a log directory, oldest first (``[]`` when the
    directory does not exist)."""
    found = []
    for info in fs.list_dir(directory):
        first = segment_first_lsn(info.name)
        if first is not None and not info.is_dir:
            found.append(SegmentFile(first, info.path, info.size))
    found.sort()
    return found


def find_segment(segments: list[SegmentFile], lsn: int) -> int:
    """Index of the segment that holds ``lsn`` (the last one starting at or
    before it), or -1 when ``lsn`` is before the first segment."""
    return bisect.bisect_right([s.first_lsn for s in segments], lsn) - 1


# -- header ---------------------------------------------------------------------


def encode_header(store_id: str, first_lsn: int, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                  history: History = ROOT) -> bytes:
    if not 0 < max_record_bytes <= MAX_RECORD_LIMIT:
        raise ValueError(f"max_record_bytes must be in 1..{MAX_RECORD_LIMIT}, not {max_record_bytes}")
    if history[-1].first_lsn > first_lsn:
        raise ValueError(f"a segment from LSN {first_lsn} cannot be on {history[-1]}, which begins at LSN "
                         f"{history[-1].first_lsn}")
    return _SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, FORMAT_VERSION, 0, uuid.UUID(hex=store_id).bytes, first_lsn, time.time_ns() // 1000,
        max_record_bytes,
    ) + encode_history(history)


def decode_header(payload: bytes, path: str) -> SegmentHeader:
    if len(payload) < 10 or payload[:8] != SEGMENT_MAGIC:
        raise CorruptionError("not a walkv log segment (bad magic)", kind=Damage.HEADER, path=path, offset=0,
                              hint=REPAIR_HINT)
    version = int.from_bytes(payload[8:10], "little")
    if not 1 <= version <= FORMAT_VERSION:
        raise CorruptionError(
            f"segment format version {version} is not supported (this walkv reads 1..{FORMAT_VERSION})",
            kind=Damage.HEADER, path=path, offset=0, hint="upgrade walkv",
        )
    layout = _SEGMENT_HEADER_V1 if version == 1 else _SEGMENT_HEADER
    if len(payload) != layout.size if version < 3 else len(payload) < layout.size:
        raise CorruptionError("segment header has the wrong size", kind=Damage.HEADER, path=path, offset=0,
                              hint=REPAIR_HINT)
    history = ROOT
    if version == 1:
        _, _, _flags, sid, first_lsn, created = layout.unpack(payload)
        limit = DEFAULT_MAX_RECORD_BYTES
    else:
        _, _, _flags, sid, first_lsn, created, limit = layout.unpack_from(payload)
        if version == 3:
            history = decode_history(payload[layout.size:], path)
            if history[-1].first_lsn > first_lsn:
                raise CorruptionError(f"segment header puts its first LSN {first_lsn} on {history[-1]}, which "
                                      f"begins at LSN {history[-1].first_lsn}", kind=Damage.HEADER, path=path,
                                      offset=0, hint=REPAIR_HINT)
        if not ENTRY_HEADER_SIZE <= limit <= MAX_RECORD_LIMIT:
            raise CorruptionError(
                f"segment header states a record limit of {limit} bytes; a walkv log's limit is "
                f"{ENTRY_HEADER_SIZE}..{MAX_RECORD_LIMIT} bytes", kind=Damage.HEADER, path=path, offset=0,
                hint=REPAIR_HINT)
    return SegmentHeader(version, uuid.UUID(bytes=sid).hex, first_lsn, created, limit, history)


def read_header(f: BinaryIO, path: str) -> tuple[SegmentHeader, int]:
    """Read a segment's header record (a few dozen bytes, whatever the
    segment's size); return it and the offset after it."""
    try:
        found = _header_record(f, path)
        if found is not None:
            payload, end_offset = found
            header = decode_header(payload, path)
            named = segment_first_lsn(os.path.basename(path))
            if named is not None and named != header.first_lsn:
                raise CorruptionError(
                    f"segment header says first LSN {header.first_lsn} but the file name says {named}",
                    kind=Damage.HEADER, path=path, offset=0, hint=REPAIR_HINT,
                )
            return header, end_offset
    except CorruptionError as e:
        if e.kind is Damage.HEADER:
            raise
        raise CorruptionError(f"bad segment header record ({e.reason})", kind=Damage.HEADER, path=path, offset=0,
                              hint=REPAIR_HINT) from None
    raise CorruptionError("segment has no header record", kind=Damage.HEADER, path=path, offset=0, hint=REPAIR_HINT)


def _header_record(f: BinaryIO, path: str) -> tuple[bytes, int] | None:
    """The header record's payload and the offset after it (None: no
    record): first from a short read, then, for a header too long for it (a
    long timeline history), from a read long enough for the longest one."""
    for end in (_HEADER_READ, _MAX_HEADER + 4 * BLOCK_SIZE):
        reader = RecordReader(f, path=path, start_offset=0, end_offset=end, zeros_end=True,
                              max_record_bytes=_MAX_HEADER)
        for _, payload in reader.records():
            return payload, reader.end_offset
        if reader.torn_tail is None or reader.torn_tail[0] != 0:
            return None
    return None


# -- entries --------------------------------------------------------------------


_make_entry: Final = partial(tuple.__new__, Entry)
"""``Entry`` from an ``(lsn, timestamp_us, payload)`` tuple without a Python
call per entry (what ``Entry._make`` does, minus the call)."""
_LSN: Final = itemgetter(0)
_TIMESTAMP: Final = itemgetter(1)
_ENTRIES: Final = attrgetter("entries")


def decode_entry(payload: bytes, path: str | None, offset: int) -> Entry:
    if len(payload) < ENTRY_HEADER_SIZE:
        raise CorruptionError("log entry shorter than its header", path=path, offset=offset, hint=REPAIR_HINT)
    lsn, ts = _unpack_entry_header(payload)
    return Entry(lsn, ts, payload[ENTRY_HEADER_SIZE:])


class EntryBatch(NamedTuple):
    """Consecutive entries of one segment, as :meth:`SegmentScan.batches`
    yields them: ``entries[i]`` is the record at ``offsets[i]``."""

    offsets: list[int]
    entries: list[Entry]


class SegmentScan:
    """One strict pass over a segment's entries, from ``start_offset`` (0, or
    a record offset from a sparse index): every reader of segments uses it.

    :meth:`batches` yields the entries a block at a time (the bulk path of
    replay and log reads), :meth:`entries` one ``(record offset, Entry)`` at a
    time. The header record is always read first and decoded into
    :attr:`header`: its record limit bounds every record read (the limit the
    log was written with, whatever the reader's own options), and when the
    scan starts at offset 0 its first LSN is the LSN the first entry must
    have. Each entry's LSN must follow the one before (and ``next_lsn``, when
    the caller knows it): a break is :class:`CorruptionError` of kind
    SEQUENCE at the entry's offset, because a segment holds consecutive LSNs.
    An entry too short for its header, and any damage the record reader
    finds, is corruption too. A torn tail ends the entries quietly (a crash
    tears only the end); :meth:`torn_tail` reports it. Damage is raised once
    the valid entries before it have been yielded.

    Whether the entries ended or raised, :attr:`data_end` is the offset just
    after the last valid record and :attr:`next_lsn` the LSN the next entry
    would carry (``None`` when unknown): recovery cuts and repairs there.
    While :meth:`entries` runs they describe the entry last yielded; while
    :meth:`batches` runs, the last entry of the batch last yielded.
    """

    __slots__ = ("_end_offset", "_f", "_reader", "_start", "data_end", "header", "next_lsn", "path")

    def __init__(
        self,
        f: BinaryIO,
        path: str,
        start_offset: int = 0,
        next_lsn: int | None = None,
        *,
        end_offset: int | None = None,
    ) -> None:
        self.path = path
        self.header: SegmentHeader | None = None
        self.next_lsn = next_lsn
        self.data_end = start_offset
        self._f = f
        self._start = start_offset
        self._end_offset = end_offset
        self._reader: RecordReader | None = None

    def entries(self, from_lsn: int = 1, to_lsn: int | None = None) -> Iterator[tuple[int, Entry]]:
        """The entries ``from_lsn..to_lsn`` (earlier ones are checked and
        skipped); never parses past ``to_lsn``, which may be mid-write."""
        for batch in self.batches(from_lsn, to_lsn):
            next_lsn, data_end = self.next_lsn, self.data_end
            last = len(batch.entries) - 1
            for i, entry in enumerate(batch.entries):
                if i < last:  # one FULL fragment (see RecordBatch): it ends where its bytes do
                    self.next_lsn = entry.lsn + 1
                    self.data_end = batch.offsets[i] + HEADER_SIZE + ENTRY_HEADER_SIZE + len(entry.payload)
                else:
                    self.next_lsn, self.data_end = next_lsn, data_end
                yield batch.offsets[i], entry

    def batches(self, from_lsn: int = 1, to_lsn: int | None = None) -> Iterator[EntryBatch]:
        """As :meth:`entries`, the entries of a block at a time (never an
        empty batch)."""
        path = self.path
        header, header_end = read_header(self._f, path)
        self.header = header
        start = self._start
        if start < header_end:
            start = self.data_end = header_end
            self.next_lsn = header.first_lsn
        reader = self._reader = RecordReader(self._f, path=path, start_offset=start, end_offset=self._end_offset,
                                             zeros_end=True, max_record_bytes=header.max_record_bytes)
        for records in reader.batches():
            payloads = records.payloads
            n = len(payloads)
            good = n  # payloads[:good] are entries in sequence
            if min(map(len, payloads)) < ENTRY_HEADER_SIZE:
                good = next(i for i, p in enumerate(payloads) if len(p) < ENTRY_HEADER_SIZE)
            heads = list(map(_unpack_entry_header, payloads if good == n else payloads[:good]))
            lsns = list(map(_LSN, heads))
            expected = self.next_lsn
            if expected is None and lsns:
                expected = lsns[0]
            if expected is not None and lsns != list(range(expected, expected + good)):
                good = next(i for i, lsn in enumerate(lsns) if lsn != expected + i)
            reach = n + 1 if to_lsn is None or expected is None else to_lsn - expected + 1
            stop = good > 0 and reach <= good  # to_lsn is reached: nothing after it is looked at
            take = max(reach, 0) if stop else good
            if take:
                assert expected is not None  # set from the first entry
                self.next_lsn = expected + take
                self.data_end = records.record_end(take - 1)
                skip = min(take, max(0, from_lsn - expected))  # before from_lsn: checked, not yielded
                if skip < take:
                    yield EntryBatch(records.offsets[skip:take], list(map(
                        _make_entry, zip(lsns[skip:take], map(_TIMESTAMP, heads[skip:take]),
                                         [p[ENTRY_HEADER_SIZE:] for p in payloads[skip:take]]))))
            if stop:
                return
            if good < n:
                offset = records.offsets[good]
                if len(payloads[good]) < ENTRY_HEADER_SIZE:
                    raise CorruptionError("log entry shorter than its header", path=path, offset=offset,
                                          hint=REPAIR_HINT)
                assert expected is not None  # a break in sequence is after a first entry
                lsn = heads[good][0]
                raise CorruptionError(f"LSN {lsn} does not follow LSN {expected + good - 1}",
                                      kind=Damage.SEQUENCE, path=path, offset=offset, lsn=lsn, hint=REPAIR_HINT)

    def torn_tail(self) -> CorruptionError | None:
        """The torn record the entries stopped at, if any (its ``reason``
        says how it is torn)."""
        torn = self._reader.torn_tail if self._reader is not None else None
        if torn is None:
            return None
        return CorruptionError(torn[1], kind=Damage.FRAMING, path=self.path, offset=torn[0], hint=REPAIR_HINT)


def iter_entries(
    f: BinaryIO,
    path: str,
    start_offset: int = 0,
    from_lsn: int = 1,
    to_lsn: int | None = None,
    *,
    end_offset: int | None = None,
) -> Iterator[Entry]:
    """Entries of one segment file, strictly checked (see :class:`SegmentScan`:
    records are bounded by the limit in the segment's header), from
    ``start_offset`` (0, or an offset from the sparse index). Pure file
    reading: no lock, safe on any process or executor."""
    scan = SegmentScan(f, path, start_offset, end_offset=end_offset)
    return chain.from_iterable(map(_ENTRIES, scan.batches(from_lsn, to_lsn)))  # no step per entry: a hot path


def read_newest_header(directory: str, fs: ReadFS = OS_FS) -> SegmentHeader | None:
    """The header of the log's newest segment (``None`` when the log has no
    segment yet): its store id, and the log's timeline history."""
    for _ in range(3):  # the newest segment may be rolled or trimmed while we look
        segments = list_segments(directory, fs)
        if not segments:
            return None
        path = segments[-1].path
        try:
            with fs.open_input(path) as f:
                return read_header(f, fs.display(path))[0]
        except FileNotFoundError:
            continue
    raise CorruptionError("the log's segments keep vanishing while being read", kind=Damage.MISSING,
                          path=fs.display(directory), offset=0)


def read_store_id(directory: str, fs: ReadFS = OS_FS) -> str | None:
    """The store id in the header of the log's newest segment (``None`` when
    the log has no segment yet)."""
    header = read_newest_header(directory, fs)
    return None if header is None else header.store_id
