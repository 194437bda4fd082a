"""The bulk readers (``RecordReader.batches``, ``SegmentScan.batches``) against
a reference: the fragment-at-a-time reader walkv used before them, kept here
as the oracle. On any bytes (valid files, torn tails, bad CRCs, records
spanning blocks, trailing zeros, mutations of all of these) both must give
the same records at the same offsets, and the same error (reason, offset,
kind, LSN), torn tail, end offset and skipped ranges."""

from __future__ import annotations

import io
import struct
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_record import BS, HDR, ref_mask
from tests.test_record_properties import mutate, mutation, payload_of, sizes, write_all
from wal.crc import crc32c
from wal.errors import CorruptionError, Damage
from wal.record import DEFAULT_MAX_RECORD_BYTES
from wal.record_reader import RecordReader
from wal.segment import Entry, SegmentScan, encode_header, pack_entry_header

CHECK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


# -- the reference: one fragment at a time ----------------------------------------


class Reference:
    """The strict/skipping record reader as it was before bulk reading:
    a physical pass yielding one fragment or event at a time, and the
    reassembly rules of :mod:`wal.record` applied to each."""

    def __init__(self, blob: bytes, *, start: int = 0, limit: int | None = None, zeros_end: bool = False,
                 skip_corrupt: bool = False, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.blob, self.start, self.limit = blob, start, limit
        self.zeros_end, self.skip_corrupt, self.max_bytes = zeros_end, skip_corrupt, max_bytes
        self.end_offset = start
        self.torn_tail: tuple[int, str] | None = None
        self.skipped: list[tuple[int, int, str]] = []

    def _fragments(self):  # (offset, kind, payload or problem)
        pos = self.start
        block_start = pos - pos % BS
        while True:
            stop = block_start + BS if self.limit is None else max(block_start, min(block_start + BS, self.limit))
            buf = self.blob[block_start:stop]
            full = len(buf) == BS
            i = pos - block_start
            while True:
                rem = len(buf) - i
                if rem < HDR:
                    if full:
                        break
                    if rem > 0 and buf[i:].count(0) != rem:
                        yield block_start + i, "torn", "truncated header at end of file"
                    else:
                        yield block_start + i, "eof", None
                    return
                crc, length, ftype = struct.unpack_from("<IHB", buf, i)
                if ftype == 0 and length == 0:
                    if self.zeros_end or not full:
                        yield block_start + i, "eof", None
                        return
                    yield block_start + i, "pad", None
                    break
                end = i + HDR + length
                if end > len(buf):
                    if not full:
                        yield block_start + i, "torn", "truncated record at end of file"
                        return
                    yield block_start + i, "bad", (block_start + len(buf),
                                                   f"bad record length {length} (past the end of the block)",
                                                   Damage.FRAMING)
                    break
                payload = buf[i + HDR:end]
                if crc != ref_mask(crc32c(bytes([ftype]) + payload)):
                    yield block_start + i, "bad", (block_start + len(buf), "checksum mismatch", Damage.CHECKSUM)
                    break
                if not 1 <= ftype <= 4:
                    yield block_start + i, "bad", (block_start + end, f"unknown record type {ftype}", Damage.FRAMING)
                else:
                    yield block_start + i, ftype, payload
                i = end
            block_start += BS
            pos = block_start
            if not full:
                yield block_start - BS + len(buf), "eof", None
                return

    def _corrupt(self, start: int, end: int, reason: str, kind: Damage = Damage.FRAMING) -> None:
        if not self.skip_corrupt:
            raise CorruptionError(reason, kind=kind, path="x", offset=start)
        self.skipped.append((start, end, reason))

    def records(self):
        resyncing = self.start % BS == 0 and self.start > 0
        parts: list[bytes] = []
        size, record_start, holed = 0, -1, -1
        for offset, kind, item in self._fragments():
            if holed >= 0 and kind not in ("pad", "eof", "torn"):
                self._corrupt(holed, offset, "zero-filled space in the middle of a fragmented record")
                holed = -1
            if kind == FULL:
                resyncing = False
                if record_start >= 0:
                    self._corrupt(record_start, offset, "partial record without end (FULL inside a fragmented record)")
                    record_start, parts = -1, []
                end = offset + HDR + len(item)
                if len(item) > self.max_bytes:
                    self._corrupt(offset, end, f"record over the limit of {self.max_bytes} bytes", Damage.TOO_LARGE)
                    continue
                self.end_offset = end
                yield offset, item
            elif kind == FIRST:
                resyncing = False
                if record_start >= 0:
                    self._corrupt(record_start, offset,
                                  "partial record without end (FIRST inside a fragmented record)")
                record_start, parts, size = offset, [item], len(item)
            elif kind in (MIDDLE, LAST):
                end = offset + HDR + len(item)
                if record_start < 0:
                    if resyncing:
                        resyncing = kind == MIDDLE
                    else:
                        name = "MIDDLE" if kind == MIDDLE else "LAST"
                        self._corrupt(offset, end, f"missing start of fragmented record ({name} without FIRST)")
                    continue
                size += len(item)
                if size > self.max_bytes:
                    self._corrupt(record_start, end, f"record over the limit of {self.max_bytes} bytes",
                                  Damage.TOO_LARGE)
                    record_start, parts = -1, []
                    continue
                parts.append(item)
                if kind == LAST:
                    start, record_start = record_start, -1
                    payload, parts = b"".join(parts), []
                    self.end_offset = end
                    yield start, payload
            elif kind == "pad":
                if record_start >= 0:
                    holed, record_start, parts = record_start, -1, []
            elif kind == "bad":
                bad_end, reason, damage = item
                if record_start >= 0:
                    self._corrupt(record_start, bad_end, reason, damage)
                    record_start, parts = -1, []
                else:
                    self._corrupt(offset, bad_end, reason, damage)
            else:
                if holed >= 0:
                    self.torn_tail = (holed, "fragmented record followed only by zeros at end of file")
                elif record_start >= 0:
                    self.torn_tail = (record_start, "fragmented record without its LAST fragment at end of file")
                elif kind == "torn":
                    self.torn_tail = (offset, item)
                return


def outcome(reader, records) -> tuple:
    """Everything a reader reports: records, error, end offset, torn tail, skipped."""
    got = []
    error = None
    try:
        for r in records:
            got.append(r)
    except CorruptionError as e:
        error = (e.reason, e.offset, e.kind)
    return got, error, reader.end_offset, reader.torn_tail, reader.skipped


def batched(reader: RecordReader):
    for batch in reader.batches():
        assert batch.offsets and len(batch.offsets) == len(batch.payloads)
        for i, (offset, payload) in enumerate(zip(batch.offsets, batch.payloads)):
            if i < len(batch.offsets) - 1:  # all but the last are one FULL fragment
                assert batch.record_end(i) == offset + HDR + len(payload)
            yield offset, payload
        assert reader.end_offset == batch.end


def check_same(blob: bytes, **kw) -> None:
    for skip in (False, True):
        ref = Reference(blob, skip_corrupt=skip, **kw)
        want = outcome(ref, ref.records())
        opts = dict(path="x", start_offset=kw.get("start", 0), end_offset=kw.get("limit"),
                    zeros_end=kw.get("zeros_end", False), skip_corrupt=skip,
                    max_record_bytes=kw.get("max_bytes", DEFAULT_MAX_RECORD_BYTES))
        r = RecordReader(io.BytesIO(blob), **opts)
        assert outcome(r, r.records()) == want
        b = RecordReader(io.BytesIO(blob), **opts)
        got = outcome(b, batched(b))
        assert got[:2] == want[:2] and got[3:] == want[3:]
        if got[1] is None:
            assert got[2] == want[2]


# Mostly small records, so that blocks hold runs of FULL fragments between a
# LAST and a FIRST (the shape of a real log), and some that span blocks.
small_first = st.lists(st.one_of(st.integers(0, 200), st.integers(0, 200), sizes), min_size=0, max_size=400)


@CHECK
@given(small_first, st.integers(0, 2 * BS), st.lists(mutation, max_size=3), st.booleans(), st.data())
def test_records_match_the_reference(ns: list[int], zeros: int, muts, zeros_end: bool, data) -> None:
    blob, starts = write_all([payload_of(n, i) for i, n in enumerate(ns)])
    blob = mutate(blob + bytes(zeros), muts) if muts else blob + bytes(zeros)
    start = data.draw(st.sampled_from([0, *[s for s in starts[:20] if s <= len(blob)], *range(BS, len(blob) + 1, BS)]))
    limit = data.draw(st.one_of(st.none(), st.integers(start, len(blob) + 10)))
    max_bytes = data.draw(st.sampled_from([DEFAULT_MAX_RECORD_BYTES, BS, 300, 50]))
    check_same(blob, start=start, limit=limit, zeros_end=zeros_end, max_bytes=max_bytes)


@CHECK
@given(st.binary(max_size=3 * BS), st.booleans())
def test_random_bytes_match_the_reference(blob: bytes, zeros_end: bool) -> None:
    check_same(blob, zeros_end=zeros_end)


def test_damage_after_good_records_in_one_block_comes_after_them() -> None:
    blob, starts = write_all([payload_of(30, i) for i in range(20)])
    bad = bytearray(blob)
    bad[starts[12] + HDR + 3] ^= 1  # record 12's CRC fails
    r = RecordReader(io.BytesIO(bytes(bad)), path="x", start_offset=0)
    batches = r.batches()
    first = next(batches)
    assert first.offsets == starts[:12] and r.end_offset == starts[12]
    try:
        next(batches)
    except CorruptionError as e:
        assert (e.offset, e.kind) == (starts[12], Damage.CHECKSUM)
    else:
        raise AssertionError("the bad CRC was not reported")


# -- segments: SegmentScan.batches and entries against the reference ------------------


STORE = uuid.UUID(int=7).hex


def segment(first_lsn: int, bodies: list[bytes], lsns: list[int] | None = None) -> bytes:
    """A segment's bytes: its header, then an entry per body (with LSN
    ``lsns[i]``; a negative one: the body alone, too short for a header)."""
    lsns = list(range(first_lsn, first_lsn + len(bodies))) if lsns is None else lsns
    records = [encode_header(STORE, first_lsn)]
    records += [b[:5] if lsn < 0 else pack_entry_header(lsn, 1000 + lsn) + b for lsn, b in zip(lsns, bodies)]
    blob, _ = write_all(records)
    return blob


def reference_scan(blob: bytes, from_lsn: int, to_lsn: int | None) -> tuple:
    """What the per-entry scan reported: each entry with the data end after
    it, the error, and the final data end and next LSN."""
    first = next(Reference(blob).records())[1]  # the header record
    expected = struct.unpack_from("<8sHH16sQ", first)[4]
    start = data_end = HDR + len(first)
    ref = Reference(blob, start=start, zeros_end=True)
    got: list[tuple[int, Entry, int]] = []
    error = None
    try:
        for offset, payload in ref.records():
            if len(payload) < 16:
                raise CorruptionError("log entry shorter than its header", path="x", offset=offset)
            lsn, ts = struct.unpack_from("<QQ", payload)
            if lsn != expected:
                raise CorruptionError(f"LSN {lsn} does not follow LSN {expected - 1}", kind=Damage.SEQUENCE,
                                      path="x", offset=offset, lsn=lsn)
            if to_lsn is not None and lsn > to_lsn:
                break
            expected = lsn + 1
            data_end = ref.end_offset
            if lsn >= from_lsn:
                got.append((offset, Entry(lsn, ts, payload[16:]), data_end))
            if lsn == to_lsn:
                break
    except CorruptionError as e:
        error = (e.reason, e.offset, e.kind, e.lsn)
    return got, error, data_end, expected


def scan_outcome(blob: bytes, from_lsn: int, to_lsn: int | None, bulk: bool) -> tuple:
    """The same, from SegmentScan.batches (bulk: the data end after each
    batch's last entry only) or SegmentScan.entries."""
    scan = SegmentScan(io.BytesIO(blob), "x")
    got: list[tuple[int, Entry, int | None]] = []
    error = None
    try:
        if bulk:
            for batch in scan.batches(from_lsn, to_lsn):
                assert batch.entries and scan.next_lsn == batch.entries[-1].lsn + 1
                got += [(offset, entry, None) for offset, entry in zip(batch.offsets, batch.entries)]
                got[-1] = (*got[-1][:2], scan.data_end)
        else:
            for offset, entry in scan.entries(from_lsn, to_lsn):
                assert scan.next_lsn == entry.lsn + 1
                got.append((offset, entry, scan.data_end))
    except CorruptionError as e:
        error = (e.reason, e.offset, e.kind, e.lsn)
    return got, error, scan.data_end, scan.next_lsn


bodies = st.lists(st.one_of(st.integers(0, 150), st.integers(0, 150), sizes), min_size=0, max_size=300)


@CHECK
@given(bodies, st.lists(mutation, max_size=2), st.integers(0, 400), st.data())
def test_segment_scan_matches_the_reference(ns: list[int], muts, zeros: int, data) -> None:
    first_lsn = data.draw(st.integers(1, 5))
    lsns = list(range(first_lsn, first_lsn + len(ns)))
    if lsns and data.draw(st.booleans()):  # a break in sequence, or an entry too short for its header
        at = data.draw(st.integers(0, len(lsns) - 1))
        lsns[at] = data.draw(st.sampled_from([lsns[at] + 1, lsns[at] - 1, -1]))
    raw = [payload_of(n, i) for i, n in enumerate(ns)]
    blob = segment(first_lsn, [b[:5] if lsn < 0 else b for lsn, b in zip(lsns, raw)], lsns) + bytes(zeros)
    blob = mutate(blob, muts) if muts else blob
    last = first_lsn + len(ns)
    from_lsn = data.draw(st.integers(1, last + 1))
    to_lsn = data.draw(st.one_of(st.none(), st.integers(0, last + 1)))
    try:
        want = reference_scan(blob, from_lsn, to_lsn)
    except (CorruptionError, StopIteration, struct.error):
        return  # the header itself is damaged: read_header's errors, not the scan's
    assert scan_outcome(blob, from_lsn, to_lsn, bulk=False) == want
    got = scan_outcome(blob, from_lsn, to_lsn, bulk=True)
    assert got[1:] == want[1:]
    assert [(o, e) for o, e, _ in got[0]] == [(o, e) for o, e, _ in want[0]]
    assert all(end is None or end == w[2] for (_, _, end), w in zip(got[0], want[0]))


def test_scan_stops_at_to_lsn_before_damage_in_the_same_block() -> None:
    """A reader bounded at an LSN never reports what lies after it (the
    writer may be mid-way through it), even in the block it reads."""
    blob = bytearray(segment(1, [payload_of(40, i) for i in range(30)]))
    blob[-10] ^= 0xFF  # entry 30's CRC fails, in the same block as entry 10
    for bulk in (True, False):
        got, error, data_end, next_lsn = scan_outcome(bytes(blob), 1, 10, bulk)
        assert [e.lsn for _, e, _ in got] == list(range(1, 11)) and error is None and next_lsn == 11
        assert data_end == got[-1][0] + HDR + 16 + 40
    got, error, _, next_lsn = scan_outcome(bytes(blob), 5, None, True)
    assert [e.lsn for _, e, _ in got] == list(range(5, 30)) and error is not None and error[2] is Damage.CHECKSUM
    assert next_lsn == 30
