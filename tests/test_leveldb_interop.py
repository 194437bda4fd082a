"""walkv's framing against real LevelDB (through plyvel).

(a) A log written by LevelDB is read by RecordReader: every WriteBatch comes
    back, in order, and re-framing its payloads with RecordWriter reproduces
    LevelDB's file byte for byte. LevelDB's MANIFEST (also log format) reads
    too.
(b) A log written by RecordWriter is replayed by LevelDB: we overwrite the log
    LevelDB will recover on open with our own file of WriteBatch records
    (sequence numbers above any LevelDB used, records placed to hit every
    trailer case: an empty FIRST in the last 7 bytes of a block, 1..6 byte
    zero trailers, a 1-byte FIRST, a record ending exactly at a block end,
    records over 100 KB), open with paranoid_checks=True (any log corruption
    fails the open) and find every key.

LevelDB formats used (db/write_batch.cc, db/version_edit.cc, db/filename.cc):
WriteBatch := sequence:fixed64 count:fixed32 op*
op := kTypeValue(1) varstring(key) varstring(value) | kTypeDeletion(0) varstring(key)
varstring := varint32(len) bytes. Log files are NNNNNN.log; CURRENT names the
MANIFEST, whose VersionEdits carry the log number (tag 2) and last sequence
(tag 4); LevelDB replays every log numbered >= the log number.
"""

from __future__ import annotations

import io
import random
import re
import struct
from pathlib import Path

import pytest

plyvel = pytest.importorskip("plyvel")

from tests.test_record import BS, HDR, ref_frame  # noqa: E402
from wal.record import RecordWriter  # noqa: E402
from wal.record_reader import RecordReader  # noqa: E402

TYPE_DELETION = 0
TYPE_VALUE = 1


# -- LevelDB encodings -------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def get_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        assert shift <= 63, "varint too long"


