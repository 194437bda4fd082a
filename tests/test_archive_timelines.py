"""The archive keeps each timeline apart (kvstore/archive/layout.py): the
HA issue's fork reproduced through an archive, restores along a chosen
lineage, fencing of an older writer, two timelines with one number, and
retention across a fork.

The fork (issue 34): a store archives; both hold LSNs 1..100. A damaged
record at LSN 70 is cut by a repair; the store writes 50 new entries, LSNs
70..119 again (on timeline 2). A restore from the archive must then hold
exactly the store's state, never the old keys 70..100 beside the new ones;
a restore of timeline 1 to LSN 100 gives back the old history. Before
timelines the archiver went on after the archive's LSN 100 with the new
history's 101..119, and a restore held old and new keys together.
"""

from __future__ import annotations

import datetime
import os
import shutil
import time
import uuid
from collections.abc import Callable

import pytest

import kvstore
from kvstore import Archiver, ArchiveReader, restore_from_archive
from kvstore.cli.main import main
from kvstore.store.repair import repair_store
from tests.test_repair_snapshots import damage_record


def old(i: int) -> bytes:
    return b"old-%03d" % i


def new(i: int) -> bytes:
    return b"new-%03d" % i


def state(path: str) -> dict[bytes, bytes]:
    with kvstore.open(path, readonly=True) as db:
        return dict(db.scan())


def fill(path: str, value: bytes = b"o", segment_bytes: int = 16 << 10) -> None:
    """Issue 34's step 1: LSNs 1..100, a key ``old(i)`` each."""
    with kvstore.open(path, segment_bytes=segment_bytes) as db:
        for i in range(1, 101):
            assert db.put(old(i), value) == i


def fork(path: str, value: bytes = b"n", segment_bytes: int = 16 << 10) -> dict[bytes, bytes]:
    """Issue 34's step 2: LSN 70 damaged and cut by a repair, then 50 new
    keys ``new(i)`` at LSNs 70..119; return the store's state then."""
    damage_record(path, 70)
    assert repair_store(path, os.path.join(path, "wal")).log.last_good_lsn == 69
    with kvstore.open(path, segment_bytes=segment_bytes) as db:
        for i in range(50):
            db.put(new(i), value)
        assert db.last_lsn == 119
        return dict(db.scan())


def archive_then_fork(path: str, loc: str, between: Callable[[], object] = lambda: None) -> dict[bytes, bytes]:
    """Issue 34's steps 1 and 2, through an archive at ``loc`` (``between``
    runs once it holds 1..100); return the store's state at its end (LSN 119)."""
    fill(path)
    a = Archiver(path, loc)
    assert a.ship_once() == 100
    a.stop()
    between()
    wanted = fork(path)
    a = Archiver(path, loc)
    assert a.ship_once() == 119
    a.stop()
    return wanted


def check_restores(loc: str, tmp_path, wanted: dict[bytes, bytes]) -> None:
    info = restore_from_archive(loc, tmp_path / "latest")
    assert info.lsn == 119
    assert state(info.path) == wanted  # never the old keys 70..100 beside the new ones
    assert state(info.path) == {**{old(i): b"o" for i in range(1, 70)}, **{new(i): b"n" for i in range(50)}}
    info = kvstore.restore(loc, tmp_path / "t1", to_lsn=100, timeline=1)  # the old history, still there
    assert info.lsn == 100 and state(info.path) == {old(i): b"o" for i in range(1, 101)}
    info = restore_from_archive(loc, tmp_path / "t2at80", to_lsn=80)
    assert state(info.path) == {**{old(i): b"o" for i in range(1, 70)}, **{new(i): b"n" for i in range(11)}}
    reader = ArchiveReader(loc)
    assert ArchiveReader(loc, timeline=1).last_lsn == 100 and reader.last_lsn == 119
    assert reader.verify() == []


