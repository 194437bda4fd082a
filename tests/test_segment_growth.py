"""wal/segment_writer.py: a group larger than the preallocation ahead of it
writes each byte of the segment once (the zeros that keep later fdatasyncs
from journaling a size change go only past the group), and reads back whole."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wal
from wal.fs import File, FileSystem
from wal.reader import read_log


class _Recording(File):
    """Every range written to a segment, in order: (offset, length, zeros?)."""

    writes: list[tuple[int, int, bool]]

    def pwrite(self, data, offset: int) -> None:  # type: ignore[no-untyped-def]
        if self.path.endswith(".wal"):
            self.writes.append((offset, len(data), False))
        super().pwrite(data, offset)

    def pwritev(self, buffers, offset: int) -> None:  # type: ignore[no-untyped-def]
        self.writes.append((offset, sum(map(len, buffers)), False))
        File.pwrite(self, b"".join(buffers), offset)

    def write_zeros(self, offset: int, length: int) -> None:
        self.writes.append((offset, length, True))
        File.pwrite(self, bytes(length), offset)

    def preallocate(self, offset: int, length: int) -> None:
        self.write_zeros(offset, length)


class _RecordingFS(FileSystem):
    def __init__(self) -> None:
        self.writes: list[tuple[int, int, bool]] = []

    def open(self, path: str, *, create: bool = False, exclusive: bool = False, readonly: bool = False) -> File:
        f = super().open(path, create=create, exclusive=exclusive, readonly=readonly)
        rec = _Recording(f.path, f.fd)
        rec.writes = self.writes
        f.fd = -1  # (the recording file owns the descriptor now)
        return rec


@pytest.mark.parametrize("sync", ["always", "none"])
@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=4))
def test_a_group_past_the_preallocation_writes_each_byte_once(tmp_path_factory, sync: str, sizes: list[int]) -> None:
    d = str(tmp_path_factory.mktemp("log"))
    fs = _RecordingFS()
    payloads = [os.urandom(n) for n in sizes]
    with wal.open(d, fs=fs, sync=sync, segment_bytes=256 << 10) as log:  # preallocated 256 KiB at a time
        del fs.writes[:]  # (the new segment's header and first preallocation)
        log.append_batch(payloads)
        writes = sorted(fs.writes)
    for (a, n, _), (b, _, _) in zip(writes, writes[1:]):
        assert a + n <= b, f"bytes at {b} written twice: {writes}"
    assert [e.payload for e in read_log(d)] == payloads
