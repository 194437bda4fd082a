"""Opening a log after crashes and damage (wal/recovery.py; DESIGN.md section 4).

The rules under test:

* only the active segment's tail is scanned at open; an invalid record there is
  a torn tail (cut, zeroed, logged) when nothing valid follows it or when the
  bytes up to the next valid record include an all-zero 512-byte sector;
* any other invalid record in the active segment, a missing segment, a broken
  LSN sequence, a segment of another store or with a header that disagrees
  with its name refuses to open with a CorruptionError naming the file, the
  offset and ``walkv repair``;
* sealed segments are trusted at open when their index is valid (damage in
  them shows when that range is read) and scanned strictly when the index
  must be rebuilt;
* ``recovery="prefix"`` and ``wal.repair`` keep the longest valid prefix and
  move what they cut to ``.broken`` files; ``wal.verify`` reports damage.

After each case the log is reopened and appended to. "Crash images" are the
files as a killed process leaves them (everything it wrote is in the page
cache, nothing of close() happened), made by copying the bytes of an open log.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import wal
from wal.errors import CorruptionError, LockedError, LogGapError
from wal.index import read_index
from wal.record import BLOCK_SIZE, frame_into
from wal.record_reader import RecordReader
from wal.segment import index_path, list_segments

SECTOR = 512


def pl(i: int, size: int = 40) -> bytes:
    head = b"%08d:" % i
    return (head * (size // len(head) + 1))[:size]


def read_all(log: wal.Log, **kw) -> list[tuple[int, bytes]]:
    return list(log.read(**kw))


def records(path: str | Path) -> list[tuple[int, int, int]]:
    """``(offset, end, lsn)`` of every entry record of a segment file."""
    out = []
    with open(path, "rb") as fh:
        reader = RecordReader(fh, zeros_end=True)
        for off, payload in reader.records():
            if off == 0:
                continue
            out.append((off, reader.end_offset, int.from_bytes(payload[:8], "little")))
    return out


def flip(path: str | Path, offset: int, bit: int = 0x04) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ bit]))


def crash_image(src: Path, dst: Path) -> Path:
    """The files of an open log as a SIGKILL would leave them (LOCK aside)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
    return dst


def drop_active_index(d: Path) -> None:
    """What a crash leaves: the active segment has no sidecar (close writes it)."""
    p = index_path(list_segments(str(d))[-1].path)
    if os.path.exists(p):
        os.unlink(p)


def make_log(d: Path, n: int, *, segment_bytes: int = 16384, size=lambda i: 150 + (i * 41) % 150,
             close: bool = True) -> dict[int, bytes]:
    model = {}
    log = wal.open(d, segment_bytes=segment_bytes, sync="none")
    for i in range(1, n + 1):
        model[log.append(pl(i, size(i)))] = pl(i, size(i))
    log.close()
    return model


def nonzero_end(data: bytes, start: int) -> int:
    """Offset just past the last non-zero byte at or after ``start`` (``start`` if none)."""
    stripped = data[start:].rstrip(b"\x00")
    return start + len(stripped)


def assert_reopens_and_appends(d: Path, expect: list[tuple[int, bytes]], **kw) -> None:
    with wal.open(d, **kw) as log:
        assert read_all(log, from_lsn=log.first_lsn) == expect
        last = log.last_lsn
        assert last == (expect[-1][0] if expect else log.first_lsn - 1)
        assert log.append(b"after-recovery") == last + 1
    with wal.open(d) as log:
        assert read_all(log, from_lsn=log.first_lsn) == expect + [(last + 1, b"after-recovery")]
    assert wal.verify(str(d)) == []


# -- torn tails at every byte offset -------------------------------------------------


@pytest.fixture(scope="module")
def torn_image(tmp_path_factory: pytest.TempPathFactory):
    """A crash image whose active segment ends in two records, the first of
    them split across a block boundary (FIRST + LAST fragments)."""
    base = tmp_path_factory.mktemp("torn")
    d = base / "log"
    model: dict[int, bytes] = {}
    log = wal.open(d, segment_bytes=40000)
    i = 0

    def add(size: int) -> None:
        nonlocal i
        i += 1
        model[log.append(pl(i, size))] = pl(i, size)

    while len(list_segments(str(d))) < 2:
        add(977)  # 1000-byte records
    active = list_segments(str(d))[-1].path

    def data_end() -> int:
        return records(active)[-1][1] if records(active) else 0

    while data_end() < BLOCK_SIZE - 1200:
        add(977)
    add(BLOCK_SIZE - 40 - data_end() - 23)  # the next record starts 40 bytes before the block end
    add(100)  # record n-1: FIRST (7 + 33) fills the block, LAST (7 + 83) in the next
    add(37)   # record n: 60 bytes
    recs = records(active)
    assert recs[-2][0] == BLOCK_SIZE - 40 and recs[-2][1] == BLOCK_SIZE + 90 and recs[-1][1] == BLOCK_SIZE + 150
    image = crash_image(d, base / "image")
    log.close()
    drop_active_index(image)
    return image, os.path.basename(active), model, recs[-2], recs[-1]


