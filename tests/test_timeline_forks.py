"""The fork the HA issue reproduced, and what a history that changes course
does to everything that reads a log it did not write (wal/timeline.py).

1. A store and a replica both hold LSNs 1..100.
2. A damaged record at LSN 70 is cut by a repair; the store then writes 50
   new entries, which get LSNs 70..119 again, on timeline 2.
3. The replica, following the store again, must not serve the old keys
   70..100 beside the new ones (a state the store never had): it sees the
   fork and rebuilds from a snapshot, with a warning that names both
   timelines and the fork LSN.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

import kvstore
from kvstore.store.repair import repair_store
from tests.served import ServerThread
from tests.test_repair_snapshots import damage_record
from wal.errors import ForkedHistoryError
from wal.timeline import TimelineStart


def _old(i: int) -> bytes:
    return b"old-%03d" % i


def _new(i: int) -> bytes:
    return b"new-%03d" % i


def fork_the_store(path: str) -> None:
    """Steps 2: the store, holding LSNs 1..100 (one key each), has LSN 70
    damaged and cut, and writes 50 new keys at LSNs 70..119."""
    damage_record(path, 70)
    report = repair_store(path, f"{path}/wal").log
    assert report.cut and report.last_good_lsn == 69
    assert report.timeline is not None and report.timeline.first_lsn == 70
    with kvstore.open(path, segment_bytes=16 << 10) as db:
        assert db.last_lsn == 69 and db.history[-1].timeline == 2
        for i in range(50):
            db.put(_new(i), b"n")
        assert db.last_lsn == 119


def wait_until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def expected_state() -> dict[bytes, bytes]:
    return {**{_old(i): b"o" for i in range(1, 70)}, **{_new(i): b"n" for i in range(50)}}


def _fill(path: str) -> None:
    with kvstore.open(path, segment_bytes=16 << 10) as db:
        for i in range(1, 101):
            assert db.put(_old(i), b"o") == i


@pytest.mark.parametrize("kind", ["directory", "http"])
@pytest.mark.parametrize("running", [True, False], ids=["running", "reopened"])
def test_a_replica_of_a_store_that_forked_rebuilds_and_never_mixes(tmp_path, caplog, kind, running):
    """The replica follows the store across its repair (running) or is
    reopened after it; either way it ends with the store's state."""
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    _fill(src)
    server = ServerThread(src) if kind == "http" else None
    source = server.url if server is not None else src
    with caplog.at_level(logging.WARNING, logger="walkv.replica"):
        rep = kvstore.open_replica(source, rdir, poll_interval=0.01)
        try:
            rep.wait_for(100)
            if not running:
                rep.close()
            if server is not None:
                port = int(server.url.rsplit(":", 1)[1])
                server.stop()   # the repair takes the store's lock
            fork_the_store(src)
            if server is not None:
                server = ServerThread(src, port=port)
            if not running:
                rep = kvstore.open_replica(source, rdir, poll_interval=0.01)
            wait_until(lambda: rep.applied_lsn == 119 and rep.history[-1].timeline == 2)
            assert dict(rep.scan()) == expected_state()   # not the old keys 70..100 beside the new
            assert rep.history == (TimelineStart(1, 1), rep.history[-1])
        finally:
            rep.close()
            if server is not None:
                server.stop()
    # it said why it started again: the fork, or (running, watching the store's files) a durable LSN
    # below what it applied: 69 when it looked between the repair and the first new put, up to 99
    # when the new puts had begun (a replica polling every 10 ms on a loaded machine)
    warned = [r.getMessage() for r in caplog.records if r.name == "walkv.replica"]
    behind = [int(lsn) for w in warned
              for lsn in re.findall(r"durable LSN (\d+) is before the replica's applied LSN 100", w)]
    assert any("after LSN 69" in w for w in warned) or any(69 <= lsn < 100 for lsn in behind), warned


