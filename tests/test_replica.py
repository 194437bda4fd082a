"""Read replicas (kvstore/replica/replica.py): a writer PROCESS and a replica in this
one, its state at every LSN it shows checked against the log replayed into a
dict; kill -9 of the writer; retention trimming past the replica; wait_for;
promote; a replica of an archive; the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import kvstore
from kvstore.archive.shipper import Archiver
from kvstore.entry import conditions
from kvstore.entry.codec import OP_DELETE, OP_PUT, decode
from tests.test_cli import REPO
from wal import list_segments, read_durable_lsn, read_log
from wal.errors import ClosedError, LockedError, ReplicaError, ReplicaLagError

WRITER = os.path.join(REPO, "tests", "replica_writer.py")


def start_writer(store: str, count: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.Popen([sys.executable, WRITER, store, str(count)], stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    return p


def wait_line(p: subprocess.Popen, prefix: bytes) -> int:
    assert p.stdout is not None
    while True:
        line = p.stdout.readline()
        assert line, f"the writer ended before printing {prefix!r}"
        if line.startswith(prefix):
            return int(line.split()[1])


class Model:
    """The source's log replayed into a dict, up to ``lsn``."""

    def __init__(self, wal_dir: str) -> None:
        self.wal_dir = wal_dir
        self.lsn = 0
        self.data: dict[bytes, bytes] = {}

    def at(self, lsn: int) -> dict[bytes, bytes]:
        assert lsn >= self.lsn
        if lsn > self.lsn:
            for e in read_log(self.wal_dir, self.lsn + 1, lsn, durable_only=False):
                for op in conditions.writes_of(decode(e.payload, e.lsn)):
                    if op[0] == OP_PUT:
                        self.data[op[1]] = op[2]
                    elif op[0] == OP_DELETE:
                        self.data.pop(op[1], None)
                    else:
                        for k in [k for k in self.data if op[1] <= k < op[2]]:
                            del self.data[k]
                assert e.lsn == self.lsn + 1
                self.lsn = e.lsn
        assert self.lsn == lsn
        return self.data


def check_views(rep, model: Model, until) -> int:
    """Take views until ``until()``; each one equals the log's prefix at its
    LSN and keeps the writer's invariant. Returns the distinct LSNs seen."""
    seen = set()
    while True:
        with rep.view() as v:
            lsn = v.lsn
            items = dict(v.scan())
        assert items.get(b"a") == items.get(b"b")
        if lsn not in seen:
            assert items == model.at(lsn), lsn
            seen.add(lsn)
        if until():
            return len(seen)