def test_the_fork_through_a_directory_archive(tmp_path, capsys):
    path, loc = str(tmp_path / "store"), str(tmp_path / "arch")
    wanted = archive_then_fork(path, loc)
    check_restores(loc, tmp_path, wanted)
    history = history_of(path)
    assert ArchiveReader(loc).history == history and history[-1].timeline == 2
    # timeline 1 keeps its names; timeline 2 has its own directory and history object
    names = sorted(os.listdir(os.path.join(loc, "wal")))
    tl2 = f"tl-{2:020d}-{history[-1].uid:016x}"
    assert names == ["00000000000000000001-00000000000000000100.wal", tl2, tl2 + ".history"]
    assert main(["archive-verify", loc]) == 0
    assert main(["archive-ls", loc]) == 0
    out = capsys.readouterr().out
    assert "timeline 1  " in out and "LSNs 1..100" in out and "begins at LSN 70, forked from timeline 1" in out
    assert main(["restore", loc, str(tmp_path / "cli"), "--timeline", "1", "--to-lsn", "90"]) == 0
    assert state(str(tmp_path / "cli")) == {old(i): b"o" for i in range(1, 91)}
    # a time follows the lineage too: when timeline 1 held LSN 100, timeline 2's history was at LSN 69
    us = next(ArchiveReader(loc, timeline=1).read_entries(100, 100)).timestamp_us
    when = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=us)
    assert ArchiveReader(loc, timeline=1).lsn_at_time(when) == 100 and ArchiveReader(loc).lsn_at_time(when) == 69
    info = restore_from_archive(loc, tmp_path / "at", to_time=when)
    assert info.lsn == 69 and state(info.path) == {old(i): b"o" for i in range(1, 70)}


def test_the_fork_through_a_real_s3_server(s3server, tmp_path):
    pytest.importorskip("pyarrow")
    path, uri = str(tmp_path / "store"), s3server.uri(f"fork-{uuid.uuid4().hex[:8]}")
    check_restores(uri, tmp_path, archive_then_fork(path, uri))


def test_a_replica_of_the_archive_follows_it_across_the_fork(tmp_path):
    path, loc, rdir = str(tmp_path / "store"), str(tmp_path / "arch"), str(tmp_path / "rep")
    replicas = []

    def follow() -> None:
        replicas.append(kvstore.open_replica(loc, rdir, poll_interval=0.02))
        assert replicas[0].wait_for(100) == 100

    wanted = archive_then_fork(path, loc, follow)
    rep = replicas[0]
    try:
        deadline = time.monotonic() + 30
        while not (rep.applied_lsn == 119 and rep.history[-1].timeline == 2):
            assert time.monotonic() < deadline, (rep.applied_lsn, rep.history)
            time.sleep(0.02)
        assert dict(rep.scan()) == wanted and rep.rebuilds == 1  # rebuilt, never the old keys beside the new
    finally:
        rep.close()


def promoted_copy(path: str, copy: str) -> None:
    """A second writer of the same store (a promoted replica): the same
    files, going on on a new timeline from the next LSN."""
    shutil.copytree(path, copy)
    with kvstore.open(copy) as db:
        db.start_timeline()
        db.put(b"promoted", b"1")


def test_an_older_writer_is_fenced_by_a_newer_timeline_in_the_archive(tmp_path):
    path, copy, loc = str(tmp_path / "store"), str(tmp_path / "copy"), str(tmp_path / "arch")
    with kvstore.open(path) as db:
        for i in range(1, 41):
            db.put(old(i), b"o")
    a = Archiver(path, loc)
    assert a.ship_once() == 40
    a.stop()
    promoted_copy(path, copy)
    b = Archiver(copy, loc)
    assert b.ship_once() == 41
    b.stop()
    with kvstore.open(path) as db:  # the deposed writer goes on on timeline 1
        for i in range(41, 51):
            db.put(old(i), b"o")
    a = Archiver(path, loc, interval=0.01)
    with pytest.raises(kvstore.ArchiveFencedError) as e:
        a.ship_once()
    assert e.value.fork_lsn == 40 and e.value.mine.timeline == 1 and e.value.theirs.timeline == 2
    assert "timeline 1" in str(e.value) and "timeline 2" in str(e.value) and "LSN 40" in str(e.value)
    a.start()  # the thread stops on it too, as on another store's archive
    with pytest.raises(kvstore.ArchiveFencedError):
        a.flush(timeout=10)
    a.stop()
    assert isinstance(a.failed, kvstore.ArchiveFencedError)
    reader = ArchiveReader(loc)  # nothing of the older writer's after the fork
    assert [(o.first, o.last) for o in reader.log_objects()] == [(1, 40), (41, 41)]
    assert reader.verify() == [] and reader.last_lsn == 41
    assert state(restore_from_archive(loc, tmp_path / "r").path) == state(copy)


