"""The segmented log's API (wal/log.py, wal/segment.py; DESIGN.md sections 2, 3, 9).

Everything here runs on real files with real fsyncs. ``segment_bytes`` is small
(4 KiB to 64 KiB) so that segments roll and sealed segments get sparse indexes.
Recovery, damage and crashes are in test_wal_recovery.py; threads, group commit
and injected I/O failures in test_wal_concurrency.py; random operation
sequences against a model in test_wal_properties.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import wal
from wal.errors import ClosedError, CorruptionError, LogFailedError, LogGapError, RecordTooLargeError, WalkvError
from wal.fs import FileSystem
from wal.index import INDEX_INTERVAL, read_index, scan_segment
from wal.record import BLOCK_SIZE
from wal.record_reader import RecordReader
from wal.segment import index_path, iter_entries, list_segments, read_header
from wal.truncation import TRUNCATE_MARKER

STATS_KEYS = {
    "appends", "bytes", "groups", "fsyncs", "max_group", "rolls", "first_lsn", "last_lsn", "durable_lsn",
    "segments", "sync", "dropped_bytes_at_open", "avg_group", "fsync_p50_ms", "fsync_p99_ms",
}


def pl(i: int, size: int = 40) -> bytes:
    """A deterministic payload for LSN-ish ``i`` (distinct for distinct ``i`` when size >= 9)."""
    head = b"%08d:" % i
    body = (head * (size // len(head) + 1))[:size]
    return body


def wal_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".wal"))


def idx_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".idx"))


def fill(log: wal.Log, count: int, start: int = 1, size=lambda i: 40 + (i * 37) % 500) -> dict[int, bytes]:
    """Append ``count`` entries one by one; return {lsn: payload}."""
    model = {}
    for i in range(start, start + count):
        p = pl(i, size(i))
        lsn = log.append(p)
        model[lsn] = p
    return model


def read_all(log: wal.Log, **kw) -> list[tuple[int, bytes]]:
    return list(log.read(**kw))


def entries_in_files(d: Path) -> list[tuple[int, bytes]]:
    """Every entry of every segment, read with the pure file functions."""
    out = []
    for seg in list_segments(str(d)):
        with open(seg.path, "rb") as fh:
            out.extend((e.lsn, e.payload) for e in iter_entries(fh, seg.path))
    return out


# -- basics -------------------------------------------------------------------


def test_empty_log(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d) as log:
        assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1, 0, 0)
        assert read_all(log) == []
        assert log.directory == os.fspath(d)
        assert len(log.store_id) == 32 and int(log.store_id, 16) >= 0
        store_id = log.store_id
        assert wal_files(d) == ["00000000000000000001.wal"]
        assert wal.read_durable_lsn(str(d)) == 0
    assert oct(os.stat(d).st_mode & 0o777) == oct(0o700)
    assert oct(os.stat(d / "00000000000000000001.wal").st_mode & 0o777) == oct(0o600)
    with wal.open(d) as log:
        assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1, 0, 0)
        assert log.store_id == store_id
        assert log.append(b"x") == 1


def test_append_read_and_timestamps_across_rolls(tmp_path: Path) -> None:
    d = tmp_path / "log"
    t0 = time.time_ns() // 1000
    with wal.open(d, segment_bytes=4096) as log:
        model = fill(log, 300)
        t1 = time.time_ns() // 1000
        assert list(model) == list(range(1, 301))
        assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1, 300, 300)
        assert read_all(log) == list(model.items())
        entries = list(log.read_entries())
        assert [(e.lsn, e.payload) for e in entries] == list(model.items())
        stamps = [e.timestamp_us for e in entries]
        assert stamps == sorted(stamps), "commit timestamps must not go backwards"
        assert t0 - 1_000_000 <= stamps[0] and stamps[-1] <= t1 + 1_000_000
        st = log.stats()
        assert st["rolls"] >= 10 and st["segments"] == st["rolls"] + 1
        assert st["appends"] == 300
    # The files themselves: named by first LSN, header agrees, LSNs run on.
    segs = list_segments(str(d))
    assert len(segs) >= 11
    assert entries_in_files(d) == list(model.items())
    expect = 1
    for seg in segs:
        assert os.path.basename(seg.path) == f"{seg.first_lsn:020d}.wal"
        with open(seg.path, "rb") as fh:
            header, _ = read_header(fh, seg.path)
            assert header.first_lsn == seg.first_lsn == expect
            lsns = [e.lsn for e in iter_entries(fh, seg.path)]
        assert lsns == list(range(expect, expect + len(lsns))) and lsns
        expect += len(lsns)
    # Sealed segments were cut to their data end: no preallocated zeros left.
    for seg in segs[:-1]:
        with open(seg.path, "rb") as fh:
            reader = RecordReader(fh, zeros_end=True)
            list(reader)
            assert reader.end_offset == os.path.getsize(seg.path)


def test_lsns_gap_free_across_reopen_and_rolls(tmp_path: Path) -> None:
    d = tmp_path / "log"
    model: dict[int, bytes] = {}
    for cycle in range(5):
        with wal.open(d, segment_bytes=8192) as log:
            assert log.last_lsn == len(model) == log.durable_lsn
            assert log.first_lsn == 1
            more = fill(log, 40, start=len(model) + 1)
            assert min(more) == len(model) + 1
            model.update(more)
            first, last = log.append_batch([pl(n, 100) for n in range(cycle * 7, cycle * 7 + 7)])
            assert (first, last) == (len(model) + 1, len(model) + 7)
            for k, n in enumerate(range(cycle * 7, cycle * 7 + 7)):
                model[first + k] = pl(n, 100)
            assert read_all(log) == sorted(model.items())
    assert entries_in_files(d) == sorted(model.items())
    # The indexes written live (across reopens, which resume from the last
    # indexed point) are the ones a full scan of each segment builds.
    for seg in list_segments(str(d)):
        with open(seg.path, "rb") as fh:
            assert read_index(seg.path) == scan_segment(fh, seg.path)[1], seg.path
    with wal.open(d) as log:
        assert read_all(log) == sorted(model.items())


def test_append_batch(tmp_path: Path) -> None:
    with wal.open(tmp_path / "log", segment_bytes=4096) as log:
        assert log.append(b"a") == 1
        assert log.append_batch([b"b", b"c", b""]) == (2, 4)
        big = [pl(i, 3000) for i in range(10)]  # a batch larger than a segment
        assert log.append_batch(iter(big)) == (5, 14)
        assert log.append_batch([bytearray(b"ba"), memoryview(b"mv")]) == (15, 16)
        got = read_all(log)
        assert got == list(zip(range(1, 17), [b"a", b"b", b"c", b""] + big + [b"ba", b"mv"]))
        assert all(type(p) is bytes for _, p in got)
        entries = list(log.read_entries(5, 14))
        assert len({e.timestamp_us for e in entries}) == 1, "one batch, one commit"
        with pytest.raises(ValueError):
            log.append_batch([])
        with pytest.raises(TypeError):
            log.append_batch([b"ok", "not bytes", b"ok"])
        with pytest.raises(TypeError):
            log.append_batch([b"ok", None])
        assert log.last_lsn == 16
        assert log.append(b"next") == 17
    with wal.open(tmp_path / "log") as log:
        assert log.last_lsn == 17


def test_payload_types_and_sizes(tmp_path: Path) -> None:
    with wal.open(tmp_path / "log") as log:
        for bad in ("text", 5, None, [b"x"], object()):
            with pytest.raises(TypeError):
                log.append(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                log.append_nowait(bad, lambda lsn, err: None)  # type: ignore[arg-type]
        assert log.last_lsn == 0
        sizes = [0, 1, BLOCK_SIZE - 7 - 16, BLOCK_SIZE - 16, BLOCK_SIZE, 3 * BLOCK_SIZE + 5, 1 << 20]
        for n, size in enumerate(sizes, 1):
            assert log.append(pl(n, size)) == n
        assert read_all(log) == [(n, pl(n, s)) for n, s in enumerate(sizes, 1)]
    with wal.open(tmp_path / "log") as log:
        assert read_all(log) == [(n, pl(n, s)) for n, s in enumerate(sizes, 1)]


def test_record_too_large_writes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, max_record_bytes=1000) as log:
        limit = 1000 - 16  # the entry header (LSN, timestamp) counts
        assert log.append(b"x" * limit) == 1
        with pytest.raises(RecordTooLargeError) as ei:
            log.append(b"x" * (limit + 1))
        assert isinstance(ei.value, ValueError) and isinstance(ei.value, WalkvError)
        assert "nothing was written" in str(ei.value)
        with pytest.raises(RecordTooLargeError):
            log.append_batch([b"small", b"x" * 5000])
        with pytest.raises(RecordTooLargeError):
            log.append_nowait(b"x" * 5000, lambda lsn, err: None)
        assert log.last_lsn == 1
        assert log.append(b"after") == 2
        assert read_all(log) == [(1, b"x" * limit), (2, b"after")]
    with wal.open(d, max_record_bytes=1000) as log:
        assert read_all(log) == [(1, b"x" * limit), (2, b"after")]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sync"):
        wal.open(tmp_path / "a", sync="sometimes")
    with pytest.raises(ValueError):
        wal.open(tmp_path / "b", segment_bytes=10)
    with pytest.raises(ValueError, match="recovery"):
        wal.open(tmp_path / "c", recovery="optimistic")
    # A refused open must not keep the lock.
    with wal.open(tmp_path / "c") as log:
        assert log.append(b"x") == 1


# -- reading ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    """A closed log of 500 entries over many 16 KiB segments, some entries
    spanning blocks; module-scoped because reading tests do not modify it."""
    d = tmp_path_factory.mktemp("big") / "log"
    model: dict[int, bytes] = {}
    with wal.open(d, segment_bytes=16384, sync="none") as log:
        for i in range(1, 501):
            size = 9000 if i % 97 == 0 else 30 + (i * 53) % 700
            assert log.append(pl(i, size)) == i
            model[i] = pl(i, size)
    return d, model


def copy_log(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def check_reads_from_every_lsn(log: wal.Log, model: dict[int, bytes]) -> None:
    first, last = log.first_lsn, log.last_lsn
    items = sorted(model.items())
    for lsn in range(first, last + 1):
        assert list(log.read(lsn, lsn)) == [(lsn, model[lsn])], lsn
        hi = min(last, lsn + 6)
        assert list(log.read(lsn, lsn + 6)) == [(k, model[k]) for k in range(lsn, hi + 1)], lsn
        if lsn % 23 == 0 or lsn in (first, last):
            assert list(log.read(lsn)) == items[lsn - 1:], lsn
    assert list(log.read(last + 1)) == []
    assert list(log.read(last + 100, last + 200)) == []
    assert list(log.read(first + 5, first + 4)) == []
    assert list(log.read(first, last + 1000)) == items[first - 1:]


def test_read_from_every_lsn(big_log, tmp_path: Path) -> None:
    d = copy_log(big_log[0], tmp_path / "log")
    model = big_log[1]
    with wal.open(d) as log:
        assert log.last_lsn == 500
        assert len(list_segments(str(d))) > 10
        check_reads_from_every_lsn(log, model)
        entries = list(log.read_entries(250, 252))
        assert [(e.lsn, e.payload) for e in entries] == [(k, model[k]) for k in (250, 251, 252)]


def test_sparse_indexes_of_sealed_segments(big_log, tmp_path: Path) -> None:
    d = copy_log(big_log[0], tmp_path / "log")
    with wal.open(d) as log:
        segs = list_segments(str(d))
        # While open, only sealed segments have an index (the active one is in memory).
        assert idx_files(d) == sorted(os.path.basename(index_path(s.path)) for s in segs[:-1])
        for k, seg in enumerate(segs[:-1]):
            index = read_index(seg.path)
            assert index is not None
            assert index.first_lsn == seg.first_lsn and index.last_lsn == segs[k + 1].first_lsn - 1
            assert index.data_end == os.path.getsize(seg.path)
            assert index.points and index.points == sorted(index.points)
            offsets = [off for _, off in index.points]
            assert all(b - a >= INDEX_INTERVAL for a, b in zip(offsets, offsets[1:]))
            # A point every ~4 KiB: no gap between points much larger than that
            # plus one record.
            assert all(b - a <= INDEX_INTERVAL + 10000 for a, b in zip(offsets, offsets[1:]))
            # Each point is the start of the record of that LSN.
            with open(seg.path, "rb") as fh:
                for p_lsn, off in index.points:
                    e = next(iter_entries(fh, seg.path, off))
                    assert e.lsn == p_lsn
        log.append(b"one more")
    # A clean close indexes the active segment too (so the next open scans little).
    segs = list_segments(str(d))
    assert idx_files(d) == sorted(os.path.basename(index_path(s.path)) for s in segs)
    active_index = read_index(segs[-1].path)
    assert active_index is not None and active_index.last_lsn == 501
    with wal.open(d) as log:
        assert log.last_lsn == 501
        assert not os.path.exists(index_path(segs[-1].path)), "the active segment's index is dropped at open"


def test_missing_indexes_are_rebuilt(big_log, tmp_path: Path) -> None:
    d = copy_log(big_log[0], tmp_path / "log")
    model = big_log[1]
    segs = list_segments(str(d))
    originals = {s.path: read_index(s.path) for s in segs[:-1]}
    assert all(originals.values())
    for name in idx_files(d):
        os.unlink(d / name)
    with wal.open(d) as log:
        for path, index in originals.items():
            assert os.path.exists(index_path(path)), "index rebuilt at open"
            assert read_index(path) == index
        check_reads_from_every_lsn(log, model)
        assert log.append(b"x") == 501


@pytest.mark.parametrize("damage", ["bitflip", "halved", "empty", "garbage", "other_segment", "wrong_magic"])
def test_damaged_index_is_rebuilt(big_log, tmp_path: Path, damage: str) -> None:
    d = copy_log(big_log[0], tmp_path / "log")
    model = big_log[1]
    segs = list_segments(str(d))
    victim = segs[2].path
    ipath = index_path(victim)
    original = read_index(victim)
    data = Path(ipath).read_bytes()
    if damage == "bitflip":
        b = bytearray(data)
        b[len(b) // 2] ^= 0x10
        Path(ipath).write_bytes(bytes(b))
    elif damage == "halved":
        Path(ipath).write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        Path(ipath).write_bytes(b"")
    elif damage == "garbage":
        Path(ipath).write_bytes(os.urandom(len(data)))
    elif damage == "other_segment":
        shutil.copy(index_path(segs[1].path), ipath)  # valid CRC, wrong segment
    else:
        import io

        from wal.record import RecordWriter

        buf = io.BytesIO()
        RecordWriter(buf, 0).add_record(b"NOTANIDX" + data[15:])
        Path(ipath).write_bytes(buf.getvalue())
    assert read_index(victim) != original
    problems = wal.verify(str(d))
    if damage != "other_segment":
        assert any(ipath in p for p in problems), problems
    with wal.open(d) as log:
        assert read_index(victim) == original, "index rebuilt at open"
        check_reads_from_every_lsn(log, model)
    assert wal.verify(str(d)) == []


# -- truncate_before -------------------------------------------------------------


def test_truncate_before(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        model = fill(log, 200)
        segs = list_segments(str(d))
        assert len(segs) > 5
        assert log.truncate_before(1) == 0
        assert log.truncate_before(segs[1].first_lsn - 1) == 0, "segment 0 still holds that LSN"
        assert wal_files(d)[0] == os.path.basename(segs[0].path)

        target = segs[3].first_lsn + 2
        expect_freed = sum(os.path.getsize(s.path) + os.path.getsize(index_path(s.path)) for s in segs[:3])
        freed = log.truncate_before(target)
        assert freed == expect_freed
        assert log.first_lsn == segs[3].first_lsn
        assert log.stats()["first_lsn"] == segs[3].first_lsn
        for s in segs[:3]:
            assert not os.path.exists(s.path) and not os.path.exists(index_path(s.path))
        with pytest.raises(LogGapError, match="no longer") as gap:
            list(log.read(segs[3].first_lsn - 1))
        assert (gap.value.first_missing, gap.value.last_missing, gap.value.first_available) == (
            segs[3].first_lsn - 1, segs[3].first_lsn - 1, segs[3].first_lsn)
        with pytest.raises(LogGapError):
            list(log.read(1, 5))
        with pytest.raises(LogGapError):
            list(log.read_entries(1))
        assert read_all(log, from_lsn=log.first_lsn) == [(k, model[k]) for k in range(segs[3].first_lsn, 201)]
        # Never deletes the active segment, however far ahead the LSN.
        freed = log.truncate_before(10**9)
        assert freed > 0
        active = list_segments(str(d))
        assert len(active) == 1 and active[0].path == segs[-1].path
        assert log.first_lsn == segs[-1].first_lsn <= log.last_lsn == 200
        assert read_all(log, from_lsn=log.first_lsn) == [(k, model[k]) for k in range(segs[-1].first_lsn, 201)]
        assert log.append(b"after") == 201
        first = log.first_lsn
    with wal.open(d, segment_bytes=4096) as log:
        assert log.first_lsn == first and log.last_lsn == 201
        assert read_all(log, from_lsn=first)[-1] == (201, b"after")
        with pytest.raises(LogGapError):
            list(log.read(1))
        more = fill(log, 100, start=202)
        assert min(more) == 202
        assert log.truncate_before(log.last_lsn) > 0
        assert log.first_lsn <= log.last_lsn


# -- truncate_after -----------------------------------------------------------------


def test_truncate_after_in_active_segment(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d) as log:
        model = fill(log, 50)
        log.truncate_after(50)  # no-op
        log.truncate_after(70)  # no-op: beyond the end
        assert log.last_lsn == 50
        log.truncate_after(30)
        assert (log.first_lsn, log.last_lsn, log.durable_lsn) == (1, 30, 30)
        assert wal.read_durable_lsn(str(d)) == 30
        assert read_all(log) == [(k, model[k]) for k in range(1, 31)]
        assert log.append(b"new 31") == 31
        assert log.append_batch([b"new 32", b"new 33"]) == (32, 33)
        assert read_all(log)[-4:] == [(30, model[30]), (31, b"new 31"), (32, b"new 32"), (33, b"new 33")]
    with wal.open(d) as log:
        assert log.last_lsn == 33
        assert read_all(log) == [(k, model[k]) for k in range(1, 31)] + [
            (31, b"new 31"), (32, b"new 32"), (33, b"new 33")]
        log.truncate_after(0)
        assert (log.first_lsn, log.last_lsn) == (1, 0)
        assert read_all(log) == []
        assert log.append(b"fresh") == 1
    with wal.open(d) as log:
        assert read_all(log) == [(1, b"fresh")]
        with pytest.raises(ValueError):
            log.truncate_after(-1)


def test_truncate_after_across_segments(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        model = fill(log, 200)
        segs = list_segments(str(d))
        assert len(segs) > 6
        # Inside an older sealed segment: every later segment goes.
        cut = segs[4].first_lsn + 3
        fork = log.truncate_after(cut)
        assert log.last_lsn == cut
        left = list_segments(str(d))
        # ... and the log goes on on a new timeline, in a segment of its own (wal/timeline.py)
        assert [s.path for s in left] == [s.path for s in segs[:5]] + [str(d / f"{cut + 1:020d}.wal")]
        assert fork is not None and fork.first_lsn == cut + 1 and log.timeline == fork
        assert not any(os.path.exists(index_path(s.path)) for s in segs[5:])
        assert read_all(log) == [(k, model[k]) for k in range(1, cut + 1)]
        assert log.append(b"x") == cut + 1
        # Exactly at a segment boundary: the segment starting at lsn+1 stays, empty, on the new timeline.
        boundary = segs[3].first_lsn - 1
        log.truncate_after(boundary)
        assert log.last_lsn == boundary
        assert [s.path for s in list_segments(str(d))] == [s.path for s in segs[:4]]
        assert [t.first_lsn for t in log.history] == [1, boundary + 1]
        assert read_all(log) == [(k, model[k]) for k in range(1, boundary + 1)]
        new = fill(log, 150, start=1000)
        assert min(new) == boundary + 1
        expected = [(k, model[k]) for k in range(1, boundary + 1)] + sorted(new.items())
        assert read_all(log) == expected
    with wal.open(d, segment_bytes=4096) as log:
        assert read_all(log) == expected
        assert entries_in_files(d) == expected
        # After truncate_before, truncating to just before the first LSN empties the log.
        log.truncate_before(log.last_lsn)
        first = log.first_lsn
        assert first > 1
        with pytest.raises(ValueError):
            log.truncate_after(first - 2)
        log.truncate_after(first - 1)
        assert (log.first_lsn, log.last_lsn) == (first, first - 1)
        assert read_all(log, from_lsn=first) == []
        assert log.append(b"again") == first
    with wal.open(d) as log:
        assert (log.first_lsn, log.last_lsn) == (first, first)
        assert read_all(log, from_lsn=first) == [(first, b"again")]


def _write_marker(d: Path, lsn: int) -> None:
    """Do what truncate_after does first: a durable TRUNCATE marker naming the LSN."""
    fs = FileSystem()
    fs.write_file(str(d / TRUNCATE_MARKER), str(lsn).encode())
    fs.fsync_dir(str(d))


def test_open_finishes_an_interrupted_truncate_after(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        model = fill(log, 200)
    segs = list_segments(str(d))
    # 1. Crash right after the marker became durable: nothing cut yet.
    cut = segs[5].first_lsn + 1
    _write_marker(d, cut)
    with wal.open(d, segment_bytes=4096) as log:
        assert log.last_lsn == cut
        assert read_all(log) == [(k, model[k]) for k in range(1, cut + 1)]
        assert not os.path.exists(d / TRUNCATE_MARKER)
        assert log.append(b"x") == cut + 1
    # 2. Crash half way: the later segments are gone, the kept one not yet cut.
    cut2 = segs[2].first_lsn + 2
    _write_marker(d, cut2)
    for s in list_segments(str(d))[3:]:
        os.unlink(s.path)
        if os.path.exists(index_path(s.path)):
            os.unlink(index_path(s.path))
    with wal.open(d) as log:
        assert log.last_lsn == cut2
        assert read_all(log) == [(k, model[k]) for k in range(1, cut2 + 1)]
        assert not os.path.exists(d / TRUNCATE_MARKER)
    # 3. Crash after the cut, before the marker was removed: finishing is idempotent.
    _write_marker(d, cut2)
    with wal.open(d) as log:
        assert log.last_lsn == cut2
        assert log.append(b"y") == cut2 + 1
    with wal.open(d) as log:
        assert read_all(log)[-2:] == [(cut2, model[cut2]), (cut2 + 1, b"y")]


class _FailingUnlinkFS(FileSystem):
    """Fails the first unlink of a segment file: truncate_after dies after its
    marker is durable, as a crash would leave it."""

    def __init__(self) -> None:
        self.armed = False

    def unlink(self, path: str) -> None:
        if self.armed and path.endswith(".wal"):
            self.armed = False
            raise OSError(5, "injected EIO", path)
        super().unlink(path)


def test_truncate_after_failure_is_finished_by_next_open(tmp_path: Path) -> None:
    d = tmp_path / "log"
    fs = _FailingUnlinkFS()
    log = wal.open(d, segment_bytes=4096, fs=fs)
    model = fill(log, 120)
    cut = list_segments(str(d))[2].first_lsn + 1
    fs.armed = True
    with pytest.raises(LogFailedError):
        log.truncate_after(cut)
    with pytest.raises(LogFailedError):
        log.append(b"refused")
    log.close()
    assert os.path.exists(d / TRUNCATE_MARKER)
    with wal.open(d) as log:
        assert log.last_lsn == cut
        assert read_all(log) == [(k, model[k]) for k in range(1, cut + 1)]
        assert log.append(b"z") == cut + 1


def test_empty_truncate_marker_left_by_a_crash(tmp_path: Path) -> None:
    """truncate_after writes its marker with FileSystem.write_file, which is not
    atomic (create, then write, then fsync): a crash in between leaves an empty
    TRUNCATE file. truncate_after had not returned, so the log must open (as it
    was before the call); instead open refuses."""
    d = tmp_path / "log"
    with wal.open(d) as log:
        model = fill(log, 20)
    (d / TRUNCATE_MARKER).write_bytes(b"")
    with wal.open(d) as log:
        assert read_all(log) == sorted(model.items())
        assert log.append(b"x") == 21
    assert not os.path.exists(d / TRUNCATE_MARKER)


# -- stats, close, context manager ------------------------------------------------


def test_stats(tmp_path: Path) -> None:
    with wal.open(tmp_path / "log", segment_bytes=4096) as log:
        st = log.stats()
        assert STATS_KEYS <= set(st)
        assert (st["appends"], st["groups"], st["avg_group"]) == (0, 0, 0.0)
        fill(log, 100)
        log.append_batch([b"a", b"b", b"c"])
        st = log.stats()
        assert st["appends"] == 103 and st["groups"] == 101
        assert st["max_group"] == 3
        assert st["avg_group"] == pytest.approx(103 / 101)
        assert st["fsyncs"] >= 101, "sync='always': at least one fsync per group"
        assert st["bytes"] > 100 * 40
        assert st["last_lsn"] == st["durable_lsn"] == 103 and st["first_lsn"] == 1
        assert st["sync"] == "always" and st["rolls"] >= 3 and st["segments"] == st["rolls"] + 1
        assert 0 < st["fsync_p50_ms"] <= st["fsync_p99_ms"]
        assert st["dropped_bytes_at_open"] == 0


def test_context_manager_and_closed_errors(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with pytest.raises(RuntimeError):
        with wal.open(d) as log:
            log.append(b"kept")
            raise RuntimeError("boom")
    assert log.closed
    with wal.open(d) as log:  # the lock was released
        assert read_all(log) == [(1, b"kept")]
        reader = log.read()  # created before close, iterated after
    assert log.closed
    log.close()  # idempotent
    calls = []
    for call in (
        lambda: log.append(b"x"),
        lambda: log.append_batch([b"x"]),
        lambda: log.append_nowait(b"x", lambda lsn, err: calls.append(lsn)),
        lambda: list(log.read()),
        lambda: list(log.read_entries()),
        lambda: list(reader),
        log.sync,
        lambda: log.truncate_before(1),
        lambda: log.truncate_after(0),
    ):
        with pytest.raises(ClosedError):
            call()
    assert calls == []
    assert isinstance(log.stats(), dict)
    with wal.open(d) as log:
        assert log.last_lsn == 1


# -- durability modes --------------------------------------------------------------


def _wait_until(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_sync_batch_flusher_interval(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, sync="batch", sync_interval=10, segment_bytes=8192) as log:
        model = fill(log, 60)
        assert log.last_lsn == 60
        assert _wait_until(lambda: log.durable_lsn == 60), "the flusher catches up"
        assert _wait_until(lambda: wal.read_durable_lsn(str(d)) == 60)
        assert read_all(log) == sorted(model.items())
        assert log.stats()["sync"] == "batch"
    with wal.open(d) as log:
        assert read_all(log) == sorted(model.items())


def test_sync_batch_flusher_bytes_and_explicit_sync(tmp_path: Path) -> None:
    d = tmp_path / "log"
    # The interval never fires during the test: only sync_bytes and sync() make data durable.
    with wal.open(d, sync="batch", sync_interval=3_600_000, sync_bytes=1 << 30) as log:
        fill(log, 20)
        time.sleep(0.05)
        assert log.durable_lsn == 0 and log.last_lsn == 20
        assert read_all(log) == [], "readers see only durable entries"
        assert len(read_all(log, durable_only=False)) == 20
        assert wal.read_durable_lsn(str(d)) == 0
        assert log.sync() == 20
        assert log.durable_lsn == 20 and wal.read_durable_lsn(str(d)) == 20
        assert [k for k, _ in read_all(log)] == list(range(1, 21))
    with wal.open(d, sync="batch", sync_interval=3_600_000, sync_bytes=4096) as log:
        for i in range(21, 41):
            log.append(pl(i, 1000))  # 20 KB: over sync_bytes several times
        assert _wait_until(lambda: log.durable_lsn >= 24), "sync_bytes wakes the flusher"


def test_sync_none(tmp_path: Path) -> None:
    d = tmp_path / "log"
    with wal.open(d, sync="none", segment_bytes=4096) as log:
        model = fill(log, 100)
        assert log.last_lsn == 100
        st = log.stats()
        # Rolls seal (and fsync) segments; nothing else syncs in this mode.
        assert st["fsyncs"] == st["rolls"]
        durable = log.durable_lsn
        assert durable < 100
        assert [k for k, _ in read_all(log)] == list(range(1, durable + 1))
        assert read_all(log, durable_only=False) == sorted(model.items())
        assert list(log.read(durable + 1, durable_only=False)) == [(k, model[k]) for k in range(durable + 1, 101)]
        assert wal.read_durable_lsn(str(d)) == durable
        assert log.sync() == 100
        assert wal.read_durable_lsn(str(d)) == 100
        log.append(b"last")
    # close syncs
    assert wal.read_durable_lsn(str(d)) == 101
    with wal.open(d) as log:
        assert log.durable_lsn == 101
        assert read_all(log)[-1] == (101, b"last")


def test_read_durable_lsn_from_another_process(tmp_path: Path) -> None:
    d = tmp_path / "log"
    assert wal.read_durable_lsn(str(d)) is None  # no log yet
    code = "import sys, wal; print(wal.read_durable_lsn(sys.argv[1]))"
    with wal.open(d, segment_bytes=4096) as log:
        fill(log, 77)
        out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, check=True,
                             timeout=60)
        assert out.stdout.strip() == "77"
        log.truncate_after(70)
        out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, check=True,
                             timeout=60)
        assert out.stdout.strip() == "70"
    assert wal.read_durable_lsn(str(d)) == 70
    # A torn DURABLE file (its check word does not match) reads as unknown, never as a wrong LSN.
    data = bytearray((d / "DURABLE").read_bytes())
    data[0] ^= 1
    (d / "DURABLE").write_bytes(bytes(data))
    assert wal.read_durable_lsn(str(d)) is None


def test_durable_only_false_sees_written_entries(tmp_path: Path) -> None:
    d = tmp_path / "log"
    seen = []
    with wal.open(d, sync="none") as log:
        log.append(b"a")
        log.append_nowait(b"b", lambda lsn, err: seen.append((lsn, err)))
        log.sync()
        assert seen == [(2, None)]
        log.append(b"c")
        assert read_all(log) == [(1, b"a"), (2, b"b")]
        assert read_all(log, durable_only=False) == [(1, b"a"), (2, b"b"), (3, b"c")]
        assert [e.lsn for e in log.read_entries(durable_only=False)] == [1, 2, 3]


def test_reads_concurrent_with_appends_and_rolls(tmp_path: Path) -> None:
    """A reader running beside the writer sees a gap-free prefix with the right payloads."""
    d = tmp_path / "log"
    errors: list[BaseException] = []
    stop = threading.Event()
    with wal.open(d, segment_bytes=4096) as log:

        def reader() -> None:
            try:
                while not stop.is_set():
                    got = list(log.read())
                    assert [k for k, _ in got] == list(range(1, len(got) + 1))
                    assert all(p == pl(k, 30 + k % 300) for k, p in got)
                    got = list(log.read(max(1, len(got) - 5), durable_only=False))
                    assert all(p == pl(k, 30 + k % 300) for k, p in got)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(1, 301):
                assert log.append(pl(i, 30 + i % 300)) == i
        finally:
            stop.set()
            t.join()
    assert not errors, errors[0]


# -- reading the files without the log object (wal.read_log) ----------------------------


def test_read_log_beside_a_live_writer(tmp_path: Path) -> None:
    d = tmp_path / "log"
    assert list(wal.read_log(str(tmp_path))) == []  # no segment at all
    with wal.open(d, segment_bytes=4096, sync="none") as log:
        model = fill(log, 150)
        durable = log.durable_lsn
        assert durable < 150
        # Up to the published durable LSN only, unless asked otherwise.
        assert [(e.lsn, e.payload) for e in wal.read_log(str(d))] == [(k, model[k]) for k in range(1, durable + 1)]
        assert [(e.lsn, e.payload) for e in wal.read_log(str(d), durable_only=False)] == sorted(model.items())
        log.sync()
        assert [(e.lsn, e.payload) for e in wal.read_log(str(d), 40, 60)] == [(k, model[k]) for k in range(40, 61)]
        assert [e.lsn for e in wal.read_log(str(d), 149)] == [149, 150]
        assert list(wal.read_log(str(d), 151)) == []
        assert [e.payload for e in wal.read_log(str(d))] == [model[k] for k in range(1, 151)]
        log.truncate_before(60)
        first = log.first_lsn
        with pytest.raises(LogGapError) as gap:
            list(wal.read_log(str(d), 1))
        assert (gap.value.first_missing, gap.value.first_available) == (1, first)
        assert [e.lsn for e in wal.read_log(str(d), first)] == list(range(first, 151))
    segs = list_segments(str(d))
    os.unlink(segs[1].path)
    with pytest.raises(CorruptionError, match=f"LSNs {segs[1].first_lsn}..{segs[2].first_lsn - 1} are missing"):
        list(wal.read_log(str(d), first))


def test_reader_overtaken_by_truncate_before(tmp_path: Path) -> None:
    """A read that reaches a segment truncate_before deleted meanwhile gets a
    LogGapError saying so (never a bare FileNotFoundError or wrong data)."""
    with wal.open(tmp_path / "log", segment_bytes=4096) as log:
        model = fill(log, 200)
        reader = log.read()
        got = [next(reader) for _ in range(3)]
        assert log.truncate_before(150) > 0
        with pytest.raises(LogGapError, match="truncate_before"):
            got.extend(reader)
        assert got == [(k, model[k]) for k in range(1, len(got) + 1)]


def _cached_bytes(path: str) -> int | None:
    """How much of ``path`` the page cache holds (util-linux ``fincore``), or None without it."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             capture_output=True, text=True, check=True).stdout
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None
    return int(out.split()[0])


def test_sealed_segments_leave_the_page_cache(tmp_path: Path) -> None:
    """A sealed segment's pages are dropped from the page cache once synced
    (wal/segment_writer.py: seal), so a growing log does not push the state
    machine's pages out; the active segment, which readers tail, stays."""
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=1 << 20, sync="none") as log:
        payload = os.urandom(4000)
        for _ in range(4 * 256 + 10):  # ~4 MiB: three rolls at least
            log.append(payload)
        segs = list_segments(str(d))
        assert len(segs) >= 3
        kind = subprocess.run(["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True).stdout.strip()
        if kind not in ("ext2/ext3", "xfs", "btrfs"):  # (tmpfs is the page cache; overlays may not pass the hint)
            pytest.skip(f"{d} is on {kind or 'an unknown file system'}, not a disk file system")
        cached = [_cached_bytes(s.path) for s in segs]
        if None in cached:
            pytest.skip("fincore (util-linux) is not installed")
        sealed = [os.path.getsize(s.path) for s in segs[:-1]]
        assert all(c is not None and c <= size // 10 for c, size in zip(cached, sealed)), (cached, sealed)
        assert list(log.read(1, 5)) and log.last_lsn == 4 * 256 + 10  # still read back whole