def test_replica_follows_a_writer_process_through_kill_9(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    w = start_writer(src, 0)
    try:
        wait_line(w, b"lsn")
        model = Model(os.path.join(src, "wal"))
        with kvstore.open_replica(src, rdir) as rep:
            assert check_views(rep, model, lambda: rep.applied_lsn >= 3000) >= 1
            w.send_signal(signal.SIGKILL)
            w.wait()
            durable = read_durable_lsn(os.path.join(src, "wal"))
            assert rep.wait_for(durable) == durable   # everything durable, nothing more
            assert rep.get(b"a") == rep.get(b"b") and rep.lag.lsns == 0
            w = start_writer(src, 150)  # recovers the store, goes on from its "a"
            done = wait_line(w, b"done")
            assert done > durable
            check_views(rep, model, lambda: rep.applied_lsn >= done)
            rep.wait_for(done)
            assert dict(rep.scan()) == model.at(done)
            assert rep.lag == (0, 0.0) and rep.last_error is None
    finally:
        w.kill()
        w.wait()


def test_retention_past_a_stopped_replica_restarts_it_from_the_snapshot(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src, segment_bytes=4096, keep_snapshots=1) as db:
        for i in range(100):
            db.put(b"k%03d" % i, b"%d" % i)
        with kvstore.open_replica(src, rdir) as rep:
            rep.wait_for(db.last_lsn)
            stopped_at = rep.applied_lsn
        for i in range(100, 400):
            db.put(b"k%03d" % (i % 150), b"v%d" % i)
        db.snapshot()
        assert list_segments(os.path.join(src, "wal"))[0].first_lsn > stopped_at + 1
        with kvstore.open_replica(src, rdir) as rep:
            assert rep.applied_lsn >= db.list_snapshots()[-1].lsn
            rep.wait_for(db.last_lsn)
            assert dict(rep.scan()) == dict(db.scan())


def test_retention_past_a_running_replica_rebuilds_it_while_reads_go_on(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    errors: list[BaseException] = []
    stop = threading.Event()
    # max_retained_bytes=0: retention does not wait for the replica (by default it does, below)
    with kvstore.open(src, sync="none", segment_bytes=1024, keep_snapshots=1, max_retained_bytes=0) as db:
        for i in range(50):
            db.update({b"a": b"%d" % i, b"b": b"%d" % i})
        with kvstore.open_replica(src, rdir, poll_interval=2.0) as rep:
            rep.wait_for(db.sync())  # sync="none": the replica follows what is durable

            def read() -> None:
                while not stop.is_set():
                    try:
                        a, b = rep.get(b"a"), rep.get(b"b")
                        assert a is not None and b is not None
                        assert sum(1 for _ in rep.scan()) == 2
                    except BaseException as e:  # noqa: BLE001 - reported below
                        errors.append(e)
                        return

            reader = threading.Thread(target=read)
            reader.start()
            i = 50
            for _ in range(10):
                # caught up, its thread sleeps 2 s: meanwhile the log it reads is trimmed past it
                rep.wait_for(db.sync(), timeout=30)
                if rep.rebuilds:
                    break
                for _ in range(2000):
                    i += 1
                    db.update({b"a": b"%d" % i, b"b": b"%d" % i})
                db.snapshot()
            stop.set()
            reader.join()
            assert rep.rebuilds >= 1
            assert errors == []
            rep.wait_for(db.sync(), timeout=30)
            assert dict(rep.scan()) == {b"a": b"%d" % i, b"b": b"%d" % i}


def test_wait_for_times_out_with_a_replica_lag_error(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src) as db:
        lsn = db.put(b"x", b"1")
        with kvstore.open_replica(src, rdir) as rep:
            assert rep.wait_for(lsn) >= lsn and rep.get(b"x") == b"1"
            with pytest.raises(ReplicaLagError) as err:
                rep.wait_for(lsn + 5, timeout=0.1)
            assert (err.value.applied_lsn, err.value.target_lsn) == (lsn, lsn + 5)
            lsn2 = db.put(b"x", b"2")
            rep.wait_for(lsn2)
            assert rep.get(b"x") == b"2"
        with pytest.raises(ClosedError):
            rep.get(b"x")


def test_promote_after_the_writer_is_killed_continues_its_lsns(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    w = start_writer(src, 0)
    try:
        wait_line(w, b"lsn")
        rep = kvstore.open_replica(src, rdir)
        with pytest.raises(LockedError):
            rep.promote()  # the writer is alive: nothing changes
        assert not rep.closed
        w.send_signal(signal.SIGKILL)
        w.wait()
        durable = read_durable_lsn(os.path.join(src, "wal"))
        expected = Model(os.path.join(src, "wal")).at(durable)
        with rep.promote() as db:
            assert rep.closed
            assert dict(db.scan()) == expected
            assert db.put(b"after", b"1") == durable + 1
            # the same store, whose history changes course after the LSN it had (wal/timeline.py)
            assert db.store_id == rep.store_id
            assert db.history[-1].timeline == 2 and db.history[-1].first_lsn == durable + 1
        with kvstore.open(rdir) as db:  # a store like any other, and rebuildable
            assert db.last_lsn == durable + 1 and db.get(b"after") == b"1"
            assert [s.lsn for s in db.list_snapshots()] == [durable]
        with pytest.raises(ReplicaError):
            kvstore.open_replica(src, rdir)  # a store now, not a replica
    finally:
        w.kill()
        w.wait()


def test_replica_of_an_archive_and_promote_fenced_by_its_lease(tmp_path):
    src, rdir, arch = str(tmp_path / "src"), str(tmp_path / "rep"), str(tmp_path / "archive")
    with kvstore.open(src) as db:
        for i in range(50):
            db.put(b"k%d" % i, b"%d" % i)
        db.snapshot()
        for i in range(50, 80):
            db.put(b"k%d" % (i % 60), b"v%d" % i)
        archiver = Archiver(src, arch)
        lsn = archiver.ship_once()
        with kvstore.open_replica(arch, rdir, poll_interval=0.05) as rep:
            assert rep.wait_for(lsn) == lsn
            assert dict(rep.scan()) == dict(db.scan())
            lsn2 = db.delete_range(b"k1", b"k3")
            assert archiver.ship_once() == lsn2
            rep.wait_for(lsn2)
            assert dict(rep.scan()) == dict(db.scan())
            with pytest.raises(ReplicaError):
                rep.watch()
            with pytest.raises(LockedError):
                rep.promote()  # the archiver's lease is live: the source ships
            archiver.stop()
            with rep.promote() as promoted:
                assert promoted.put(b"new", b"1") == lsn2 + 1


def test_a_replica_follows_one_store_and_writers_refuse_its_directory(tmp_path):
    a, b, rdir = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "rep")
    with kvstore.open(a) as db:
        db.put(b"x", b"1")
    with kvstore.open(b) as db:
        db.put(b"y", b"1")
    with kvstore.open_replica(a, rdir) as rep:
        with pytest.raises(LockedError):
            kvstore.open_replica(a, rdir)  # one process follows a directory
    with pytest.raises(ReplicaError):
        kvstore.open_replica(b, rdir)
    with pytest.raises(ReplicaError):
        kvstore.open(rdir)
    with pytest.raises(ReplicaError):
        kvstore.open_replica(a, b)  # a store's directory is not a replica's
    with kvstore.open_replica(a, rdir) as rep:
        assert rep.get(b"x") == b"1"


def test_watch_on_a_replica_shows_what_it_applied(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src) as db, kvstore.open_replica(src, rdir) as rep:
        lsns = [db.put(b"w%d" % i, b"%d" % i) for i in range(5)]
        with rep.watch(prefix=b"w", from_lsn=1) as w:
            got = [next(w) for _ in range(5)]
        assert [(c.lsn, c.key) for c in got] == [(lsn, b"w%d" % i) for i, lsn in enumerate(lsns)]
        assert all(c.lsn <= rep.applied_lsn for c in got)


def test_walkv_replica_command_runs_until_sigint(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src) as db:
        lsn = db.put(b"k", b"v")
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "replica", src, rdir, "--interval", "0.1"],
                         stderr=subprocess.PIPE, env=env)
    assert p.stderr is not None
    lines = []
    while True:
        line = p.stderr.readline().decode()
        assert line, lines
        lines.append(line)
        if f"applied LSN {lsn} (lag 0 entries" in line:
            break
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read().decode()
    assert p.wait(30) == 0
    assert "stopped; applied LSN" in rest
    with kvstore.open_replica(src, rdir) as rep:
        assert rep.get(b"k") == b"v"
