"""Property tests of wal/record.py: round trips across block boundaries and
writer sessions, and a fuzz of the reader (any bytes at all give records, a
clean end, or CorruptionError; with skip_corrupt=True never an exception),
and bounded memory for records over max_record_bytes.

The expected file bytes come from ``tests.test_record.ref_frame``, the format
restated by hand, not from RecordWriter.
"""

from __future__ import annotations

import io
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_record import BS, HDR, ref_frame
from wal.errors import CorruptionError
from wal.record import RecordWriter
from wal.record_reader import RecordReader

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Sizes that put record ends and fragment ends at every interesting place:
# around a block's payload capacity (32761), around 2 blocks, and small ones
# that walk the write position through the last few bytes of a block.
_EDGE = [0, 1, 2, 5, 6, 7, 8, 13, 14, 15]
_NEAR = [BS - HDR + d for d in range(-16, 17)] + [2 * (BS - HDR) + d for d in (-1, 0, 1, 7)]
sizes = st.one_of(
    st.sampled_from(_EDGE),
    st.sampled_from(_NEAR),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=3 * BS),
)


def payload_of(size: int, seed: int) -> bytes:
    return random.Random(size * 1_000_003 + seed).randbytes(size)


payload_lists = st.lists(sizes, min_size=0, max_size=12).flatmap(
    lambda ns: st.tuples(st.just(ns), st.integers(min_value=0, max_value=2**32))
).map(lambda t: [payload_of(n, t[1] + i) for i, n in enumerate(t[0])])


def write_all(payloads: list[bytes]) -> tuple[bytes, list[int]]:
    f = io.BytesIO()
    w = RecordWriter(f)
    starts = [w.add_record(p) for p in payloads]
    assert w.offset == len(f.getvalue())
    return f.getvalue(), starts


@FAST
@given(payload_lists)
def test_round_trip_sizes(payloads: list[bytes]) -> None:
    data, starts = write_all(payloads)
    expected, ref_starts = ref_frame(payloads)
    assert data == expected
    assert starts == ref_starts
    r = RecordReader(io.BytesIO(data), path="mem")
    assert list(r.records()) == list(zip(starts, payloads))
    assert r.end_offset == len(data)
    assert r.torn_tail is None
    assert r.skipped == []


@FAST
@given(st.lists(st.binary(max_size=600), max_size=40))
def test_round_trip_binary(payloads: list[bytes]) -> None:
    data, _ = write_all(payloads)
    assert data == ref_frame(payloads)[0]
    assert list(RecordReader(io.BytesIO(data))) == payloads


@FAST
@given(st.integers(min_value=0, max_value=BS - 1), st.lists(sizes, min_size=1, max_size=4))
def test_round_trip_from_any_block_position(offset: int, ns: list[int]) -> None:
    # A writer continuing at any position within a block (the previous
    # session's records are stood in for by a zero prefix we do not read).
    payloads = [payload_of(n, i) for i, n in enumerate(ns)]
    f = io.BytesIO()
    f.write(bytes(offset))
    w = RecordWriter(f)
    starts = [w.add_record(p) for p in payloads]
    expected, ref_starts = ref_frame(payloads, offset)
    assert f.getvalue()[offset:] == expected
    assert starts == ref_starts
    r = RecordReader(io.BytesIO(f.getvalue()), start_offset=offset)
    assert list(r.records()) == list(zip(starts, payloads))


@FAST
@given(payload_lists, st.lists(st.integers(min_value=0, max_value=12), max_size=4), st.booleans())
def test_several_writer_sessions(tmp_path_factory, payloads: list[bytes], cuts: list[int], explicit: bool) -> None:
    path = Path(tmp_path_factory.mktemp("sessions")) / "log"
    path.write_bytes(b"")
    bounds = sorted({min(c, len(payloads)) for c in cuts} | {0, len(payloads)})
    for a, b in zip(bounds, bounds[1:]):
        if explicit:
            with open(path, "r+b") as f:
                size = f.seek(0, io.SEEK_END)
                w = RecordWriter(f, size)
                for p in payloads[a:b]:
                    w.add_record(p)
        else:
            with open(path, "ab") as f:
                w = RecordWriter(f)
                for p in payloads[a:b]:
                    w.add_record(p)
    assert path.read_bytes() == ref_frame(payloads)[0]
    with open(path, "rb") as f:
        assert list(RecordReader(f)) == payloads


