"""``walkv repair`` never loses what a good snapshot holds (issue 24).

Real stores with small segments (several sealed ones and the active one),
two snapshots (at S1 = 5 and S2 = 40) and 70 puts of distinct keys, so the
state after LSN n is exactly the keys of the LSNs applied. One byte of one
record (or of a segment header) is flipped, then ``walkv repair --yes`` (a
subprocess, as a person runs it) or :func:`kvstore.store.repair.repair_store`,
then the store is opened again. The rules under test:

* damage at or below the newest good snapshot's LSN loses nothing: the log
  restarts after it, the state is the snapshot plus every entry after it;
* damage after it is cut at the first bad record; ``--salvage`` keeps every
  intact entry after it, each lost LSN an empty entry (LSNs stay
  consecutive, none renumbered);
* the report names exactly the LSNs lost and the snapshot the state comes
  from; what is taken out is kept in ``.broken`` files; ``--dry-run``
  changes nothing; the next open rebuilds LMDB from the snapshot when it
  may hold writes the log lost; ``verify`` is clean and a second repair
  finds nothing to do; a crash at any step of a repair leaves files a second
  repair finishes.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
import snapshot
import wal
from kvstore.store.repair import repair_store
from tests.faultfs import PLAIN, FaultFS, count_boundaries, run_to_crash, scratch_dir
from tests.test_cli import walkv
from tests.test_cli_files import _flip as flip
from wal.record_reader import RecordReader
from wal.segment import list_segments

S1, S2, LAST = 5, 40, 70
SEGMENT_BYTES = 1024


def key(i: int) -> bytes:
    return b"k%05d" % i


def value(i: int) -> bytes:
    return (b"v%05d-" % i) * 14


def expected(lsns) -> dict[bytes, bytes]:
    return {key(i): value(i) for i in lsns}


def build(path: str) -> str:
    with kvstore.open(path, segment_bytes=SEGMENT_BYTES) as db:
        for i in range(1, LAST + 1):
            assert db.put(key(i), value(i)) == i
            if i in (S1, S2):
                assert db.snapshot().lsn == i
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = build(str(tmp_path_factory.mktemp("repair") / "template"))
    segs = list_segments(wal_dir(path))
    assert len(segs) >= 6 and segs[0].first_lsn <= S1 + 1  # the log reaches back to the older snapshot
    assert [i.lsn for i in snapshot.list_snapshots(os.path.join(path, "snapshots"))] == [S1, S2]
    positions(path)
    return path


def copy_of(template: str, path) -> str:
    shutil.copytree(template, str(path))
    return str(path)


def wal_dir(store: str) -> str:
    return os.path.join(store, "wal")


def records(store: str) -> dict[int, tuple[str, int, int, bool]]:
    """LSN -> (segment path, record offset, record end, in the active segment)."""
    segs = list_segments(wal_dir(store))
    out = {}
    for n, seg in enumerate(segs):
        with open(seg.path, "rb") as fh:
            reader = RecordReader(fh, zeros_end=True)
            for off, payload in reader.records():
                if off:
                    out[int.from_bytes(payload[:8], "little")] = (seg.path, off, reader.end_offset, n == len(segs) - 1)
    return out


def damage_record(store: str, lsn: int, where: float = 0.5) -> None:
    path, off, end, _ = records(store)[lsn]
    flip(path, off + min(end - off - 1, int((end - off) * where)))


def state(store: str) -> tuple[dict[bytes, bytes], int, str | None]:
    with kvstore.open(store) as db:
        return dict(db.items()), db.last_lsn, db.rebuilt


def rebuilt_by(proc: subprocess.CompletedProcess) -> str | None:
    """Why the read-write open that ``walkv repair`` ends with rebuilt the
    state (None: it did not need to)."""
    found = re.search(r"^the state: +rebuilt \((.*)\); it holds", proc.stdout, re.MULTILINE)
    return found.group(1) if found else None


def check_whole(store: str) -> None:
    proc = walkv("verify", store)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = walkv("repair", store, "--yes")
    assert again.returncode == 0 and "nothing to cut" in again.stdout, again.stdout


def positions(store: str) -> dict[str, int]:
    """A damage LSN for each place that matters."""
    recs = records(store)
    active = min(lsn for lsn, r in recs.items() if r[3])
    sealed_after = next(lsn for lsn in range(S2 + 2, LAST) if not recs[lsn][3])
    assert S2 + 1 < active < LAST - 1 and not recs[S2][3]
    return {"before": 12, "just-before": S2 - 1, "inside": S2, "after-sealed": sealed_after,
            "after-active": active + 1}


# -- every damage position, through the CLI ---------------------------------------------------------


@pytest.mark.parametrize("salvage", [False, True], ids=["cut", "salvage"])
@pytest.mark.parametrize("place", ["before", "just-before", "inside", "after-sealed", "after-active"])
def test_repair_keeps_what_the_snapshot_holds(template, tmp_path, place, salvage):
    s = copy_of(template, tmp_path / "s")
    d = positions(s)[place]
    damage_record(s, d)
    flags = ["--salvage"] if salvage else []
    before = sorted(os.listdir(wal_dir(s)))
    dry = walkv("repair", s, "--dry-run", *flags)
    assert dry.returncode == 1 and "dry run: nothing was changed" in dry.stdout, dry.stdout + dry.stderr
    assert sorted(os.listdir(wal_dir(s))) == before

    proc = walkv("repair", s, "--yes", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if d <= S2:  # below the snapshot: nothing is lost, the log starts after the damage
        lost: list[int] = []
    elif salvage:  # the one bad record; an empty entry keeps its LSN
        lost = [d]
    else:  # cut at the bad record, as always
        lost = list(range(d, LAST + 1))
    got, last, _ = state(s)
    rebuilt = rebuilt_by(proc)
    assert got == expected(i for i in range(1, LAST + 1) if i not in lost)
    assert expected(range(1, S2 + 1)).items() <= got.items(), "nothing the snapshot holds is lost"
    assert last == (LAST if salvage or not lost else d - 1)

    for out in (dry.stdout, proc.stdout):  # the report: the snapshot, what is taken out, what is lost
        assert f"snapshot:     LSN {S2} ({os.path.join(s, 'snapshots', snapshot.snapshot_dir_name(S2))})" in out
        if not lost:
            assert "lost:         nothing" in out
            assert f"taken out:    LSNs {list_segments(wal_dir(template))[0].first_lsn}..{d}" in out
        elif salvage:
            assert f"lost:         LSNs {d} (1 write(s) after the snapshot at LSN {S2})" in out
            assert f"LSNs {d} stay in the log as empty entries" in out
        else:
            assert f"lost:         LSNs {d}..{LAST} ({LAST - d + 1} write(s) after the snapshot at LSN {S2})" in out
    if not lost:
        assert list_segments(wal_dir(s))[0].first_lsn == d + 1
    elif not salvage:
        assert f"the log now ends at LSN {d - 1}" in proc.stdout
    assert any(n.endswith(".broken") for n in os.listdir(wal_dir(s))), "what is taken out is kept"
    if lost:  # LMDB had applied writes the log no longer has: rebuilt, from the snapshot
        assert rebuilt is not None and "walkv repair" in rebuilt and f"snapshot at LSN {S2}" in rebuilt
    check_whole(s)


@pytest.mark.parametrize("salvage", [False, True], ids=["cut", "salvage"])
@pytest.mark.parametrize("which", ["before", "after", "active"])
def test_damaged_segment_header(template, tmp_path, which, salvage):
    s = copy_of(template, tmp_path / "s")
    segs = list_segments(wal_dir(s))
    seg = {"before": next(x for x in segs if 10 < x.first_lsn <= S2),
           "after": next(x for x in segs[:-1] if x.first_lsn > S2 + 1),
           "active": segs[-1]}[which]
    flip(seg.path, 20)  # inside the header record: its checksum fails
    proc = walkv("repair", s, "--yes", *(["--salvage"] if salvage else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The entries after a bad header are intact: salvage keeps them all; so does
    # a cut below the snapshot (the log restarts with a new header there).
    lost = [] if salvage or seg.first_lsn <= S2 else list(range(seg.first_lsn, LAST + 1))
    got, _, _ = state(s)
    rebuilt = rebuilt_by(proc)
    assert got == expected(i for i in range(1, LAST + 1) if i not in lost)
    assert f"snapshot:     LSN {S2} " in proc.stdout
    if lost:
        assert f"lost:         LSNs {lost[0]}..{LAST} ({len(lost)} write(s) after the snapshot" in proc.stdout
        assert rebuilt is not None and f"rebuilt from the snapshot at LSN {S2}" in rebuilt
    else:
        assert "lost:         nothing" in proc.stdout and rebuilt is None
    check_whole(s)


# -- the issue's reproduction, and a log an older repair already cut ------------------------------------


def _issue_store(path: str) -> str:
    with kvstore.open(path) as db:
        for i in range(1, 31):
            db.put(key(i), value(i))
        db.snapshot()
        for i in range(31, 34):
            db.put(key(i), value(i))
    return path


def test_issue_24_reproduction(tmp_path):
    s = _issue_store(str(tmp_path / "s"))
    damage_record(s, 2, where=0.7)
    proc = walkv("repair", s, "--yes")
    assert proc.returncode == 0, proc.stderr
    got, last, _ = state(s)
    assert got == expected(range(1, 34)) and last == 33
    check_whole(s)
    snap = os.path.join(s, "snapshots", snapshot.snapshot_dir_name(30))
    restored = walkv("restore", snap, str(tmp_path / "r"))  # the snapshot where it sits: its own state
    assert restored.returncode == 0, restored.stderr
    with kvstore.open(str(tmp_path / "r")) as db:
        assert dict(db.items()) == expected(range(1, 31))
    restored = walkv("restore", snap, str(tmp_path / "r33"), "--to-lsn", "33")  # and on through the repaired log
    assert restored.returncode == 0, restored.stderr
    with kvstore.open(str(tmp_path / "r33")) as db:
        assert dict(db.items()) == expected(range(1, 34))


def test_a_log_cut_behind_its_snapshot_restarts_after_it(tmp_path):
    """What the old repair left: the log cut back to LSN 1 and LMDB rebuilt
    from it alone (1 key), the snapshot at LSN 30 intact. A repair now makes
    the log start after the snapshot, and the store has its 30 keys again."""
    s = _issue_store(str(tmp_path / "s"))
    with wal.open(wal_dir(s)) as lg:
        lg.truncate_after(1)
    with kvstore.open(s) as db:
        assert len(db) == 1
    assert "past the log's durable LSN 1" in walkv("verify", s).stdout
    proc = walkv("repair", s, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "the log ends before the newest snapshot" in proc.stdout and "LSN 30" in proc.stdout
    got, last, _ = state(s)
    assert got == expected(range(1, 31)) and last == 30 and rebuilt_by(proc)
    check_whole(s)
    assert walkv("put", s, "new", "x").returncode == 0
    with kvstore.open(s) as db:
        assert db.last_lsn == 31 and len(db) == 31


# -- the snapshot the state comes from ------------------------------------------------------------------


def test_a_damaged_newest_snapshot_is_passed_over(template, tmp_path):
    s = copy_of(template, tmp_path / "s")
    snap_dir = os.path.join(s, "snapshots", snapshot.snapshot_dir_name(S2))
    chunk = os.path.join(snap_dir, sorted(n for n in os.listdir(snap_dir) if n.endswith(".wkc"))[0])
    flip(chunk, os.path.getsize(chunk) - 10)
    damage_record(s, 20)
    proc = walkv("repair", s, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert f"snapshot:     LSN {S1} " in proc.stdout and f"passed over:  {snap_dir}" in proc.stderr
    assert f"lost:         LSNs 20..{LAST}" in proc.stdout
    got, last, _ = state(s)
    assert got == expected(range(1, 20)) and last == 19


def test_open_after_repair_rebuilds_from_the_snapshot(template, tmp_path, caplog):
    s = copy_of(template, tmp_path / "s")
    damage_record(s, S2 + 3)
    report = repair_store(s, wal_dir(s)).log
    assert report.lost == [(S2 + 3, LAST)] and report.base_lsn == S2
    caplog.set_level(logging.INFO, logger="walkv.recovery")
    got, _, rebuilt = state(s)
    assert rebuilt is not None and f"LSNs {S2 + 3}..{LAST}" in rebuilt
    assert any(f"pairs of the snapshot at LSN {S2}" in r.getMessage() for r in caplog.records)
    assert got == expected(range(1, S2 + 3))


def test_read_only_open_refuses_until_the_state_is_rebuilt(template, tmp_path):
    s = copy_of(template, tmp_path / "s")
    damage_record(s, S2 + 3)
    repair_store(s, wal_dir(s))
    with pytest.raises(kvstore.WalkvError, match="read-write once"):
        kvstore.open(s, readonly=True)
    state(s)
    with kvstore.open(s, readonly=True) as db:
        assert len(db) == S2 + 2


# -- salvage across a longer stretch of damage --------------------------------------------------------


def test_salvage_keeps_every_intact_entry_around_a_zeroed_stretch(tmp_path):
    s = str(tmp_path / "s")
    with kvstore.open(s, segment_bytes=8 << 10) as db:
        for i in range(1, 301):
            db.put(key(i), value(i))
            if i == 50:
                db.snapshot()
    recs = records(s)
    middle = list_segments(wal_dir(s))[2].path  # a sealed segment
    victim = sorted(lsn for lsn, r in recs.items() if r[0] == middle)[10]
    path, start, _, active = recs[victim]
    assert not active and victim > 50
    with open(path, "r+b") as f:  # 2000 bytes from inside the victim's record
        f.seek(start + 30)
        f.write(bytes(2000))
    lost = [lsn for lsn, (p, off, end, _) in recs.items() if p == path and off < start + 2030 and end > start + 30]
    assert len(lost) >= 5
    report = repair_store(s, wal_dir(s), salvage=True).log
    assert report.lost == report.filled == [(lost[0], lost[-1])]
    got, last, _ = state(s)
    assert last == 300 and got == expected(i for i in range(1, 301) if i not in lost)
    check_whole(s)


# -- any damage position (property) -------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data(), salvage=st.booleans())
def test_any_damage_position(template, tmp_path_factory, data, salvage):
    s = copy_of(template, tmp_path_factory.mktemp("any") / "s")
    recs = records(s)
    segs = list_segments(wal_dir(s))
    if data.draw(st.booleans(), label="header"):
        seg = data.draw(st.sampled_from(segs), label="segment")
        flip(seg.path, data.draw(st.integers(8, 40), label="header byte"))
        first_lost = seg.first_lsn
        lost = [] if salvage or seg.first_lsn <= S2 else list(range(seg.first_lsn, LAST + 1))
    else:
        d = data.draw(st.sampled_from(sorted(recs)), label="lsn")
        path, off, end, _ = recs[d]
        flip(path, data.draw(st.integers(off, end - 1), label="offset"))
        first_lost = d
        if d == LAST:  # the newest record of the active segment: a crash's torn tail, which open cuts
            lost = [d]
        elif d <= S2:
            lost = []
        else:
            lost = [d] if salvage else list(range(d, LAST + 1))
    report = repair_store(s, wal_dir(s), salvage=salvage).log
    assert [x for r in report.lost for x in range(r[0], r[1] + 1)] == [x for x in lost if x != LAST or report.cut]
    if report.cut:
        assert report.base_lsn == S2 and report.first_lsn <= S2 + 1
        assert report.first_lsn <= first_lost or first_lost <= S2
    got, _, _ = state(s)
    assert got == expected(i for i in range(1, LAST + 1) if i not in lost)
    assert wal.verify(wal_dir(s)) == []
    assert not repair_store(s, wal_dir(s), salvage=salvage).log.cut


# -- a crash during a repair ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["below", "salvage"])
def test_a_crash_at_any_step_of_a_repair_is_finished_by_another(template, tmp_path, case):
    damaged = copy_of(template, tmp_path / "damaged")
    d, salvage = (12, False) if case == "below" else (S2 + 3, True)
    damage_record(damaged, d)
    lost = [] if case == "below" else [d]
    want = expected(i for i in range(1, LAST + 1) if i not in lost)
    with scratch_dir(tmp_path) as scratch:
        work = os.path.join(scratch, "s")

        def fresh() -> None:
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(damaged, work)

        def workload(fs: FaultFS) -> None:
            repair_store(work, wal_dir(work), salvage=salvage, fs=fs)

        fresh()
        n = count_boundaries(workload)
        assert n >= 8
        for k in range(1, n + 2):
            fresh()
            run_to_crash(workload, FaultFS(), k, PLAIN, random.Random(k))
            repair_store(work, wal_dir(work), salvage=salvage)
            got, _, _ = state(work)
            assert got == want, f"crash at boundary {k} of {n}"
            assert wal.verify(wal_dir(work)) == []
