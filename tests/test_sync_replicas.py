"""Synchronous replicas in one store (kvstore/store/replication.py), and a
store that follows another's log (append_replicated, refuse_writes,
discard_after): the parts of a cluster node that need no network.
"""

from __future__ import annotations

import threading
import time

import pytest

import kvstore
from wal.errors import (
    FencedError,
    LogFailedError,
    NotLeaderError,
    OutcomeUnknownError,
    SnapshotError,
    SyncReplicationError,
)
from wal.timeline import TimelineStart


def test_a_write_waits_for_its_replica_and_is_visible_only_after(tmp_path):
    with kvstore.open(tmp_path / "s", sync_replicas=1, sync_timeout=10) as db:
        reps = db.replicas
        assert reps is not None
        seen: list[bytes | None] = []

        def replica() -> None:  # reports LSN 1 once the write is durable, and looks first
            while db.durable_lsn < 1:
                time.sleep(0.001)
            seen.append(db.get(b"k"))  # durable, not yet acknowledged: not applied
            reps.report("r1", 1, reps.epoch)

        t = threading.Thread(target=replica)
        t.start()
        assert db.put(b"k", b"v") == 1
        t.join()
        assert seen == [None] and db.get(b"k") == b"v"
        assert reps.holding(1) == 1 and reps.waits == 1
        assert db.stats()["sync_replicas"]["replicas"][0]["durable_lsn"] == 1


def test_one_replication_round_trip_serves_a_whole_group(tmp_path):
    """Writers that arrive while a group waits for its replica form the next
    group, which waits once for all of them: a wait per group, not per write."""
    writers = 32
    with kvstore.open(tmp_path / "s", sync_replicas=1, sync_timeout=30) as db:
        reps = db.replicas
        assert reps is not None
        groups_before = db.stats()["log"]["groups"]
        started = threading.Semaphore(0)
        release = threading.Event()

        def replica() -> None:  # reports what is durable, once the writers queued behind the first group
            reported = 0
            while reported < writers:
                lsn = db.durable_lsn
                if lsn > reported and release.is_set():
                    reps.report("r1", lsn, reps.epoch)
                    reported = lsn
                time.sleep(0.001)

        def writer(i: int) -> None:
            started.release()
            db.put(b"k%02d" % i, b"v")

        threads = [threading.Thread(target=replica)] + [threading.Thread(target=writer, args=(i,))
                                                          for i in range(writers)]
        for t in threads:
            t.start()
        for _ in range(writers):
            started.acquire()
        while db.durable_lsn < 1:  # the first group is durable and waits for its replica
            time.sleep(0.001)
        time.sleep(0.2)             # the other writers queue behind it meanwhile
        release.set()
        for t in threads:
            t.join()
        groups = db.stats()["log"]["groups"] - groups_before
        assert db.last_lsn == writers and len(dict(db.scan())) == writers
        assert reps.waits == groups and groups < writers, (reps.waits, groups)


def test_a_report_of_another_epoch_counts_for_nothing(tmp_path):
    with kvstore.open(tmp_path / "s", sync_replicas=1, sync_timeout=0.3) as db:
        assert db.replicas is not None
        db.replicas.report("old", 10**6, db.replicas.epoch + 7)  # a replica of another leader
        with pytest.raises(SyncReplicationError) as info:
            db.put(b"k", b"v")
        assert (info.value.lsn, info.value.holding, info.value.required) == (1, 0, 1)


def test_a_write_no_replica_confirms_fails_never_acknowledged_and_the_store_refuses_more(tmp_path):
    path = tmp_path / "s"
    with kvstore.open(path, sync_replicas=1, sync_timeout=0.2) as db:
        with pytest.raises(SyncReplicationError) as info:
            db.put(b"k", b"v")
        assert isinstance(info.value, OutcomeUnknownError) and isinstance(info.value, LogFailedError)
        assert "0 of the 1 replicas" in str(info.value) and "LSN 1" in str(info.value)
        assert db.get(b"k") is None                # never applied: no read saw it
        with pytest.raises(SyncReplicationError):  # no silent degrade: every later write refused
            db.put(b"k2", b"v")
        assert db.failure is info.value
    with kvstore.open(path) as db:                 # it is in the log: its outcome was unknown, not "lost"
        assert db.get(b"k") == b"v"


def test_the_fence_is_checked_after_the_replicas_confirmed(tmp_path):
    allowed = [True]

    def fence(lsn: int) -> None:
        if not allowed[0]:
            raise FencedError(f"no longer the leader at LSN {lsn}")

    with kvstore.open(tmp_path / "s", fence=fence) as db:
        assert db.put(b"a", b"1") == 1
        allowed[0] = False
        with pytest.raises(FencedError):
            db.put(b"b", b"2")
        assert db.get(b"b") is None