@pytest.mark.parametrize("how", ["zeroed", "truncated"])
def test_torn_tail_at_every_offset_of_the_last_two_records(torn_image, tmp_path: Path, caplog, how: str) -> None:
    image, active_name, model, rec1, rec2 = torn_image
    n = max(model)
    pristine = (image / active_name).read_bytes()
    s1, e1, _ = rec1
    e2 = rec2[1]
    assert rec2[0] == e1
    d = crash_image(image, tmp_path / "log")
    active = d / active_name
    caplog.set_level(logging.WARNING, logger="walkv.wal")
    for o in range(s1, e2 + 1):
        data = pristine[:o] + bytes(len(pristine) - o) if how == "zeroed" else pristine[:o]
        active.write_bytes(data)
        for extra in ("DURABLE", active_name[:-4] + ".idx"):
            if (d / extra).exists():
                os.unlink(d / extra)
        last = n if o >= e2 else n - 1 if o >= e1 else n - 2
        keep_end = {n: e2, n - 1: e1, n - 2: s1}[last]
        dropped = nonzero_end(data, keep_end) - keep_end
        caplog.clear()
        with wal.open(d, segment_bytes=40000) as log:
            assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1, last, last), o
            assert log.stats()["dropped_bytes_at_open"] == dropped, o
            if dropped:
                assert any(str(dropped) in r.getMessage() and active_name in r.getMessage()
                           for r in caplog.records if r.levelno >= logging.WARNING), (o, caplog.text)
            after = active.read_bytes()[keep_end:]
            assert after.count(0) == len(after), f"offset {o}: the torn bytes must be zeroed"
            assert read_all(log, from_lsn=last - 3) == [(k, model[k]) for k in range(last - 3, last + 1)], o
            assert log.append(b"next %d" % o) == last + 1
        if o % 8 and o not in (s1, e1, e2, BLOCK_SIZE):
            continue  # the zeroing was checked above; reopen at a sample of offsets
        with wal.open(d, segment_bytes=40000) as log:
            got = read_all(log, from_lsn=last - 1)
            assert got == [(last - 1, model[last - 1]), (last, model[last]), (last + 1, b"next %d" % o)], o
    with wal.open(d) as log:
        assert read_all(log)[: n - 2] == [(k, model[k]) for k in range(1, n - 1)]


# -- the active segment: torn write (zero sector) vs corruption ---------------------------


@pytest.fixture()
def four_blocks(tmp_path: Path):
    """A crash image of a one-segment log of ~4 blocks of 280-byte records."""
    d = tmp_path / "log"
    model = make_log(d, 430, segment_bytes=1 << 20, size=lambda i: 257)
    drop_active_index(d)
    seg = list_segments(str(d))[-1].path
    recs = records(seg)
    assert recs[-1][1] > 3 * BLOCK_SIZE
    return d, seg, model, recs


def test_torn_write_with_a_zero_sector_is_cut(four_blocks, caplog) -> None:
    """Garbage where a record was, then an all-zero sector, then valid records
    in later blocks: a write that reached the disk only in part (etcd's rule)."""
    d, seg, model, recs = four_blocks
    off, _, lsn = next(r for r in recs if r[0] > BLOCK_SIZE + 1000)
    data = bytearray(Path(seg).read_bytes())
    end_before = nonzero_end(bytes(data), 0)
    garbage = bytes(b or 0x5A for b in random.Random(1).randbytes(100))
    data[off : off + 100] = garbage
    zero_from = off + 100
    zero_to = (zero_from + SECTOR - 1) // SECTOR * SECTOR + SECTOR
    data[zero_from:zero_to] = bytes(zero_to - zero_from)
    Path(seg).write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="walkv.wal")
    with wal.open(d) as log:
        assert log.last_lsn == lsn - 1
        assert log.stats()["dropped_bytes_at_open"] == end_before - off
        assert any("torn" in r.getMessage() and str(end_before - off) in r.getMessage() for r in caplog.records)
    assert Path(seg).read_bytes()[off:].count(0) == len(Path(seg).read_bytes()) - off
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)])


