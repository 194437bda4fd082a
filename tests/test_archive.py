"""The archive on local directories and file:// URIs (the fast tier):
shipping, compaction, resume, identity, lease, retention, reading, verify,
restore to an LSN and a time, hostile names, the commands."""

from __future__ import annotations

import json
import os
import time

import pytest

import kvstore
from kvstore import Archiver, ArchiveReader, ArchiveTarget, restore_from_archive
from kvstore.archive.layout import WAL_DIR
from kvstore.cli.main import main
from wal.errors import ArchiveError, ArchiveLagError, CorruptionError, LockedError
from wal.reader import read_log

pytest.importorskip("pyarrow")


def fill(db: kvstore.KVStore, start: int, n: int, tag: bytes = b"v") -> None:
    for i in range(start, start + n):
        db.put(b"k%05d" % (i % 700), tag + b"%d" % i * 20)


def model(n: int) -> dict[bytes, bytes]:
    """The state after LSN ``n`` of a store written only by :func:`fill` with tag b"v"."""
    d = {}
    for i in range(n):
        d[b"k%05d" % (i % 700)] = b"v" + b"%d" % i * 20
    return d


def store_entries(path: str) -> list[tuple[int, int, bytes]]:
    wal_dir = os.path.join(path, "wal")
    from wal.segment import list_segments
    return [tuple(e) for e in read_log(wal_dir, list_segments(wal_dir)[0].first_lsn)]


def state(path: str) -> dict[bytes, bytes]:
    db = kvstore.open(path, readonly=True)
    try:
        return dict(db.scan())
    finally:
        db.close()


@pytest.fixture
def store(tmp_path):
    db = kvstore.open(str(tmp_path / "store"), segment_bytes=64 << 10)
    yield db
    if not db.closed:
        db.close()


@pytest.mark.parametrize("form", ["path", "file"])
def test_ship_compact_read_and_restore_equal_local(store, tmp_path, form):
    loc = str(tmp_path / "arch") if form == "path" else (tmp_path / "arch").as_uri()
    a = Archiver(store.path, loc)
    fill(store, 0, 300)
    assert a.ship_once() == 300
    fill(store, 300, 1200)
    mid = time.time()
    time.sleep(0.01)
    a.ship_once()
    before = store_entries(store.path)  # the local snapshot trims the local log
    store.snapshot(keep=10)
    fill(store, 1500, 600)
    assert a.flush(timeout=10) == 2100
    a.stop()
    names = sorted(os.listdir(tmp_path / "arch" / WAL_DIR))
    r = ArchiveReader(loc)
    objs = r.log_objects()
    assert len(objs) == len(names) and len(r.segments()) == len(objs)  # compaction left no redundant piece
    assert objs[0].first == 1 and objs[-1].last == 2100
    assert all(objs[i].last + 1 == objs[i + 1].first for i in range(len(objs) - 1))
    entries = [tuple(e) for e in r.read_entries()]
    assert entries == before + [e for e in store_entries(store.path) if e[0] > 1500]
    assert [s.lsn for s in r.snapshots()] == [1500]
    assert r.verify() == []
    t_lsn = r.lsn_at_time(mid)
    assert t_lsn == max(e[0] for e in entries if e[1] <= mid * 1e6)
    store.close()
    for to in (0, 1, 777, 1500, 1501, 2100):
        info = restore_from_archive(loc, tmp_path / f"a{to}", to_lsn=to)
        assert info.lsn == to and state(info.path) == model(to)
        if to >= 1500:
            local = kvstore.restore(store.path, tmp_path / f"l{to}", to_lsn=to)
            assert state(info.path) == state(local.path)
    info = restore_from_archive(loc, tmp_path / "at", to_time=mid)
    assert info.lsn == t_lsn and state(info.path) == model(t_lsn)