@FAST
@given(payload_lists, st.data())
def test_reader_resumes_at_end_offset(payloads: list[bytes], data) -> None:
    # Reading up to a bound and then on from reader.end_offset gives every
    # record once: how a tailing reader follows a file being written.
    blob, starts = write_all(payloads)
    bound = data.draw(st.integers(min_value=0, max_value=len(blob)))
    r1 = RecordReader(io.BytesIO(blob), end_offset=bound)
    first = list(r1.records())
    r2 = RecordReader(io.BytesIO(blob), start_offset=r1.end_offset)
    second = list(r2.records())
    assert first + second == list(zip(starts, payloads))
    assert r1.skipped == [] and r2.skipped == []


@FAST
@given(payload_lists, st.booleans())
def test_kept_payloads_are_bytes_of_their_own(tmp_path_factory, payloads: list[bytes], by_batch: bool) -> None:
    # A record in fragments is joined from views into the blocks read; what
    # the reader yields must not be such a view (or one into any buffer the
    # reader or the file reuses): every payload, kept past the end of the
    # read, the file's close and a second read, is bytes equal to what was
    # written.
    blob, starts = write_all(payloads)
    path = Path(tmp_path_factory.mktemp("kept")) / "log"
    path.write_bytes(blob)
    kept: list[tuple[int, bytes]] = []
    with open(path, "rb") as f:
        r = RecordReader(f)
        if by_batch:
            for batch in r.batches():
                kept.extend(zip(batch.offsets, batch.payloads))
        else:
            kept.extend(r.records())
    other = [payload_of(len(p), 99) for p in payloads]  # the same sizes, other bytes, read after
    assert list(RecordReader(io.BytesIO(write_all(other)[0]))) == other
    assert [type(p) for _, p in kept] == [bytes] * len(payloads)
    assert kept == list(zip(starts, payloads))


# -- fuzz ------------------------------------------------------------------------


def read_strict(blob: bytes, **kw) -> tuple[list[bytes], CorruptionError | None, RecordReader]:
    r = RecordReader(io.BytesIO(blob), path="fuzz.log", **kw)
    out: list[bytes] = []
    try:
        for p in r:
            out.append(p)
    except CorruptionError as e:
        assert e.path == "fuzz.log"
        assert e.offset is not None and 0 <= e.offset <= len(blob)
        return out, e, r
    return out, None, r


def read_skipping(blob: bytes, **kw) -> tuple[list[bytes], RecordReader]:
    r = RecordReader(io.BytesIO(blob), path="fuzz.log", skip_corrupt=True, **kw)
    out = list(r)
    for start, end, reason in r.skipped:
        assert 0 <= start <= end <= len(blob)
        assert isinstance(reason, str) and reason
    return out, r


def is_subsequence(got: list[bytes], of: list[bytes]) -> bool:
    it = iter(of)
    return all(any(g == o for o in it) for g in got)


def check_any_bytes(blob: bytes, zeros_end: bool) -> None:
    recs, err, r = read_strict(blob, zeros_end=zeros_end)
    assert 0 <= r.end_offset <= len(blob)
    recs2, r2 = read_skipping(blob, zeros_end=zeros_end)
    # Skipping never loses what strict reading returned before its error.
    assert recs2[: len(recs)] == recs
    if err is None:
        assert recs2 == recs


@FUZZ
@given(st.binary(max_size=3000), st.booleans())
def test_fuzz_random_bytes(blob: bytes, zeros_end: bool) -> None:
    check_any_bytes(blob, zeros_end)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=4 * BS + 50), st.booleans())
