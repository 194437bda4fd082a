"""Reading a chunk file back (:mod:`snapshot.chunk` owns its format), one
data record at a time, checked against the chunk's manifest entry
(:class:`~snapshot.chunk.ChunkInfo`).

Every record is checked as it is read (framing and the CRC of every
fragment are :class:`~wal.record_reader.RecordReader`'s; shape, types and
key order are :func:`~snapshot.chunk.decode_record`'s; first key, order
across records and counts so far against the manifest), so nothing
unchecked is ever yielded; a read that reaches the end of the file also
checks what only the whole file shows: the counts, the last key, the size
and the CRC-32C of the file, in the same single pass.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import chain, starmap
from typing import BinaryIO, cast

from snapshot.chunk import HEADER_SIZE, ChunkInfo, check_file_sums, damaged_chunk, decode_header, decode_record
from wal.crc import extend
from wal.errors import CorruptionError, Damage, SnapshotError
from wal.record import MAX_RECORD_LIMIT
from wal.record_reader import RecordReader


class _ChecksumReader:
    """Wraps the caller's file so every byte RecordReader reads is counted and
    CRC'd: a full read checks size and checksum in the same single pass."""

    def __init__(self, f: BinaryIO, name: str | None) -> None:
        self._f = f
        self.name = name
        self.crc = 0
        self.size = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        if pos != 0 or whence != 0:  # pragma: no cover - RecordReader starts at 0 here
            raise ValueError("chunk reads start at offset 0")
        self._f.seek(0)
        self.crc = 0
        self.size = 0
        return 0

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        if not isinstance(data, bytes):
            data = bytes(data)
        self.crc = extend(self.crc, data)
        self.size += len(data)
        return data


class ChunkRecords:
    """The data records of one chunk file, checked against its manifest entry.

    Iterating yields each data record as ``(offset, payload)`` after the
    header record was checked (framing and CRC of every fragment are
    :class:`~wal.record.RecordReader`'s). The caller decodes each payload and
    reports it with :meth:`tally` (its first and last key and pair count)
    before using it, then calls :meth:`finish` once iteration ends, which
    checks what only the whole file can show (counts, last key, size,
    CRC-32C of the file). :func:`read_chunk_columns` is this with
    :func:`decode_record`; a reader with its own decoding of the same
    records (Spark's, to Arrow) uses this class so the checks are the same.
    """

    def __init__(self, f: BinaryIO, chunk: ChunkInfo, name: str) -> None:
        self.chunk = chunk
        self.name = name
        self._tee = _ChecksumReader(f, name)
        limit = max(HEADER_SIZE, min(chunk.max_record_bytes, MAX_RECORD_LIMIT, chunk.bytes))
        # RecordReader only reads and seeks, which _ChecksumReader does.
        self._reader = RecordReader(cast(BinaryIO, self._tee), path=name, start_offset=0, max_record_bytes=limit)
        self._records = self._reader.records()
        self.prev: bytes | None = None  # the last key tallied
        self.nrecords = 0
        self.npairs = 0
        self._check_header()

    def _next(self) -> tuple[int, bytes] | None:
        try:
            return next(self._records)
        except StopIteration:
            return None
        except CorruptionError as e:
            raise damaged_chunk(e.reason, e.path, e.offset or 0, e.kind) from e
        except OSError as e:
            raise SnapshotError(f"cannot read snapshot chunk {self.name}: {e}") from e

    def _check_header(self) -> None:
        chunk, name = self.chunk, self.name
        head = self._next()
        if head is None or head[0] != 0:
            if self._reader.torn_tail is not None:
                raise damaged_chunk("chunk file is truncated (no complete header record)", name, 0, Damage.FRAMING)
            raise damaged_chunk("chunk file has no header record", name, 0, Damage.HEADER)
        index, lsn = decode_header(head[1], name)
        if index != chunk.index or lsn != chunk.lsn:
            raise damaged_chunk(
                f"chunk header says chunk {index} of the snapshot at LSN {lsn}; the manifest "
                f"expects chunk {chunk.index} of LSN {chunk.lsn}",
                name,
                0,
                Damage.HEADER,
            )

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        while (item := self._next()) is not None:
            yield item

    def tally(self, first: bytes, last: bytes, pairs: int, offset: int) -> None:
        """Check one decoded record (keys ``first``..``last``, ``pairs``
        of them, already checked increasing inside it) against the records
        before it and the manifest."""
        chunk, name = self.chunk, self.name
        if self.prev is None:
            if first != chunk.first_key:
                raise damaged_chunk("chunk's first key differs from the manifest's", name, offset)
        elif not self.prev < first:
            raise damaged_chunk("keys are not strictly increasing across records", name, offset)
        self.prev = last
        self.nrecords += 1
        self.npairs += pairs
        if self.nrecords > chunk.records or self.npairs > chunk.pairs:
            raise damaged_chunk(
                f"chunk holds more than the manifest's {chunk.records} records / {chunk.pairs} pairs",
                name,
                offset,
            )
        if last > chunk.last_key:
            raise damaged_chunk("chunk holds a key past the manifest's last key", name, offset)

    def finish(self) -> None:
        """The whole-file checks, once every record was read and tallied."""
        chunk, name, tee = self.chunk, self.name, self._tee
        if self._reader.torn_tail is not None:
            off, why = self._reader.torn_tail
            raise damaged_chunk(f"chunk file is truncated ({why})", name, off, Damage.FRAMING)
        if self.nrecords != chunk.records or self.npairs != chunk.pairs:
            raise damaged_chunk(
                f"chunk holds {self.nrecords} records / {self.npairs} pairs, the manifest says "
                f"{chunk.records} / {chunk.pairs}",
                name,
            )
        if self.prev != chunk.last_key:
            raise damaged_chunk("chunk's last key differs from the manifest's", name)
        check_file_sums(chunk, tee.size, tee.crc, name)


