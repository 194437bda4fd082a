"""Chunk files: one contiguous key range of a snapshot, readable on its own.

Format of ``chunk-NNNNNN.wkc`` (version 1)::

    chunk   := header data+                   wal.record records (LevelDB framing:
                                              32 KiB blocks, CRC-32C per fragment),
                                              nothing after the last record
    header  := magic:8 = b"WALKVSNC"  version:uint16le = 1
               chunk_index:uint32le  snapshot_lsn:uint64le          (22 bytes)
    data    := msgpack array [keys, values]   two msgpack arrays of the same
                                              length n >= 1, every element bin

Rules, and the reason for each:

* Framing is ``wal.record`` (the one framing implementation): every fragment is
  CRC-checked and lengths are bounded, so a damaged chunk is found, not
  misread, and a length field claiming gigabytes allocates nothing.
* The header makes a chunk identifiable alone (a file handed to a Spark
  executor, or copied out of its directory, still says which snapshot and
  position it is): the reader checks index and LSN against the manifest.
* A data record holds about ``record_bytes`` (default 64 KiB) of keys and
  values, stored as columns, ``[keys, values]``, not as n ``[key, value]``
  pairs: one msgpack call packs or unpacks a whole record, n fewer arrays make
  both about 1.5-2x faster, and the columns become Arrow arrays in Spark
  with no transposition.
* Keys are strictly increasing, bytewise, inside a record, across the
  records of a chunk and across chunks (chunk i's last key < chunk i+1's
  first key): the snapshot is one sorted map, chunks cover disjoint ranges,
  and a key range read can skip whole chunks and records.
* The manifest (``snapshot.manifest``) records each chunk's first and last
  key, record and pair counts, byte size and CRC-32C of the whole file; a
  full read checks all of them, which catches a record lost, repeated or
  reordered whole (each of which the per-fragment CRCs cannot see).
* Empty chunks and empty records are never written: an empty snapshot has
  no chunks.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice, starmap
from operator import lt
from typing import BinaryIO, cast

import msgpack

from wal.crc import extend
from wal.errors import SNAPSHOT_HINT, CorruptionError, Damage, SnapshotError
from wal.fs import File, FileSystem
from wal.record import DEFAULT_MAX_RECORD_BYTES, MAX_RECORD_LIMIT, RecordWriter
from wal.record_reader import RecordReader

CHUNK_MAGIC = b"WALKVSNC"
CHUNK_VERSION = 1
_HEADER = struct.Struct("<8sHIQ")
HEADER_SIZE = _HEADER.size  # 22
MAX_RECORD_BYTES = DEFAULT_MAX_RECORD_BYTES
"""The default record limit of a snapshot's chunks (a snapshot holding a
larger pair states its own limit in its manifest, up to
:data:`~wal.record.MAX_RECORD_LIMIT`, 1 GiB), and the limit of a manifest
of version 1, which states none."""
_FLUSH_BYTES = 1 << 20  # small records are gathered into writes of this size
_DIRECT_BYTES = 32 << 10  # a record this large is written as it comes


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One chunk as the manifest describes it; all a reader needs to read and
    check the chunk file alone (picklable, for Spark executors)."""

    index: int
    name: str
    lsn: int
    first_key: bytes
    last_key: bytes
    records: int
    pairs: int
    bytes: int
    crc32c: int
    max_record_bytes: int = MAX_RECORD_BYTES  # the limit the chunk was written with (from the manifest)


def encode_header(index: int, lsn: int) -> bytes:
    return _HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, index, lsn)


def _corrupt(message: str, path: str | None, offset: int = 0, kind: Damage = Damage.CONTENT) -> CorruptionError:
    """A damaged chunk: ``offset`` is where the bad data starts (0: the file as a whole)."""
    return CorruptionError(message, kind=kind, path=path, offset=offset, hint=SNAPSHOT_HINT)


