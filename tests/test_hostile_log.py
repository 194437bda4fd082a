"""Hostile input to every reader of the log's files.

Random bytes and random mutations of real segment and index files (and of
the DURABLE and TRUNCATE files) are fed to wal.record.RecordReader,
wal.segment (read_header, iter_entries, scan_segment, read_index,
read_durable_lsn, read_log), wal.open (strict and prefix recovery), wal.verify and
wal.repair. The rules:

* only walkv's errors (WalkvError subclasses) are raised, never another
  exception;
* nothing is silently altered: whatever a reader returns is what was
  written, at its LSN (CRC-32C and LSN checks make forging improbable);
* memory stays bounded: a length field claiming gigabytes allocates nothing;
* a segment from another store placed in the directory is refused, naming it.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal
from wal import iter_entries, list_segments, read_durable_lsn, read_header, read_index, read_log
from wal.crc import crc32c, mask
from wal.errors import CorruptionError, WalkvError
from wal.index import scan_segment
from wal.record import BLOCK_SIZE, FIRST, FULL, LAST, MIDDLE
from wal.record_reader import RecordReader
from wal.segment import index_path

SEGMENT_BYTES = 4096
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _payload(i: int) -> bytes:
    size = [0, 10, 200, 3000, 40000][i % 5]
    return (b"%d:" % i + bytes(range(256)) * (size // 256 + 1))[:max(size, 3)]


_TEMPLATE: dict = {}


def _template() -> dict:
    """A real log: several sealed segments with indexes, fragmented records,
    closed cleanly (so the active segment has an index too). Built once; not
    a fixture, so that hypothesis does not print it in a falsifying example."""
    if not _TEMPLATE:
        import tempfile

        d = os.path.join(tempfile.mkdtemp(prefix="walkv-hostile-"), "log")
        with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
            for i in range(40):
                log.append(_payload(i))
            log.append_batch([_payload(i) for i in range(40, 50)])
        files = {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}
        _TEMPLATE.update(dir=d, files=files, entries={i + 1: _payload(i) for i in range(50)})
    return _TEMPLATE


@pytest.fixture(scope="module", autouse=True)
def _cleanup_template():
    yield
    if _TEMPLATE:
        shutil.rmtree(os.path.dirname(_TEMPLATE["dir"]), ignore_errors=True)
        _TEMPLATE.clear()


def _copy(template: dict, dst: str) -> str:
    shutil.copytree(template["dir"], dst)
    return dst


# -- mutations -----------------------------------------------------------------------


@st.composite
def mutations(draw, size: int):
    """A list of edits to a file of ``size`` bytes: flipped bits, overwritten
    ranges (random or zeros), a truncation, an inserted or deleted range, a
    block duplicated elsewhere."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "overwrite", "zeros", "truncate", "insert", "delete", "dup"]))
        off = draw(st.integers(0, max(0, size - 1)))
        if kind == "flip":
            edits.append(("flip", off, draw(st.integers(0, 7))))
        elif kind in ("overwrite", "insert"):
            edits.append((kind, off, draw(st.binary(min_size=1, max_size=64))))
        elif kind == "zeros":
            edits.append(("zeros", off, draw(st.sampled_from([1, 7, 512, 4096]))))
        elif kind == "truncate":
            edits.append(("truncate", off, None))
        elif kind == "delete":
            edits.append(("delete", off, draw(st.integers(1, 600))))
        else:
            edits.append(("dup", off, draw(st.integers(0, max(0, size - 1)))))
    return edits


