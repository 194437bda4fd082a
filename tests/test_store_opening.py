"""What ``kvstore.open`` opens (kvstore/store/opening.py): a file is "a file,
not a directory"; a directory that holds other things and no log is refused,
naming what it holds, and nothing is made in it (nor does ``walkv verify`` or
``walkv put`` take it for a store); new paths, empty directories, bytes and
``PathLike`` paths, a store's own leftovers and a replica's directory open
as before."""

from __future__ import annotations

import os
import pathlib

import pytest

import kvstore
from kvstore.layout import LOCK_NAME
from tests.test_cli import one_line_error, walkv


def test_a_file_is_not_a_directory(tmp_path):
    f = tmp_path / "afile"
    f.write_text("hello")
    for path in (f, f / "below"):
        with pytest.raises(kvstore.NotAStoreError, match="is a file, not a directory"):
            kvstore.open(str(path))
    assert f.read_text() == "hello"
    proc = walkv("put", str(f), "k", "v")
    assert proc.returncode == 1 and "is a file, not a directory" in one_line_error(proc)


def test_a_directory_of_other_things_is_refused_naming_them(tmp_path):
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    before = sorted(os.listdir(home))
    with pytest.raises(kvstore.NotAStoreError) as exc:
        kvstore.open(str(home))
    assert "projects/" in str(exc.value) and "notes.txt" in str(exc.value) and "no wal/" in str(exc.value)
    with pytest.raises(kvstore.NotAStoreError, match="notes.txt"):
        kvstore.open(str(home), readonly=True)
    assert sorted(os.listdir(home)) == before  # no LOCK, no wal/, no lmdb/ left behind
    proc = walkv("put", str(home), "k", "v")
    assert proc.returncode == 1 and "notes.txt" in one_line_error(proc)
    proc = walkv("verify", str(home))
    assert proc.returncode == 1 and "ok" not in proc.stdout
    assert "not a walkv store" in one_line_error(proc) and "notes.txt" in one_line_error(proc)
    assert sorted(os.listdir(home)) == before


def test_a_stores_log_directory_given_by_mistake_says_so(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.put(b"k", b"v")
    with pytest.raises(kvstore.NotAStoreError, match="looks like a store's wal/ directory; open its parent"):
        kvstore.open(str(tmp_path / "s" / "wal"))


def test_what_opened_before_still_opens(tmp_path):
    paths = [tmp_path / "new" / "deeper", tmp_path / "empty"]
    (tmp_path / "empty").mkdir()
    leftover = tmp_path / "leftover"  # a writer stopped before its log existed
    leftover.mkdir()
    (leftover / LOCK_NAME).write_text("")
    fresh_fs = tmp_path / "mnt"
    (fresh_fs / "lost+found").mkdir(parents=True)
    for path in [*paths, leftover, fresh_fs]:
        with kvstore.open(pathlib.Path(path)) as db:
            db.put(b"k", b"v")
        with kvstore.open(str(path)) as db:  # and again: it is a store now
            assert db.get(b"k") == b"v"
    with kvstore.open(os.fsencode(tmp_path / "bytes")) as db:  # failed inside os.path.join before
        assert db.path == str(tmp_path / "bytes")
        db.put(b"k", b"v")
    with kvstore.open(os.fsencode(tmp_path / "bytes"), readonly=True) as db:
        assert db.get(b"k") == b"v"
    with pytest.raises(TypeError, match="not int"):
        kvstore.open(3)  # type: ignore[arg-type]


def test_restore_and_replica_targets_still_open(tmp_path):
    src = str(tmp_path / "src")
    with kvstore.open(src) as db:
        db.put(b"k", b"v")
        db.snapshot()
    kvstore.restore(src, str(tmp_path / "restored"))
    with kvstore.open(str(tmp_path / "restored")) as db:
        assert db.get(b"k") == b"v"
    rep = kvstore.open_replica(src, str(tmp_path / "replica"))
    try:
        rep.catch_up()
        promoted = rep.promote()
    finally:
        rep.close()
    with promoted:
        assert promoted.get(b"k") == b"v"
