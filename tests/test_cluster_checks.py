"""The cluster tests' checks (tests/cluster_checks.py) catch what they are
for, on logs written by real stores and on hand-made client records: an
entry that differs on two nodes at one (timeline, LSN), a write lost or at
the wrong LSN, two nodes acknowledging in one epoch, a read served from a
forked history, and a history with a hole."""

from __future__ import annotations

import os

import kvstore
from kvstore.entry import codec
from tests.cluster_checks import (
    UNKNOWN,
    NodeLog,
    States,
    effective_writes,
    final_history,
    forked_reads,
    forks,
    lost_writes,
    read_log,
    shared_epochs,
    timeline_at,
    verdict,
)
from tests.cluster_workload import Write
from tests.linearizability import FAIL, INFO, OK, READ, WRITE, Op


def store_log(tmp_path, name: str, writes: list[tuple[bytes, bytes]], cas: bool = False) -> NodeLog:
    path = str(tmp_path / name)
    with kvstore.open(path, segment_bytes=1 << 20) as db:
        for key, value in writes:
            db.put(key, value)
        if cas:
            assert not db.compare_and_set(b"reg/0", b"nope", b"x")  # logged as a failed batch
            assert db.compare_and_set(b"reg/0", None, b"first")
    return read_log(name, os.path.join(path, "wal"))


def test_a_log_is_read_with_its_timeline_and_writes(tmp_path):
    log = store_log(tmp_path, "n1", [(b"a", b"1"), (b"b", b"2")], cas=True)
    assert log.history[0][0] == 1 and log.last_lsn == 4
    assert [t for t, _ in log.entries.values()] == [1, 1, 1, 1]
    assert [effective_writes(p) for _, p in log.entries.values()] == [
        [(b"a", b"1")], [(b"b", b"2")], [], [(b"reg/0", b"first")]]


def test_timeline_at_follows_the_history():
    history = ((1, 1), (3, 101), (4, 101), (7, 250))
    assert [timeline_at(history, lsn) for lsn in (1, 100, 101, 249, 250, 10**6)] == [1, 1, 4, 4, 7, 7]


def test_two_entries_at_one_timeline_and_lsn_are_a_fork(tmp_path):
    same = [store_log(tmp_path, n, [(b"a", b"1"), (b"b", b"2")]) for n in ("n1", "n2")]
    assert forks(same) == []
    other = store_log(tmp_path, "n3", [(b"a", b"1"), (b"b", b"other")])
    found = forks([*same, other])
    assert len(found) == 1 and "timeline 1 LSN 2" in found[0] and "n3" in found[0]
    moved = NodeLog("n4", ((1, 1), (2, 2)), {1: (1, other.entries[1][1]), 2: (2, other.entries[2][1])})
    assert forks([*same, moved]) == []  # LSN 2 on timeline 2 is another entry than timeline 1's


def test_the_final_history_comes_from_every_node_and_names_holes(tmp_path):
    full = store_log(tmp_path, "n1", [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")])
    tail = NodeLog("n2", full.history, {3: full.entries[3]})  # bootstrapped from a snapshot at LSN 2
    states, problems = final_history([full, tail], "n2")
    assert problems == [] and states.last == 3
    assert [states.value_at(b"a", lsn) for lsn in (0, 1, 2, 3)] == [None, b"1", b"1", b"3"]
    trimmed, problems = final_history([tail], "n2")  # trimmed after a snapshot on every node
    assert problems == [] and trimmed.first == 3
    assert trimmed.value_at(b"a", 3) == b"3" and trimmed.value_at(b"b", 3) is UNKNOWN
    hole = NodeLog("n2", full.history, {1: full.entries[1], 3: full.entries[3]})
    _, problems = final_history([hole], "n2")
    assert problems and "LSN 2" in problems[0]


def write(key: bytes, value: bytes, status: str = OK, lsn: int | None = None, epoch: int | None = 1,
          node: str | None = "http://n1", via: str = "raw") -> Write:
    return Write(key, value, via, status, node, epoch, lsn, node)


def test_lost_and_misplaced_and_refused_writes(tmp_path):
    log = store_log(tmp_path, "n1", [(b"w/0/1", b"v1"), (b"w/0/2", b"v2")])
    states, _ = final_history([log], "n1")
    found = {b"w/0/1": b"v1", b"w/0/2": b"v2"}
    good = [write(b"w/0/1", b"v1", lsn=1), write(b"w/0/2", b"v2", lsn=2), write(b"w/0/3", b"v3", INFO)]
    assert lost_writes(good, states, found) == []
    lost = lost_writes([write(b"w/0/9", b"v9", lsn=3)], states, found)
    assert any(p.startswith("LOST") for p in lost)
    assert "LSN 1" in lost_writes([write(b"w/0/2", b"v2", lsn=1)], states, found)[0]
    assert "timeline 1" in lost_writes([write(b"w/0/1", b"v1", lsn=1, epoch=5)], states, found)[0]
    assert "refused" in lost_writes([write(b"w/0/1", b"v1", FAIL)], states, found)[0]


def test_two_nodes_acknowledging_in_one_epoch():
    writes = [write(b"a", b"1", lsn=1, epoch=3, node="http://n1"), write(b"b", b"1", lsn=2, epoch=4, node="http://n2")]
    assert shared_epochs(writes, []) == []
    op = Op("p", WRITE, b"reg/0", b"x", None, 0.0, 1.0, OK, ("http://n2", 3, 3, "http://n2"))
    assert shared_epochs(writes, [op]) == ["epoch 3: writes acknowledged by ['http://n1', 'http://n2']"]
    assert "without" in shared_epochs([write(b"c", b"1", epoch=None)], [])[0]


def test_a_read_from_a_forked_history():
    states = States({1: (1, codec.encode([[codec.OP_PUT, b"reg/0", b"a"]])),
                     2: (1, codec.encode([[codec.OP_PUT, b"reg/0", b"b"]]))})
    read = lambda value, lsn: Op("p", READ, b"reg/0", None, value, 0.0, 1.0, OK, ("n2", lsn, 0))
    assert forked_reads([read(b"a", 1), read(b"b", 2), read(None, 0)], states) == ([], 3)
    problems, _ = forked_reads([read(b"b", 1), read(b"b", 7)], states)
    assert len(problems) == 2 and "past the final" in problems[1]


def test_verdict_runs_every_check(tmp_path):
    log = store_log(tmp_path, "n1", [(b"w/0/1", b"v1"), (b"reg/0", b"x")])
    ops = [Op("p", WRITE, b"reg/0", b"x", None, 0.0, 1.0, OK, ("http://n1", 1, 2, "http://n1")),
           Op("q", READ, b"reg/0", None, b"x", 2.0, 3.0, OK, ("n1", 2, 2))]
    good = verdict([log], "n1", [write(b"w/0/1", b"v1", lsn=1)], ops, {b"w/0/1": b"v1"})
    assert good.ok, good.text()
    assert good.stats["acknowledged"] == 2 and good.stats["reads_checked"] == 1
    stale = ops + [Op("r", READ, b"reg/0", None, None, 4.0, 5.0, OK, ("n1", None, 2))]
    bad = verdict([log], "n1", [write(b"w/0/1", b"v1", lsn=1)], stale, {b"w/0/1": b"v1"})
    assert not bad.ok and bad.problems["registers linearizable"] and "NOT linearizable" in bad.text()