def test_zero_hole_in_the_tail_is_cut(four_blocks) -> None:
    """A record whose header reads as zeros (a sector that never reached the
    disk), valid records after it: the data after the hole is dropped."""
    d, seg, model, recs = four_blocks
    off, _, lsn = next(r for r in recs if r[0] > 2 * BLOCK_SIZE + 500)
    data = bytearray(Path(seg).read_bytes())
    start = off // SECTOR * SECTOR
    data[start : start + SECTOR] = bytes(SECTOR)
    Path(seg).write_bytes(bytes(data))
    with wal.open(d) as log:
        assert log.last_lsn < lsn and log.last_lsn >= lsn - 3
        kept = log.last_lsn
        assert log.stats()["dropped_bytes_at_open"] > 0
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, kept + 1)])


def test_bit_flip_followed_by_valid_blocks_refuses_to_open(four_blocks) -> None:
    d, seg, model, recs = four_blocks
    off, end, lsn = next(r for r in recs if r[0] > BLOCK_SIZE + 2000)
    flip(seg, (off + end) // 2)
    before = Path(seg).read_bytes()
    for _ in range(2):  # a refused open changes nothing, so it refuses again
        with pytest.raises(CorruptionError) as ei:
            wal.open(d)
        e = ei.value
        assert e.path == seg and e.offset == off and e.lsn == lsn
        assert "walkv repair" in str(e) and seg in str(e) and str(off) in str(e)
        assert Path(seg).read_bytes() == before
    problems = wal.verify(str(d))
    assert len(problems) == 1 and seg in problems[0] and f"offset {off}" in problems[0]


def test_bit_flip_followed_by_valid_records_in_the_same_block_refuses_to_open(four_blocks) -> None:
    """The same damage in the last block: the records after it, fsynced and
    acknowledged, are in the same 32 KiB block. DESIGN section 4: an invalid
    record followed by valid ones (and no all-zero sector) is corruption, never a
    torn tail. Open instead cuts the block's remaining records as a torn tail."""
    d, seg, model, recs = four_blocks
    last_block = recs[-1][0] // BLOCK_SIZE
    in_block = [r for r in recs if r[0] // BLOCK_SIZE == last_block]
    assert len(in_block) > 10
    off, end, lsn = in_block[len(in_block) // 2]
    flip(seg, (off + end) // 2)
    before = Path(seg).read_bytes()
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == seg and ei.value.offset == off
    assert Path(seg).read_bytes() == before, "acknowledged entries were zeroed"


def test_torn_last_entry_whose_payload_holds_framed_bytes(tmp_path: Path) -> None:
    """A crash tears the last entry, whose payload happens to contain bytes that
    form a valid record (a value holding a LevelDB log or walkv segment, say).
    That is still a torn tail: the valid-looking bytes are inside the torn
    record, not a later entry (they do not carry the next LSN)."""
    d = tmp_path / "log"
    inner: list[bytes] = []
    frame_into(inner, b"an embedded record " * 4, 0)
    big = b"y" * 100 + b"".join(inner) + b"z" * 400
    with wal.open(d, segment_bytes=1 << 20) as log:
        for i in range(1, 21):
            log.append(pl(i, 300))
        assert log.append(big) == 21
    drop_active_index(d)
    seg = list_segments(str(d))[-1].path
    off, end, lsn = records(seg)[-1]
    assert lsn == 21
    data = bytearray(Path(seg).read_bytes())
    data[end - 40 : end] = bytes(40)  # the end of the last write never reached the disk
    Path(seg).write_bytes(bytes(data))
    assert wal.verify(str(d)) == []
    with wal.open(d) as log:
        assert log.last_lsn == 20
    assert_reopens_and_appends(d, [(k, pl(k, 300)) for k in range(1, 21)])


def test_length_bit_flip_that_hides_the_last_record_refuses_to_open(four_blocks) -> None:
    """A bit flip in the length of the second-to-last record makes it claim the
    start of the last record. The last record is valid and acknowledged, and no
    zero sector lies between: corruption, not a torn tail (a torn write leaves
    a length either right or zero, never larger)."""
    d, seg, model, recs = four_blocks
    off, end, lsn = recs[-2]
    assert recs[-1][0] == end and recs[-1][1] + 300 < (end // BLOCK_SIZE + 1) * BLOCK_SIZE
    length = int.from_bytes(Path(seg).read_bytes()[off + 4 : off + 6], "little")
    # Set a clear bit of the length's high byte so the record claims the whole
    # last record and still fits its block.
    bit = next(b for b in (0x01, 0x02, 0x04, 0x08) if not (length >> 8) & b
               and off + 7 + (length | b << 8) >= recs[-1][1]
               and off % BLOCK_SIZE + 7 + (length | b << 8) <= BLOCK_SIZE)
    flip(seg, off + 5, bit)
    before = Path(seg).read_bytes()
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == seg and ei.value.offset == off
    assert Path(seg).read_bytes() == before, "the acknowledged last entry was zeroed"


def test_bit_flip_in_the_last_record_is_a_torn_tail(four_blocks) -> None:
    """Nothing valid follows the bad record: the normal result of a crash."""
    d, seg, model, recs = four_blocks
    off, end, lsn = recs[-1]
    flip(seg, end - 3)
    with wal.open(d) as log:
        assert log.last_lsn == lsn - 1
        assert log.stats()["dropped_bytes_at_open"] == end - off
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)])


def test_clean_close_index_limits_what_open_scans(four_blocks) -> None:
    """After a clean close, open scans the active segment from its last indexed
    point only: damage before it is found when that range is read."""
    d, seg, model, recs = four_blocks
    with wal.open(d) as log:
        pass  # a clean close writes the active segment's index
    index = read_index(seg)
    assert index is not None and index.points
    last_point = index.points[-1][1]
    off, end, lsn = next(r for r in recs if BLOCK_SIZE < r[0] < last_point - 600)
    flip(seg, (off + end) // 2)
    with wal.open(d) as log:
        assert log.last_lsn == 430
        with pytest.raises(CorruptionError) as ei:
            list(log.read(1))
        assert ei.value.path == seg and ei.value.offset == off
        assert read_all(log, from_lsn=index.points[-1][0]) == [
            (k, model[k]) for k in range(index.points[-1][0], 431)]
        assert log.append(b"x") == 431


# -- sealed segments ------------------------------------------------------------------


@pytest.fixture()
def sealed_log(tmp_path: Path):
    d = tmp_path / "log"
    model = make_log(d, 400)
    segs = list_segments(str(d))
    assert len(segs) >= 5
    drop_active_index(d)
    return d, segs, model


def _middle_record(seg: str) -> tuple[int, int, int]:
    recs = records(seg)
    index = read_index(seg)
    assert index is not None and len(index.points) >= 3
    # A record after the first index point and well before the last one.
    return next(r for r in recs if r[0] > index.points[1][1] + 100)


def test_bit_flip_in_sealed_segment_with_valid_index(sealed_log) -> None:
    d, segs, model = sealed_log
    seg = segs[1]
    off, end, lsn = _middle_record(seg.path)
    flip(seg.path, (off + end) // 2)
    with wal.open(d) as log:  # trusted at open: its index is valid
        assert log.last_lsn == 400
        with pytest.raises(CorruptionError) as ei:
            list(log.read(seg.first_lsn))
        assert ei.value.path == seg.path and ei.value.offset == off and "walkv repair" in str(ei.value)
        with pytest.raises(CorruptionError):
            list(log.read(lsn, lsn))
        # Other ranges read fine, including the rest of this segment: reads
        # seek with the sparse index past the damaged block.
        assert read_all(log, to_lsn=seg.first_lsn - 1) == [(k, model[k]) for k in range(1, seg.first_lsn)]
        index = read_index(seg.path)
        later = next(p_lsn for p_lsn, p_off in index.points if p_off > off)
        assert read_all(log, from_lsn=later) == [(k, model[k]) for k in range(later, 401)]
        assert log.append(b"x") == 401
    problems = wal.verify(str(d))
    assert problems and seg.path in problems[0] and f"offset {off}" in problems[0]


def test_read_up_to_the_record_before_damage(sealed_log) -> None:
    """read(a, b) with every entry of [a, b] intact must not fail because the
    record after b is damaged."""
    d, segs, model = sealed_log
    seg = segs[1]
    off, end, lsn = _middle_record(seg.path)
    flip(seg.path, (off + end) // 2)
    with wal.open(d) as log:
        assert read_all(log, from_lsn=lsn - 3, to_lsn=lsn - 1) == [(k, model[k]) for k in range(lsn - 3, lsn)]


def test_bit_flip_in_sealed_segment_found_when_its_index_is_rebuilt(sealed_log) -> None:
    d, segs, model = sealed_log
    seg = segs[2]
    off, end, lsn = _middle_record(seg.path)
    flip(seg.path, (off + end) // 2)
    os.unlink(index_path(seg.path))
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == seg.path and ei.value.offset == off and "walkv repair" in str(ei.value)
    # The refused open released the lock and changed nothing: prefix recovery
    # keeps LSNs 1..lsn-1 and moves the rest to .broken files.
    later = [s.path for s in segs[3:]]
    later_bytes = {p: Path(p).read_bytes() for p in later}
    cut_bytes = Path(seg.path).read_bytes()[off:]
    with wal.open(d, recovery="prefix") as log:
        assert log.last_lsn == lsn - 1
        assert read_all(log) == [(k, model[k]) for k in range(1, lsn)]
        assert log.append(b"x") == lsn
    for p in later:
        assert not os.path.exists(p) and Path(p + ".broken").read_bytes() == later_bytes[p]
    assert Path(seg.path + ".broken").read_bytes() == cut_bytes.rstrip(b"\x00")
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)] + [(lsn, b"x")])


def test_bit_flip_in_sealed_segment_header_refuses_to_open(sealed_log) -> None:
    d, segs, model = sealed_log
    flip(segs[1].path, 20)  # inside the header record, index still valid
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == segs[1].path and ei.value.offset == 0
    with wal.open(d, recovery="prefix") as log:
        assert log.last_lsn == segs[1].first_lsn - 1
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, segs[1].first_lsn)])


