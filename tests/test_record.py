"""wal/record.py is LevelDB's log format byte for byte, and its reader follows
the spec (DESIGN.md section 1).

Expected bytes are built by hand from the published format (LevelDB
doc/log_format.md, db/log_format.h): a 7-byte header ``struct.pack("<IHB",
masked_crc32c(type_byte + payload), length, type)`` with the CRC computed here
by crcmod directly, never by ``RecordWriter``. The reader tests port every case
of LevelDB's db/log_test.cc, adapted to walkv's semantics: LevelDB reports
corruption to a Reporter and goes on; walkv raises CorruptionError (naming the
path and offset) in strict mode, and with ``skip_corrupt=True`` records each
skipped byte range in ``reader.skipped``. A torn tail ends the log cleanly.
"""

from __future__ import annotations

import io
import os
import struct
from array import array
from pathlib import Path
from typing import Iterable

import crcmod.predefined
import pytest

from wal.errors import CorruptionError, RecordTooLargeError, WalkvError
from wal.record import BLOCK_SIZE, RecordWriter, frame_into
from wal.record_reader import RecordReader

BS = 32768  # kBlockSize, written out: the format is fixed, not our constant
HDR = 7  # kHeaderSize
ZERO, FULL, FIRST, MIDDLE, LAST = 0, 1, 2, 3, 4

_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


# -- the reference: the format, by hand ----------------------------------------


def ref_mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def ref_header(ftype: int, payload: bytes) -> bytes:
    """The 7-byte fragment header: masked CRC-32C of type byte + payload,
    uint16 length, uint8 type, little-endian."""
    return struct.pack("<IHB", ref_mask(_crc32c(bytes([ftype]) + payload)), len(payload), ftype)


def ref_fragment(ftype: int, payload: bytes) -> bytes:
    return ref_header(ftype, payload) + payload


def ref_frame(payloads: Iterable[bytes], offset: int = 0) -> tuple[bytes, list[int]]:
    """LevelDB's Writer::AddRecord, restated: the bytes written from file
    ``offset`` for ``payloads`` and the offset each record starts at."""
    out = bytearray()
    pos = offset
    starts = []
    for payload in payloads:
        rest = bytes(payload)
        begin = True
        while True:
            left = BS - pos % BS
            if left < HDR:  # too small for a header: zero trailer
                out += bytes(left)
                pos += left
                left = BS
            if begin:
                starts.append(pos)
            piece, rest = rest[: left - HDR], rest[left - HDR :]
            end = not rest
            ftype = (FULL if end else FIRST) if begin else (LAST if end else MIDDLE)
            out += ref_fragment(ftype, piece)
            pos += HDR + len(piece)
            begin = False
            if end:
                break
    return bytes(out), starts


