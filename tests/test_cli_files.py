"""``walkv inspect``, ``walkv verify`` and ``walkv repair`` as subprocesses on
real stores: clean stores, a corrupt record in a sealed and in the active
segment, a missing segment, a damaged index, a damaged snapshot chunk, and
repair's confirmation, dry run and lock."""

from __future__ import annotations

import json
import os

import kvstore
import snapshot
from tests.test_cli import one_line_error, walkv
from wal.record import BLOCK_SIZE
from wal.segment import list_segments


def _store(path: str, n: int = 400, value: int = 300, segment_bytes: int = 64 << 10) -> str:
    """A store of ``n`` puts spread over several segments and blocks."""
    with kvstore.open(path, segment_bytes=segment_bytes) as db:
        for i in range(n):
            db.put(b"k%05d" % i, bytes([65 + i % 26]) * value)
    return path


def _records(segment: str) -> list[dict]:
    proc = walkv("inspect", segment, "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(ln) for ln in proc.stdout.splitlines()]


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# -- inspect -------------------------------------------------------------------------------------


def test_inspect_lists_records_with_lsns_and_ops(tmp_path):
    s = str(tmp_path / "s")
    with kvstore.open(s) as db:
        db.put(b"alpha", b"1")
        db.delete(b"alpha")
        db.delete_range(b"a", b"m")
        with db.batch() as b:
            b.put(b"x", b"2")
            b.put(b"y", b"3")
            b.delete(b"z")
        db.put(b"big", b"v" * (BLOCK_SIZE * 2))  # FIRST, MIDDLE..., LAST
    seg = list_segments(os.path.join(s, "wal"))[0].path
    rows = _records(seg)
    assert rows[0]["offset"] == 0 and rows[0]["header"]["first_lsn"] == 1
    entries = rows[1:]
    assert [r["lsn"] for r in entries] == [1, 2, 3, 4, 5]
    assert entries[0]["summary"] == "put alpha = 1 (1 B)"
    assert entries[1]["summary"] == "delete alpha"
    assert entries[2]["summary"] == "delete_range [a, m)"
    assert entries[3]["summary"].startswith("batch of 3: 2 put, 1 delete")
    assert entries[4]["fragments"][0] == "FIRST" and entries[4]["fragments"][-1] == "LAST"
    assert set(entries[4]["fragments"][1:-1]) == {"MIDDLE"}
    assert all(r["fragments"] == ["FULL"] for r in entries[:4])
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(offsets)
    text = walkv("inspect", seg)
    assert text.returncode == 0 and "6 records, LSNs up to 5" in text.stdout
    raw = walkv("inspect", seg, "--raw")
    assert raw.returncode == 0
    types = [ln.split()[2] for ln in raw.stdout.splitlines()[1:-1]]
    assert types[:5] == ["FULL"] * 5 and types[5] == "FIRST" and types[-1] == "LAST"
    ops = walkv("inspect", seg, "--ops").stdout
    assert "put x = 2 (1 B)" in ops and "delete z" in ops


def test_inspect_shows_damage_and_goes_on(tmp_path):
    s = _store(str(tmp_path / "s"), n=300, segment_bytes=64 << 20)
    seg = list_segments(os.path.join(s, "wal"))[0].path
    rows = _records(seg)
    victim = rows[10]
    _flip(seg, victim["offset"] + 20)
    proc = walkv("inspect", seg)
    assert proc.returncode == 4
    assert f"{victim['offset']:>10}  BAD" in proc.stdout and "checksum mismatch" in proc.stdout
    after = [json.loads(ln) for ln in walkv("inspect", seg, "--json").stdout.splitlines()]
    # Records in later blocks are still listed (the reader resynchronises at the next block).
    assert any(r.get("lsn", 0) > victim["lsn"] + 1 for r in after)


def test_inspect_missing_and_directory(tmp_path):
    proc = walkv("inspect", str(tmp_path / "none.wal"))
    assert proc.returncode == 1 and "no such file" in one_line_error(proc)
    proc = walkv("inspect", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in one_line_error(proc)


def test_inspect_snapshot_chunk(tmp_path):
    info = snapshot.write(str(tmp_path / "snaps"), 7, [(b"a", b"1"), (b"b", b"2")])
    chunk = os.path.join(info.path, os.listdir(info.path)[0] if os.listdir(info.path)[0].endswith(".wkc")
                         else sorted(n for n in os.listdir(info.path) if n.endswith(".wkc"))[0])
    proc = walkv("inspect", chunk)
    assert proc.returncode == 0, proc.stderr
    assert "snapshot LSN 7" in proc.stdout and "2 pairs" in proc.stdout


# -- verify ----------------------------------------------------------------------------------------


def test_verify_clean_store(tmp_path):
    s = _store(str(tmp_path / "s"))
    assert len(list_segments(os.path.join(s, "wal"))) > 1
    proc = walkv("verify", s)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: no problems found" in proc.stdout and "400 entries" in proc.stdout
    report = json.loads(walkv("verify", s, "--json").stdout)
    assert report["problems"] == [] and report["checked"]["entries"] == 400


def test_corrupt_sealed_segment_verify_then_repair(tmp_path):
    s = _store(str(tmp_path / "s"))
    segs = list_segments(os.path.join(s, "wal"))
    seg = segs[1].path  # a sealed segment in the middle
    rows = _records(seg)
    victim = rows[len(rows) // 2]
    _flip(seg, victim["offset"] + 30)

    proc = walkv("verify", s)
    assert proc.returncode == 4
    assert f"CORRUPT: {seg}, offset {victim['offset']}: checksum mismatch" in proc.stdout
    assert f"walkv repair {s}" in proc.stdout
    report = json.loads(walkv("verify", s, "--json").stdout)
    assert report["problems"][0]["file"] == seg and report["problems"][0]["offset"] == victim["offset"]

    # Open reads only the headers and indexes of sealed segments; reading the
    # entries (a restore replays them all) finds the damage and names the fix.
    restored = walkv("restore", s, str(tmp_path / "copy"))
    assert restored.returncode == 4
    line = one_line_error(restored)
    assert seg in line and "walkv repair" in line

    # No terminal to ask on and no --yes: nothing is cut.
    before = sorted(os.listdir(os.path.join(s, "wal")))
    asked = walkv("repair", s)
    assert asked.returncode == 1 and "pass --yes" in one_line_error(asked)
    assert f"offset      {victim['offset']}" in asked.stdout
    dry = walkv("repair", s, "--dry-run")
    assert dry.returncode == 1 and "dry run: nothing was changed" in dry.stdout
    assert sorted(os.listdir(os.path.join(s, "wal"))) == before

    fixed = walkv("repair", s, "--yes")
    assert fixed.returncode == 0, fixed.stderr
    assert f"the log now ends at LSN {victim['lsn'] - 1}" in fixed.stdout
    broken = [n for n in os.listdir(os.path.join(s, "wal")) if n.endswith(".broken")]
    assert broken, "the cut bytes are kept"
    assert walkv("verify", s).returncode == 0
    again = walkv("repair", s, "--yes")
    assert again.returncode == 0 and "nothing to cut" in again.stdout

    # Everything before the bad record is there; the store opens and takes writes again.
    assert walkv("put", s, "new", "x").returncode == 0
    with kvstore.open(s) as db:
        assert db.last_lsn == victim["lsn"]
        assert [k for k, _ in db.scan(prefix=b"k")] == [b"k%05d" % i for i in range(victim["lsn"] - 1)]
        assert db.get(b"new") == b"x"


def test_corrupt_active_segment_before_a_later_block(tmp_path):
    # Damage in the active segment followed by valid data in a later block is
    # corruption, not a torn tail: verify reports it and repair cuts there.
    s = _store(str(tmp_path / "s"), n=300, segment_bytes=64 << 20)
    seg = list_segments(os.path.join(s, "wal"))[-1].path
    rows = _records(seg)
    victim = next(r for r in rows if r.get("lsn") and r["offset"] < BLOCK_SIZE - 1000 and r["lsn"] > 20)
    assert rows[-1]["offset"] > 2 * BLOCK_SIZE
    _flip(seg, victim["offset"] + 12)
    # As after a crash: no index sidecar for the active segment, so the next
    # writer's open scans it from the start (a clean close writes one, and
    # open then scans only from its last point).
    os.unlink(seg[:-4] + ".idx")
    proc = walkv("verify", s)
    assert proc.returncode == 4 and f"offset {victim['offset']}" in proc.stdout
    assert walkv("get", s, "k00001").returncode == 0  # a reader still reads the state it has
    opened = walkv("put", s, "new", "x")  # a writer's open refuses, naming the file and the fix
    assert opened.returncode == 4
    line = one_line_error(opened)
    assert seg in line and f"offset {victim['offset']}" in line and "walkv repair" in line
    assert walkv("repair", s, "--yes").returncode == 0
    assert walkv("verify", s).returncode == 0
    with kvstore.open(s) as db:
        assert db.last_lsn == victim["lsn"] - 1 and len(db) == victim["lsn"] - 1


def test_verify_missing_segment(tmp_path):
    s = _store(str(tmp_path / "s"))
    segs = list_segments(os.path.join(s, "wal"))
    assert len(segs) >= 3
    os.unlink(segs[1].path)
    proc = walkv("verify", s)
    assert proc.returncode == 4
    assert "missing" in proc.stdout and os.path.basename(segs[2].path) in proc.stdout


def test_verify_damaged_index_is_a_problem_not_corruption(tmp_path):
    s = _store(str(tmp_path / "s"))
    idx = list_segments(os.path.join(s, "wal"))[0].path[:-4] + ".idx"
    _flip(idx, 12)
    proc = walkv("verify", s)
    assert proc.returncode == 1
    assert "PROBLEM" in proc.stdout and os.path.basename(idx) in proc.stdout


def test_verify_damaged_snapshot(tmp_path):
    s = _store(str(tmp_path / "s"), n=50)
    with kvstore.open(s) as db:
        info = snapshot.write(os.path.join(s, "snapshots"), db.last_lsn, db.scan())
    assert walkv("verify", s).returncode == 0
    chunk = os.path.join(info.path, sorted(n for n in os.listdir(info.path) if n.endswith(".wkc"))[0])
    _flip(chunk, os.path.getsize(chunk) - 10)
    proc = walkv("verify", s)
    assert proc.returncode == 4
    assert chunk in proc.stdout


def test_verify_log_gap_after_newest_snapshot(tmp_path):
    s = _store(str(tmp_path / "s"))
    segs = list_segments(os.path.join(s, "wal"))
    for seg in segs[:2]:  # as if retention had run without a snapshot covering them
        os.unlink(seg.path)
        if os.path.exists(seg.path[:-4] + ".idx"):
            os.unlink(seg.path[:-4] + ".idx")
    proc = walkv("verify", s)
    assert proc.returncode == 4
    assert f"the log starts at LSN {segs[2].first_lsn}" in proc.stdout


# -- repair ---------------------------------------------------------------------------------------


def test_repair_whole_log_and_bare_log_directory(tmp_path):
    s = _store(str(tmp_path / "s"), n=20)
    proc = walkv("repair", s, "--yes")
    assert proc.returncode == 0 and "nothing to cut" in proc.stdout
    bare = walkv("repair", os.path.join(s, "wal"), "--dry-run")
    assert bare.returncode == 0 and "nothing to cut" in bare.stdout


def test_repair_refuses_a_locked_store(tmp_path):
    s = _store(str(tmp_path / "s"), n=10)
    with kvstore.open(s):
        proc = walkv("repair", s, "--yes")
    assert proc.returncode == 3
    assert str(os.getpid()) in one_line_error(proc)


def test_repair_refuses_a_log_open_by_itself(tmp_path):
    # The log's own lock counts too: a process with only the log open (no
    # store) keeps repair out.
    import wal

    s = _store(str(tmp_path / "s"), n=10)
    with wal.open(os.path.join(s, "wal")):
        proc = walkv("repair", s, "--yes")
        bare = walkv("repair", os.path.join(s, "wal"), "--yes")
    assert proc.returncode == 3 and bare.returncode == 3
    assert "the log" in one_line_error(proc) and str(os.getpid()) in one_line_error(bare)


def test_verify_of_a_damaged_log_counts_what_it_read_before_the_damage(tmp_path):
    """Issue 33: verify printed "0 segments ... 0 entries checked" before the
    CORRUPT line: it counts what it read up to the first bad record, of how
    many segments, and says where reading stopped (and no index problem
    for the segment it stopped in)."""
    s = _store(str(tmp_path / "s"))
    segs = list_segments(os.path.join(s, "wal"))
    rows = _records(segs[1].path)
    victim = rows[len(rows) // 2]
    _flip(segs[1].path, victim["offset"] + 30)
    proc = walkv("verify", s)
    assert proc.returncode == 4
    head = proc.stdout.splitlines()[0]
    expected = f"2 of {len(segs)} segments"
    assert expected in head and f"{victim['lsn'] - 1} entries (the log read up to its first bad record)" in head
    assert "PROBLEM" not in proc.stdout
    report = json.loads(walkv("verify", s, "--json").stdout)
    assert report["checked"]["entries"] == victim["lsn"] - 1 and report["checked"]["log_segments"] == len(segs)