def test_deleted_middle_segment(sealed_log) -> None:
    d, segs, model = sealed_log
    gone = segs[2]
    os.unlink(gone.path)
    os.unlink(index_path(gone.path))
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    msg = str(ei.value)
    assert f"LSNs {gone.first_lsn}..{segs[3].first_lsn - 1} are missing" in msg
    assert ei.value.path == segs[3].path and "walkv repair" in msg
    problems = wal.verify(str(d))
    assert problems and f"{gone.first_lsn}..{segs[3].first_lsn - 1}" in problems[0]
    with wal.open(d, recovery="prefix") as log:
        assert log.last_lsn == gone.first_lsn - 1
        assert read_all(log) == [(k, model[k]) for k in range(1, gone.first_lsn)]
    for s in segs[3:]:
        assert os.path.exists(s.path + ".broken")
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, gone.first_lsn)])


def test_deleted_middle_segment_with_its_neighbours_reindexed(sealed_log) -> None:
    """No index at all (every one rebuilt at open): the gap is still found."""
    d, segs, model = sealed_log
    os.unlink(segs[1].path)
    for s in segs:
        if os.path.exists(index_path(s.path)):
            os.unlink(index_path(s.path))
    with pytest.raises(CorruptionError, match=f"LSNs {segs[1].first_lsn}..{segs[2].first_lsn - 1} are missing"):
        wal.open(d)