def test_a_follower_store_refuses_its_writers_and_copies_a_log(tmp_path):
    leader_path, follower_path = tmp_path / "leader", tmp_path / "follower"
    with kvstore.open(leader_path) as leader:
        for i in range(10):
            leader.put(b"k%d" % i, b"v%d" % i)
        leader.start_timeline(number=5)
        with leader.batch() as b:
            b.put(b"batch", b"1")
            b.delete(b"k0")
        entries = list(leader._log.read_entries())
        history, sid = leader.history, leader.store_id
    from kvstore.replica.restore import LogFiles, build
    build(str(follower_path), LogFiles(str(leader_path / "wal"), 1, 0), None, 0, source="test", history=history,
          store_id=sid)
    with kvstore.open(follower_path, sweep_interval=None) as f:
        refusal = NotLeaderError("not the leader", leader="http://x", epoch=5)
        f.following.refuse_writes(refusal)
        with pytest.raises(NotLeaderError):
            f.put(b"mine", b"x")
        with pytest.raises(NotLeaderError):
            f.update({b"a": b"b"})
        f.following.append_replicated(entries[:10])
        f.start_timeline(timeline=history[-1])
        f.following.append_replicated(entries[10:])
        assert f.history == history and f.last_lsn == 11
        assert f.get(b"batch") == b"1" and f.get(b"k0") is None and f.get(b"k9") == b"v9"
        assert [e.timestamp_us for e in f._log.read_entries()] == [e.timestamp_us for e in entries]
        f.following.refuse_writes(None)
        assert f.put(b"mine", b"x") == 12


def test_discard_after_drops_what_the_leaders_history_does_not_hold(tmp_path):
    """A deposed leader: timeline 5 from LSN 11, entries 11..15 that no
    replica confirmed; the new leader's timeline 6 began at LSN 13."""
    path = tmp_path / "s"
    with kvstore.open(path, segment_bytes=4096) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v" * 500)
        db.snapshot()   # at LSN 10: the base the rebuild starts from
        t5 = db.start_timeline(number=5)
        for i in range(5):
            db.put(b"late%d" % i, b"x")
        db.snapshot()   # at LSN 15: past the fork, so it goes
        leader = (TimelineStart(1, 1), t5, TimelineStart(6, 13, 99))
        assert db.following.discard_after(12, leader) == 3
        assert db.last_lsn == 12 and db.history == leader and db.applied_lsn == 15  # applied past it: reopen
    with kvstore.open(path) as db:  # rebuilt: what it discarded is not served
        assert db.applied_lsn == 12 and db.rebuilt is not None
        assert db.get(b"late1") == b"x" and db.get(b"late2") is None
        assert [s.lsn for s in db.list_snapshots()] == [10]


def test_discard_after_refuses_when_nothing_would_be_left_to_rebuild_from(tmp_path):
    """Its only snapshot is past the fork and its log was trimmed to it: it
    changes nothing, and the follower builds the store from its leader."""
    path = tmp_path / "s"
    with kvstore.open(path, segment_bytes=4096) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v" * 500)
        t5 = db.start_timeline(number=5)
        for i in range(5):
            db.put(b"late%d" % i, b"x")
        db.snapshot(keep=1)   # at LSN 15; the log before it goes
        assert db.list_snapshots()[0].lsn == 15 and db._log.first_lsn > 1
        with pytest.raises(SnapshotError, match="leader's snapshot"):
            db.following.discard_after(12, (TimelineStart(1, 1), t5, TimelineStart(6, 13, 99)))
        assert db.last_lsn == 15 and db.history[-1] == t5 and [s.lsn for s in db.list_snapshots()] == [15]


def test_a_timeline_begun_and_never_written_on_gives_way_to_the_leaders_line(tmp_path):
    """A node won epoch 9 at LSN 10 and was killed before its first write;
    the next leader went on on timeline 1 (LSN 11, unacknowledged once, now
    its line) and began timeline 10 at LSN 12. Nothing to discard: the store
    takes the leader's line, across a reopen, and copies LSNs 11 and 12."""
    from wal.segment import Entry

    path = tmp_path / "s"
    with kvstore.open(path) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v")
        entries = list(db._log.read_entries())
        db.start_timeline(9)
    leader = (TimelineStart(1, 1), TimelineStart(10, 12, 77))
    with kvstore.open(path) as db:
        assert db.history[-1].timeline == 9 and db.last_lsn == 10
        assert db.following.discard_after(10, leader) == 0
        assert db.history == (TimelineStart(1, 1),)
    with kvstore.open(path) as db:  # durable: the empty timeline is gone for good
        assert db.history == (TimelineStart(1, 1),) and db.following.discard_after(10, leader) == 0
        db.following.refuse_writes(NotLeaderError("not the leader", leader="http://x", epoch=10))
        last = entries[-1]
        db.following.append_replicated([Entry(11, last.timestamp_us, last.payload)])
        db.start_timeline(timeline=leader[1])
        db.following.append_replicated([Entry(12, last.timestamp_us, last.payload)])
        assert db.history == leader and db.last_lsn == 12
