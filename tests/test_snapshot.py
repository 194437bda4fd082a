"""snapshot/: round trips, range reads, chunk reads from file objects, input
checks, listing, newest-with-fallback, prune and cleanup."""

from __future__ import annotations

import io
import logging
import os
import pickle
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot.layout import DirLock, tmp_dir_name
from wal.errors import CorruptionError, Damage, SnapshotError
from wal.record_reader import RecordReader


def _pairs(n: int, vsize: int = 20) -> list[tuple[bytes, bytes]]:
    return [(b"key%08d" % i, (b"v%d-" % i) * (vsize // 4 + 1)) for i in range(n)]


def _write(parent, lsn, pairs, **kw):
    kw.setdefault("chunk_bytes", 2048)
    kw.setdefault("record_bytes", 256)
    return snapshot.write(parent, lsn, pairs, **kw)


# -- round trips ------------------------------------------------------------

keys = st.binary(min_size=0, max_size=24)
values = st.binary(min_size=0, max_size=300)


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.dictionaries(keys, values, max_size=300),
    chunk_bytes=st.integers(1, 4096),
    record_bytes=st.integers(1, 1024),
    bounds=st.tuples(st.none() | keys, st.none() | keys),
)
def test_round_trip(tmp_path_factory, data, chunk_bytes, record_bytes, bounds):
    parent = tmp_path_factory.mktemp("snaps")
    expected = sorted(data.items())
    info = snapshot.write(parent, 42, iter(expected), chunk_bytes=chunk_bytes,
                          record_bytes=record_bytes, store_id="s1")
    assert info.lsn == 42 and info.count == len(expected)
    assert info.path == os.path.join(str(parent), "snap-00000000000000000042")
    snap = snapshot.open(info.path)
    assert (snap.lsn, snap.count, snap.store_id, len(snap)) == (42, len(expected), "s1", len(expected))
    assert list(snap) == expected
    assert all(type(k) is bytes and type(v) is bytes for k, v in snap)
    # Chunks: disjoint, ordered key ranges that together hold everything.
    assert sum(c.pairs for c in snap.chunks) == len(expected)
    assert [c.index for c in snap.chunks] == list(range(len(snap.chunks)))
    for a, b in zip(snap.chunks, snap.chunks[1:]):
        assert a.last_key < b.first_key
    got = [kv for i in range(len(snap.chunks)) for kv in snap.iter_chunk(i)]
    assert got == expected
    start, stop = bounds
    want = [(k, v) for k, v in expected
            if (start is None or k >= start) and (stop is None or k < stop)]
    assert list(snap.items(start, stop)) == want
    snap.verify()
    assert snapshot.list_snapshots(parent) == [info]


def test_many_chunks_and_records(tmp_path):
    pairs = _pairs(5000, 40)
    info = _write(tmp_path, 9, pairs, chunk_bytes=8192, record_bytes=512)
    snap = snapshot.open(info.path)
    assert len(snap.chunks) > 20
    assert all(c.records > 1 for c in snap.chunks[:-1])
    # Every chunk but the last reached chunk_bytes; none overshoots by more than a record.
    for c in snap.chunks[:-1]:
        assert 8192 <= c.bytes <= 8192 + 2048
    assert sum(c.bytes for c in snap.chunks) == info.bytes == snap.bytes
    assert list(snap) == pairs
    snap.verify()


def test_empty_snapshot(tmp_path):
    info = snapshot.write(tmp_path, 0, [])
    assert (info.count, info.chunks, info.bytes) == (0, 0, 0)
    snap = snapshot.open(info.path)
    assert list(snap) == [] and snap.chunks == () and len(snap) == 0
    assert list(snap.items(b"a", b"z")) == []
    snap.verify()
    assert os.listdir(info.path) == ["MANIFEST"]
    assert snapshot.newest(tmp_path).lsn == 0


def test_record_sizes_follow_record_bytes_when_pair_sizes_jump(tmp_path):
    # Thousands of tiny pairs, then big ones: the writer's slices adapt, and
    # an oversized slice is split, so records stay near record_bytes.
    pairs = [(b"a%06d" % i, b"x") for i in range(3000)]
    pairs += [(b"b%06d" % i, os.urandom(3000)) for i in range(200)]
    pairs += [(b"c%06d" % i, b"") for i in range(3000)]
    info = snapshot.write(tmp_path, 1, pairs, chunk_bytes=1 << 30, record_bytes=4096)
    snap = snapshot.open(info.path)
    assert len(snap.chunks) == 1
    with open(snap.chunk_path(0), "rb") as f:
        sizes = [len(p) for p in RecordReader(f)][1:]
    assert max(sizes) <= 2 * 4096 + 3100
    assert len(sizes) >= (200 * 3000) // (2 * 4096 + 3100)
    assert list(snap) == pairs


def test_one_pair_larger_than_record_bytes(tmp_path):
    pairs = [(b"a", b"x" * 100_000), (b"b", b"y")]
    info = snapshot.write(tmp_path, 1, pairs, record_bytes=10)
    assert list(snapshot.open(info.path)) == pairs


def test_progress_reports_pairs(tmp_path):
    calls = []
    pairs = _pairs(2000)
    _write(tmp_path, 3, pairs, progress=lambda done, total: calls.append((done, total)), total=2000)
    assert calls and calls[-1] == (2000, 2000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_file_and_directory_modes(tmp_path):
    info = _write(tmp_path / "new" / "snaps", 5, _pairs(300))
    assert stat.S_IMODE(os.stat(info.path).st_mode) & 0o077 == 0
    for name in os.listdir(info.path):
        assert stat.S_IMODE(os.stat(os.path.join(info.path, name)).st_mode) == 0o600


def test_chunk_header_identifies_chunk(tmp_path):
    info = _write(tmp_path, 77, _pairs(500))
    snap = snapshot.open(info.path)
    with snap.open_chunk(2) as f:
        header = next(iter(RecordReader(f)))
    assert header[:8] == b"WALKVSNC"
    assert int.from_bytes(header[10:14], "little") == 2
    assert int.from_bytes(header[14:22], "little") == 77


# -- range reads --------------------------------------------------------------


def test_range_reads_skip_chunks_outside_the_range(tmp_path):
    pairs = _pairs(3000)
    info = _write(tmp_path, 1, pairs)
    snap = snapshot.open(info.path)
    n = len(snap.chunks)
    assert n > 10
    mid = snap.chunks[n // 2]
    # Remove every chunk but the middle one: a range inside it must still read.
    for i, c in enumerate(snap.chunks):
        if i != n // 2:
            os.unlink(snap.chunk_path(i))
    lo, hi = mid.first_key, mid.last_key
    got = list(snap.items(lo, hi + b"\x00"))
    assert got == [(k, v) for k, v in pairs if lo <= k <= hi]
    inner = [k for k, _ in got][3:-3]
    assert [k for k, _ in snap.items(inner[0], inner[-1])] == inner[:-1]
    with pytest.raises(CorruptionError, match="missing"):
        list(snap.items(None, hi))


@pytest.mark.parametrize(
    "start,stop",
    [(None, None), (b"key00000100", None), (None, b"key00000100"), (b"key00000100", b"key00000100"),
     (b"key00000200", b"key00000100"), (b"key00000100x", b"key00000200x"), (b"", b"\xff"),
     (b"zzz", None), (None, b"")],
)
def test_range_bounds(tmp_path, start, stop):
    pairs = _pairs(1000)
    snap = snapshot.open(_write(tmp_path, 1, pairs).path)
    want = [(k, v) for k, v in pairs if (start is None or k >= start) and (stop is None or k < stop)]
    assert list(snap.items(start, stop)) == want
    cols = list(snap.columns(start, stop))
    assert [kv for ks, vs in cols for kv in zip(ks, vs)] == want


def test_range_bounds_must_be_bytes(tmp_path):
    snap = snapshot.open(_write(tmp_path, 1, _pairs(10)).path)
    with pytest.raises(TypeError):
        snap.items("a")
    with pytest.raises(TypeError):
        snap.items(None, 5)


# -- one chunk from a file object (what a Spark executor does) ---------------


def test_read_one_chunk_from_bytesio_given_only_its_chunkinfo(tmp_path):
    pairs = _pairs(2000)
    snap = snapshot.open(_write(tmp_path, 5, pairs).path)
    i = len(snap.chunks) // 2
    info = pickle.loads(pickle.dumps(snap.chunks[i]))  # shipped to an executor
    with open(snap.chunk_path(i), "rb") as f:
        data = f.read()
    got = list(snapshot.read_chunk(io.BytesIO(data), info))
    assert got == list(snap.iter_chunk(i))
    assert len(got) == info.pairs and got[0][0] == info.first_key and got[-1][0] == info.last_key
    cols = list(snapshot.read_chunk_columns(io.BytesIO(data), info))
    assert sum(len(k) for k, _ in cols) == info.pairs
    assert all(len(k) == len(v) for k, v in cols)
    # The wrong chunk's info is refused, naming the file given.
    other = snap.chunks[i + 1]
    with pytest.raises(CorruptionError, match=f"says chunk {i} of") as e:
        list(snapshot.read_chunk(io.BytesIO(data), other, path="s3://bucket/x.wkc"))
    assert e.value.path == "s3://bucket/x.wkc" and e.value.offset == 0


def test_read_one_chunk_from_pyarrow_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pairs = _pairs(1500)
    snap = snapshot.open(_write(tmp_path, 5, pairs).path)
    got = []
    for i, c in enumerate(snap.chunks):
        with pa.OSFile(snap.chunk_path(i), "rb") as f:
            got.extend(snapshot.read_chunk(f, c))
    assert got == pairs
    from pyarrow import fs as pafs

    with pafs.LocalFileSystem().open_input_file(snap.chunk_path(1)) as f:
        assert list(snapshot.read_chunk(f, snap.chunks[1])) == list(snap.iter_chunk(1))


def test_read_through_a_uri_file_seam(tmp_path):
    """The reader goes through the read-only seam: a file:// URI (pyarrow)
    opens, lists, verifies and reads the same, and names files as URIs."""
    pytest.importorskip("pyarrow")
    from wal.readfs import resolve

    pairs = _pairs(800)
    _write(tmp_path, 5, pairs[:100])
    info = _write(tmp_path, 9, pairs)
    fs, root = resolve("file://" + str(tmp_path))
    path = fs.join(root, os.path.basename(info.path))
    snap = snapshot.open(path, fs=fs)
    assert list(snap) == pairs and snap.chunks == snapshot.open(info.path).chunks
    assert list(snap.items(pairs[10][0], pairs[20][0])) == pairs[10:20]
    assert snapshot.verify(path, fs=fs).count == len(pairs)
    assert [s.lsn for s in snapshot.list_snapshots(root, fs=fs)] == [5, 9]
    assert snapshot.newest(root, fs=fs).lsn == 9
    assert snapshot.newest(root, fs=fs, max_lsn=8).lsn == 5
    assert snapshot.newest(root, fs=fs, max_lsn=4) is None
    shipped = pickle.loads(pickle.dumps(snap))  # to a Spark executor
    assert list(shipped.iter_chunk(1)) == list(snap.iter_chunk(1))
    os.unlink(snap.chunk_path(2))
    with pytest.raises(CorruptionError, match="missing") as e:
        snapshot.open(path, fs=fs)
    assert e.value.kind is Damage.MISSING and e.value.offset == 0
    assert e.value.path == "file://" + os.path.join(info.path, snap.chunks[2].name)
    with pytest.raises(CorruptionError, match="missing") as e:
        list(snapshot.read_chunk_file(fs, path, snap.chunks[2]))
    assert e.value.kind is Damage.MISSING
    with pytest.raises(SnapshotError, match="no snapshot directory"):
        snapshot.open(fs.join(root, "snap-00000000000000000001"), fs=fs)


# -- writer input checks ------------------------------------------------------


@pytest.mark.parametrize(
    "bad,exc,match",
    [
        ([(b"zb", b"1"), (b"za", b"2")], ValueError, "strictly increasing"),
        ([(b"za", b"1"), (b"za", b"2")], ValueError, "strictly increasing"),
        ([(b"00001", b"1")], ValueError, "strictly increasing"),
        ([(b"za", b"1"), ("zb", b"2")], TypeError, "keys must be bytes"),
        ([(b"za", b"1"), (b"zb", "2")], TypeError, "values must be bytes"),
        ([(b"za", b"1"), (b"zb", 2)], TypeError, "values must be bytes"),
        ([(b"za", b"1"), (b"zb", b"2", b"3")], TypeError, "pairs"),
        ([(b"za", b"1"), b"zb"], TypeError, "pairs"),
        ([(b"za", b"1"), None], TypeError, "pairs"),
        ([(b"za", b"1"), (memoryview(b"zb"), b"2")], TypeError, "keys must be bytes"),
    ],
)
def test_bad_items_raise_and_leave_nothing(tmp_path, bad, exc, match):
    items = [(b"%05d" % i, b"v") for i in range(300)] + bad
    with pytest.raises(exc, match=match):
        _write(tmp_path, 1, items)
    assert os.listdir(tmp_path) == []


def test_bad_items_at_start(tmp_path):
    with pytest.raises(ValueError, match="strictly increasing"):
        _write(tmp_path, 1, [(b"b", b"1"), (b"a", b"2")])
    with pytest.raises(TypeError):
        _write(tmp_path, 1, [("a", b"1")])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kw",
    [dict(lsn=-1), dict(lsn=True), dict(lsn=1.0), dict(lsn=1 << 64), dict(chunk_bytes=0),
     dict(record_bytes=-5), dict(store_id=5), dict(store_id="x" * 300)],
)
def test_bad_arguments(tmp_path, kw):
    args = dict(lsn=1)
    args.update(kw)
    lsn = args.pop("lsn")
    with pytest.raises(ValueError):
        snapshot.write(tmp_path, lsn, [], **args)
    assert os.listdir(tmp_path) == []


def test_items_iterator_error_propagates_and_cleans_up(tmp_path):
    def gen():
        yield from _pairs(500)
        raise RuntimeError("cursor died")

    with pytest.raises(RuntimeError, match="cursor died"):
        _write(tmp_path, 1, gen())
    assert os.listdir(tmp_path) == []


def test_same_lsn_twice(tmp_path):
    first = _write(tmp_path, 8, _pairs(100))
    with pytest.raises(SnapshotError, match="already exists"):
        _write(tmp_path, 8, _pairs(50))
    assert _write(tmp_path, 8, iter(()), exist_ok=True) == first
    assert snapshot.list_snapshots(tmp_path) == [first]
    assert snapshot.open(first.path).count == 100


def test_broken_snapshot_at_same_lsn_is_replaced(tmp_path):
    first = _write(tmp_path, 8, _pairs(100))
    os.unlink(os.path.join(first.path, "MANIFEST"))
    second = _write(tmp_path, 8, _pairs(60))
    assert snapshot.open(second.path).count == 60
    assert sorted(os.listdir(tmp_path)) == ["snap-00000000000000000008"]


# -- open errors ----------------------------------------------------------------


def test_open_errors(tmp_path):
    with pytest.raises(SnapshotError, match="no snapshot"):
        snapshot.open(tmp_path / "snap-00000000000000000001")
    with pytest.raises(SnapshotError, match="not a snapshot directory"):
        snapshot.open(tmp_path)
    tmp = tmp_path / tmp_dir_name(3)
    tmp.mkdir()
    with pytest.raises(SnapshotError, match="not a snapshot directory"):
        snapshot.open(tmp)
    empty = tmp_path / "snap-00000000000000000004"
    empty.mkdir()
    with pytest.raises(CorruptionError, match="no MANIFEST"):
        snapshot.open(empty)


# -- listing, newest, prune, cleanup -----------------------------------------------


def test_list_snapshots_oldest_first_and_only_valid(tmp_path, caplog):
    infos = [_write(tmp_path, lsn, _pairs(50 + lsn)) for lsn in (30, 5, 100, 7)]
    (tmp_path / "unrelated.txt").write_text("x")
    (tmp_path / "snap-12").mkdir()  # not 20 digits: not ours
    (tmp_path / tmp_dir_name(200)).mkdir()  # incomplete: never listed
    (tmp_path / "snap-00000000000000000150").mkdir()  # committed name, no manifest: broken
    with caplog.at_level(logging.WARNING, logger="walkv.snapshot"):
        listed = snapshot.list_snapshots(tmp_path)
    assert [i.lsn for i in listed] == [5, 7, 30, 100]
    assert listed == sorted(infos, key=lambda i: i.lsn)
    assert "snap-00000000000000000150" in caplog.text
    assert snapshot.list_snapshots(tmp_path / "missing") == []
    assert snapshot.newest(tmp_path / "missing") is None


def test_newest_falls_back_past_a_broken_newest(tmp_path, caplog):
    for lsn in (10, 20, 30):
        _write(tmp_path, lsn, _pairs(200 + lsn))
    manifest = tmp_path / "snap-00000000000000000030" / "MANIFEST"
    data = bytearray(manifest.read_bytes())
    data[len(data) // 2] ^= 0x01
    manifest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="walkv.snapshot"):
        snap = snapshot.newest(tmp_path)
    assert snap.lsn == 20 and snap.count == 220
    assert "snap-00000000000000000030" in caplog.text and "falling back" in caplog.text


def test_newest_verify_falls_back_past_damaged_chunk_data(tmp_path, caplog):
    for lsn in (10, 20):
        _write(tmp_path, lsn, _pairs(500))
    snap = snapshot.open(tmp_path / "snap-00000000000000000020")
    path = snap.chunk_path(3)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0x40
    open(path, "wb").write(bytes(data))
    assert snapshot.newest(tmp_path).lsn == 20  # opening does not read chunk data
    with caplog.at_level(logging.WARNING, logger="walkv.snapshot"):
        assert snapshot.newest(tmp_path, verify=True).lsn == 10
    assert "chunk-000003.wkc" in caplog.text


def test_prune_keeps_the_newest_k(tmp_path):
    for lsn in (1, 2, 3, 4, 5):
        _write(tmp_path, lsn, _pairs(40))
    (tmp_path / "keep-me").write_text("not ours")
    removed = snapshot.prune(tmp_path, keep=2)
    assert [i.lsn for i in snapshot.list_snapshots(tmp_path)] == [4, 5]
    assert len(removed) == 3
    assert sorted(os.listdir(tmp_path)) == ["keep-me", "snap-00000000000000000004", "snap-00000000000000000005"]
    assert snapshot.prune(tmp_path, keep=2) == []
    snapshot.prune(tmp_path, keep=1)
    assert [i.lsn for i in snapshot.list_snapshots(tmp_path)] == [5]
    with pytest.raises(ValueError):
        snapshot.prune(tmp_path, keep=0)


def test_prune_counts_only_valid_snapshots_and_removes_old_broken_ones(tmp_path):
    for lsn in (1, 2, 3, 4):
        _write(tmp_path, lsn, _pairs(40))
    os.unlink(tmp_path / "snap-00000000000000000004" / "MANIFEST")  # newest is broken
    os.unlink(tmp_path / "snap-00000000000000000001" / "MANIFEST")  # oldest is broken
    snapshot.prune(tmp_path, keep=2)
    # Kept: the two newest *valid* (2, 3); the broken newer one stays as evidence.
    assert sorted(os.listdir(tmp_path)) == [
        "snap-00000000000000000002", "snap-00000000000000000003", "snap-00000000000000000004"]


def test_cleanup_incomplete_removes_leftovers_but_not_live_writers_or_strangers(tmp_path):
    done = _write(tmp_path, 1, _pairs(40))
    dead_tmp = tmp_path / tmp_dir_name(2)
    dead_tmp.mkdir()
    (dead_tmp / "chunk-000000.wkc").write_bytes(b"partial")
    dead_del = tmp_path / "snap-00000000000000000001.del-abcdef"
    dead_del.mkdir()
    (dead_del / "MANIFEST").write_bytes(b"x")
    live_tmp = tmp_path / tmp_dir_name(3)
    live_tmp.mkdir()
    (tmp_path / "snap-00000000000000000004.tmp-notours!").mkdir()
    (tmp_path / "README").write_text("x")
    lock = DirLock(str(live_tmp))
    try:
        removed = snapshot.cleanup_incomplete(tmp_path)
    finally:
        lock.release()
    assert sorted(removed) == sorted([str(dead_tmp), str(dead_del)])
    assert sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(done.path), live_tmp.name, "snap-00000000000000000004.tmp-notours!", "README"])
    assert snapshot.cleanup_incomplete(tmp_path) == [str(live_tmp)]