def test_segment_name_disagrees_with_header(sealed_log) -> None:
    d, segs, model = sealed_log
    s = segs[2]
    wrong = os.path.join(str(d), f"{s.first_lsn + 1:020d}.wal")
    os.rename(s.path, wrong)
    os.rename(index_path(s.path), index_path(wrong))
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == wrong and "first LSN" in str(ei.value)
    assert wal.verify(str(d))
    os.rename(wrong, s.path)
    os.rename(index_path(wrong), index_path(s.path))
    assert_reopens_and_appends(d, sorted(model.items()))


def test_newest_segment_name_disagrees_with_header(sealed_log) -> None:
    d, segs, model = sealed_log
    s = segs[-1]
    wrong = os.path.join(str(d), f"{s.first_lsn + 5:020d}.wal")
    os.rename(s.path, wrong)
    with pytest.raises(CorruptionError) as ei:
        wal.open(d)
    assert ei.value.path == wrong


def _twin_logs(base: Path) -> tuple[Path, Path, dict[int, bytes]]:
    """Two stores written identically: their segments have the same names."""
    a, b = base / "a", base / "b"
    model = make_log(a, 300)
    make_log(b, 300)
    assert [os.path.basename(s.path) for s in list_segments(str(a))] == [
        os.path.basename(s.path) for s in list_segments(str(b))]
    return a, b, model