def test_pieces_of_one_active_segment_resume_where_the_last_ended(tmp_path):
    # Many rounds into one active segment, with records fragmented across
    # 32 KiB blocks: each piece starts reading where the previous one ended
    # and must hold exactly the next LSNs, framed anew, byte-equal in content.
    db = kvstore.open(str(tmp_path / "store"), segment_bytes=32 << 20)
    try:
        a = Archiver(db.path, str(tmp_path / "arch"))
        lsn = 0
        for r in range(12):
            for i in range(1 + r * 3):
                lsn = db.put(b"k%d-%d" % (r, i), bytes([65 + r]) * (5000 + 3001 * i))
            assert a.ship_once() == lsn
        a.stop()
        reader = ArchiveReader(str(tmp_path / "arch"))
        assert [(o.first, o.last) for o in reader.log_objects()][:2] == [(1, 1), (2, 5)]
        assert len(reader.log_objects()) == 12 and reader.verify() == []
        assert [tuple(e) for e in reader.read_entries()] == store_entries(db.path)
    finally:
        db.close()


def test_resume_after_restart_ships_no_duplicate(store, tmp_path):
    loc = str(tmp_path / "arch")
    fill(store, 0, 200)
    first = Archiver(store.path, loc)
    first.ship_once()
    first.stop()
    fill(store, 200, 50)
    a = Archiver(store.path, loc)  # a new archiver (a restart) resumes from the listing
    assert a.ship_once() == 250
    a.stop()
    r = ArchiveReader(loc)
    lsns = [e.lsn for e in r.read_entries()]
    assert lsns == list(range(1, 251))


def test_archive_of_another_store_is_refused(tmp_path):
    a = kvstore.open(str(tmp_path / "a")); a.put(b"x", b"1")
    b = kvstore.open(str(tmp_path / "b")); b.put(b"x", b"2")
    loc = str(tmp_path / "arch")
    Archiver(a.path, loc).ship_once()
    with pytest.raises(ArchiveError, match="belongs to another store"):
        Archiver(b.path, loc).ship_once()
    a.close(); b.close()


def test_second_archiver_refused_while_the_lease_is_live(store, tmp_path):
    loc = str(tmp_path / "arch")
    fill(store, 0, 10)
    first = Archiver(store.path, loc)
    first.ship_once()
    with pytest.raises(LockedError, match="another archiver"):
        Archiver(store.path, loc).ship_once()
    first.stop()  # releases the lease
    assert Archiver(store.path, loc).ship_once() == 10


def test_flush_timeout_names_the_lag(store, tmp_path):
    loc = tmp_path / "arch"
    fill(store, 0, 20)
    a = Archiver(store.path, str(loc))
    a.ship_once()
    fill(store, 20, 5)
    os.rename(loc / WAL_DIR, loc / "moved")
    (loc / WAL_DIR).write_text("not a directory: uploads fail from now on")
    with pytest.raises(ArchiveLagError) as ei:
        a.flush(timeout=0.5)
    os.unlink(loc / WAL_DIR)
    os.rename(loc / "moved", loc / WAL_DIR)
    assert ei.value.archived_lsn == 20 and ei.value.target_lsn == 25 and "5 entries behind" in str(ei.value)
    assert a.stats()["errors"] >= 1 and a.stats()["last_error"]
    assert a.flush(timeout=10) == 25


def test_thread_follows_and_stats(store, tmp_path):
    a = Archiver(store.path, str(tmp_path / "arch"), interval=0.05)
    a.start()
    try:
        fill(store, 0, 300)
        assert a.flush(timeout=20) == 300
        st = a.stats()
        assert st["archived_lsn"] == 300 and st["lag_lsns"] == 0 and st["errors"] == 0 and st["uploads"] >= 1
    finally:
        a.stop()


