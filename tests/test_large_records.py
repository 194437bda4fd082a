"""Large records: the limit a log (or snapshot) was written with travels with
it, every reader goes by it, repair never cuts a whole record, and a large
put costs about its own size in memory (issue 16, item 3)."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import textwrap
import uuid

import msgpack
import pytest

import kvstore
import snapshot
import wal
from kvstore.cli.main import main as walkv
from kvstore.entry.codec import put_payload
from kvstore.spark.files import StoreFiles
from wal.errors import CorruptionError, Damage, RecordOverLimitError
from wal.record import (
    BLOCK_SIZE,
    DEFAULT_MAX_RECORD_BYTES,
    MAX_RECORD_LIMIT,
    RecordWriter,
    frame,
    frame_into,
    frame_pieces,
)
from wal.record_reader import RecordReader
from wal.segment import SEGMENT_MAGIC, encode_header, list_segments, read_header, segment_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = (64 << 20) + 4096  # one record over the default 64 MiB limit of every reader
LIMIT = 80 << 20


def _value(n: int) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n]


def test_a_log_and_snapshot_with_a_raised_limit_read_back_through_every_reader(tmp_path, capsys):
    path = str(tmp_path / "db")
    big = _value(BIG)
    with kvstore.open(path, max_record_bytes=LIMIT, max_value_bytes=LIMIT) as db:
        db.put(b"small", b"x")
        db.put(b"big", big)
        db.put(b"after", b"y")
    wal_dir = os.path.join(path, "wal")
    seg = list_segments(wal_dir)[0].path
    with open(seg, "rb") as f:
        assert read_header(f, seg)[0].max_record_bytes == LIMIT  # the limit travels with the log

    # The log's readers: read_log, the Spark source's slices, Log open and read.
    assert [(e.lsn, len(e.payload)) for e in wal.read_log(wal_dir)][1][1] > BIG
    files = StoreFiles(path)
    durable = wal.read_durable_lsn(wal_dir)
    assert durable == 3
    got = [e.lsn for piece in files.plan_log(1, 3, durable, 1 << 20) for e in files.iter_slice(piece)]
    assert got == [1, 2, 3]
    with wal.open(wal_dir) as log:  # the default limit: reads, and appends go on
        assert [lsn for lsn, _ in log.read()] == [1, 2, 3]
        log.append(msgpack.packb([[2, b"gone"]], use_bin_type=True))

    # verify and repair see a whole log.
    assert wal.verify(wal_dir) == []
    assert wal.repair(wal_dir, dry_run=True).cut is False
    assert walkv(["verify", path]) == 0
    assert walkv(["repair", "--dry-run", path]) == 0
    assert "nothing to cut" in capsys.readouterr().out

    # A snapshot holds the large pair (its limit raised for it), restore
    # reads it back, and the log can be trimmed behind it.
    with kvstore.open(path, max_record_bytes=LIMIT, max_value_bytes=LIMIT) as db:
        info = db.snapshot()
        assert info.count == 3
    snap = snapshot.open(info.path)
    assert snap.manifest.max_record_bytes > BIG
    snap.verify()
    assert dict(snap)[b"big"] == big
    target = str(tmp_path / "restored")
    kvstore.restore(path, target)
    with kvstore.open(target, readonly=True) as db:
        assert db.get(b"big") == big and db.get(b"after") == b"y"
    assert walkv(["verify", path]) == 0


def _log_with_small_limit(tmp_path, limit: int = 4096) -> tuple[str, str]:
    directory = str(tmp_path / "log")
    with wal.open(directory, max_record_bytes=limit) as log:
        log.append(b"a" * 100)
    return directory, list_segments(directory)[0].path


def _append_raw_entry(seg: str, lsn: int, payload: bytes) -> None:
    """Append one whole, CRC-valid entry the way the writer frames them, but
    past the limit the segment's header states."""
    with open(seg, "r+b") as f:
        data = f.read()
        reader = RecordReader(io.BytesIO(data), path=seg, start_offset=0, zeros_end=True, skip_corrupt=True,
                              max_record_bytes=1 << 20)
        for _ in reader.records():
            pass
        end = reader.end_offset
        framed, _ = frame(struct.pack("<QQ", lsn, 0) + payload, end)
        f.seek(end)
        f.write(framed)