def test_segment_from_another_store_in_the_middle(tmp_path: Path) -> None:
    a, b, model = _twin_logs(tmp_path)
    segs = list_segments(str(a))
    stray = segs[2].path
    shutil.copy(os.path.join(b, os.path.basename(stray)), stray)
    shutil.copy(index_path(os.path.join(b, os.path.basename(stray))), index_path(stray))
    with pytest.raises(CorruptionError) as ei:
        wal.open(a)
    assert ei.value.path == stray and "another store" in str(ei.value)
    assert wal.verify(str(a))
    with wal.open(a, recovery="prefix") as log:
        assert log.last_lsn == segs[2].first_lsn - 1
    assert_reopens_and_appends(a, [(k, model[k]) for k in range(1, segs[2].first_lsn)])


def test_segment_from_another_store_as_the_newest(tmp_path: Path) -> None:
    """The stray segment is the newest one: the error must name it, not the
    log's own first segment (its hint says to move the named file away)."""
    a, b, model = _twin_logs(tmp_path)
    stray = list_segments(str(a))[-1].path
    shutil.copy(os.path.join(b, os.path.basename(stray)), stray)
    with pytest.raises(CorruptionError) as ei:
        wal.open(a)
    assert ei.value.path == stray and "another store" in str(ei.value)


def test_leftover_temp_files_are_removed(sealed_log) -> None:
    """A crash while creating a segment or writing an index leaves a .tmp file."""
    d, segs, model = sealed_log
    nxt = f"{max(model) + 1:020d}.wal.tmp"
    (d / nxt).write_bytes(b"half a header")
    (d / (os.path.basename(index_path(segs[1].path)) + ".tmp")).write_bytes(b"\0" * 100)
    with wal.open(d) as log:
        assert not [n for n in os.listdir(d) if n.endswith(".tmp")]
        assert read_all(log) == sorted(model.items())
    assert_reopens_and_appends(d, sorted(model.items()))


# -- the lock ----------------------------------------------------------------------


def test_second_writer_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d) as log:
        log.append(b"x")
        with pytest.raises(LockedError) as ei:
            wal.open(d)
        assert str(os.getpid()) in str(ei.value)
        code = textwrap.dedent("""
            import sys, wal
            try:
                wal.open(sys.argv[1])
            except wal.LockedError as e:
                print("LOCKED", e)
            else:
                print("OPENED")
        """)
        out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith("LOCKED"), out.stdout + out.stderr
        assert f"pid {os.getpid()}" in out.stdout
        assert log.append(b"y") == 2  # the refused opens did not disturb the writer
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("OPENED"), out.stdout + out.stderr
    with wal.open(d) as log:
        assert read_all(log) == [(1, b"x"), (2, b"y")]


def test_lock_released_after_a_refused_open(sealed_log) -> None:
    d, segs, model = sealed_log
    os.rename(segs[2].path, segs[2].path + ".away")
    with pytest.raises(CorruptionError):
        wal.open(d)
    os.rename(segs[2].path + ".away", segs[2].path)
    assert_reopens_and_appends(d, sorted(model.items()))


# -- repair, verify, prefix -----------------------------------------------------------


def test_repair_active_segment_corruption(four_blocks) -> None:
    d, seg, model, recs = four_blocks
    off, end, lsn = next(r for r in recs if r[0] > BLOCK_SIZE + 2000)
    flip(seg, (off + end) // 2)
    original = Path(seg).read_bytes()
    cut = original[off:nonzero_end(original, off)]
    dry = wal.repair(str(d), dry_run=True)
    assert dry.cut and dry.offset == off and dry.last_good_lsn == lsn - 1
    assert Path(seg).read_bytes() == original and not os.path.exists(seg + ".broken")
    report = wal.repair(str(d))
    assert report.cut and report.path == seg and report.offset == off
    assert report.last_good_lsn == lsn - 1 and report.reason
    assert report.broken_files == [seg + ".broken"]
    assert Path(seg + ".broken").read_bytes() == cut and report.dropped_bytes == len(cut)
    after = Path(seg).read_bytes()
    assert after[:off] == original[:off] and after[off:].count(0) == len(after) - off
    assert wal.repair(str(d)).cut is False
    assert wal.verify(str(d)) == []
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)])