def big_string(partial: bytes, n: int) -> bytes:
    """LevelDB log_test.cc BigString."""
    return (partial * (n // len(partial) + 1))[:n]


def number_string(n: int) -> bytes:
    return b"%d." % n


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def written(payloads: Iterable[bytes], offset: int = 0) -> bytes:
    f = io.BytesIO()
    if offset:
        f.write(bytes(offset))
    w = RecordWriter(f, offset)
    for p in payloads:
        w.add_record(p)
    return f.getvalue()[offset:]


def test_block_size_constant() -> None:
    assert BLOCK_SIZE == BS


# -- literal vectors -----------------------------------------------------------


def test_literal_headers() -> None:
    # Worked out from the format (bitwise CRC-32C, mask by hand); these also
    # pin the reference helpers above.
    assert ref_header(FULL, b"") == bytes.fromhex("052b2843000001")
    assert ref_header(FULL, b"foo") == bytes.fromhex("dd5fb37a030001")
    assert written([b""]) == bytes.fromhex("052b2843000001")
    assert written([b"foo"]) == bytes.fromhex("dd5fb37a030001") + b"foo"
    assert written([b"a"]) == bytes.fromhex("b5cd0ba2010001") + b"a"


# -- writer: hand-built vectors ----------------------------------------------


def test_record_0_bytes() -> None:
    assert written([b""]) == ref_fragment(FULL, b"")
    assert len(written([b""])) == HDR


def test_record_1_byte() -> None:
    assert written([b"x"]) == ref_fragment(FULL, b"x")


def test_record_32761_bytes_fills_block_exactly() -> None:
    p = pattern(BS - HDR)
    data = written([p, b"next"])
    assert data[:BS] == ref_fragment(FULL, p)
    # The next record starts the next block: no trailer.
    assert data[BS:] == ref_fragment(FULL, b"next")


def test_record_32762_bytes_is_first_and_last() -> None:
    p = pattern(BS - HDR + 1)
    expected = ref_fragment(FIRST, p[: BS - HDR]) + ref_fragment(LAST, p[BS - HDR :])
    assert written([p]) == expected
    assert len(expected) == BS + HDR + 1


def test_record_100000_bytes() -> None:
    p = pattern(100_000, 3)
    a = BS - HDR
    expected = (
        ref_fragment(FIRST, p[:a])
        + ref_fragment(MIDDLE, p[a : 2 * a])
        + ref_fragment(MIDDLE, p[2 * a : 3 * a])
        + ref_fragment(LAST, p[3 * a :])
    )
    assert len(p[3 * a :]) == 100_000 - 3 * a == 1717
    assert written([p]) == expected
    assert written([p]) == ref_frame([p])[0]


def test_record_ending_6_before_block_end_zero_trailer() -> None:
    p = pattern(BS - HDR - 6)  # ends 6 bytes before the block end
    data = written([p, b"bar"])
    assert data == ref_fragment(FULL, p) + bytes(6) + ref_fragment(FULL, b"bar")
    assert len(data) == BS + HDR + 3


def test_record_ending_1_before_block_end_zero_trailer() -> None:
    p = pattern(BS - HDR - 1)
    data = written([p, b"bar"])
    assert data == ref_fragment(FULL, p) + b"\0" + ref_fragment(FULL, b"bar")


def test_record_ending_7_before_block_end_empty_first() -> None:
    p = pattern(BS - HDR - 7)  # exactly a header's worth left
    data = written([p, b"bar"])
    assert data == ref_fragment(FULL, p) + ref_fragment(FIRST, b"") + ref_fragment(LAST, b"bar")
    assert data[BS - HDR : BS] == ref_header(FIRST, b"")


def test_empty_record_in_last_7_bytes_is_full() -> None:
    p = pattern(BS - HDR - 7)
    data = written([p, b"", b"bar"])
    assert data == ref_fragment(FULL, p) + ref_fragment(FULL, b"") + ref_fragment(FULL, b"bar")


def test_record_ending_8_before_block_end_one_byte_first() -> None:
    p = pattern(BS - HDR - 8)
    data = written([p, b"bar"])
    assert data == ref_fragment(FULL, p) + ref_fragment(FIRST, b"b") + ref_fragment(LAST, b"ar")


def test_big_record_after_empty_first() -> None:
    p = pattern(BS - HDR - 7)
    q = pattern(70_000, 9)
    a = BS - HDR
    data = written([p, q])
    assert data == (
        ref_fragment(FULL, p)
        + ref_fragment(FIRST, b"")
        + ref_fragment(MIDDLE, q[:a])
        + ref_fragment(MIDDLE, q[a : 2 * a])
        + ref_fragment(LAST, q[2 * a :])
    )


@pytest.mark.parametrize("sizes", [[0, 1, 32761, 32762, 100000], [5, 32754, 3, 32753, 2, 65536, 0, 0]])
def test_sequences_match_reference(sizes: list[int]) -> None:
    payloads = [pattern(n, i) for i, n in enumerate(sizes)]
    f = io.BytesIO()
    w = RecordWriter(f)
    starts = [w.add_record(p) for p in payloads]
    expected, ref_starts = ref_frame(payloads)
    assert f.getvalue() == expected
    assert starts == ref_starts
    assert w.offset == len(expected)


def test_add_record_returns_start_offsets() -> None:
    f = io.BytesIO()
    w = RecordWriter(f)
    assert w.add_record(pattern(BS - HDR - 3)) == 0
    # 3 bytes left: the record starts in the next block.
    assert w.add_record(b"x") == BS
    assert w.offset == BS + HDR + 1
    w.add_record(pattern(BS - 2 * HDR - HDR - 1))  # now exactly 7 left
    assert w.offset == 2 * BS - HDR
    # Exactly 7 left: the empty FIRST is the record's start.
    assert w.add_record(b"yy") == 2 * BS - HDR


def test_frame_into_matches_reference_at_every_block_position() -> None:
    for offset in [0, 1, 100, BS - 8, BS - 7, BS - 6, BS - 1, BS, 3 * BS + 5]:
        for n in [0, 1, 6, 7, 8, BS - HDR - 1, BS - HDR, BS - HDR + 1, 2 * BS]:
            p = pattern(n, offset)
            out: list[bytes] = []
            end = frame_into(out, p, offset)
            expected, _ = ref_frame([p], offset)
            assert b"".join(out) == expected, (offset, n)
            assert end == offset + len(expected), (offset, n)


def test_bytes_like_payloads_frame_identically() -> None:
    p = pattern(40_000)
    expected = written([p, b"abc"])
    assert written([bytearray(p), bytearray(b"abc")]) == expected
    assert written([memoryview(p), memoryview(b"abc")]) == expected


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_frame_into_accepts_bytes_like(kind) -> None:
    # The log's group commit frames payloads with frame_into directly; it must
    # accept what RecordWriter accepts, whichever CRC implementation is loaded.
    for n in (3, 40_000):
        p = pattern(n)
        out: list[bytes] = []
        end = frame_into(out, kind(p), 0)
        expected, _ = ref_frame([p])
        assert b"".join(out) == expected
        assert end == len(expected)


# -- writer: reopened files --------------------------------------------------


def test_writer_continues_reopened_file_mid_block(tmp_path: Path) -> None:
    path = tmp_path / "000001.log"
    first = [b"hello", pattern(50_000, 1), b"", pattern(BS - HDR - 40, 2)]
    second = [b"world", pattern(BS, 3), b"z"]
    third = [pattern(10, 4)]
    with open(path, "wb") as f:
        w = RecordWriter(f)
        for p in first:
            w.add_record(p)
    size1 = path.stat().st_size
    assert size1 % BS != 0  # mid-block
    # Reopen for appending: the offset defaults to f.tell(), the file size.
    with open(path, "ab") as f:
        w = RecordWriter(f)
        assert w.offset == size1
        starts = [w.add_record(p) for p in second]
    size2 = path.stat().st_size
    # Reopen read/write with an explicit offset.
    with open(path, "r+b") as f:
        f.seek(size2)
        w = RecordWriter(f, size2)
        w.add_record(third[0])
    expected, ref_starts = ref_frame(first + second + third)
    assert path.read_bytes() == expected
    assert starts == ref_starts[len(first) : len(first) + len(second)]
    with open(path, "rb") as f:
        assert list(RecordReader(f)) == first + second + third


def test_writer_reopened_inside_trailer(tmp_path: Path) -> None:
    # The previous session ended 3 bytes before a block end: the new session
    # zero-fills the trailer and starts in the next block.
    path = tmp_path / "x.log"
    a = pattern(BS - HDR - 3)
    with open(path, "wb") as f:
        RecordWriter(f).add_record(a)
    with open(path, "ab") as f:
        assert RecordWriter(f).add_record(b"next") == BS
    assert path.read_bytes() == ref_fragment(FULL, a) + bytes(3) + ref_fragment(FULL, b"next")


def test_leveldb_open_for_append() -> None:
    # log_test.cc OpenForAppend
    f = io.BytesIO()
    RecordWriter(f).add_record(b"hello")
    w = RecordWriter(f, f.tell())
    w.add_record(b"world")
    f.seek(0)
    assert list(RecordReader(f)) == [b"hello", b"world"]


# -- writer: limits and types ------------------------------------------------


def test_writer_refuses_record_over_limit() -> None:
    f = io.BytesIO()
    w = RecordWriter(f, max_record_bytes=100)
    w.add_record(bytes(100))
    before = f.getvalue()
    with pytest.raises(RecordTooLargeError) as ei:
        w.add_record(bytes(101))
    assert isinstance(ei.value, ValueError)
    assert "101" in str(ei.value) and "100" in str(ei.value)
    assert f.getvalue() == before  # nothing written
    assert w.offset == len(before)
    w.add_record(b"ok")
    f.seek(0)
    assert list(RecordReader(f)) == [bytes(100), b"ok"]


def test_writer_limit_counts_bytes_not_items() -> None:
    # A memoryview of 8-byte items has len() == items, but it is framed as
    # its bytes: the limit must apply to the bytes.
    f = io.BytesIO()
    w = RecordWriter(f, max_record_bytes=10)
    wide = memoryview(array("Q", [1, 2]))  # 2 items, 16 bytes
    assert wide.nbytes == 16
    with pytest.raises(RecordTooLargeError):
        w.add_record(wide)
    assert f.getvalue() == b""


@pytest.mark.parametrize("bad", ["text", 12, None, [1, 2], 3.5])
def test_writer_type_error_for_non_bytes(bad) -> None:
    f = io.BytesIO()
    w = RecordWriter(f)
    with pytest.raises(TypeError):
        w.add_record(bad)  # type: ignore[arg-type]
    assert f.getvalue() == b""
    assert w.offset == 0


class _FullDisk(io.BytesIO):
    """A file whose next write fails with ENOSPC and writes nothing."""

    fail_next = False

    def write(self, b) -> int:  # type: ignore[override]
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        return super().write(b)


def test_writer_offset_unchanged_when_write_fails() -> None:
    # After a failed write nothing of the record is in the file; the writer's
    # offset must still be where the file ends, so a retry (after freeing
    # space) frames the next record at the right block position.
    f = _FullDisk()
    w = RecordWriter(f)
    a = pattern(BS - HDR - 20)
    w.add_record(a)
    f.fail_next = True
    with pytest.raises(OSError):
        w.add_record(pattern(40_000))
    assert w.offset == len(f.getvalue()) == BS - 20
    assert w.add_record(pattern(40_000)) == BS - 20
    assert f.getvalue() == ref_frame([a, pattern(40_000)])[0]


class _ShortWrites(io.RawIOBase):
    """A raw file (like open(path, "ab", buffering=0)): each write() may
    write fewer bytes than given and says how many, as RawIOBase allows."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return len(self.buf)

    def write(self, b) -> int:  # type: ignore[override]
        chunk = bytes(b[:1000])
        self.buf += chunk
        return len(chunk)


def test_writer_completes_short_writes() -> None:
    f = _ShortWrites()
    w = RecordWriter(f)
    payloads = [pattern(5000), b"x", pattern(70_000, 1)]
    for p in payloads:
        w.add_record(p)
    assert bytes(f.buf) == ref_frame(payloads)[0]


# -- reader helpers ------------------------------------------------------------


class Log:
    """LevelDB's LogTest harness: write with our writer (its bytes are proven
    above), damage the bytes, read back."""

    def __init__(self) -> None:
        self.f = io.BytesIO()
        self.w = RecordWriter(self.f)
        self._data: bytearray | None = None

    def write(self, payload: bytes) -> int:
        if self._data is not None:
            assert self._data == self.f.getvalue(), "write after damaging the bytes"
            self._data = None
        return self.w.add_record(payload)

    @property
    def data(self) -> bytearray:
        if self._data is None:
            self._data = bytearray(self.f.getvalue())
        return self._data

    @data.setter
    def data(self, value: bytearray) -> None:
        self._data = bytearray(value)

    def increment_byte(self, offset: int, delta: int) -> None:
        self.data[offset] = (self.data[offset] + delta) & 0xFF

    def set_byte(self, offset: int, value: int) -> None:
        self.data[offset] = value

    def shrink(self, n: int) -> None:
        del self.data[len(self.data) - n :]

    def fix_checksum(self, header_offset: int, length: int) -> None:
        crc = ref_mask(_crc32c(bytes(self.data[header_offset + 6 : header_offset + 7 + length])))
        self.data[header_offset : header_offset + 4] = struct.pack("<I", crc)

    def reader(self, **kw) -> RecordReader:
        kw.setdefault("path", "/logs/000007.log")
        return RecordReader(io.BytesIO(bytes(self.data)), **kw)

    def read(self, **kw) -> tuple[list[bytes], RecordReader]:
        r = self.reader(**kw)
        return list(r), r

    def read_skip(self, **kw) -> tuple[list[bytes], RecordReader]:
        return self.read(skip_corrupt=True, **kw)

    def corruption(self, **kw) -> CorruptionError:
        r = self.reader(**kw)
        with pytest.raises(CorruptionError) as ei:
            for _ in r:
                pass
        return ei.value


def dropped(r: RecordReader) -> int:
    return sum(end - start for start, end, _ in r.skipped)


def assert_clean(r: RecordReader) -> None:
    assert r.skipped == []


# -- LevelDB log_test.cc, case by case ---------------------------------------


def test_empty() -> None:
    log = Log()
    recs, r = log.read()
    assert recs == []
    assert r.end_offset == 0
    assert r.torn_tail is None
    assert_clean(r)


def test_read_write() -> None:
    log = Log()
    for p in (b"foo", b"bar", b"", b"xxxx"):
        log.write(p)
    r = log.reader()
    it = iter(r)
    assert [next(it) for _ in range(4)] == [b"foo", b"bar", b"", b"xxxx"]
    assert next(it, None) is None
    assert next(it, None) is None  # reads at EOF keep saying EOF
    assert r.end_offset == len(log.data)
    assert r.torn_tail is None


def test_records_yields_offsets() -> None:
    log = Log()
    payloads = [b"foo", pattern(BS), b"", pattern(BS - 2 * HDR - 3 - HDR), b"z"]
    starts = [log.write(p) for p in payloads]
    r = log.reader()
    got = list(r.records())
    assert got == list(zip(starts, payloads))
    assert starts == ref_frame(payloads)[1]
    assert all(type(p) is bytes for _, p in got)


def test_many_blocks() -> None:
    log = Log()
    n = 100_000
    for i in range(n):
        log.write(number_string(i))
    assert len(log.data) > 20 * BS
    recs, r = log.read()
    assert len(recs) == n
    assert all(recs[i] == number_string(i) for i in range(n))
    assert r.end_offset == len(log.data)
    assert_clean(r)


def test_fragmentation() -> None:
    log = Log()
    payloads = [b"small", big_string(b"medium", 50000), big_string(b"large", 100000)]
    for p in payloads:
        log.write(p)
    recs, r = log.read()
    assert recs == payloads
    assert_clean(r)


def test_marginal_trailer() -> None:
    # A trailer exactly the size of an empty record.
    log = Log()
    n = BS - 2 * HDR
    log.write(big_string(b"foo", n))
    assert len(log.data) == BS - HDR
    log.write(b"")
    log.write(b"bar")
    recs, r = log.read()
    assert recs == [big_string(b"foo", n), b"", b"bar"]
    assert_clean(r)


def test_marginal_trailer2() -> None:
    log = Log()
    n = BS - 2 * HDR
    log.write(big_string(b"foo", n))
    assert len(log.data) == BS - HDR
    log.write(b"bar")
    recs, r = log.read()
    assert recs == [big_string(b"foo", n), b"bar"]
    assert_clean(r)
    assert r.torn_tail is None


def test_short_trailer() -> None:
    log = Log()
    n = BS - 2 * HDR + 4
    log.write(big_string(b"foo", n))
    assert len(log.data) == BS - HDR + 4
    log.write(b"")
    log.write(b"bar")
    recs, r = log.read()
    assert recs == [big_string(b"foo", n), b"", b"bar"]
    assert_clean(r)


def test_aligned_eof() -> None:
    log = Log()
    n = BS - 2 * HDR + 4
    log.write(big_string(b"foo", n))
    assert len(log.data) == BS - HDR + 4
    recs, r = log.read()
    assert recs == [big_string(b"foo", n)]
    assert r.end_offset == BS - HDR + 4
    assert r.torn_tail is None


class LevelDBRandom:
    """util/random.h: the Park-Miller generator log_test.cc uses."""

    M = 2147483647

    def __init__(self, seed: int) -> None:
        self.seed = seed & 0x7FFFFFFF
        if self.seed in (0, self.M):
            self.seed = 1

    def next(self) -> int:
        product = self.seed * 16807
        self.seed = (product >> 31) + (product & self.M)
        if self.seed > self.M:
            self.seed -= self.M
        return self.seed

    def uniform(self, n: int) -> int:
        return self.next() % n

    def skewed(self, max_log: int) -> int:
        return self.uniform(1 << self.uniform(max_log + 1))


def random_skewed_string(i: int, rnd: LevelDBRandom) -> bytes:
    return big_string(number_string(i), rnd.skewed(17))


def test_random_read() -> None:
    log = Log()
    n = 500
    write_rnd = LevelDBRandom(301)
    for i in range(n):
        log.write(random_skewed_string(i, write_rnd))
    read_rnd = LevelDBRandom(301)
    recs, r = log.read()
    assert recs == [random_skewed_string(i, read_rnd) for i in range(n)]
    assert_clean(r)


class _FailingRead(io.BytesIO):
    def __init__(self, data: bytes, fail_on: int) -> None:
        super().__init__(data)
        self.calls = 0
        self.fail_on = fail_on

    def read(self, n: int | None = -1) -> bytes:  # type: ignore[override]
        self.calls += 1
        if self.calls == self.fail_on:
            raise OSError(5, "Input/output error")
        return super().read(n)


def test_read_error_is_not_end_of_log() -> None:
    # log_test.cc ReadError: LevelDB reports the block as dropped. walkv must
    # never mistake an I/O error for the clean end of the log.
    log = Log()
    log.write(b"foo")
    log.write(pattern(2 * BS))
    for fail_on in (1, 2):
        r = RecordReader(_FailingRead(bytes(log.data), fail_on), skip_corrupt=True)
        with pytest.raises((OSError, WalkvError)):
            list(r)


def test_bad_record_type() -> None:
    log = Log()
    log.write(b"foo")
    log.increment_byte(6, 100)  # the type is header[6]
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert "unknown record type" in str(err)
    assert err.offset == 0
    assert err.path == "/logs/000007.log"
    recs, r = log.read_skip()
    assert recs == []
    assert len(r.skipped) == 1
    start, end, reason = r.skipped[0]
    assert (start, end) == (0, HDR + 3)
    assert "unknown record type" in reason
    assert r.end_offset == 0


def test_bad_record_type_zero_with_length() -> None:
    # Type 0 is reserved for zero-fill; with a length and a valid CRC it is an
    # unknown type, not padding.
    log = Log()
    log.write(b"foo")
    log.write(b"bar")
    log.set_byte(6, ZERO)
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == [b"bar"]
    assert r.skipped and r.skipped[0][0] == 0


def test_truncated_trailing_record_is_ignored() -> None:
    log = Log()
    log.write(b"foo")
    log.shrink(4)  # all the payload and a header byte
    recs, r = log.read()
    assert recs == []
    assert_clean(r)
    assert r.end_offset == 0
    assert r.torn_tail is not None and r.torn_tail[0] == 0
    assert "truncated" in r.torn_tail[1]


def test_truncated_trailing_record_after_good_one() -> None:
    log = Log()
    log.write(b"first")
    end = len(log.data)
    log.write(pattern(1000))
    for cut in range(1, HDR + 1000):
        log2 = Log()
        log2.data = log.data[: len(log.data) - cut]
        recs, r = log2.read()
        assert recs == [b"first"], cut
        assert r.end_offset == end
        assert r.torn_tail is not None and r.torn_tail[0] == end, cut


def test_bad_length() -> None:
    log = Log()
    payload_size = BS - HDR
    log.write(big_string(b"bar", payload_size))
    log.write(b"foo")
    log.increment_byte(4, 1)  # the low byte of the length is header[4]
    err = log.corruption()
    assert "bad record length" in str(err)
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == [b"foo"]
    assert dropped(r) == BS  # the whole block, as LevelDB reports
    assert "bad record length" in r.skipped[0][2]


def test_bad_length_at_end_is_ignored() -> None:
    log = Log()
    log.write(b"foo")
    log.shrink(1)
    recs, r = log.read()
    assert recs == []
    assert_clean(r)
    assert r.torn_tail is not None and r.torn_tail[0] == 0


def test_bad_length_claiming_past_end_of_partial_block_is_torn() -> None:
    # The length field of the last fragment points past the end of the file
    # (the tail of the write was lost): a torn tail, not corruption.
    log = Log()
    log.write(b"ok")
    log.write(b"foo")
    log.data[9 + 4 : 9 + 6] = struct.pack("<H", 20000)
    recs, r = log.read()
    assert recs == [b"ok"]
    assert r.torn_tail is not None and r.torn_tail[0] == 9
    assert r.end_offset == 9


def test_checksum_mismatch() -> None:
    log = Log()
    log.write(b"foo")
    log.increment_byte(0, 10)
    err = log.corruption()
    assert "checksum mismatch" in str(err)
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == []
    assert dropped(r) == 10  # LevelDB: 10
    assert r.end_offset == 0


@pytest.mark.parametrize("where", [0, 1, 2, 3, 4, 6, 7, 8, 9])
def test_checksum_mismatch_any_byte(where: int) -> None:
    # Any damaged byte of a fragment but the length's high byte (a longer
    # length at the end of the file is a torn tail, tested above) is a
    # checksum mismatch: the CRC covers the type and, through it, the length.
    log = Log()
    log.write(b"foo")
    log.write(b"bar")
    log.data[where] ^= 0x01 if where == 4 else 0x40
    err = log.corruption()
    assert err.offset == 0
    recs, r = log.read_skip()
    assert b"foo" not in recs


def test_unexpected_middle_type() -> None:
    log = Log()
    log.write(b"foo")
    log.set_byte(6, MIDDLE)
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert "missing start" in str(err)
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == []
    assert dropped(r) == HDR + 3
    assert "missing start" in r.skipped[0][2]


def test_unexpected_last_type() -> None:
    log = Log()
    log.write(b"foo")
    log.set_byte(6, LAST)
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert "missing start" in str(err)
    recs, r = log.read_skip()
    assert recs == []
    assert dropped(r) == HDR + 3


def test_unexpected_full_type() -> None:
    log = Log()
    log.write(b"foo")
    log.write(b"bar")
    log.set_byte(6, FIRST)
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert "partial record without end" in str(err)
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == [b"bar"]
    assert r.skipped == [(0, HDR + 3, r.skipped[0][2])]
    assert "partial record without end" in r.skipped[0][2]


def test_unexpected_first_type() -> None:
    log = Log()
    log.write(b"foo")
    log.write(big_string(b"bar", 100000))
    log.set_byte(6, FIRST)
    log.fix_checksum(0, 3)
    err = log.corruption()
    assert "partial record without end" in str(err)
    assert err.offset == 0
    recs, r = log.read_skip()
    assert recs == [big_string(b"bar", 100000)]
    assert r.skipped == [(0, HDR + 3, r.skipped[0][2])]


def test_missing_last_is_ignored() -> None:
    log = Log()
    log.write(big_string(b"bar", BS))
    log.shrink(14)  # the LAST fragment, header included
    assert len(log.data) == BS
    recs, r = log.read()
    assert recs == []
    assert_clean(r)
    assert r.torn_tail is not None and r.torn_tail[0] == 0
    assert r.end_offset == 0


def test_partial_last_is_ignored() -> None:
    log = Log()
    log.write(b"before")
    log.write(big_string(b"bar", BS))
    log.shrink(1)
    recs, r = log.read()
    assert recs == [b"before"]
    assert_clean(r)
    assert r.torn_tail is not None and r.torn_tail[0] == HDR + 6
    assert r.end_offset == HDR + 6


def test_missing_middle_and_last_at_end_is_torn() -> None:
    log = Log()
    log.write(b"a")
    log.write(pattern(3 * BS))
    log.data = log.data[: 2 * BS + 3]  # cut inside the second MIDDLE's header
    recs, r = log.read()
    assert recs == [b"a"]
    assert r.torn_tail is not None and r.torn_tail[0] == HDR + 1
    assert_clean(r)


@pytest.mark.parametrize("block", [1, 2, 3])
def test_skip_into_multi_record(block: int) -> None:
    # first(R1) middle(R1) middle(R1) last(R1) full(R2): starting at any block
    # boundary inside R1, its MIDDLE and LAST fragments are not errors.
    log = Log()
    log.write(big_string(b"foo", 3 * BS))
    log.write(b"correct")
    recs, r = log.read(start_offset=block * BS)
    assert recs == [b"correct"]
    assert_clean(r)
    assert r.end_offset == len(log.data)


def test_skip_into_multi_record_then_orphan_is_corruption() -> None:
    # After the resync ends (R1's LAST), an orphan MIDDLE is corruption again.
    log = Log()
    log.write(big_string(b"foo", 2 * BS))
    at = log.write(b"xyz")
    log.write(b"after")
    log.set_byte(at + 6, MIDDLE)
    log.fix_checksum(at, 3)
    err = log.corruption(start_offset=BS)
    assert err.offset == at
    assert "missing start" in str(err)


def _error_joins_log() -> Log:
    # first(R1) last(R1) first(R2) last(R2) full(R3): the block holding
    # last(R1) and first(R2) is lost. first(R1)+last(R2) must not be joined.
    log = Log()
    log.write(big_string(b"foo", BS))
    log.write(big_string(b"bar", BS))
    log.write(b"correct")
    return log


def test_error_joins_records() -> None:
    log = _error_joins_log()
    for off in range(BS, 2 * BS):
        log.set_byte(off, ord("x"))
    err = log.corruption()
    assert err.offset in (0, BS)
    recs, r = log.read_skip()
    assert recs == [b"correct"]
    assert 2 * BS <= dropped(r) <= 2 * BS + 100


def test_zeroed_block_inside_fragmented_record_does_not_join() -> None:
    # The same, with the lost block zero-filled (what a filesystem shows for a
    # block that never reached the disk). A zero header is padding, but inside
    # a fragmented record it is lost data: LevelDB reports "error in middle of
    # record" (kBadRecord while in_fragmented_record) and drops the partial
    # record; it must never return first(R1)+last(R2).
    log = _error_joins_log()
    log.data[BS : 2 * BS] = bytes(BS)
    # Layout: first(R1) 0..BS, last(R1) BS..BS+14, first(R2) BS+14..2BS,
    # last(R2) = the last 21 bytes of R2 at 2BS, full(R3) at 2BS+28.
    spliced = big_string(b"foo", BS)[: BS - HDR] + big_string(b"bar", BS)[-21:]
    recs, r = log.read_skip()
    assert spliced not in recs
    assert recs == [b"correct"]
    assert r.skipped
    r2 = log.reader()
    with pytest.raises(CorruptionError):
        list(r2)


@pytest.mark.parametrize(
    "zeros,zeros_end",
    [
        pytest.param(z, ze)
        for z in [1, 100, BS - 9 - 1, BS, BS + 100, 2 * BS, 3 * BS - 5]
        for ze in (False, True)
    ],
)
def test_fragmented_record_then_only_zeros_to_eof_is_torn(zeros: int, zeros_end: bool) -> None:
    # A crash that grew the file but lost the data (the tail reads as zeros,
    # as on XFS) after a FIRST: nothing follows, so it is a torn tail, the
    # same whether the zeros are shorter or longer than a block. Only data
    # after the hole makes it corruption (the tests above).
    log = Log()
    log.write(b"ok")
    log.write(pattern(100_000))
    log.data = log.data[:BS] + bytes(zeros)
    recs, r = log.read(zeros_end=zeros_end)
    assert recs == [b"ok"]
    assert r.end_offset == HDR + 2
    assert r.torn_tail is not None and r.torn_tail[0] == HDR + 2
    assert_clean(r)


def test_zeroed_middle_of_one_record_does_not_shorten_it() -> None:
    log = Log()
    log.write(b"a")
    big = pattern(3 * BS, 5)
    log.write(big)
    log.write(b"z")
    log.data[BS : 2 * BS] = bytes(BS)  # the first MIDDLE
    recs, r = log.read_skip()
    assert all(len(p) in (1, len(big)) for p in recs), [len(p) for p in recs]
    assert big not in recs
    assert recs == [b"a", b"z"]


# -- start_offset: LevelDB's initial-offset tests, adapted ----------------------

INITIAL_SIZES = [10000, 10000, 2 * BS - 1000, 1, 13716, BS - HDR]
INITIAL_OFFSETS = [
    0,
    HDR + 10000,
    2 * (HDR + 10000),
    2 * (HDR + 10000) + (2 * BS - 1000) + 3 * HDR,
    2 * (HDR + 10000) + (2 * BS - 1000) + 3 * HDR + HDR + 1,
    3 * BS,
]


def _initial_offset_log() -> Log:
    log = Log()
    for i, n in enumerate(INITIAL_SIZES):
        assert log.write(bytes([ord("a") + i]) * n) == INITIAL_OFFSETS[i]
    return log


@pytest.mark.parametrize(
    "start,first_index",
    [
        (0, 0),  # ReadStart
        (HDR + 10000, 1),  # ReadSecondStart
        (2 * (HDR + 10000), 2),  # ReadThirdStart
        (INITIAL_OFFSETS[3], 3),  # ReadFourthStart
        (INITIAL_OFFSETS[4], 4),
        (INITIAL_OFFSETS[5], 5),
        (BS, 3),  # ReadFourthMiddleBlock: from a block boundary inside record 2
        (2 * BS, 3),  # ReadFourthLastBlock
        (3 * BS - 2, 5),  # ReadInitialOffsetIntoBlockPadding (record 4's end)
    ],
)
def test_initial_offset(start: int, first_index: int) -> None:
    log = _initial_offset_log()
    r = log.reader(start_offset=start)
    got = list(r.records())
    assert [off for off, _ in got] == INITIAL_OFFSETS[first_index:]
    assert [len(p) for _, p in got] == INITIAL_SIZES[first_index:]
    assert [p[:1] for _, p in got] == [bytes([ord("a") + i]) for i in range(first_index, 6)]
    assert_clean(r)


@pytest.mark.parametrize("past", [0, 5, BS])
def test_offset_past_end_returns_no_records(past: int) -> None:
    # ReadEnd, ReadPastEnd
    log = _initial_offset_log()
    r = log.reader(start_offset=len(log.data) + past)
    assert list(r) == []
    assert r.torn_tail is None
    assert_clean(r)


def test_start_offset_defaults_to_file_position() -> None:
    log = _initial_offset_log()
    f = io.BytesIO(bytes(log.data))
    f.seek(INITIAL_OFFSETS[2])
    r = RecordReader(f)
    assert [off for off, _ in r.records()] == INITIAL_OFFSETS[2:]


def test_every_record_start_and_block_boundary() -> None:
    log = Log()
    rnd = LevelDBRandom(17)
    payloads = [random_skewed_string(i, rnd) for i in range(300)]
    starts = [log.write(p) for p in payloads]
    data = bytes(log.data)
    for i in range(0, len(starts), 7):
        r = RecordReader(io.BytesIO(data), start_offset=starts[i])
        assert [off for off, _ in r.records()] == starts[i:]
    for b in range(0, len(data) // BS + 2):
        r = RecordReader(io.BytesIO(data), start_offset=b * BS)
        got = list(r.records())
        expected = [(s, p) for s, p in zip(starts, payloads) if s >= b * BS]
        assert got == expected, b
        assert_clean(r)


# -- end_offset (bound), end_offset (attribute), torn_tail, zeros_end ----------


def test_end_offset_bounds_reading() -> None:
    log = Log()
    payloads = [b"one", pattern(50_000), b"three", pattern(BS - 30), b"five"]
    starts = [log.write(p) for p in payloads]
    ends = [s + len(ref_frame([p], s)[0]) for s, p in zip(starts, payloads)]
    assert ends[-1] == len(log.data)
    data = bytes(log.data)
    for i, end in enumerate(ends):
        r = RecordReader(io.BytesIO(data), end_offset=end)
        assert list(r) == payloads[: i + 1]
        assert r.end_offset == end
        assert r.torn_tail is None
        # One byte short: that record is torn and the reader stops before it.
        r = RecordReader(io.BytesIO(data), end_offset=end - 1)
        assert list(r) == payloads[:i]
        assert r.end_offset == (ends[i - 1] if i else 0)
        assert r.torn_tail is not None and r.torn_tail[0] == starts[i]
    # A bound at a block boundary in the middle of a record.
    r = RecordReader(io.BytesIO(data), end_offset=BS)
    assert list(r) == payloads[:1]
    assert r.torn_tail is not None and r.torn_tail[0] == starts[1]


def test_end_offset_with_start_offset() -> None:
    log = Log()
    payloads = [pattern(n, n) for n in (10, 20000, 30000, 5, 70000, 8)]
    starts = [log.write(p) for p in payloads]
    r = RecordReader(io.BytesIO(bytes(log.data)), start_offset=starts[2], end_offset=starts[5])
    assert list(r) == payloads[2:5]
    assert r.end_offset == starts[5]


def test_end_offset_attribute_skips_trailer() -> None:
    log = Log()
    p = pattern(BS - HDR - 3)
    log.write(p)
    log.write(b"x")
    # Cut the second record: end_offset is the end of the first record, before
    # the trailer; a writer continuing there rewrites the trailer.
    data = bytes(log.data[: BS + 2])
    r = RecordReader(io.BytesIO(data))
    assert list(r) == [p]
    assert r.end_offset == BS - 3
    assert r.torn_tail is not None and r.torn_tail[0] == BS


def test_zeros_end() -> None:
    log = Log()
    payloads = [b"one", pattern(40_000), b"three"]
    for p in payloads:
        log.write(p)
    data_end = len(log.data)
    prealloc = bytes(log.data) + bytes(5 * BS + 123)  # a preallocated segment
    for zeros_end in (True, False):
        r = RecordReader(io.BytesIO(prealloc), zeros_end=zeros_end)
        assert list(r) == payloads
        assert r.end_offset == data_end
        assert r.torn_tail is None
        assert_clean(r)


def test_zeros_end_stops_at_zero_header_padding_does_not() -> None:
    # A zero header followed by data in a later block: with zeros_end it is the
    # end of the data; without, it is padding (LevelDB) and reading goes on.
    first = ref_fragment(FULL, b"one")
    later = ref_fragment(FULL, b"two")
    data = first + bytes(BS - len(first)) + later
    r = RecordReader(io.BytesIO(data), zeros_end=True)
    assert list(r) == [b"one"]
    assert r.end_offset == len(first)
    r = RecordReader(io.BytesIO(data), zeros_end=False)
    assert list(r) == [b"one", b"two"]
    assert r.end_offset == len(data)


def test_trailing_zeros_shorter_than_header_are_clean_end() -> None:
    data = ref_fragment(FULL, b"one") + bytes(5)
    r = RecordReader(io.BytesIO(data))
    assert list(r) == [b"one"]
    assert r.torn_tail is None
    assert r.end_offset == HDR + 3


def test_torn_tail_reasons() -> None:
    data = ref_fragment(FULL, b"one")
    cases = {
        "header": data + ref_header(FULL, b"two")[:4],
        "payload": data + ref_fragment(FULL, b"two")[:-1],
        "fragmented": data + ref_frame([pattern(BS)], len(data))[0][: BS - len(data)],
    }
    for name, blob in cases.items():
        r = RecordReader(io.BytesIO(blob))
        assert list(r) == [b"one"], name
        assert r.end_offset == len(data)
        assert r.torn_tail is not None, name
        offset, reason = r.torn_tail
        assert offset == len(data)
        assert isinstance(reason, str) and reason


# -- max_record_bytes --------------------------------------------------------


def test_full_record_over_limit_is_corruption() -> None:
    log = Log()
    log.write(bytes(100))
    at = log.write(bytes(101))
    log.write(b"ok")
    r = log.reader(max_record_bytes=100)
    with pytest.raises(CorruptionError) as ei:
        list(r)
    assert ei.value.offset == at
    recs, r = log.read_skip(max_record_bytes=100)
    assert recs == [bytes(100), b"ok"]
    assert [s for s, _, _ in r.skipped] == [at]


def test_fragmented_record_over_limit_is_corruption() -> None:
    log = Log()
    at = log.write(pattern(200_000))
    log.write(b"ok")
    with pytest.raises(CorruptionError) as ei:
        list(log.reader(max_record_bytes=100_000))
    assert ei.value.offset == at
    assert "limit" in str(ei.value)
    recs, r = log.read_skip(max_record_bytes=100_000)
    assert recs == [b"ok"]
    assert r.skipped and r.skipped[0][0] == at
    # Exactly at the limit is fine.
    assert list(log.reader(max_record_bytes=200_000)) == [pattern(200_000), b"ok"]


# -- errors name the file and the offset ---------------------------------------


def test_corruption_error_names_path_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "000042.log"
    with open(path, "wb") as f:
        w = RecordWriter(f)
        w.add_record(pattern(BS))
        at = w.add_record(b"victim")
        w.add_record(b"after")
    data = bytearray(path.read_bytes())
    data[at + HDR] ^= 0xFF
    path.write_bytes(bytes(data))
    with open(path, "rb") as f:
        r = RecordReader(f)
        got = []
        with pytest.raises(CorruptionError) as ei:
            for p in r:
                got.append(p)
    err = ei.value
    assert got == [pattern(BS)]
    assert err.path == str(path)
    assert err.offset == at
    assert str(path) in str(err)
    assert f"offset {at}" in str(err)
    assert isinstance(err, WalkvError)
    # An explicit path wins over the file's name.
    with open(path, "rb") as f:
        with pytest.raises(CorruptionError) as ei:
            list(RecordReader(f, path="segment-7"))
    assert ei.value.path == "segment-7"


def test_path_accepts_pathlike(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    path.write_bytes(ref_fragment(FULL, b"a")[:-1] + b"b")  # CRC mismatch
    with open(path, "rb") as f:
        with pytest.raises(CorruptionError) as ei:
            list(RecordReader(f, path=path))
    assert ei.value.path == os.fspath(path)
