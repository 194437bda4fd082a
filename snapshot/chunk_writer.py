"""Writing a chunk file (:mod:`snapshot.chunk` owns its format): the header
record at once, then data records as the snapshot writer
(:mod:`snapshot.writer`) encodes them, framed by
:class:`~wal.record.RecordWriter`, the whole file CRC'd as it is written
(the CRC-32C its manifest entry records), small records gathered into
writes of up to 1 MiB, fsynced at the end.
"""

from __future__ import annotations

from typing import BinaryIO, cast

from snapshot.chunk import MAX_RECORD_BYTES, ChunkInfo, encode_header
from wal.crc import extend
from wal.fs import File, FileSystem
from wal.record import RecordWriter

_FLUSH_BYTES = 1 << 20  # small records are gathered into writes of this size
_DIRECT_BYTES = 32 << 10  # a record this large is written as it comes


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