def _apply(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for kind, off, arg in edits:
        off = min(off, max(0, len(b) - 1)) if b else 0
        if kind == "flip" and b:
            b[off] ^= 1 << arg
        elif kind == "overwrite":
            b[off : off + len(arg)] = arg
        elif kind == "zeros":
            b[off : off + arg] = bytes(len(b[off : off + arg]))
        elif kind == "truncate":
            del b[off:]
        elif kind == "insert":
            b[off:off] = arg
        elif kind == "delete":
            del b[off : off + arg]
        elif kind == "dup":
            src = min(arg, max(0, len(b) - 1))
            piece = b[src : src + 512]
            b[off : off + len(piece)] = piece
    return bytes(b)


def _read_all_entries(d: str) -> dict[int, bytes]:
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
        return dict(log.read(log.first_lsn)) if log.last_lsn >= log.first_lsn else {}


# -- the record reader -------------------------------------------------------------------


@SETTINGS
@given(data=st.binary(max_size=70000), skip=st.booleans(), zeros_end=st.booleans(),
       start_block=st.integers(0, 2))
def test_record_reader_random_bytes(data, skip, zeros_end, start_block):
    start = min(start_block * BLOCK_SIZE, len(data))
    reader = RecordReader(io.BytesIO(data), path="random", start_offset=start, skip_corrupt=skip,
                          zeros_end=zeros_end, max_record_bytes=1 << 20)
    try:
        for offset, payload in reader.records():
            assert start <= offset < len(data) and len(payload) <= 1 << 20
    except CorruptionError as e:
        assert not skip, f"skip_corrupt=True raised {e}"
        assert e.path == "random" and e.offset is not None
    assert reader.end_offset <= len(data)


# -- segment and index readers --------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_mutated_segment_every_reader(tmp_path_factory, data):
    template = _template()
    names = [n for n in template["files"] if n.endswith(".wal")]
    name = data.draw(st.sampled_from(names))
    edits = data.draw(mutations(len(template["files"][name])))
    path = str(tmp_path_factory.mktemp("seg") / name)
    with open(path, "wb") as f:
        f.write(_apply(template["files"][name], edits))
    entries = template["entries"]
    for reader in (
        lambda fh: read_header(fh, path),
        lambda fh: list(iter_entries(fh, path)),
        lambda fh: scan_segment(fh, path),
        lambda fh: list(RecordReader(fh, path=path, zeros_end=True)),
        lambda fh: list(RecordReader(fh, path=path, skip_corrupt=True)),
    ):
        with open(path, "rb") as fh:
            try:
                got = reader(fh)
            except WalkvError:
                continue
        if isinstance(got, list) and got and isinstance(got[0], wal.Entry):
            for e in got:
                assert entries.get(e.lsn) == e.payload, f"LSN {e.lsn} read back altered"


@SETTINGS
@given(data=st.data())
def test_mutated_index_is_rebuilt_never_trusted_wrongly(tmp_path_factory, data):
    template = _template()
    names = [n for n in template["files"] if n.endswith(".idx")]
    name = data.draw(st.sampled_from(names))
    edits = data.draw(mutations(len(template["files"][name])))
    d = str(tmp_path_factory.mktemp("idx") / "log")
    _copy(template, d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(_apply(template["files"][name], edits))
    index = read_index(os.path.join(d, name))  # None when damaged; never raises
    assert index is None or index.points == sorted(index.points)
    # The log still reads back exactly, whatever the index says.
    try:
        got = _read_all_entries(d)
    except WalkvError:
        return  # a (CRC-valid) index that lies is caught as corruption, not trusted
    assert got == template["entries"]


@SETTINGS
@given(data=st.data(), mode=st.sampled_from(["strict", "prefix"]))
def test_mutated_log_directory_open_recover_verify_repair(tmp_path_factory, data, mode):
    """Mutate one file of a real log directory; every entry open returns is
    the original at its LSN, and only walkv's errors are raised (prefix
    recovery never fails on damaged data: open reads only what it must, so
    damage inside a sealed segment is found, as CorruptionError naming it,
    when that segment is read)."""
    template = _template()
    names = [n for n in template["files"] if n.endswith((".wal", ".idx", "DURABLE"))] + ["TRUNCATE"]
    name = data.draw(st.sampled_from(names))
    d = str(tmp_path_factory.mktemp("dir") / "log")
    _copy(template, d)
    original = template["files"].get(name, b"12")
    with open(os.path.join(d, name), "wb") as f:
        f.write(_apply(original, data.draw(mutations(len(original)))))
    assert isinstance(wal.verify(d), list)
    try:  # the lock-free reader (Spark executors, other processes)
        for e in read_log(d):
            assert template["entries"].get(e.lsn) == e.payload, f"read_log: LSN {e.lsn} altered"
    except CorruptionError as e:
        assert e.path is not None
    try:
        log = wal.open(d, segment_bytes=SEGMENT_BYTES, recovery=mode)
    except WalkvError as e:
        assert mode == "strict" or name == "TRUNCATE", f"recovery='prefix' refused to open: {e!r}"
        assert wal.repair(d, dry_run=True) is not None
        return
    with log:
        got: dict[int, bytes] = {}
        try:
            for lsn, payload in log.read(log.first_lsn):
                got[lsn] = payload
        except CorruptionError as e:
            assert e.path is not None and e.offset is not None
        lsn = log.append(b"after")
        assert list(log.read(lsn)) == [(lsn, b"after")]
    for k, v in got.items():
        assert template["entries"].get(k) == v, f"LSN {k} altered by a mutation of {name}"


def test_durable_file_garbage(tmp_path):
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
        log.append(b"x")
    assert read_durable_lsn(str(d)) == 1
    for junk in (b"", b"\x00" * 3, os.urandom(16), struct.pack("<QQ", 5, 5), os.urandom(1 << 20)):
        (d / "DURABLE").write_bytes(junk)
        assert read_durable_lsn(str(d)) is None or isinstance(read_durable_lsn(str(d)), int)
        with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
            assert list(log.read()) == [(1, b"x")]


# -- lengths claiming gigabytes ----------------------------------------------------------------


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _fragment(kind: int, payload: bytes) -> bytes:
    crc = mask(crc32c(bytes([kind]) + payload))
    return struct.pack("<IHB", crc, len(payload), kind) + payload


def test_endless_fragmented_record_is_refused_at_the_limit():
    """FIRST then MIDDLE fragments forever (each CRC-valid): the reader stops
    at max_record_bytes, with a CorruptionError, having held about that much."""
    block = _fragment(FIRST, bytes(BLOCK_SIZE - 7))
    middle = _fragment(MIDDLE, bytes(BLOCK_SIZE - 7))
    data = block + middle * 63  # 2 MiB of one record that never ends
    limit = 256 << 10

    def read():
        with pytest.raises(CorruptionError):
            list(RecordReader(io.BytesIO(data), path="f", max_record_bytes=limit))

    assert _peak(read) < 4 * limit + (1 << 20) - len(data) // 2  # not the whole file's worth of record


def test_length_fields_past_the_block_are_corruption_not_allocation():
    # The framing's length is 16 bits and bounded by the block: 0xFFFF is corrupt.
    data = struct.pack("<IHB", 0, 0xFFFF, FULL) + b"x" * 70000
    with pytest.raises(CorruptionError):
        list(RecordReader(io.BytesIO(data), path="f"))
    # LAST without FIRST, MIDDLE without FIRST.
    for kind in (MIDDLE, LAST):
        with pytest.raises(CorruptionError):
            list(RecordReader(io.BytesIO(_fragment(kind, b"abc") + _fragment(FULL, b"x")), path="f"))


def test_index_claiming_four_billion_points(tmp_path):
    template = _template()
    name = next(n for n in template["files"] if n.endswith(".idx"))
    d = _copy(template, str(tmp_path / "log"))
    # A CRC-valid index record whose point count says 2**32-1.
    head = struct.pack("<8sHHQQQI", b"WALKVIDX", 1, 0, 1, 10, 4096, 0xFFFFFFFF)
    rec = _fragment(FULL, head + b"\x00" * 32)
    with open(os.path.join(d, name), "wb") as f:
        f.write(rec)
    assert _peak(lambda: read_index(os.path.join(d, name))) < 1 << 20
    assert read_index(os.path.join(d, name)) is None
    assert _read_all_entries(d) == template["entries"]


def test_segment_entry_of_claimed_huge_size_is_bounded(tmp_path):
    """A segment whose record reassembles past max_record_bytes: open refuses
    or cuts it as a torn tail, holding at most about the limit in memory."""
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=SEGMENT_BYTES, max_record_bytes=64 << 10) as log:
        log.append(b"ok")
    seg = list_segments(str(d))[-1].path
    with open(seg, "r+b") as f:
        data = f.read()
        end = data.rstrip(b"\x00")
        off = len(end)
        f.seek(off)
        f.write(_fragment(FIRST, bytes(BLOCK_SIZE - off % BLOCK_SIZE - 7)))
        for _ in range(8):
            f.write(_fragment(MIDDLE, bytes(BLOCK_SIZE - 7)))
    os.unlink(index_path(seg)) if os.path.exists(index_path(seg)) else None

    def reopen():
        try:
            with wal.open(d, segment_bytes=SEGMENT_BYTES, max_record_bytes=64 << 10) as log:
                assert list(log.read()) == [(1, b"ok")]
        except CorruptionError:
            pass

    assert _peak(reopen) < 4 << 20


# -- a segment from another store ---------------------------------------------------------------------


def _two_logs(tmp_path) -> tuple[str, str]:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d in (a, b):
        with wal.open(d, segment_bytes=SEGMENT_BYTES) as log:
            for i in range(30):
                log.append(_payload(i))
    return a, b


def test_foreign_segment_in_the_middle_is_refused_by_name(tmp_path):
    a, b = _two_logs(tmp_path)
    segs_a, segs_b = list_segments(a), list_segments(b)
    assert len(segs_a) >= 3
    victim = segs_a[1]
    stray = next(s for s in segs_b if s.first_lsn == victim.first_lsn)
    shutil.copy(stray.path, victim.path)
    os.unlink(index_path(victim.path))
    with pytest.raises(CorruptionError) as e:
        wal.open(a, segment_bytes=SEGMENT_BYTES)
    assert e.value.path == victim.path and "another store" in str(e.value)


def test_foreign_segment_as_the_newest_is_refused_by_name(tmp_path):
    """A stray segment that sorts last: the error must name the stray file,
    not blame the store's own segments."""
    a, b = _two_logs(tmp_path)
    last_a = list_segments(a)[-1]
    with wal.open(a, segment_bytes=SEGMENT_BYTES) as log:
        nxt = log.last_lsn + 1
    # Another store's segment that claims to continue this log.
    with wal.open(str(tmp_path / "c"), segment_bytes=SEGMENT_BYTES, start_lsn=nxt) as other:
        other.append(b"from another store")
    stray = list_segments(str(tmp_path / "c"))[-1].path
    dst = os.path.join(a, os.path.basename(stray))
    shutil.copy(stray, dst)
    with pytest.raises(CorruptionError) as e:
        wal.open(a, segment_bytes=SEGMENT_BYTES)
    assert e.value.path == dst, f"the error blames {e.value.path}, not the stray {dst}: {e.value}"
    assert last_a.path != dst


def test_foreign_segment_is_never_read_as_ours_by_verify(tmp_path):
    a, b = _two_logs(tmp_path)
    victim = list_segments(a)[1]
    stray = next(s for s in list_segments(b) if s.first_lsn == victim.first_lsn)
    shutil.copy(stray.path, victim.path)
    problems = wal.verify(a)
    assert problems and "another store" in problems[0] and victim.path in problems[0]