def test_fuzz_random_large_blobs(seed: int, size: int, zeros_end: bool) -> None:
    rnd = random.Random(seed)
    blob = bytearray(rnd.randbytes(size))
    # Plant plausible headers (small lengths, types 0..5) so the reader gets
    # past the first header now and then.
    for _ in range(rnd.randrange(0, 40)):
        at = rnd.randrange(0, size)
        blob[at : at + 7] = rnd.randbytes(4) + rnd.randrange(0, 400).to_bytes(2, "little") + bytes([rnd.randrange(0, 6)])
    check_any_bytes(bytes(blob[:size]), zeros_end)


_BASE_PAYLOADS = [payload_of(n, i) for i, n in enumerate([3, 100, 0, BS - HDR - 120, 5, 2 * BS, 40, BS - 14, 7, 9000])]
_BASE, _BASE_STARTS = write_all(_BASE_PAYLOADS)

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(_BASE) - 1), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, len(_BASE) - 1), st.just(0)),
    st.tuples(st.just("zero"), st.integers(0, len(_BASE) - 1), st.integers(1, 2 * BS)),
    st.tuples(st.just("garbage"), st.integers(0, len(_BASE) - 1), st.integers(1, 64)),
    st.tuples(st.just("delete"), st.integers(0, len(_BASE) - 1), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.integers(0, len(_BASE) - 1), st.integers(1, 64)),
)


