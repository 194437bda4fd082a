"""snapshot/: damaged and hostile input. Every kind of damage is found and
reported as CorruptionError naming the file (never another exception, never
a silent short read), and no length field makes a reader allocate what it
claims."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot.chunk import ChunkInfo, encode_header
from snapshot.manifest import decode_manifest
from wal.crc import crc32c
from wal.errors import SNAPSHOT_HINT, CorruptionError, Damage, SnapshotError
from wal.record import BLOCK_SIZE, FIRST, MIDDLE, RecordWriter, fragment_crc
from wal.record_reader import RecordReader

PAIRS = [(b"key%06d" % i, b"value-%d" % i * 3) for i in range(1200)]


@pytest.fixture
def snap(tmp_path):
    info = snapshot.write(tmp_path, 7, PAIRS, chunk_bytes=4096, record_bytes=400)
    s = snapshot.open(info.path)
    assert len(s.chunks) >= 6
    return s


def _frame(payloads: list[bytes]) -> bytes:
    out = io.BytesIO()
    w = RecordWriter(out, offset=0)
    for p in payloads:
        w.add_record(p)
    return out.getvalue()


def _manifest_body(path: str) -> dict:
    with open(os.path.join(path, "MANIFEST"), "rb") as f:
        (payload,) = list(RecordReader(f))
    return msgpack.unpackb(payload, raw=False)


def _put_manifest(path: str, body) -> None:
    with open(os.path.join(path, "MANIFEST"), "wb") as f:
        f.write(_frame([msgpack.packb(body, use_bin_type=True)]))


def _mutate(path: str, fn) -> None:
    body = _manifest_body(path)
    fn(body)
    _put_manifest(path, body)


def _flip(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


# -- chunk files --------------------------------------------------------------


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10_000), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_bit_flip_in_a_chunk_is_found_by_verify(snap, which, where, bit):
    i = which % len(snap.chunks)
    path = snap.chunk_path(i)
    offset = int(where * snap.chunks[i].bytes)
    _flip(path, offset, bit)
    try:
        with pytest.raises(CorruptionError) as e:
            snap.verify()
        assert e.value.path == path
        with pytest.raises(CorruptionError):
            list(snapshot.open(snap.path))
    finally:
        _flip(path, offset, bit)
    snap.verify()


def test_bit_flip_in_data_names_file_and_offset(snap):
    path = snap.chunk_path(2)
    _flip(path, 200)
    with pytest.raises(CorruptionError, match="checksum mismatch") as e:
        snap.verify()
    assert e.value.path == path and e.value.offset is not None and e.value.offset <= 200
    assert "chunk-000002.wkc" in str(e.value)
    # Pairs before the damaged record were yielded; none after it.
    got = []
    with pytest.raises(CorruptionError):
        for kv in snap:
            got.append(kv)
    assert got == PAIRS[: len(got)] and len(got) < snap.chunks[0].pairs + snap.chunks[1].pairs + snap.chunks[2].pairs


def test_bit_flip_in_block_padding_is_found_by_the_file_checksum():
    # A record that leaves < 7 bytes at a block's end pads it with zeros that
    # no fragment CRC covers; the whole-file CRC-32C in the manifest does.
    # Header record: 7 + 22 bytes; data record 1: 7 + 9 + n bytes; end at BLOCK_SIZE - 3.
    n = BLOCK_SIZE - 3 - 29 - 7 - 9
    data, info = _chunk([[[b"a"], [b"x" * n]], [[b"z"], [b"y"]]], pairs=2)
    pad = BLOCK_SIZE - 3
    assert data[pad:BLOCK_SIZE] == b"\x00\x00\x00"
    assert list(snapshot.read_chunk(io.BytesIO(data), info)) == [(b"a", b"x" * n), (b"z", b"y")]
    damaged = data[:pad] + b"\x01" + data[pad + 1:]
    with pytest.raises(CorruptionError, match="checksum") as e:
        list(snapshot.read_chunk(io.BytesIO(damaged), info))
    assert e.value.kind is Damage.CHECKSUM and e.value.offset == 0


@pytest.mark.parametrize("cut", [0, 5, 21, 29, 1000, -7, -1])
def test_truncated_chunk(snap, cut):
    i = 3
    path = snap.chunk_path(i)
    data = open(path, "rb").read()
    short = data[:cut] if cut >= 0 else data[:cut]
    with open(path, "wb") as f:
        f.write(short)
    with pytest.raises(CorruptionError, match="bytes, the manifest says") as e:
        snapshot.open(snap.path)
    assert e.value.path == path and e.value.offset == 0 and e.value.kind is Damage.FRAMING
    assert e.value.hint == SNAPSHOT_HINT
    # Read alone from a file object given its (now wrong) ChunkInfo: still refused.
    with pytest.raises(CorruptionError) as e:
        list(snapshot.read_chunk(io.BytesIO(short), snap.chunks[i], path="remote/chunk"))
    assert e.value.path == "remote/chunk"
    with pytest.raises(CorruptionError):
        snap.verify()


def test_missing_chunk(snap):
    path = snap.chunk_path(4)
    os.unlink(path)
    with pytest.raises(CorruptionError, match="missing") as e:
        snapshot.open(snap.path)
    assert e.value.path == path and e.value.offset == 0 and e.value.kind is Damage.MISSING
    with pytest.raises(CorruptionError, match="missing"):
        snap.verify()  # the already-open snapshot finds it too
    assert snapshot.list_snapshots(os.path.dirname(snap.path)) == []


def test_chunk_replaced_by_symlink(snap, tmp_path):
    path = snap.chunk_path(1)
    outside = tmp_path / "outside.wkc"
    os.rename(path, outside)
    os.symlink(outside, path)
    with pytest.raises(CorruptionError, match="not a regular file"):
        snapshot.open(snap.path)
    with pytest.raises(CorruptionError, match="symlink"):
        list(snap.iter_chunk(1))


def test_chunks_swapped(snap):
    a, b = snap.chunk_path(1), snap.chunk_path(2)
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    with pytest.raises(CorruptionError):
        snapshot.open(snap.path).verify()


def test_chunk_from_another_snapshot_at_another_lsn(tmp_path):
    one = snapshot.write(tmp_path, 1, PAIRS, chunk_bytes=4096, record_bytes=400)
    two = snapshot.write(tmp_path, 2, PAIRS, chunk_bytes=4096, record_bytes=400)
    name = "chunk-000001.wkc"
    os.replace(os.path.join(one.path, name), os.path.join(two.path, name))
    with pytest.raises(CorruptionError, match="LSN 1"):
        snapshot.open(two.path).verify()


# -- crafted chunk contents (valid framing, bad meaning) --------------------------


def _chunk(records: list, *, index: int = 0, lsn: int = 1, header: bytes | None = None,
           first: bytes = b"a", last: bytes = b"z", pairs: int | None = None):
    payloads = [r if isinstance(r, bytes) else msgpack.packb(r, use_bin_type=True) for r in records]
    data = _frame([encode_header(index, lsn) if header is None else header] + payloads)
    info = ChunkInfo(0, "chunk.wkc", 1, first, last, max(1, len(records)),
                     pairs if pairs is not None else max(1, len(records)), len(data), crc32c(data))
    return data, info


@pytest.mark.parametrize(
    "records,kw,match",
    [
        ([], {}, "holds 0 records"),
        ([[[b"a"], [b"z"]]], dict(header=b"WALKVSNC\x01\x00"), "bad header"),
        ([[[b"a"], [b"z"]]], dict(header=b"NOTASNAP" + b"\x00" * 14), "bad header"),
        ([[[b"a"], [b"z"]]], dict(header=struct.pack("<8sHIQ", b"WALKVSNC", 9, 0, 1)), "version 9"),
        ([[[b"a"], [b"z"]]], dict(index=3), "says chunk 3"),
        ([[[b"a"], [b"z"]]], dict(lsn=8), "LSN 8"),
        ([b"\xc1"], {}, "not valid msgpack"),
        ([b"\x92\x91\xc4\x01a"], {}, "not valid msgpack"),
        ([{"a": 1}], {}, "not a \\[keys, values\\] array"),
        ([[[b"a"], [b"z"], [b"q"]]], {}, "not a \\[keys, values\\] array"),
        ([[b"a", b"z"]], {}, "not arrays"),
        ([[[b"a", b"b"], [b"1"]]], {}, "2 keys but 1 values"),
        ([[[], []]], {}, "empty"),
        ([[[b"a"], ["1"]]], {}, "not bytes"),
        ([[["a"], [b"1"]]], {}, "not bytes"),
        ([[[b"a"], [None]]], {}, "not bytes"),
        ([[[b"a", b"c", b"b"], [b"1", b"2", b"3"]]], dict(pairs=3), "not strictly increasing"),
        ([[[b"a", b"a"], [b"1", b"2"]]], dict(pairs=2), "not strictly increasing"),
        ([[[b"a", b"c"], [b"1", b"2"]], [[b"b", b"z"], [b"1", b"2"]]], dict(pairs=4), "across records"),
        ([[[b"b"], [b"1"]], [[b"z"], [b"2"]]], dict(pairs=2), "first key"),
        ([[[b"a"], [b"1"]], [[b"y"], [b"2"]]], dict(pairs=2), "last key"),
        ([[[b"a"], [b"1"]], [[b"zz"], [b"2"]]], dict(pairs=2), "past the manifest's last key"),
        ([[[b"a"], [b"1"]], [[b"z"], [b"2"]]], dict(pairs=3), "manifest says"),
        ([[[b"a", b"b"], [b"1", b"2"]], [[b"z"], [b"2"]]], dict(pairs=2), "more than the manifest"),
    ],
)
def test_crafted_chunk_contents(records, kw, match):
    data, info = _chunk(records, **kw)
    with pytest.raises(CorruptionError, match=match) as e:
        list(snapshot.read_chunk(io.BytesIO(data), info, path="c.wkc"))
    assert e.value.path == "c.wkc"


def test_whole_record_duplicated_or_dropped(snap):
    path = snap.chunk_path(0)
    data = open(path, "rb").read()
    recs = list(RecordReader(io.BytesIO(data)))
    info = snap.chunks[0]
    dropped = _frame(recs[:-1])
    with pytest.raises(CorruptionError):
        list(snapshot.read_chunk(io.BytesIO(dropped), info))
    doubled = _frame(recs + recs[-1:])
    with pytest.raises(CorruptionError):
        list(snapshot.read_chunk(io.BytesIO(doubled), info))
    extra = data + b"\x00" * 100
    with pytest.raises(CorruptionError, match="bytes, the manifest says"):
        list(snapshot.read_chunk(io.BytesIO(extra), info))


@settings(deadline=None, max_examples=150)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
))
def test_any_msgpack_record_is_data_or_corruption(obj):
    payload = msgpack.packb(obj, use_bin_type=True)
    data, info = _chunk([payload])
    try:
        list(snapshot.read_chunk(io.BytesIO(data), info))
    except CorruptionError:
        pass


# -- bounded memory ---------------------------------------------------------------


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "payload",
    [
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 G elements
        b"\x92\xdd\xff\xff\xff\xff\xdd\xff\xff\xff\xff",
        b"\x92\x91\xc6\xff\xff\xff\xf0\x91\xc4\x01a",  # bin32 claiming 4 GiB
        b"\x92\x91\xdb\xff\xff\xff\xf0",  # str32 claiming 4 GiB
    ],
)
def test_msgpack_length_claims_allocate_nothing(payload):
    data, info = _chunk([payload])

    def read():
        with pytest.raises(CorruptionError):
            list(snapshot.read_chunk(io.BytesIO(data), info))

    assert _peak(read) < 1 << 20


def test_fragmented_record_longer_than_the_chunk_is_refused_early():
    # FIRST, then MIDDLE fragments for 16 MiB, never a LAST; the manifest says
    # the chunk is 64 KiB, so the reader stops at 64 KiB, not at the end.
    head = _frame([encode_header(0, 1)])
    out = bytearray(head)
    piece = b"x" * (BLOCK_SIZE - 7)

    def frag(t, p):
        out.extend(struct.pack("<IHB", fragment_crc(t, p), len(p), t) + p)

    out.extend(b"\x00" * (BLOCK_SIZE - len(out)))
    frag(FIRST, piece)
    for _ in range(16 * 1024 * 1024 // BLOCK_SIZE):
        frag(MIDDLE, piece)
    data = bytes(out)
    info = ChunkInfo(0, "c", 1, b"a", b"z", 1, 1, 64 << 10, 0)
    f = io.BytesIO(data)

    def read():
        with pytest.raises(CorruptionError, match="over the limit"):
            list(snapshot.read_chunk(f, info))

    assert _peak(read) < 1 << 20
    assert f.tell() < 1 << 20  # it stopped reading, too


def test_fragment_length_past_its_block():
    data = bytearray(_frame([encode_header(0, 1), msgpack.packb([[b"a"], [b"1"]])]))
    hdr = len(encode_header(0, 1)) + 7
    data[hdr + 4: hdr + 6] = b"\xff\xff"
    info = ChunkInfo(0, "c", 1, b"a", b"a", 1, 1, len(data), crc32c(bytes(data)))
    with pytest.raises(CorruptionError) as e:
        list(snapshot.read_chunk(io.BytesIO(bytes(data)), info))
    assert e.value.offset == hdr


def test_streaming_read_holds_one_record_not_a_chunk(tmp_path):
    pairs = [(b"k%07d" % i, os.urandom(1000)) for i in range(6000)]  # ~6 MB in one chunk
    info = snapshot.write(tmp_path, 1, pairs, chunk_bytes=1 << 30, record_bytes=16 << 10)
    s = snapshot.open(info.path)
    assert len(s.chunks) == 1 and s.bytes > 6_000_000
    n = 0

    def read():
        nonlocal n
        for _ in s:
            n += 1

    assert _peak(read) < 1 << 20
    assert n == 6000


def test_oversized_manifest_is_refused_before_reading(snap):
    path = os.path.join(snap.path, "MANIFEST")
    with open(path, "r+b") as f:
        f.truncate(200 << 20)  # sparse: costs no disk
    assert _peak(lambda: pytest.raises(CorruptionError, snapshot.open, snap.path)) < 1 << 20
    with pytest.raises(CorruptionError, match="over the limit") as e:
        snapshot.open(snap.path)
    assert e.value.path == path


# -- the manifest -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../x", "../snap-00000000000000000007/MANIFEST", "/etc/passwd", "a/b", "a\\b", "a\x00b",
     "..", ".", ".hidden", "MANIFEST", "", "x" * 300, "caf\u00e9", 5, None, b"chunk"],
)
def test_manifest_chunk_names_must_be_plain(snap, tmp_path, name):
    (tmp_path / "x").write_bytes(open(snap.chunk_path(0), "rb").read())

    def bad(body):
        body["chunks"][0]["name"] = name

    _mutate(snap.path, bad)
    with pytest.raises(CorruptionError, match="chunk name") as e:
        snapshot.open(snap.path)
    assert e.value.path == os.path.join(snap.path, "MANIFEST")


def test_manifest_duplicate_chunk_names(snap):
    def dup(body):
        body["chunks"][1]["name"] = body["chunks"][0]["name"]

    _mutate(snap.path, dup)
    with pytest.raises(CorruptionError, match="appears twice"):
        snapshot.open(snap.path)


def _set(path, value):
    def fn(body):
        *outer, last = path
        obj = body
        for p in outer:
            obj = obj[p]
        obj[last] = value(obj[last]) if callable(value) else value
    return fn


def _delete(key):
    def fn(body):
        del body[key]
    return fn


inc = (lambda v: v + 1)


@pytest.mark.parametrize(
    "fn,match",
    [
        (_set(["count"], inc), "'count' is"),
        (_set(["bytes"], inc), "'bytes' is"),
        (_set(["lsn"], 8), "LSN 8"),
        (_set(["lsn"], "7"), "not an integer"),
        (_set(["lsn"], -7), "out of range"),
        (_set(["count"], True), "not an integer"),
        (_set(["created_us"], 1.5), "not an integer"),
        (_set(["store_id"], 5), "store_id"),
        (_set(["version"], 0), "out of range"),
        (_set(["format"], "leveldb"), "not a walkv snapshot manifest"),
        (_delete("chunks"), "no 'chunks'"),
        (_delete("lsn"), "no 'lsn'"),
        (_set(["chunks"], {"a": 1}), "not an array"),
        (_set(["chunks", 0], [1, 2]), "not a map"),
        (_set(["chunks", 0, "first_key"], "key000000"), "not bytes"),
        (_set(["chunks", 0, "records"], 0), "out of range"),
        (_set(["chunks", 0, "pairs"], 0), "out of range"),
        (_set(["chunks", 0, "crc32c"], 2**32), "out of range"),
        (_set(["chunks", 0, "bytes"], 3), "out of range"),
        (_set(["chunks", 0, "last_key"], b""), "first key is not below"),
        (_set(["chunks", 1, "first_key"], b"key000000"), "overlaps"),
        (_set(["chunks", 0, "bytes"], inc), "'bytes' is"),
    ],
)
def test_manifest_fields_are_checked(snap, fn, match):
    _mutate(snap.path, fn)
    with pytest.raises(CorruptionError, match=match) as e:
        snapshot.open(snap.path)
    assert e.value.path == os.path.join(snap.path, "MANIFEST")
    assert snapshot.list_snapshots(os.path.dirname(snap.path)) == []


@pytest.mark.parametrize(
    "fn,match",
    [
        (_set(["chunks", 2, "pairs"], inc), "manifest says"),
        (_set(["chunks", 2, "records"], inc), "manifest says"),
        (_set(["chunks", 2, "crc32c"], lambda v: v ^ 1), "checksum"),
        (_set(["chunks", 2, "first_key"], lambda v: v + b"\x00"), "first key"),
        (_set(["chunks", 2, "last_key"], lambda v: v + b"\x00"), "last key"),
    ],
)
def test_manifest_disagreeing_with_chunk_is_found_by_verify(snap, fn, match):
    def both(body):
        fn(body)
        body["count"] = sum(c["pairs"] for c in body["chunks"])

    _mutate(snap.path, both)
    s = snapshot.open(snap.path)
    with pytest.raises(CorruptionError, match=match) as e:
        s.verify()
    assert e.value.path == s.chunk_path(2)


def test_directory_named_for_another_lsn(snap):
    other = os.path.join(os.path.dirname(snap.path), "snap-00000000000000000070")
    os.rename(snap.path, other)
    with pytest.raises(CorruptionError, match="LSN 7 but the directory is named for LSN 70"):
        snapshot.open(other)
    assert snapshot.list_snapshots(os.path.dirname(other)) == []


def test_unknown_manifest_fields_are_ignored_and_newer_versions_refused(snap):
    _mutate(snap.path, _set(["future"], {"x": [1, 2]}))
    assert list(snapshot.open(snap.path)) == PAIRS
    _mutate(snap.path, _set(["version"], 4))
    with pytest.raises(SnapshotError, match="version 4"):
        snapshot.open(snap.path)


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: d[:-1], "truncated"),
        (lambda d: d[:3], "truncated"),
        (lambda d: b"", "empty"),
        (lambda d: d + b"\x00" * 3, "after its record"),
        (lambda d: d + b"junk", "after its record|truncated"),
        (lambda d: d + d, "more than one record"),
        (lambda d: d[:10] + bytes([d[10] ^ 4]) + d[11:], "checksum"),
        (lambda d: _frame([b"\x93\x01\x02\x03"]), "not a map"),
        (lambda d: _frame([b"\xc1"]), "not valid msgpack"),
        (lambda d: _frame([msgpack.packb({1: 2})]), "not valid msgpack"),
    ],
)
def test_manifest_file_damage(snap, damage, match):
    path = os.path.join(snap.path, "MANIFEST")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(damage(data))
    with pytest.raises(CorruptionError, match=match) as e:
        snapshot.open(snap.path)
    assert e.value.path == path


@settings(deadline=None, max_examples=200)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["format", "version", "lsn", "count", "bytes", "chunks", "name", "first_key",
                         "last_key", "records", "pairs", "crc32c", "store_id", "created_us", "sections",
                         "section"]) | st.text(max_size=3),
        inner, max_size=8),
    max_leaves=30,
))
def test_any_msgpack_manifest_is_valid_or_corruption(obj):
    if isinstance(obj, dict):
        obj = {"format": "walkv-snapshot", "version": 1, **obj}
    data = _frame([msgpack.packb(obj, use_bin_type=True)])
    try:
        decode_manifest(data, "M")
    except CorruptionError as e:
        assert e.path == "M"
    except SnapshotError as e:  # only for a version this walkv does not read
        assert obj["version"] > 1 and "version" in str(e)


_FIELDS = [["format"], ["version"], ["lsn"], ["store_id"], ["created_us"], ["count"], ["bytes"],
           ["chunks"], ["chunks", 0], ["chunks", 1]] + [
    ["chunks", i, k] for i in (0, 1) for k in
    ("name", "first_key", "last_key", "records", "pairs", "bytes", "crc32c")]


@settings(deadline=None, max_examples=300)
@given(field=st.sampled_from(_FIELDS), value=st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=12) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
))
def test_any_field_replaced_is_valid_or_corruption(field, value):
    chunk = {"name": "c0", "first_key": b"a", "last_key": b"b", "records": 1, "pairs": 2,
             "bytes": 100, "crc32c": 5}
    body = {"format": "walkv-snapshot", "version": 1, "lsn": 3, "store_id": None, "created_us": 1,
            "count": 4, "bytes": 200, "chunks": [chunk, dict(chunk, name="c1", first_key=b"c", last_key=b"d")]}
    _set(field, value)(body)
    data = _frame([msgpack.packb(body, use_bin_type=True)])
    try:
        m = decode_manifest(data, "M")
    except CorruptionError as e:
        assert e.path == "M"
    except SnapshotError:
        assert field == ["version"] and value > 1
    else:
        assert m.count == sum(c.pairs for c in m.chunks)