def test_repair_sealed_segment_corruption(sealed_log) -> None:
    d, segs, model = sealed_log
    off, end, lsn = _middle_record(segs[1].path)
    flip(segs[1].path, (off + end) // 2)
    later = {s.path: Path(s.path).read_bytes() for s in segs[2:]}
    report = wal.repair(str(d))
    assert report.cut and report.path == segs[1].path and report.offset == off and report.last_good_lsn == lsn - 1
    assert sorted(report.broken_files) == sorted([p + ".broken" for p in later] + [segs[1].path + ".broken"])
    for p, data in later.items():
        assert Path(p + ".broken").read_bytes() == data and not os.path.exists(index_path(p))
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)])


def test_repair_dry_run_reports_what_repair_drops(four_blocks) -> None:
    d, seg, model, recs = four_blocks
    off, end, lsn = next(r for r in recs if r[0] > BLOCK_SIZE + 2000)
    flip(seg, (off + end) // 2)
    dry = wal.repair(str(d), dry_run=True)
    real = wal.repair(str(d))
    assert (dry.cut, dry.path, dry.offset, dry.last_good_lsn) == (real.cut, real.path, real.offset, real.last_good_lsn)
    # The preallocated zeros after the data are not log bytes: repair does not count them.
    assert dry.dropped_bytes == real.dropped_bytes


def test_verify_agrees_with_open_on_a_torn_tail(four_blocks) -> None:
    """A crash tears the last record of the (preallocated) active segment:
    its end reads as zeros, so its checksum fails. Open treats that as the
    normal end of the log (DESIGN section 4); verify must not call it damage."""
    d, seg, model, recs = four_blocks
    off, end, lsn = recs[-1]
    data = bytearray(Path(seg).read_bytes())
    data[end - 40 : end] = bytes(40)
    Path(seg).write_bytes(bytes(data))
    assert wal.verify(str(d)) == []
    with wal.open(d) as log:
        assert log.last_lsn == lsn - 1


def test_prefix_recovery_of_active_segment_corruption(four_blocks, caplog) -> None:
    d, seg, model, recs = four_blocks
    off, end, lsn = next(r for r in recs if r[0] > 2 * BLOCK_SIZE + 100)
    flip(seg, off + 10)
    original = Path(seg).read_bytes()
    caplog.set_level(logging.WARNING, logger="walkv.wal")
    with wal.open(d, recovery="prefix") as log:
        assert log.last_lsn == lsn - 1
        assert read_all(log) == [(k, model[k]) for k in range(1, lsn)]
        assert log.append(b"p") == lsn
    assert Path(seg + ".broken").read_bytes() == original[off:nonzero_end(original, off)]
    assert any("prefix" in r.getMessage() for r in caplog.records)
    assert_reopens_and_appends(d, [(k, model[k]) for k in range(1, lsn)] + [(lsn, b"p")])


def test_prefix_recovery_of_a_healthy_log_changes_nothing(sealed_log) -> None:
    d, segs, model = sealed_log
    with wal.open(d, recovery="prefix") as log:
        assert read_all(log) == sorted(model.items())
    assert not [n for n in os.listdir(d) if n.endswith(".broken")]


def test_verify(sealed_log) -> None:
    d, segs, model = sealed_log
    assert wal.verify(str(d)) == []
    calls = []
    with wal.open(d) as log:
        assert wal.verify(str(d), progress=lambda done, total: calls.append((done, total))) == []
        log.append(b"x")
    assert calls and calls[-1] == (len(segs), len(segs))
    assert wal.verify(str(d)) == []
    off = records(segs[1].path)[3][0]
    flip(segs[1].path, off + 12)
    problems = wal.verify(str(d))
    assert len(problems) == 1 and segs[1].path in problems[0] and f"offset {off}" in problems[0]


# -- reopening with other options -------------------------------------------------------


def test_reopen_with_smaller_max_record_bytes_keeps_entries(tmp_path: Path) -> None:
    """An entry written under a larger limit is data, not a torn tail: open must
    keep it (or refuse), never zero it."""
    d = tmp_path / "log"
    with wal.open(d) as log:
        log.append(b"a")
        log.append(b"b" * 200_000)
    drop_active_index(d)
    try:
        with wal.open(d, max_record_bytes=100_000):
            pass
    except (CorruptionError, ValueError):
        pass
    with wal.open(d) as log:
        assert read_all(log) == [(1, b"a"), (2, b"b" * 200_000)]


def test_start_lsn(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, start_lsn=1000, segment_bytes=4096) as log:
        assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1000, 999, 999)
        assert read_all(log, from_lsn=1000) == []
        with pytest.raises(LogGapError):
            list(log.read(1))
        for i in range(100):
            assert log.append(pl(i)) == 1000 + i
    assert os.path.basename(list_segments(str(d))[0].path) == f"{1000:020d}.wal"
    with wal.open(d, start_lsn=5) as log:  # only for a log created empty
        assert (log.first_lsn, log.last_lsn) == (1000, 1099)
        assert read_all(log, from_lsn=1000) == [(1000 + i, pl(i)) for i in range(100)]
    with pytest.raises(ValueError):
        wal.open(tmp_path / "other", start_lsn=0)