def test_retention_keeps_what_kept_snapshots_need(store, tmp_path):
    loc = str(tmp_path / "arch")
    a = Archiver(store.path, loc, keep_snapshots=1)
    for round_ in range(3):
        fill(store, round_ * 400, 400)
        a.ship_once()
        store.snapshot(keep=10)
        a.ship_once()
    fill(store, 1200, 100)
    a.ship_once()
    a.stop()
    r = ArchiveReader(loc)
    assert [s.lsn for s in r.snapshots()] == [1200]
    assert r.first_lsn <= 1201 and r.last_lsn == 1300 and r.verify() == []
    store.close()
    info = restore_from_archive(loc, tmp_path / "r", to_lsn=1250)
    assert info.snapshot_lsn == 1200
    assert state(info.path) == state(kvstore.restore(store.path, tmp_path / "l", to_lsn=1250).path)


def test_damaged_object_named_by_verify_and_refused_by_restore(store, tmp_path):
    loc = tmp_path / "arch"
    fill(store, 0, 1500)
    Archiver(store.path, str(loc)).ship_once()
    r = ArchiveReader(str(loc))
    objs = r.log_objects()
    victim = objs[len(objs) // 2]
    with open(victim.path, "r+b") as f:
        f.seek(victim.size // 2)
        b = f.read(1)
        f.seek(victim.size // 2)
        f.write(bytes([b[0] ^ 0x40]))
    problems = r.verify()
    assert len(problems) == 1 and os.path.basename(victim.path) in problems[0].path
    assert problems[0].offset > 0
    with pytest.raises(CorruptionError) as ei:
        restore_from_archive(str(loc), tmp_path / "r1")
    assert os.path.basename(victim.path) in str(ei.value) and "to_lsn" in str(ei.value)
    assert not os.path.exists(tmp_path / "r1")
    info = restore_from_archive(str(loc), tmp_path / "r2", to_lsn=victim.first - 1)
    assert info.lsn == victim.first - 1
    assert main(["archive-verify", str(loc)]) == 4


def check_damaged_identity(loc: str, identity_file: str, object_file: str, capsys) -> None:
    """Issue 23: a damaged ``ARCHIVE`` object is damage: ``archive-verify``
    reports it as one (exit 4) and goes on to check the rest; readers refuse
    it as :class:`CorruptionError`. ``*_file``: the files behind the objects."""
    with open(identity_file, "r+b") as f:  # the same length: object stores list sizes
        n = len(f.read())
        f.seek(0)
        f.write(b"\x00garbled" + b"\xff" * (n - 9))
    with open(object_file, "r+b") as f:
        f.seek(os.path.getsize(object_file) // 2)
        f.write(b"\xff\xfe")
    assert main(["archive-verify", loc]) == 4
    out = capsys.readouterr().out.splitlines()
    corrupt = [line for line in out if line.startswith("CORRUPT: ")]
    assert len(corrupt) == 2 and "ARCHIVE" in corrupt[0] and "identity" in corrupt[0]
    assert os.path.basename(object_file) in corrupt[1] and "2 problem(s)" in out[-1]
    assert main(["archive-verify", "--json", loc]) == 4
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems[0]["object"].endswith("ARCHIVE") and problems[0]["kind"] == "content"
    assert problems[1]["object"].endswith(os.path.basename(object_file))
    with pytest.raises(CorruptionError, match="identity") as ei:
        ArchiveReader(loc)
    assert ei.value.path.endswith("ARCHIVE") and "archive-verify" in str(ei.value)


def test_damaged_identity_is_damage_exit_4(store, tmp_path, capsys):
    loc = str(tmp_path / "arch")
    a = Archiver(store.path, loc)
    fill(store, 0, 300)
    a.ship_once()
    fill(store, 300, 300)
    a.ship_once()
    a.stop()
    objs = ArchiveReader(loc).log_objects()
    check_damaged_identity(loc, os.path.join(loc, "ARCHIVE"), objs[-1].path, capsys)
    archiver = Archiver(store.path, loc)
    with pytest.raises(ArchiveError, match="identity is damaged"):  # it stops: no retry mends it
        archiver.ship_once()
    archiver.stop()
    os.remove(os.path.join(loc, "ARCHIVE"))  # missing, where log objects are: damage too
    assert main(["archive-verify", loc]) == 4
    out = capsys.readouterr().out
    assert "CORRUPT: " in out and "ARCHIVE" in out and "missing" in out
    with pytest.raises(CorruptionError, match="ARCHIVE"):
        ArchiveReader(loc)
    assert main(["archive-verify", str(tmp_path / "nothing")]) == 1  # no archive at all: not damage


def test_hostile_names_are_ignored_never_followed(store, tmp_path, capsys):
    loc = tmp_path / "arch"
    fill(store, 0, 100)
    Archiver(store.path, str(loc)).ship_once()
    wal = loc / WAL_DIR
    (tmp_path / "outside.wal").write_bytes(b"secret data outside the archive")
    (wal / "README").write_text("foreign")
    (wal / "1-2.wal").write_text("foreign")
    (wal / "00000000000000000009-00000000000000000001.wal").write_text("backwards")
    (wal / ".00000000000000000101-00000000000000000200.wal.tmp-0123456789abcdef").write_text("temp")
    (wal / "00000000000000000101-00000000000000000200.wal.partial").write_text("foreign")
    os.mkdir(wal / "00000000000000000300-00000000000000000400.wal")
    (loc / "snapshots").mkdir(exist_ok=True)
    (loc / "snapshots" / "snap-..").mkdir()
    (loc / "snapshots" / "snap-00000000000000000050.tmp-aa").mkdir()
    r = ArchiveReader(str(loc))
    assert [(o.first, o.last) for o in r.log_objects()] == [(1, 100)]
    assert [e.lsn for e in r.read_entries()] == list(range(1, 101)) and r.snapshots() == []
    assert r.verify() == []
    os.symlink(tmp_path / "outside.wal", wal / "00000000000000000101-00000000000000000200.wal")
    problems = ArchiveReader(str(loc)).verify()
    assert len(problems) == 1 and "symlink" in problems[0].message
    with pytest.raises(CorruptionError, match="symlink"):
        list(ArchiveReader(str(loc)).read_entries())


def test_credentials_are_redacted_in_display_and_errors():
    t = ArchiveTarget.open("s3://AKIAEXAMPLE:sup3r-s3cret@bucket/p?endpoint_override=127.0.0.1:1&scheme=http")
    assert "sup3r-s3cret" not in t.uri and "AKIAEXAMPLE" not in t.uri
    assert "sup3r-s3cret" not in t.display(t.path("wal", "x"))
    assert t.scrub("failed for sup3r-s3cret and AKIAEXAMPLE") == "failed for *** and ***"


@pytest.mark.parametrize("uri", [
    "s3://bucket?secret_key=sup3r-s3cret&region=x",           # a query right after the host
    "s3://bucket/p/q?access_key=sup3r-s3cret",
    "s3://KEY:sup3r-s3cret@bucket",
    "gs://b/p?session_token=sup3r-s3cret&scheme=http",
])
def test_redact_hides_every_credential_form(uri):
    from wal.readfs import redact

    shown = redact(uri)
    assert "sup3r-s3cret" not in shown and shown.split("://")[0] == uri.split("://")[0]


def test_commands(store, tmp_path, capsys):
    loc = str(tmp_path / "arch")
    fill(store, 0, 50)
    store.snapshot(keep=10)
    assert main(["archive", store.path, loc, "--once"]) == 0
    assert "up to LSN 50" in capsys.readouterr().out
    assert main(["archive-ls", loc]) == 0
    out = capsys.readouterr().out
    assert "log LSNs     1..50" in out and "LSN 50" in out
    assert main(["archive-verify", loc]) == 0
    assert main(["archive-ls", str(tmp_path / "nothing")]) == 1