def test_a_running_replica_sees_a_promotion_of_its_store_as_a_new_timeline_it_may_follow(tmp_path):
    """No fork before what it applied: a new timeline that continues its
    history is followed without a rebuild."""
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    _fill(src)
    with kvstore.open_replica(src, rdir, poll_interval=0.01) as rep:
        rep.wait_for(100)
        with kvstore.open(src) as db:
            db.start_timeline()
            db.put(b"after", b"1")
        rep.wait_for(101)
        assert rep.get(b"after") == b"1" and rep.rebuilds == 0
        assert rep.history[-1].timeline == 2 and rep.history[-1].first_lsn == 101


def test_a_replica_refuses_entries_past_a_fork_it_applied(tmp_path):
    """The check itself: a replica whose history holds LSNs past the point
    where the source's left it gets ForkedHistoryError (the replica's loop
    turns it into a rebuild), naming both timelines and the fork LSN."""
    from wal.timeline import check_follows

    mine = (TimelineStart(1, 1),)
    theirs = (TimelineStart(1, 1), TimelineStart(2, 70, 5))
    with pytest.raises(ForkedHistoryError) as info:
        check_follows(mine, 100, theirs, what="the replica", source="the store", hint="it rebuilds")
    text = str(info.value)
    assert "timeline 1" in text and "timeline 2" in text and "after LSN 69" in text


def test_a_restore_to_an_earlier_point_takes_its_writes_on_a_new_timeline(tmp_path):
    """A point-in-time restore to LSN 60 of a store at LSN 100: the restored
    log's history forks after LSN 60, so its writes (LSNs 61..) are on a
    timeline of their own, never taken for the source's 61..100."""
    from wal.timeline import timeline_at

    src = str(tmp_path / "src")
    _fill(src)
    info = kvstore.restore(src, str(tmp_path / "restored"), to_lsn=60)
    assert info.lsn == 60
    with kvstore.open(info.path) as db:
        root, fork = db.history
        assert root.timeline == 1 and fork.timeline == 2 and fork.first_lsn == 61
        assert [db.put(_new(i), b"n") for i in range(5)] == [61, 62, 63, 64, 65]
        assert timeline_at(db.history, 65) == fork and timeline_at(db.history, 60) == root
        assert dict(db.scan()) == {**{_old(i): b"o" for i in range(1, 61)}, **{_new(i): b"n" for i in range(5)}}
    with kvstore.open(src, readonly=True) as db:
        assert db.history == (TimelineStart(1, 1),) and db.last_lsn == 100


def test_a_follower_discards_nothing_for_a_node_that_does_not_lead_its_epoch(tmp_path):
    """The stale-disk fault (tests/test_cluster_faults.py) found it: the
    leader of epoch 3 killed and started again at its address from a copy
    of its disk taken before it led (on timeline 1, LSN 50). A follower
    that held its epoch-3 entries and still followed that address took the
    old history for its leader's, saw a fork at LSN 50 and discarded entries
    the leader had acknowledged. It must refuse that node instead."""
    import shutil

    from kvstore.cluster.follower import Follower
    from wal.errors import ReplicaError

    stale, mine = str(tmp_path / "stale"), str(tmp_path / "follower")
    with kvstore.open(stale) as db:
        for i in range(1, 51):
            db.put(_old(i), b"o")
    shutil.copytree(stale, mine)
    with kvstore.open(mine) as db, ServerThread(stale) as server:
        db.start_timeline(3)
        for i in range(10):
            db.put(_new(i), b"n")  # what it had from epoch 3's leader (acknowledged with it)
        follower = Follower(db, "http://127.0.0.1:1")
        try:
            follower.follow(server.url, 3)
            wait_until(lambda: follower.last_error is not None or follower.needs is not None)
        finally:
            follower.stop()
        assert follower.needs is None and isinstance(follower.last_error, ReplicaError), follower.needs
        assert "does not lead" in str(follower.last_error)
        assert db.last_lsn == 60 and db.history[-1].timeline == 3 and db.get(_new(9)) == b"n"
