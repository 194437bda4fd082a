"""``walkv restore`` (and ``kvstore.restore``) at the edges: a snapshot
directory restores the snapshot, a time before the first write is an error
naming the first commit time unless ``--allow-empty``, and a target that is
not a new or empty directory is the same WalkvError whatever the source."""

from __future__ import annotations

import datetime
import os

import pytest

import kvstore
from kvstore.archive import Archiver
from tests.test_cli import one_line_error, walkv
from wal.errors import WalkvError
from wal.reader import read_log

EPOCH_2000 = "2000-01-01T00:00:00Z"


@pytest.fixture
def snap_store(tmp_path):
    """A store with a snapshot at LSN 25 and two writes after it (LSN 27)."""
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        for i in range(25):
            db.put(b"k%02d" % i, b"v%d" % i)
        info = db.snapshot()
        db.put(b"after", b"1")
        db.delete(b"k00")
    assert info.lsn == 25
    return path, info.path


def test_restoring_a_snapshot_directory_gives_the_snapshot(tmp_path, snap_store):
    store, snap = snap_store
    proc = walkv("restore", snap, str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "at LSN 25" in proc.stdout
    with kvstore.open(str(tmp_path / "r")) as db:
        assert db.applied_lsn == 25
        assert dict(db.scan()) == {b"k%02d" % i: b"v%d" % i for i in range(25)}
    # --to-lsn says otherwise: the store's log after the snapshot supplies the rest
    proc = walkv("restore", snap, str(tmp_path / "r27"), "--to-lsn", "27")
    assert proc.returncode == 0, proc.stderr
    with kvstore.open(str(tmp_path / "r27")) as db:
        assert db.applied_lsn == 27 and db.get(b"after") == b"1" and db.get(b"k00") is None
    assert kvstore.restore(snap, str(tmp_path / "api")).lsn == 25


def us_to_text(us: int) -> str:
    """A commit time as the error names it: ISO 8601 UTC to the microsecond."""
    t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _first_time(store: str) -> str:
    first = next(iter(read_log(os.path.join(store, "wal"))))
    return us_to_text(first.timestamp_us)


def test_to_time_before_the_first_write_is_an_error_naming_it(tmp_path, snap_store):
    store, _ = snap_store
    dst = str(tmp_path / "early")
    proc = walkv("restore", store, dst, "--to-time", EPOCH_2000)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "before the first entry" in line and _first_time(store) in line and "--allow-empty" in line
    assert not os.path.exists(dst)
    from wal.errors import RestoreTimeError

    with pytest.raises(RestoreTimeError) as e:
        kvstore.restore(store, dst, to_time=datetime.datetime(2000, 1, 1))
    assert e.value.first_lsn == 1 and us_to_text(e.value.first_time_us) == _first_time(store)
    # the first entry's own time restores it
    proc = walkv("restore", store, dst, "--to-time", _first_time(store))
    assert proc.returncode == 0, proc.stderr
    with kvstore.open(dst) as db:
        assert db.applied_lsn == 1
    empty = str(tmp_path / "empty")
    proc = walkv("restore", store, empty, "--to-time", EPOCH_2000, "--allow-empty")
    assert proc.returncode == 0, proc.stderr
    with kvstore.open(empty) as db:
        assert len(db) == 0


def test_to_time_before_the_first_archived_write(tmp_path, snap_store):
    store, _ = snap_store
    archive = str(tmp_path / "archive")
    Archiver(store, archive).ship_once()
    dst = str(tmp_path / "early")
    proc = walkv("restore", archive, dst, "--to-time", EPOCH_2000)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "before the first entry" in line and _first_time(store) in line
    assert not os.path.exists(dst)
    info = kvstore.restore(archive, dst, to_time=0, allow_empty=True)
    assert info.lsn == 0 and info.count == 0


def test_a_target_in_the_way_is_one_error_for_every_source(tmp_path, snap_store):
    store, snap = snap_store
    archive = str(tmp_path / "archive")
    Archiver(store, archive).ship_once()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    for source in (store, snap, archive, (tmp_path / "archive").as_uri()):
        for target, says in ((full, "it exists and is not empty"), (a_file, "it is a file, not a directory"),
                             (a_file / "sub", f"{a_file} is a file, not a directory")):
            with pytest.raises(WalkvError) as e:
                kvstore.restore(source, str(target))
            assert type(e.value) is WalkvError and not isinstance(e.value, ValueError)
            assert str(e.value) == (f"cannot restore into {target}: {says}; restore builds a new store in a new "
                                    "or empty directory: give another path")
            proc = walkv("restore", str(source), str(target))
            assert proc.returncode == 1
            assert one_line_error(proc) == f"walkv: error: {e.value}"
    assert (full / "x").read_text() == "keep me" and a_file.read_text() == "keep me"