def test_repair_never_cuts_a_whole_record_over_the_limit(tmp_path, capsys):
    directory, seg = _log_with_small_limit(tmp_path)
    _append_raw_entry(seg, 2, b"v" * 50_000)  # whole, CRC good, over the header's 4096
    _append_raw_entry(seg, 3, b"w" * 10)
    before = open(seg, "rb").read()

    with pytest.raises(RecordOverLimitError, match="over the limit this walkv reads") as e:
        wal.repair(directory, dry_run=True)
    assert e.value.size > 50_000 and e.value.limit == 4096
    with pytest.raises(RecordOverLimitError):
        wal.repair(directory)
    assert open(seg, "rb").read() == before  # nothing cut
    assert not [n for n in os.listdir(directory) if ".broken" in n]
    problems = wal.verify(directory)
    assert len(problems) == 1 and "over the limit this walkv reads" in problems[0]

    with pytest.raises(RecordOverLimitError):  # open refuses it too, and cuts nothing
        wal.open(directory, recovery="prefix")
    assert open(seg, "rb").read() == before

    capsys.readouterr()
    assert walkv(["repair", "--dry-run", directory]) == 1  # refused, not a cut
    out = capsys.readouterr()
    assert "to be cut" not in out.out and "over the limit this walkv reads" in out.err
    assert open(seg, "rb").read() == before


def test_damage_inside_a_large_record_is_still_cut(tmp_path):
    directory, seg = _log_with_small_limit(tmp_path)
    _append_raw_entry(seg, 2, b"v" * 50_000)
    with open(seg, "r+b") as f:  # a flipped byte in the record's second block
        f.seek(BLOCK_SIZE + 100)
        byte = f.read(1)
        f.seek(BLOCK_SIZE + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    _append_raw_entry(seg, 3, b"w" * 10)
    report = wal.repair(directory, dry_run=True)
    assert report.cut and report.last_good_lsn == 1


def test_reopening_with_a_higher_limit_starts_a_segment_that_states_it(tmp_path):
    directory, _ = _log_with_small_limit(tmp_path)
    with wal.open(directory, max_record_bytes=64 << 10) as log:
        log.append(b"b" * 40_000)  # over the first segment's 4096
    segs = list_segments(directory)
    assert len(segs) == 2
    limits = []
    for s in segs:
        with open(s.path, "rb") as f:
            limits.append(read_header(f, s.path)[0].max_record_bytes)
    assert limits == [4096, 64 << 10]
    assert [len(e.payload) for e in wal.read_log(directory)] == [100, 40_000]
    assert wal.verify(directory) == []
    with wal.open(directory) as log:
        assert [lsn for lsn, _ in log.read()] == [1, 2]


def test_an_empty_active_segment_is_replaced_when_the_limit_rises(tmp_path):
    directory = str(tmp_path / "log")
    wal.open(directory, max_record_bytes=4096).close()
    with wal.open(directory, max_record_bytes=64 << 10) as log:
        log.append(b"c" * 40_000)
    segs = list_segments(directory)
    assert len(segs) == 1
    with open(segs[0].path, "rb") as f:
        assert read_header(f, segs[0].path)[0].max_record_bytes == 64 << 10
    assert [len(e.payload) for e in wal.read_log(directory)] == [40_000]


def _raw_segment(directory: str, header_payload: bytes, first_lsn: int = 1) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, segment_name(first_lsn))
    with open(path, "wb") as f:
        w = RecordWriter(f, 0)
        w.add_record(header_payload)
        w.add_record(struct.pack("<QQ", first_lsn, 0) + b"old")
    return path


def test_version_1_segments_are_read_with_the_default_limit(tmp_path):
    directory = str(tmp_path / "v1")
    v1 = struct.pack("<8sHH16sQQ", SEGMENT_MAGIC, 1, 0, uuid.uuid4().bytes, 1, 0)
    path = _raw_segment(directory, v1)
    with open(path, "rb") as f:
        header = read_header(f, path)[0]
    assert (header.version, header.max_record_bytes) == (1, DEFAULT_MAX_RECORD_BYTES)
    assert [e.payload for e in wal.read_log(directory)] == [b"old"]
    with wal.open(directory) as log:  # the default limit: appends go on in the v1 segment
        log.append(b"new")
    assert [e.payload for e in wal.read_log(directory)] == [b"old", b"new"]


