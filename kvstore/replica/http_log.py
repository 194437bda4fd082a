"""A served store's log read over HTTP: ``GET /v1/log/segment`` (the segment's
own bytes) read with :mod:`wal`'s record reader.

The server answers ``/v1/log/segment?from_lsn=N`` with the bytes of the
segment file holding LSN ``N``, from the start of the 32 KiB block where
``N``'s record starts to the segment's durable end (headers
``Walkv-Segment``: the file's name, ``Walkv-Offset``: the file offset of the
first byte; docs/http-api.md). Those bytes are read here exactly as a
segment on disk is (:mod:`wal.segment`):

* by :class:`wal.record_reader.RecordReader` started at that block boundary
  (a reader can start at any block boundary: a fragment of a record begun
  before it is skipped), every fragment's CRC checked, records bounded by
  :data:`wal.record.MAX_RECORD_LIMIT` (the largest limit a segment header may
  state: the header itself is not sent unless the block is the first);
* the record at file offset 0 is the segment's header: its store id must be
  the source's and its first LSN the one the file's name says;
* every other record is an entry (:func:`wal.segment.decode_entry`): entries
  before ``N`` in the first block are skipped, and from ``N`` on each LSN must
  follow the one before (a break is :class:`~wal.errors.CorruptionError` of
  kind SEQUENCE naming the URL, the segment and the offset), and none after
  ``Walkv-Durable-Lsn`` is taken (the server reads it before the bytes and
  ends the body at a durable record; an entry past it could still be
  mid-write, and a crash could take it back).

The body is read as it arrives (:class:`_BodyFile`: the reader's
``read(32 KiB)`` calls take bytes off the response stream), so a catch-up of
a whole segment holds one block in memory, not the segment. A torn end
(the connection cut mid-record) ends the entries; the next read asks again
from the LSN after the last whole one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from wal.errors import CorruptionError, Damage, ReplicaError
from wal.record import MAX_RECORD_LIMIT
from wal.record_reader import RecordReader
from wal.segment import Entry, decode_entry, decode_header, segment_first_lsn
from wal.timeline import history_from_json

READ_TIMEOUT = 5.0
"""Seconds past its long poll that a segment answer may make a reader wait
for its headers or its next bytes."""


class _BodyFile:
    """The little of a binary file :class:`RecordReader` uses (``seek`` to
    where the body starts, ``read``), over a streamed HTTP body that starts
    at file offset ``start``."""

    def __init__(self, chunks: Iterator[bytes], start: int) -> None:
        self._chunks = chunks
        self._start = start
        self._buf = bytearray()
        self._done = False

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset != self._start or whence != 0:
            raise ValueError(f"a streamed segment body starts at offset {self._start}, not {offset}")
        return offset

    def read(self, n: int = -1) -> bytes:
        while not self._done and (n < 0 or len(self._buf) < n):
            chunk = next(self._chunks, None)
            if chunk is None:
                self._done = True
            else:
                self._buf += chunk
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class SegmentStream:
    """The entries of one ``/v1/log/segment`` answer from ``from_lsn`` (module
    docstring), read as they arrive. ``next_lsn`` is the LSN the next entry
    must have; ``durable_lsn`` the server's durable LSN when it answered,
    ``history`` its log's timeline history (``Walkv-History``: the entries
    sent are on it), ``epoch`` the epoch it leads (``Walkv-Epoch``: its
    timeline's number). ``params``: more query parameters (a follower's
    ``replica`` and ``epoch``).
    ``wait``: seconds the server may wait for ``from_lsn`` to be durable (a
    long poll; the answer may then hold nothing)."""

    def __init__(self, http: Any, url: str, store_id: str, from_lsn: int, wait: float = 0.0, *,
                 params: dict[str, Any] | None = None) -> None:
        self.next_lsn = self._from = from_lsn
        self._stack = ExitStack()
        params = {**(params or {}), "from_lsn": from_lsn, **({"wait": wait} if wait else {})}
        # A server that stops answering mid-way (a paused process: its socket still accepts) is given up
        # on after a while, never waited for forever.
        resp = self._stack.enter_context(http.stream("GET", "/v1/log/segment", params=params,
                                                     read_timeout=wait + READ_TIMEOUT))
        try:
            name = resp.headers["Walkv-Segment"]
            offset = int(resp.headers["Walkv-Offset"])
            self.durable_lsn = int(resp.headers["Walkv-Durable-Lsn"])
            self.history = history_from_json(json.loads(resp.headers["Walkv-History"]), "Walkv-History")
            self.epoch = int(resp.headers.get("Walkv-Epoch", self.history[-1].timeline))
            first = segment_first_lsn(name)
            if first is None or offset < 0:
                raise ValueError(f"segment {name!r} at offset {offset}")
        except (KeyError, ValueError) as exc:
            self._stack.close()
            raise ReplicaError(f"{url} answered /v1/log/segment without a valid Walkv-Segment, Walkv-Offset, "
                               f"Walkv-Durable-Lsn and Walkv-History ({exc}): is it a walkv server of this "
                               "version?") from None
        self._path = f"{url}/v1/log/segment ({name})"
        self._store_id = store_id
        self._first = first
        body = _BodyFile(resp.iter_bytes(), offset)
        self._reader = RecordReader(body, path=self._path, start_offset=offset, zeros_end=True,  # type: ignore[arg-type]
                                    max_record_bytes=MAX_RECORD_LIMIT)
        self._entries = self._read()

    def _read(self) -> Iterator[Entry]:
        path = self._path
        for batch in self._reader.batches():
            for offset, payload in zip(batch.offsets, batch.payloads):
                if offset == 0:
                    header = decode_header(payload, path)
                    if header.store_id != self._store_id or header.first_lsn != self._first:
                        raise ReplicaError(f"{path} is a segment of store {header.store_id} starting at LSN "
                                           f"{header.first_lsn}; this replica follows store {self._store_id} "
                                           f"and asked for the segment starting at LSN {self._first}")
                    continue
                entry = decode_entry(payload, path, offset)
                if entry.lsn < self._from and self.next_lsn == self._from:
                    continue  # earlier entries of the first block
                if entry.lsn != self.next_lsn:
                    raise CorruptionError(f"LSN {entry.lsn} where LSN {self.next_lsn} was expected",
                                          kind=Damage.SEQUENCE, path=path, offset=offset, lsn=entry.lsn)
                self.next_lsn = entry.lsn + 1
                yield entry

    def take(self, last: int) -> Iterator[Entry]:
        """The entries up to LSN ``last`` and never past ``durable_lsn`` (the
        bytes after it may be a record still being written); the stream stays
        positioned after the last one yielded."""
        last = min(last, self.durable_lsn)
        while self.next_lsn <= last:
            entry = next(self._entries, None)
            if entry is None:
                return
            yield entry

    def close(self) -> None:
        self._stack.close()