def read_chunk_columns(
    f: BinaryIO,
    chunk: ChunkInfo,
    *,
    path: str | None = None,
    start: bytes | None = None,
    stop: bytes | None = None,
) -> Iterator[tuple[tuple[bytes, ...], tuple[bytes, ...]]]:
    """Stream a chunk file as ``(keys, values)`` columns, one data record at a time.

    ``f`` is any binary file object with ``read`` and ``seek`` (a built-in
    file, ``io.BytesIO``, a pyarrow ``NativeFile``); ``chunk`` is its entry
    from the manifest; ``path`` names it in errors (default: the chunk's name). Memory is bounded by one
    record (at most the record limit the manifest states, and never more
    than the chunk's size as the manifest gives it) plus one 32 KiB block.

    ``start``/``stop`` restrict the keys to ``start <= key < stop`` (columns
    are sliced). A read that reaches the end of the file checks everything
    the manifest says (header, counts, first and last key, size, CRC-32C of
    the file) and raises :class:`~wal.errors.CorruptionError` naming the file
    (and offset when known) at the first disagreement; records are checked as
    they are read, so nothing unchecked is ever yielded. A read cut short by
    ``stop`` has checked every record it yielded but not the whole file.
    """
    name = path if path is not None else chunk.name
    records = ChunkRecords(f, chunk, name)
    for offset, payload in records:
        keys, values = decode_record(payload, name, offset)
        first = keys[0]
        records.tally(first, keys[-1], len(keys), offset)
        last = keys[-1]
        if start is not None and last < start:
            continue
        if stop is not None and last >= stop:
            i = bisect_left(keys, start) if start is not None and first < start else 0
            j = bisect_left(keys, stop)
            if j > i:
                yield keys[i:j], values[i:j]
            return
        if start is not None and first < start:
            i = bisect_left(keys, start)
            yield keys[i:], values[i:]
        else:
            yield keys, values
    records.finish()


def read_chunk(
    f: BinaryIO,
    chunk: ChunkInfo,
    *,
    path: str | None = None,
    start: bytes | None = None,
    stop: bytes | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """Stream a chunk file as ``(key, value)`` pairs in key order; see
    :func:`read_chunk_columns` for the arguments and the checks."""
    return chain.from_iterable(starmap(zip, read_chunk_columns(f, chunk, path=path, start=start, stop=stop)))