def test_a_header_claiming_an_absurd_limit_is_corruption(tmp_path):
    directory = str(tmp_path / "absurd")
    header = bytearray(encode_header(uuid.uuid4().hex, 1))
    at = struct.calcsize("<8sHH16sQQ")  # the record limit: the last field before the timeline history
    header[at:at + 8] = (MAX_RECORD_LIMIT + 1).to_bytes(8, "little")
    path = _raw_segment(directory, bytes(header))
    with open(path, "rb") as f, pytest.raises(CorruptionError, match="record limit") as e:
        read_header(f, path)
    assert e.value.kind is Damage.HEADER and e.value.offset == 0
    with pytest.raises(ValueError, match="at most"):
        wal.open(str(tmp_path / "x"), max_record_bytes=MAX_RECORD_LIMIT + 1)


def test_old_manifests_without_a_record_limit_still_read(tmp_path):
    info = snapshot.write(str(tmp_path), 5, [(b"a", b"1"), (b"b", b"2")])
    manifest = os.path.join(info.path, "MANIFEST")
    data = open(manifest, "rb").read()
    body = msgpack.unpackb(next(iter(RecordReader(io.BytesIO(data), start_offset=0))), raw=False)
    assert body["version"] == 2 and body["max_record_bytes"] == snapshot.MAX_RECORD_BYTES
    body["version"] = 1
    del body["max_record_bytes"]
    out = io.BytesIO()
    RecordWriter(out, 0).add_record(msgpack.packb(body, use_bin_type=True))
    open(manifest, "wb").write(out.getvalue())
    snap = snapshot.open(info.path)
    assert snap.manifest.max_record_bytes == snapshot.MAX_RECORD_BYTES
    assert list(snap) == [(b"a", b"1"), (b"b", b"2")]


def test_a_pair_over_the_snapshot_limit_raises_it_for_that_snapshot(tmp_path):
    pairs = [(b"a", b"1"), (b"b", _value(3 << 20)), (b"c", b"3")]
    info = snapshot.write(str(tmp_path), 7, pairs, max_record_bytes=1 << 20)
    snap = snapshot.open(info.path)
    assert snap.manifest.max_record_bytes > 3 << 20
    snap.verify()
    assert list(snap) == pairs


@pytest.mark.parametrize("sizes", [[16, 5], [40_000], [1, 0, 70_000, 3], [BLOCK_SIZE - 7 - 16, 9]])
@pytest.mark.parametrize("offset", [0, 100, BLOCK_SIZE - 7, BLOCK_SIZE - 6, BLOCK_SIZE - 1])
def test_framing_pieces_is_byte_for_byte_framing_the_joined_payload(sizes, offset):
    pieces = [os.urandom(n) for n in sizes]
    joined: list[bytes] = []
    end = frame_into(joined, b"".join(pieces), offset)
    gathered: list[bytes | memoryview] = []
    assert frame_pieces(gathered, pieces, offset) == end
    assert b"".join(bytes(p) for p in gathered) == b"".join(joined)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 65535, 65536, 1 << 20])
def test_a_put_payload_in_pieces_is_the_batch_encoding(n):
    key, value = b"k" * 40, _value(n)
    assert b"".join(put_payload(key, value)) == msgpack.packb([[1, key, value]], use_bin_type=True)


def test_a_large_put_costs_about_its_own_size_in_memory(tmp_path):
    """Peak RSS of a fresh process doing one 32 MiB put, over its RSS before
    the value existed: the value itself and LMDB's pages of it (about 2x),
    not the 6x of copies (msgpack, entry header, fragments, join) it was."""
    size = 32 << 20
    script = textwrap.dedent(f"""
        import kvstore

        def status(field):
            for line in open("/proc/self/status"):
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
            raise SystemExit("no " + field)

        db = kvstore.open({str(tmp_path / "db")!r})
        db.put(b"warm", b"up")
        base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
            f.write("5")
        value = b"v" * {size}
        db.put(b"big", value)
        print(status("VmHWM") - base)
        db.close()
    """)
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak RSS")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    grew = int(out.stdout.strip())
    assert grew < 2.5 * size, f"one {size >> 20} MiB put raised peak RSS by {grew / size:.1f}x its size"