def history_of(path: str):
    with kvstore.open(path, readonly=True) as db:
        return db.history


def test_two_timelines_with_one_number_are_never_picked_at_random(tmp_path):
    from kvstore.archive.layout import TimelineId, encode_lineage, history_object_name
    from kvstore.archive.target import ArchiveTarget

    path, loc = str(tmp_path / "store"), str(tmp_path / "arch")
    with kvstore.open(path) as db:
        db.put(b"a", b"1")
        store_id = db.store_id
    for name in ("x", "y"):  # two promotions nobody coordinated
        promoted_copy(path, str(tmp_path / name))
    x, y = history_of(str(tmp_path / "x")), history_of(str(tmp_path / "y"))
    assert x[-1].timeline == y[-1].timeline == 2 and x[-1].uid != y[-1].uid
    a = Archiver(str(tmp_path / "x"), loc)
    assert a.ship_once() == 2
    a.stop()
    with pytest.raises(kvstore.ArchiveFencedError):  # the second to come is fenced by the first
        Archiver(str(tmp_path / "y"), loc).ship_once()
    # were both there (archives merged by hand), a reader would refuse to choose
    ArchiveTarget.open(loc).put(encode_lineage(store_id, y), "wal", history_object_name(TimelineId.of(y[-1])))
    with pytest.raises(kvstore.ArchiveError, match="2 timelines numbered 2"):
        ArchiveReader(loc).history
    assert ArchiveReader(loc, timeline=f"2:{x[-1].uid:x}").history == x
    assert ArchiveReader(loc, timeline=f"2:{y[-1].uid:x}").history == y


def test_retention_keeps_every_lineage_a_kept_snapshot_lies_on(tmp_path):
    """Snapshots at 50 (timeline 1, before the fork: on both lineages) and at
    119 (timeline 2). Keeping both keeps all both lineages read; keeping only
    the newest deletes the old snapshot and timeline 1's objects past what
    the kept one covers, except the last (how far timeline 1 reached)."""
    path, loc = str(tmp_path / "store"), str(tmp_path / "arch")
    with kvstore.open(path, segment_bytes=4 << 10) as db:
        for i in range(1, 101):
            db.put(old(i), b"o" * 40)
            if i == 50:
                db.snapshot(keep=10)
    a = Archiver(path, loc)
    assert a.ship_once() == 100
    a.stop()
    wanted = fork(path, b"n" * 40, 4 << 10)
    with kvstore.open(path) as db:
        db.snapshot(keep=10)
    a = Archiver(path, loc, keep_snapshots=2)
    assert a.ship_once() == 119
    a.stop()
    r = ArchiveReader(loc)
    assert [s.lsn for s in r.snapshots()] == [50, 119]
    assert [s.lsn for s in ArchiveReader(loc, timeline=1).snapshots()] == [50]
    assert state(restore_from_archive(loc, tmp_path / "a", to_lsn=60, timeline=1).path) == {
        old(i): b"o" * 40 for i in range(1, 61)}
    ones = [o for o in r.log_objects() if o.timeline.timeline == 1]
    a = Archiver(path, loc, keep_snapshots=1)
    a.ship_once()
    a.stop()
    r = ArchiveReader(loc)
    assert [s.lsn for s in r.snapshots()] == [119] and r.verify() == []
    assert state(restore_from_archive(loc, tmp_path / "b").path) == wanted
    assert [o for o in r.log_objects() if o.timeline.timeline == 1] == []  # no kept snapshot needs timeline 1
    assert len(ones) > 1 and sorted(os.listdir(os.path.join(loc, "wal")))[-1].endswith(".history")