def mutate(blob: bytes, muts: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(blob)
    for kind, at, arg in muts:
        if not b:
            break
        at %= len(b)
        if kind == "flip":
            b[at] ^= arg
        elif kind == "truncate":
            del b[at:]
        elif kind == "zero":
            b[at : at + arg] = bytes(len(b[at : at + arg]))
        elif kind == "garbage":
            b[at : at + arg] = random.Random(at * 31 + arg).randbytes(len(b[at : at + arg]))
        elif kind == "delete":
            del b[at : at + arg]
        elif kind == "insert":
            b[at:at] = random.Random(at + arg).randbytes(arg)
    return bytes(b)


@FUZZ
@given(st.lists(mutation, min_size=1, max_size=4), st.booleans())
def test_fuzz_mutated_valid_file(muts: list[tuple[str, int, int]], zeros_end: bool) -> None:
    blob = mutate(_BASE, muts)
    check_any_bytes(blob, zeros_end)
    # CRCs protect every fragment: whatever survives is original records, in
    # order; damage never fabricates or splices a record.
    recs, _, _ = read_strict(blob, zeros_end=zeros_end)
    assert is_subsequence(recs, _BASE_PAYLOADS)
    recs2, _ = read_skipping(blob, zeros_end=zeros_end)
    assert is_subsequence(recs2, _BASE_PAYLOADS)


def _fragment_bounds(blob: bytes) -> set[int]:
    # Walk the headers: every fragment start and end (trailers included).
    import struct

    bounds, pos = {0}, 0
    while pos < len(blob):
        left = BS - pos % BS
        if left < HDR:
            pos += left
        else:
            (length,) = struct.unpack_from("<H", blob, pos + 4)
            pos += HDR + length
        bounds.add(pos)
    return bounds


_FRAGMENT_BOUNDS = _fragment_bounds(_BASE)


@FUZZ
@given(st.one_of(st.integers(min_value=0, max_value=len(_BASE)), st.sampled_from(sorted(_fragment_bounds(_BASE)))))
def test_truncation_is_always_a_clean_prefix(cut: int) -> None:
    # A crash only tears the end: every truncation reads, in strict mode, as
    # the records wholly before the cut, without error, ending where they end.
    blob = _BASE[:cut]
    r = RecordReader(io.BytesIO(blob), path="t.log")
    got = list(r.records())
    ends = [s + len(ref_frame([p], s)[0]) for s, p in zip(_BASE_STARTS, _BASE_PAYLOADS)]
    whole = [i for i, e in enumerate(ends) if e <= cut]
    assert got == [(_BASE_STARTS[i], _BASE_PAYLOADS[i]) for i in whole]
    assert r.end_offset == (ends[whole[-1]] if whole else 0)
    assert r.skipped == []
    # The same when the lost tail shows as zeros (a preallocated file), for a
    # cut between fragments. (A cut inside a fragment shows as a CRC mismatch
    # there; telling that from damage is wal/recovery.py's job, not the reader's.)
    if cut in _FRAGMENT_BOUNDS:
        padded = blob + bytes(len(_BASE) - cut + BS)
        r = RecordReader(io.BytesIO(padded), path="t.log", zeros_end=True)
        assert [p for p in r] == [_BASE_PAYLOADS[i] for i in whole]
        assert r.end_offset == (ends[whole[-1]] if whole else 0)


@FUZZ
@given(st.integers(min_value=0, max_value=len(_BASE) // BS + 1))
def test_fuzz_block_starts(block: int) -> None:
    recs, err, _ = read_strict(_BASE, start_offset=block * BS)
    assert err is None
    assert recs == [p for s, p in zip(_BASE_STARTS, _BASE_PAYLOADS) if s >= block * BS]


# -- memory bound ----------------------------------------------------------------


def test_huge_record_is_corruption_not_allocation() -> None:
    # A record of 8 MiB on disk, read with a 64 KiB limit: the reader must
    # stop at the limit with CorruptionError instead of building the record.
    f = io.BytesIO()
    w = RecordWriter(f)
    w.add_record(b"before")
    huge_at = w.add_record(bytes(8 << 20))
    w.add_record(b"after")
    blob = f.getvalue()
    limit = 64 << 10
    for skip in (False, True):
        tracemalloc.start()
        try:
            r = RecordReader(io.BytesIO(blob), max_record_bytes=limit, skip_corrupt=skip)
            got = []
            try:
                for p in r:
                    got.append(p)
            except CorruptionError as e:
                assert not skip
                assert e.offset == huge_at
                assert "limit" in str(e)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak  # a few blocks, never the 8 MiB record
        assert got == ([b"before", b"after"] if skip else [b"before"])


def test_forged_headers_claiming_a_huge_record() -> None:
    # Hand-made fragments: a FIRST then MIDDLE after MIDDLE, each with a valid
    # CRC, never a LAST; max_record_bytes is small. The reader must give up at
    # the limit (corruption), not keep buffering to the end of the file.
    from tests.test_record import FIRST, MIDDLE, ref_fragment

    piece = bytes(BS - HDR)
    blob = ref_fragment(FIRST, piece) + ref_fragment(MIDDLE, piece) * 40
    r = RecordReader(io.BytesIO(blob), max_record_bytes=100_000)
    with pytest.raises(CorruptionError) as ei:
        list(r)
    assert ei.value.offset == 0
    # Without a limit this would be a torn tail (no LAST before the end).
    r = RecordReader(io.BytesIO(blob))
    assert list(r) == []
    assert r.torn_tail is not None and r.torn_tail[0] == 0


@pytest.mark.parametrize("length", [BS - HDR + 1, 0xFFFF])
def test_header_length_past_block_is_bounded(length: int) -> None:
    # A length field can never make the reader read past the block.
    import struct

    header = struct.pack("<IHB", 0x12345678, length, 1)
    blob = header + bytes(BS - HDR) + b"tail"
    recs, err, _ = read_strict(blob)
    assert recs == [] and err is not None and err.offset == 0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(b for b in _FRAGMENT_BOUNDS if b < len(_BASE))), st.sampled_from([HDR, 100, BS]))
def test_zeroed_fragment_never_splices(at: int, length: int) -> None:
    # Zero-fill from a fragment header on (a block that never reached the
    # disk, a hole punched by a filesystem): with zeros read as padding
    # (LevelDB's rule) the fragments on either side of the hole must not be
    # joined into one record. See test_record.py
    # test_zeroed_block_inside_fragmented_record_does_not_join.
    blob = mutate(_BASE, [("zero", at, length)])
    for zeros_end in (False, True):
        recs2, _ = read_skipping(blob, zeros_end=zeros_end)
        assert is_subsequence(recs2, _BASE_PAYLOADS)
        recs, _, _ = read_strict(blob, zeros_end=zeros_end)
        assert is_subsequence(recs, _BASE_PAYLOADS)