def get_slice(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = get_varint(buf, pos)
    assert pos + n <= len(buf), "slice past the end"
    return buf[pos : pos + n], pos + n


Op = tuple  # ("put", key, value) | ("del", key)


def encode_batch(seq: int, ops: list[Op]) -> bytes:
    out = bytearray(struct.pack("<QI", seq, len(ops)))
    for op in ops:
        if op[0] == "put":
            out += bytes([TYPE_VALUE]) + varint(len(op[1])) + op[1] + varint(len(op[2])) + op[2]
        else:
            out += bytes([TYPE_DELETION]) + varint(len(op[1])) + op[1]
    return bytes(out)


def decode_batch(rec: bytes) -> tuple[int, list[Op]]:
    assert len(rec) >= 12, "WriteBatch shorter than its header"
    seq, count = struct.unpack_from("<QI", rec)
    pos = 12
    ops: list[Op] = []
    while pos < len(rec):
        tag = rec[pos]
        pos += 1
        if tag == TYPE_VALUE:
            key, pos = get_slice(rec, pos)
            value, pos = get_slice(rec, pos)
            ops.append(("put", key, value))
        elif tag == TYPE_DELETION:
            key, pos = get_slice(rec, pos)
            ops.append(("del", key))
        else:
            raise AssertionError(f"unknown WriteBatch tag {tag}")
    assert len(ops) == count
    return seq, ops


def decode_manifest(path: Path) -> dict[str, int]:
    """Log number, next file number and last sequence from the VersionEdits
    of a MANIFEST, read with our RecordReader (the MANIFEST is a log file)."""
    state: dict[str, int] = {}
    with open(path, "rb") as f:
        for rec in RecordReader(f):
            pos = 0
            while pos < len(rec):
                tag, pos = get_varint(rec, pos)
                if tag == 1:  # comparator name
                    name, pos = get_slice(rec, pos)
                    state["comparator"] = 1
                    assert name == b"leveldb.BytewiseComparator"
                elif tag in (2, 3, 4, 9):  # log, next file, last sequence, prev log
                    value, pos = get_varint(rec, pos)
                    state[{2: "log_number", 3: "next_file", 4: "last_sequence", 9: "prev_log"}[tag]] = value
                elif tag == 5:  # compact pointer
                    _, pos = get_varint(rec, pos)
                    _, pos = get_slice(rec, pos)
                elif tag == 6:  # deleted file
                    _, pos = get_varint(rec, pos)
                    _, pos = get_varint(rec, pos)
                elif tag == 7:  # new file
                    _, pos = get_varint(rec, pos)
                    _, pos = get_varint(rec, pos)
                    _, pos = get_varint(rec, pos)
                    _, pos = get_slice(rec, pos)
                    _, pos = get_slice(rec, pos)
                else:
                    raise AssertionError(f"unknown VersionEdit tag {tag}")
    return state


def current_manifest(db_dir: Path) -> Path:
    name = (db_dir / "CURRENT").read_text().strip()
    assert re.fullmatch(r"MANIFEST-\d+", name), name
    return db_dir / name


def log_files(db_dir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in db_dir.iterdir():
        m = re.fullmatch(r"(\d+)\.log", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def read_log(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        r = RecordReader(f, path=path)
        recs = list(r)
    assert r.torn_tail is None, r.torn_tail
    assert r.skipped == []
    assert r.end_offset == path.stat().st_size
    return recs


def value_for(i: int, rnd: random.Random) -> bytes:
    if i % 97 == 0:
        n = rnd.randrange(33_000, 120_000)  # fragments across blocks
    elif i % 89 == 0:
        n = rnd.choice([BS - HDR - 40, BS - HDR - 30, BS - HDR - 20])
    else:
        n = rnd.randrange(0, 300)
    return rnd.randbytes(n)


# -- (a) LevelDB writes, walkv reads -------------------------------------------


def test_read_log_written_by_leveldb(tmp_path: Path) -> None:
    db_dir = tmp_path / "ldb"
    rnd = random.Random(20240607)
    expected: list[list[Op]] = []
    db = plyvel.DB(str(db_dir), create_if_missing=True, write_buffer_size=512 << 20)
    try:
        for i in range(3000):
            key = b"key-%06d" % i
            value = value_for(i, rnd)
            db.put(key, value)
            expected.append([("put", key, value)])
            if i % 250 == 7:
                db.delete(b"key-%06d" % (i - 3))
                expected.append([("del", b"key-%06d" % (i - 3))])
            if i % 400 == 11:
                ops: list[Op] = [("put", b"batch-%06d-%d" % (i, j), rnd.randbytes(j * 50)) for j in range(5)]
                ops.append(("del", b"key-%06d" % (i - 1)))
                with db.write_batch() as wb:
                    for op in ops:
                        if op[0] == "put":
                            wb.put(op[1], op[2])
                        else:
                            wb.delete(op[1])
                expected.append(ops)
        big = rnd.randbytes(300_000)
        db.put(b"big", big)
        expected.append([("put", b"big", big)])
    finally:
        db.close()

    logs = log_files(db_dir)
    assert logs, sorted(p.name for p in db_dir.iterdir())
    manifest = decode_manifest(current_manifest(db_dir))
    assert manifest["log_number"] == logs[-1][0]

    records: list[bytes] = []
    for number, path in logs:
        if number >= manifest["log_number"]:
            records.extend(read_log(path))
    assert len(records) == len(expected)
    seq = None
    for rec, ops in zip(records, expected):
        s, got = decode_batch(rec)
        if seq is not None:
            assert s == seq, "sequence numbers are contiguous"
        seq = s + len(got)
        assert got == ops

    # Byte for byte: our writer frames LevelDB's payloads into LevelDB's file.
    path = logs[-1][1]
    original = path.read_bytes()
    assert len(original) > 40 * BS
    f = io.BytesIO()
    w = RecordWriter(f)
    for rec in records:
        w.add_record(rec)
    assert f.getvalue() == original
    assert ref_frame(records)[0] == original


def test_read_leveldb_manifest(tmp_path: Path) -> None:
    db_dir = tmp_path / "ldb"
    db = plyvel.DB(str(db_dir), create_if_missing=True)
    for i in range(100):
        db.put(b"k%d" % i, b"v" * 100)
    db.compact_range()  # flush to a table: the manifest gains a new-file edit
    db.close()
    path = current_manifest(db_dir)
    with open(path, "rb") as f:
        r = RecordReader(f, path=path)
        recs = list(r)
    assert recs and r.skipped == [] and r.torn_tail is None
    state = decode_manifest(path)
    assert state["last_sequence"] >= 100
    assert state["log_number"] in [n for n, _ in log_files(db_dir)]


# -- (b) walkv writes, LevelDB replays -------------------------------------------


def size_ending_before_block_end(offset: int, gap: int, min_size: int) -> int:
    """Payload size of a record written at ``offset`` that ends exactly
    ``gap`` bytes before a block end (in this block when it fits, else as a
    FIRST filling this block plus a LAST in the next)."""
    left = BS - offset % BS
    if left < HDR:
        left = BS
    room = left - HDR - gap
    if room >= min_size:
        return room
    return (left - HDR) + (BS - HDR - gap)


def sized_put(seq: int, key: bytes, size: int, rnd: random.Random) -> tuple[bytes, Op]:
    """A one-put WriteBatch of exactly ``size`` bytes."""
    fixed = 12 + 1 + len(varint(len(key))) + len(key)
    vlen = size - fixed - 1
    while fixed + len(varint(vlen)) + vlen != size:
        vlen -= 1
    assert vlen >= 0
    op = ("put", key, rnd.randbytes(vlen))
    payload = encode_batch(seq, [op])
    assert len(payload) == size
    return payload, op


def test_leveldb_replays_log_written_by_walkv(tmp_path: Path) -> None:
    db_dir = tmp_path / "ldb"
    db = plyvel.DB(str(db_dir), create_if_missing=True)
    db.put(b"orig", b"from leveldb")
    db.close()

    # The log LevelDB replays on open: the MANIFEST's log number (and every
    # later one). LevelDB just created it; it is the highest-numbered.
    manifest = decode_manifest(current_manifest(db_dir))
    logs = log_files(db_dir)
    assert logs[-1][0] == manifest["log_number"], (logs, manifest)
    log_path = logs[-1][1]
    original = read_log(log_path)
    assert [decode_batch(r)[1] for r in original] == [[("put", b"orig", b"from leveldb")]]
    last_seq = max([manifest.get("last_sequence", 0)] + [s + len(ops) - 1 for s, ops in map(decode_batch, original)])
    assert last_seq >= 1

    rnd = random.Random(99)
    expected: dict[bytes, bytes] = {b"orig": b"from leveldb"}
    seq = last_seq + 1
    f = io.BytesIO()
    w = RecordWriter(f)
    events: list[str] = []

    def add(payload: bytes) -> int:
        nonlocal seq
        s, ops = decode_batch(payload)
        assert s == seq
        for op in ops:
            if op[0] == "put":
                expected[op[1]] = op[2]
            else:
                expected.pop(op[1], None)
        seq += len(ops)
        return w.add_record(payload)

    def put(key: bytes, value: bytes) -> int:
        return add(encode_batch(seq, [("put", key, value)]))

    def end_gap(gap: int, name: bytes) -> None:
        size = size_ending_before_block_end(w.offset, gap, 40)
        payload, _ = sized_put(seq, name, size, rnd)
        add(payload)
        assert w.offset % BS == (BS - gap) % BS, (name, w.offset, gap)

    # LevelDB's own record first, copied as it was.
    for rec in original:
        w.add_record(rec)

    # The last 7 bytes of a block: an empty FIRST, then a 150 KB record.
    end_gap(7, b"fill-7")
    start = put(b"big-after-empty-first", rnd.randbytes(150_000))
    assert start % BS == BS - HDR
    events.append("empty FIRST")

    # Zero trailers of every length 1..6, each followed by a small record
    # and, for 6, by a 120 KB record.
    for gap in (1, 2, 3, 4, 5, 6):
        end_gap(gap, b"fill-%d" % gap)
        before = w.offset
        if gap == 6:
            start = put(b"big-after-trailer", rnd.randbytes(120_000))
        else:
            start = put(b"after-trailer-%d" % gap, b"small %d" % gap)
        assert start == before + gap and start % BS == 0
        events.append(f"trailer {gap}")

    # 8 bytes left: a FIRST of one byte.
    end_gap(8, b"fill-8")
    start = put(b"one-byte-first", b"0123456789" * 3)
    assert start % BS == BS - 8
    # Exactly at a block end.
    end_gap(0, b"fill-0")
    assert w.offset % BS == 0

    # Many small batches, multi-op batches, deletes and overwrites.
    for i in range(400):
        put(b"small-%04d" % i, rnd.randbytes(rnd.randrange(0, 200)))
        if i % 37 == 0:
            ops: list[Op] = [("put", b"multi-%04d-%d" % (i, j), rnd.randbytes(30)) for j in range(4)]
            ops += [("del", b"small-%04d" % (i // 2)), ("put", b"small-%04d" % i, b"overwritten %d" % i)]
            add(encode_batch(seq, ops))
    add(encode_batch(seq, [("del", b"orig")]))
    put(b"orig", b"rewritten by walkv")
    put(b"last-big", rnd.randbytes(101_000))

    data = f.getvalue()
    assert data == ref_frame([r for r in RecordReader(io.BytesIO(data))])[0]
    assert len(data) > 12 * BS
    log_path.write_bytes(data)

    # paranoid_checks: any corruption LevelDB's log reader reports fails the open.
    for _ in range(2):  # replay, then read what LevelDB flushed to its tables
        db = plyvel.DB(str(db_dir), paranoid_checks=True)
        try:
            got = dict(db.iterator())
            assert got.keys() == expected.keys()
            for k, v in expected.items():
                assert got[k] == v, k
            assert db.get(b"orig") == b"rewritten by walkv"
            assert len(db.get(b"big-after-empty-first")) == 150_000
            assert len(db.get(b"big-after-trailer")) == 120_000
            assert len(db.get(b"last-big")) == 101_000
            assert db.get(b"small-0000") == b"overwritten 0"
            # New writes get sequence numbers after ours (LevelDB took them over).
            db.put(b"post", b"ok")
            expected[b"post"] = b"ok"
        finally:
            db.close()
    info_log = (db_dir / "LOG").read_text(errors="replace")
    assert "orruption" not in info_log and "ignoring error" not in info_log
    assert len(events) == 7