def decode_record(payload: bytes, path: str | None = None, offset: int = 0
                  ) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """A data record's ``(keys, values)``, checked: shape, types, key order.

    Raises CorruptionError naming ``path`` and ``offset`` for anything else.
    """
    try:
        obj = msgpack.unpackb(payload, use_list=False, raw=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for malformed input
        raise _corrupt(f"data record is not valid msgpack ({type(e).__name__}: {e})", path, offset) from None
    if type(obj) is not tuple or len(obj) != 2:
        raise _corrupt("data record is not a [keys, values] array", path, offset)
    keys, values = obj
    if type(keys) is not tuple or type(values) is not tuple:
        raise _corrupt("data record's keys or values are not arrays", path, offset)
    if len(keys) != len(values):
        raise _corrupt(f"data record has {len(keys)} keys but {len(values)} values", path, offset)
    if not keys:
        raise _corrupt("data record is empty", path, offset)
    types = set(map(type, keys))
    types.update(map(type, values))
    if types != {bytes}:
        raise _corrupt("data record holds a key or value that is not bytes", path, offset)
    if not all(map(lt, keys, islice(keys, 1, None))):
        raise _corrupt("keys inside a data record are not strictly increasing", path, offset)
    return keys, values


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
            raise _corrupt(e.reason, e.path, e.offset or 0, e.kind) from e
        except OSError as e:
            raise SnapshotError(f"cannot read snapshot chunk {self.name}: {e}") from e

    def _check_header(self) -> None:
        chunk, name = self.chunk, self.name
        head = self._next()
        if head is None or head[0] != 0:
            if self._reader.torn_tail is not None:
                raise _corrupt("chunk file is truncated (no complete header record)", name, 0, Damage.FRAMING)
            raise _corrupt("chunk file has no header record", name, 0, Damage.HEADER)
        header = head[1]
        if len(header) != HEADER_SIZE or header[:8] != CHUNK_MAGIC:
            raise _corrupt("not a walkv snapshot chunk (bad header record)", name, 0, Damage.HEADER)
        _, version, index, lsn = _HEADER.unpack(header)
        if version != CHUNK_VERSION:
            raise _corrupt(f"chunk format version {version}, the manifest says {CHUNK_VERSION}", name, 0,
                           Damage.HEADER)
        if index != chunk.index or lsn != chunk.lsn:
            raise _corrupt(
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
                raise _corrupt("chunk's first key differs from the manifest's", name, offset)
        elif not self.prev < first:
            raise _corrupt("keys are not strictly increasing across records", name, offset)
        self.prev = last
        self.nrecords += 1
        self.npairs += pairs
        if self.nrecords > chunk.records or self.npairs > chunk.pairs:
            raise _corrupt(
                f"chunk holds more than the manifest's {chunk.records} records / {chunk.pairs} pairs",
                name,
                offset,
            )
        if last > chunk.last_key:
            raise _corrupt("chunk holds a key past the manifest's last key", name, offset)

    def finish(self) -> None:
        """The whole-file checks, once every record was read and tallied."""
        chunk, name, tee = self.chunk, self.name, self._tee
        if self._reader.torn_tail is not None:
            off, why = self._reader.torn_tail
            raise _corrupt(f"chunk file is truncated ({why})", name, off, Damage.FRAMING)
        if self.nrecords != chunk.records or self.npairs != chunk.pairs:
            raise _corrupt(
                f"chunk holds {self.nrecords} records / {self.npairs} pairs, the manifest says "
                f"{chunk.records} / {chunk.pairs}",
                name,
            )
        if self.prev != chunk.last_key:
            raise _corrupt("chunk's last key differs from the manifest's", name)
        if tee.size != chunk.bytes:
            raise _corrupt(f"chunk file is {tee.size} bytes, the manifest says {chunk.bytes}", name, 0,
                           Damage.TOO_LARGE if tee.size > chunk.bytes else Damage.FRAMING)
        if tee.crc != chunk.crc32c:
            raise _corrupt(
                f"chunk file checksum {tee.crc:#010x} differs from the manifest's {chunk.crc32c:#010x}",
                name,
                0,
                Damage.CHECKSUM,
            )


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


class _Sink:
    """The file object RecordWriter writes to: CRCs the whole file, gathers
    small records into writes of up to 1 MiB, writes big ones as they come."""

    def __init__(self, file: File) -> None:
        self.file = file
        self.crc = 0
        self.offset = 0
        self._parts: list[bytes] = []
        self._pending = 0

    def write(self, data: bytes) -> int:
        if type(data) is not bytes and not (isinstance(data, memoryview) and data.readonly):
            data = bytes(data)  # it may be kept until the next flush: never a mutable buffer
        self.crc = extend(self.crc, data)
        n = len(data)
        if n >= _DIRECT_BYTES and not self._parts:  # big enough alone: no extra copy
            self.file.pwrite(data, self.offset)
            self.offset += n
            return n
        self._parts.append(data)
        self._pending += n
        if self._pending >= _FLUSH_BYTES:
            self.flush()
        return n

    def flush(self) -> None:
        if self._parts:
            data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts = []
            self._pending = 0
            self.file.pwrite(data, self.offset)
            self.offset += len(data)


class ChunkWriter:
    """Writes one chunk file through ``fs``: the header at once, then
    :meth:`add` data records; :meth:`finish` makes it durable (fsync) and
    returns its :class:`ChunkInfo`. The file is created exclusively (mode
    0o600 by ``fs``); its name becomes durable only with an fsync of its
    directory, which is the caller's job."""

    def __init__(self, fs: FileSystem, path: str, name: str, *, index: int, lsn: int,
                 max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self.path = path
        self.name = name
        self.index = index
        self.lsn = lsn
        self._sink = _Sink(fs.open(path, create=True, exclusive=True))
        # RecordWriter only calls write(), which _Sink provides.
        self._writer = RecordWriter(cast(BinaryIO, self._sink), offset=0, max_record_bytes=max_record_bytes)
        self._writer.add_record(encode_header(index, lsn))
        self.records = 0
        self.pairs = 0
        self.first_key: bytes | None = None
        self.last_key: bytes | None = None

    @property
    def size(self) -> int:
        """Bytes written so far (buffered or not)."""
        return self._writer.offset

    def add(self, payload: bytes, first_key: bytes, last_key: bytes, pairs: int) -> None:
        """Append one encoded data record holding ``pairs`` pairs from
        ``first_key`` to ``last_key`` (the caller has checked the order)."""
        self._writer.add_record(payload)
        if self.first_key is None:
            self.first_key = first_key
        self.last_key = last_key
        self.records += 1
        self.pairs += pairs

    def finish(self) -> ChunkInfo:
        """Flush, fsync and close the file; return its manifest entry."""
        sink = self._sink
        sink.flush()
        sink.file.sync(full=True)
        sink.file.close()
        assert self.first_key is not None and self.last_key is not None, "empty chunk"
        return ChunkInfo(
            index=self.index,
            name=self.name,
            lsn=self.lsn,
            first_key=bytes(self.first_key),
            last_key=bytes(self.last_key),
            records=self.records,
            pairs=self.pairs,
            bytes=self._writer.offset,
            crc32c=sink.crc,
        )

    def abort(self) -> None:
        """Close the file without syncing (the caller removes it)."""
        try:
            self._sink.file.close()
        except OSError:
            pass