# -- crashes of a real process --------------------------------------------------------

CHILD = textwrap.dedent(r"""
    import os, sys, threading, wal

    d, seed = sys.argv[1], int(sys.argv[2])
    log = wal.open(d, segment_bytes=8192, sync="always")

    def payload(t, i):
        return b"%d:%d:" % (t, i) + bytes([65 + t]) * ((t * 31 + i * 17 + seed) % 600)

    def out(line):
        os.write(1, line.encode() + b"\n")  # one write: atomic on a pipe

    def appender(t):
        i = 0
        while True:
            lsn = log.append(payload(t, i))
            out(f"A {lsn} {t} {i}")
            i += 1

    def batcher(t):
        i = 0
        while True:
            first, last = log.append_batch([payload(t, i + k) for k in range(3)])
            for k in range(3):
                out(f"A {first + k} {t} {i + k}")
            i += 3

    def nowaiter(t):
        i = 0
        while True:
            done = threading.Semaphore(0)
            for k in range(8):
                def cb(lsn, err, i=i + k):
                    if err is None:
                        out(f"A {lsn} {t} {i}")
                    done.release()
                log.append_nowait(payload(t, i + k), cb)
            for k in range(8):
                done.acquire()
            i += 8

    def truncator():
        import time
        while True:
            time.sleep(0.03)
            log.truncate_before(log.durable_lsn - 400)
            out(f"T {log.first_lsn}")

    threads = [threading.Thread(target=appender, args=(t,), daemon=True) for t in range(5)]
    threads.append(threading.Thread(target=batcher, args=(5,), daemon=True))
    threads.append(threading.Thread(target=nowaiter, args=(6,), daemon=True))
    threads.append(threading.Thread(target=truncator, daemon=True))
    out("ready")
    for th in threads:
        th.start()
    threading.Event().wait()
""")


def _child_payload(t: int, i: int, seed: int) -> bytes:
    return b"%d:%d:" % (t, i) + bytes([65 + t]) * ((t * 31 + i * 17 + seed) % 600)


@pytest.mark.crash
def test_sigkill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(20240601)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    d = tmp_path / "log"
    total_acked = 0
    prev_last = 0
    for it in range(10):
        seed = rng.randrange(1000)
        proc = subprocess.Popen([sys.executable, str(script), str(d), str(seed)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline().strip() == b"ready", proc.stderr.read().decode()
            time.sleep(rng.uniform(0.02, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err.decode()
        acked: dict[int, tuple[int, int]] = {}
        truncated_to = 0
        for line in out.decode().splitlines():
            parts = line.split()
            if parts and parts[0] == "A" and len(parts) == 4:
                acked[int(parts[1])] = (int(parts[2]), int(parts[3]))
            elif parts and parts[0] == "T" and len(parts) == 2:
                truncated_to = max(truncated_to, int(parts[1]))
        with wal.open(d, segment_bytes=8192) as log:
            first, last = log.first_lsn, log.last_lsn
            got = read_all(log, from_lsn=first)
            assert [k for k, _ in got] == list(range(first, last + 1)), "gap-free"
            assert first >= truncated_to
            by_lsn = dict(got)
            for lsn, (t, i) in acked.items():
                if lsn >= first:
                    assert by_lsn.get(lsn) == _child_payload(t, i, seed), f"iteration {it}: acknowledged LSN {lsn}"
            assert max(acked, default=0) <= last
            # Entries of this run (acknowledged or not) are whole and unique.
            seen = set()
            for lsn, p in got:
                if lsn <= prev_last:
                    continue
                t, i, _ = p.split(b":", 2)
                key = (int(t), int(i))
                assert p == _child_payload(*key, seed) and key not in seen, lsn
                seen.add(key)
            assert len(seen) >= len([k for k in acked if k >= first])
            total_acked += len(acked)
            prev_last = log.append(b"parent %d" % it)
    assert total_acked > 30
    assert wal.verify(str(d)) == []
