"""Timelines in the log (wal/timeline.py, the segment header's history,
Log.start_timeline, truncate_after's fork, recovery's checks).

Real files and fsyncs; segments small so that forks meet rolls.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wal
from wal.errors import CorruptionError, Damage, ForkedHistoryError
from wal.record import RecordWriter
from wal.segment import (
    decode_header,
    encode_header,
    list_segments,
    pack_entry_header,
    read_newest_header,
)
from wal.timeline import (
    MAX_HISTORY,
    ROOT,
    TimelineStart,
    check_follows,
    fork_history,
    fork_point,
    new_timeline,
    timeline_at,
)
from wal.truncation import TRUNCATE_MARKER, mark_truncate

SID = "0123456789abcdef0123456789abcdef"


def histories() -> st.SearchStrategy[tuple[TimelineStart, ...]]:
    """Well-formed histories: numbers rising, first LSNs not falling."""
    def build(steps: list[tuple[int, int, int]]) -> tuple[TimelineStart, ...]:
        out = [TimelineStart(1, 1, 0)]
        for dn, dl, uid in steps:
            out.append(TimelineStart(out[-1].timeline + dn, out[-1].first_lsn + dl, uid))
        return tuple(out)
    step = st.tuples(st.integers(1, 1000), st.integers(0, 10**6), st.integers(1, 2**63 - 1))
    return st.lists(step, max_size=40).map(build)


@given(histories(), st.integers(1, 2**40))
def test_header_round_trips_with_its_history(history, extra):
    first = history[-1].first_lsn + extra
    header = decode_header(encode_header(SID, first, 1 << 20, history), "seg")
    assert header.history == history
    assert header.timeline == history[-1]
    assert (header.first_lsn, header.store_id, header.max_record_bytes, header.version) == (first, SID, 1 << 20, 3)


def test_a_header_that_puts_its_first_lsn_before_its_timeline_is_refused():
    with pytest.raises(ValueError):
        encode_header(SID, 5, 1 << 20, (TimelineStart(1, 1), TimelineStart(2, 10, 7)))
    good = encode_header(SID, 10, 1 << 20, (TimelineStart(1, 1), TimelineStart(2, 10, 7)))
    bad = good[:10] + good[10:].replace((10).to_bytes(8, "little"), (9).to_bytes(8, "little"), 1)
    with pytest.raises(CorruptionError) as info:
        decode_header(bad, "seg")
    assert info.value.kind is Damage.HEADER


def test_a_history_of_falling_numbers_or_too_many_timelines_is_corruption():
    good = encode_header(SID, 10, 1 << 20, (TimelineStart(1, 1), TimelineStart(2, 10, 7)))
    # the second timeline's number (2) made 1: no longer rising
    at = good.index((2).to_bytes(8, "little") + (10).to_bytes(8, "little"))
    bad = good[:at] + (1).to_bytes(8, "little") + good[at + 8:]
    with pytest.raises(CorruptionError, match="not a line"):
        decode_header(bad, "seg")
    count_at = len(good) - 2 - 2 * 24
    huge = good[:count_at] + (MAX_HISTORY + 1).to_bytes(2, "little") + good[count_at + 2:]
    with pytest.raises(CorruptionError, match="bad size"):
        decode_header(huge, "seg")


def test_timeline_at_and_fork_point():
    a = (TimelineStart(1, 1), TimelineStart(2, 70, 11))
    b = (TimelineStart(1, 1), TimelineStart(2, 70, 11), TimelineStart(5, 120, 12))
    c = (TimelineStart(1, 1), TimelineStart(3, 60, 13))
    assert timeline_at(a, 69).timeline == 1 and timeline_at(a, 70).timeline == 2
    assert fork_point(a, 200, b) == 119   # a holds 120..200 on timeline 2; b left it after 119
    assert fork_point(a, 119, b) is None  # a prefix of b's history
    assert fork_point(a, 59, c) is None
    assert fork_point(a, 60, c) == 59
    assert fork_point(ROOT, 10**9, ROOT) is None
    # the same number with another uid is another timeline: two unco-ordinated promotions
    twin = (TimelineStart(1, 1), TimelineStart(2, 70, 99))
    assert fork_point(a, 70, twin) == 69
    with pytest.raises(ForkedHistoryError) as info:
        check_follows(a, 80, twin, what="the replica", source="the store", hint="rebuild it")
    assert info.value.fork_lsn == 69 and info.value.mine == a[1] and info.value.theirs == twin[1]


def test_new_timeline_and_fork_history():
    h = (TimelineStart(1, 1), TimelineStart(4, 50, 3))
    t = new_timeline(h, 80)
    assert t.timeline == 5 and t.first_lsn == 80 and t.uid != 0
    assert new_timeline(h, 80, number=9).timeline == 9
    with pytest.raises(ValueError):
        new_timeline(h, 80, number=4)
    # a fork before timeline 4 began drops it from the line
    assert fork_history(h, TimelineStart(6, 30, 1)) == (TimelineStart(1, 1), TimelineStart(6, 30, 1))


def _entries(path: Path) -> list[tuple[int, bytes]]:
    return [(e.lsn, e.payload) for e in wal.read_log(str(path))]


def test_start_timeline_rolls_to_a_segment_on_the_new_timeline(tmp_path):
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        for i in range(5):
            log.append(b"a%d" % i)
        assert log.history == ROOT
        t = log.start_timeline()
        assert (t.timeline, t.first_lsn) == (2, 6) and log.timeline == t
        assert log.append(b"b") == 6
        t3 = log.start_timeline(number=7)   # an epoch
        assert t3.timeline == 7 and log.history == (TimelineStart(1, 1), t, t3)
        t4 = log.start_timeline()           # nothing written on 7: its segment is replaced, 7 leaves the line
        assert t4.timeline == 8 and t4.first_lsn == 7 and log.history == (TimelineStart(1, 1), t, t4)
    names = [os.path.basename(s.path) for s in list_segments(str(d))]
    assert names == ["00000000000000000001.wal", "00000000000000000006.wal", "00000000000000000007.wal"]
    with wal.open(d) as log:                # the history survives a reopen
        assert log.history == (TimelineStart(1, 1), t, t4)
        assert log.append(b"c") == 7
    assert _entries(d)[-2:] == [(6, b"b"), (7, b"c")]


def test_truncate_after_forks_onto_a_new_timeline(tmp_path):
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        for i in range(100):
            log.append(b"old%03d" % i)
        fork = log.truncate_after(69)
        assert fork is not None and fork.first_lsn == 70 and fork.timeline == 2
        assert log.truncate_after(200) is None       # nothing after it: no fork
        assert log.append(b"new") == 70
    header = read_newest_header(str(d))
    assert header is not None and header.history == (TimelineStart(1, 1), fork)
    assert _entries(d)[-1] == (70, b"new")


def test_a_truncate_interrupted_before_its_timeline_began_is_finished_at_open(tmp_path):
    """The crash between the cut and the new timeline's segment: the next
    open cuts, and begins the timeline the marker names, so the cut LSNs are
    never written again on the old timeline."""
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=4096) as log:
        for i in range(30):
            log.append(b"x%d" % i)
    fork = TimelineStart(2, 21, 12345)
    mark_truncate(str(d), 20, history=(TimelineStart(1, 1), fork))
    with wal.open(d) as log:
        assert log.last_lsn == 20 and log.timeline == fork
        assert not os.path.exists(d / TRUNCATE_MARKER)
        assert log.append(b"y") == 21
    with wal.open(d) as log:               # and once only
        assert log.history == (TimelineStart(1, 1), fork) and log.last_lsn == 21


def test_a_segment_of_another_history_is_refused_at_open(tmp_path):
    """A segment copied in from a twin history (the same store, the same LSNs,
    another timeline: a second promotion nobody coordinated) is corruption of
    kind TIMELINE, not data."""
    d, twin = tmp_path / "log", tmp_path / "twin"
    with wal.open(d, segment_bytes=4096) as log:
        for i in range(60):
            log.append(b"v%03d" % i)
    shutil.copytree(d, twin)
    for path in (d, twin):
        with wal.open(path, segment_bytes=4096) as log:
            log.start_timeline()
            for i in range(100):
                log.append(b"w" * 100)
    mine = list_segments(str(d))
    assert [s.first_lsn for s in mine] == [s.first_lsn for s in list_segments(str(twin))]
    forked = next(s for s in mine if s.first_lsn == 61)
    assert forked is not mine[-1]
    shutil.copyfile(os.path.join(twin, os.path.basename(forked.path)), forked.path)
    with pytest.raises(CorruptionError) as info:
        wal.open(d).close()
    assert info.value.kind is Damage.TIMELINE and info.value.lsn == 61
    assert "another history" in str(info.value)


def test_a_fork_a_fill_placed_before_a_sealed_segment_is_accepted(tmp_path):
    """A repair that fills LSNs inside an older segment begins the new
    timeline there; later sealed segments keep the line they began on (a
    prefix of the log's history): the log opens, every entry on the new line."""
    d = tmp_path / "log"
    with wal.open(d, segment_bytes=2048) as log:
        for i in range(40):
            log.append(b"e%03d" % i * 50)
    segs = list_segments(str(d))
    assert len(segs) >= 4
    fork = TimelineStart(2, segs[1].first_lsn + 1, 77)
    mark_truncate(str(d), 40, history=(TimelineStart(1, 1), fork))   # what a salvage leaves (nothing cut)
    with wal.open(d) as log:
        assert log.history == (TimelineStart(1, 1), fork) and log.last_lsn == 40
    with wal.open(d) as log:   # and again: the sealed segments of timeline 1 after the fork are accepted
        assert [e.lsn for e in log.read_entries()] == list(range(1, 41))


def test_a_log_of_format_2_reads_as_timeline_1(tmp_path):
    """Stores written before timelines open unchanged, on timeline 1."""
    d = tmp_path / "log"
    d.mkdir()
    with open(d / "00000000000000000001.wal", "wb") as f:  # a segment as walkv wrote it before format 3
        w = RecordWriter(f)
        w.add_record(struct.pack("<8sHH16sQQQ", b"WALKVLOG", 2, 0, bytes.fromhex(SID), 1, 0, 64 << 20))
        for lsn, p in ((1, b"p1"), (2, b"p2")):
            w.add_record(pack_entry_header(lsn, 0) + p)
    with wal.open(d) as log:
        assert log.history == ROOT and log.last_lsn == 2
        assert log.append(b"p3") == 3
    assert [p for _, p in _entries(d)] == [b"p1", b"p2", b"p3"]


@settings(deadline=None, max_examples=25)
@given(st.lists(st.sampled_from(["append", "fork", "cut"]), min_size=1, max_size=25), st.data())
def test_any_sequence_of_forks_leaves_a_log_whose_history_names_every_entry(tmp_path_factory, ops, data):
    """A model: after appends, start_timeline and truncate_after in any order,
    the log holds the model's entries and each LSN is on the timeline the
    model says, across a reopen."""
    d = tmp_path_factory.mktemp("fork") / "log"
    model: list[tuple[bytes, TimelineStart]] = []
    with wal.open(d, segment_bytes=2048) as log:
        for op in ops:
            if op == "append":
                p = os.urandom(data.draw(st.integers(1, 600)))
                log.append(p)
                model.append((p, log.timeline))
            elif op == "fork":
                log.start_timeline()
            elif model:
                keep = data.draw(st.integers(0, len(model)))
                fork = log.truncate_after(keep)
                assert (fork is None) == (keep == len(model))
                del model[keep:]
    with wal.open(d) as log:
        got = _entries(d)
        assert [p for _, p in got] == [p for p, _ in model]
        for lsn, (_, tl) in enumerate(model, 1):
            assert timeline_at(log.history, lsn) == tl


def test_a_follower_copies_entries_with_their_lsns_and_times_and_mirrors_its_leaders_timelines(tmp_path):
    """append_replicated writes another log's entries as they are (LSN,
    commit time, payload); a follower that starts its leader's timeline
    before the first entry of it ends with its leader's history."""
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    with wal.open(leader_dir, segment_bytes=4096) as leader:
        for i in range(30):
            leader.append(b"a%d" % i)
        t = leader.start_timeline(number=5)
        for i in range(30):
            leader.append(b"b%d" % i)
        want = list(leader.read_entries())
        history = leader.history
    with wal.open(follower_dir, segment_bytes=2048) as follower:
        got_first = follower.append_replicated(want[:10], [None] * 10)
        assert got_first == 1
        follower.append_replicated(want[10:30], [None] * 20)
        with pytest.raises(ValueError):
            follower.append_replicated(want[31:32], [None])   # not the next LSN
        follower.start_timeline(timeline=t)
        follower.append_replicated(want[30:], [None] * 30)
        assert follower.history == history
        assert list(follower.read_entries()) == want            # times included
        assert follower.append(b"local") == 61


def test_truncate_after_with_follow_takes_the_leaders_line(tmp_path):
    """A deposed leader that began timeline 5 at LSN 101 and wrote 101..110
    rejoins a leader whose timeline 6 began at 105: it drops 105..110 and
    goes on on timeline 6, its history the leader's up to there."""
    d = tmp_path / "log"
    t5 = TimelineStart(5, 101, 55)
    leader_history = (TimelineStart(1, 1), t5, TimelineStart(6, 105, 66))
    with wal.open(d, segment_bytes=4096) as log:
        for i in range(100):
            log.append(b"x")
        log.start_timeline(timeline=t5)
        for i in range(10):
            log.append(b"y")
        assert fork_point(log.history, log.last_lsn, leader_history) == 104
        goes_on = log.truncate_after(104, follow=leader_history)
        assert goes_on == leader_history[2] and log.history == leader_history and log.last_lsn == 104
        with pytest.raises(ValueError):
            log.truncate_after(50, follow=(TimelineStart(1, 1), TimelineStart(9, 40, 9)))  # left mine before 50
    with wal.open(d) as log:
        assert log.history == leader_history and log.last_lsn == 104
