"""Keyspaces beyond the model test (tests/test_keyspaces_model.py): a store
made by walkv before keyspaces opens unchanged with its data, names and
limits are checked, the entry format is strict, watch and snapshots carry
the keyspace, a restore keeps every keyspace."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

import kvstore
import snapshot
from kvstore.entry.codec import OP_DROP_KEYSPACE, OP_KEYSPACE, OP_PUT, decode, encode
from wal.errors import CorruptionError

BEFORE_KEYSPACES = "f56a9d6"
"""The last commit of main before keyspaces: the code that made old stores."""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _old_walkv(tmp_path) -> str:
    """walkv as it was before keyspaces, extracted from git (skip without git)."""
    if shutil.which("git") is None:
        pytest.skip("needs git to extract the walkv before keyspaces")
    try:
        data = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", BEFORE_KEYSPACES, "wal", "snapshot",
                               "kvstore"], check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot extract {BEFORE_KEYSPACES} ({e.stderr.decode(errors='replace').strip()})")
    out = tmp_path / "old-walkv"
    out.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    return str(out)


OLD_WRITER = """
import sys, kvstore
with kvstore.open(sys.argv[1]) as db:
    for i in range(300):
        db.put(b"k%04d" % i, b"v%d" % i)
    db.snapshot()
    with db.batch() as b:
        b.put(b"after", b"snapshot"); b.delete(b"k0000")
    print(kvstore.__file__)
"""


def test_a_store_made_before_keyspaces_opens_unchanged(tmp_path):
    old = _old_walkv(tmp_path)
    store = str(tmp_path / "store")
    out = subprocess.run([sys.executable, "-c", OLD_WRITER, store], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=old), cwd=old)
    assert out.stdout.strip().startswith(old)  # it was the old code that wrote it
    snap_manifest = snapshot.list_snapshots(os.path.join(store, "snapshots"))[-1]
    with kvstore.open(store) as db:
        assert db.rebuilt is None and db.replayed == 0  # LMDB as the old walkv left it
        assert db.get(b"k0001") == b"v1" and db.get(b"k0000") is None and db.get(b"after") == b"snapshot"
        assert len(db) == 300 and db.keyspaces() == []
        db.keyspace("new").put(b"k0001", b"elsewhere")
        assert db.get(b"k0001") == b"v1"
    assert snapshot.open(snap_manifest.path).section_names() == []  # the old snapshot reads as it was
    shutil.rmtree(os.path.join(store, "lmdb"))  # rebuilt from the old snapshot plus both logs' entries
    with kvstore.open(store) as db:
        assert db.rebuilt is not None
        assert dict(db.scan()) == {**{b"k%04d" % i: b"v%d" % i for i in range(1, 300)}, b"after": b"snapshot"}
        assert db.keyspaces() == ["new"] and db.keyspace("new").get(b"k0001") == b"elsewhere"


@pytest.mark.parametrize("name,error", [
    ("", ValueError), ("x" * 65, ValueError), ("a/b", ValueError), ("__x", ValueError), ("é", ValueError),
    (b"users", TypeError), (None, TypeError),
])
def test_keyspace_names_are_checked(tmp_path, name, error):
    with kvstore.open(tmp_path / "s") as db:
        with pytest.raises(error):
            db.keyspace(name)
        with pytest.raises(error):
            db.drop_keyspace(name)
        if name not in ("", None):  # in a batch "" is the default keyspace, None the batch's own
            with pytest.raises(error), db.batch() as b:
                b.put(b"k", b"v", keyspace=name)
        assert db.last_lsn == 0


@pytest.mark.parametrize("ops,why", [
    ([[OP_KEYSPACE, b"a"]], "is a str"),
    ([[OP_KEYSPACE, "a", "b"]], "fields"),
    ([[OP_KEYSPACE, "__a"]], "reserved"),
    ([[OP_DROP_KEYSPACE, ""]], "never dropped"),
    ([[OP_DROP_KEYSPACE, "a"], [5, b"k"]], "condition after a write"),
    ([[7, 0], [OP_DROP_KEYSPACE, "a"]], "failed"),
])
def test_bad_keyspace_ops_are_corruption(ops, why):
    with pytest.raises(CorruptionError, match=why):
        decode(encode(ops), 5)


def test_keyspace_ops_decode():
    ops = [[OP_KEYSPACE, "a"], [5, b"k"], [OP_KEYSPACE, ""], [OP_PUT, b"k", b"v"], [OP_DROP_KEYSPACE, "a"]]
    assert decode(encode(ops)) == ops
    assert decode(encode([[7, 1], [OP_KEYSPACE, "a"], [5, b"k"]])) == [[7, 1], [OP_KEYSPACE, "a"], [5, b"k"]]


def test_watch_carries_the_keyspace_and_a_drop(tmp_path):
    with kvstore.open(tmp_path / "s") as db:
        users = db.keyspace("users")
        db.put(b"k", b"default")
        with db.batch() as b:
            b.put(b"k", b"u", keyspace="users")
            b.put(b"j", b"d")
        users.drop()
        every = [(c.lsn, c.op, c.key, c.end_key, c.keyspace) for c in db.watch(from_lsn=1, keyspace=None, timeout=0)]
        assert every == [(1, "upsert", b"k", None, ""), (2, "upsert", b"k", None, "users"),
                         (2, "upsert", b"j", None, ""), (3, "delete_range", b"", None, "users")]
        assert [(c.lsn, c.key) for c in db.watch(from_lsn=1, timeout=0)] == [(1, b"k"), (2, b"j")]
        assert [(c.lsn, c.op) for c in users.watch(from_lsn=1, timeout=0)] == [(2, "upsert"), (3, "delete_range")]


def test_snapshot_restore_and_replica_keep_every_keyspace(tmp_path):
    src = tmp_path / "s"
    with kvstore.open(src) as db:
        db.update({b"a": b"1"})
        db.keyspace("x").update({b"a": b"x1", b"b": b"x2"})
        db.keyspace("y").put(b"a", b"y1")
        info = db.snapshot()
        db.keyspace("x").delete(b"b")
        db.drop_keyspace("y")
    snap = snapshot.open(info.path)
    assert snap.section_names() == ["ks:x", "ks:y"] and info.count == 4
    assert list(snap.section_items("ks:x")) == [(b"a", b"x1"), (b"b", b"x2")]
    kvstore.restore(src, tmp_path / "at-snapshot", to_lsn=info.lsn)
    kvstore.restore(src, tmp_path / "now")
    with kvstore.open(tmp_path / "at-snapshot", readonly=True) as db:
        assert db.keyspaces() == ["x", "y"] and db.keyspace("y").get(b"a") == b"y1"
        assert dict(db.keyspace("x").scan()) == {b"a": b"x1", b"b": b"x2"}
    with kvstore.open(tmp_path / "now", readonly=True) as db:
        assert db.keyspaces() == ["x"] and dict(db.keyspace("x").scan()) == {b"a": b"x1"}
        assert dict(db.scan()) == {b"a": b"1"}


READER = """
import sys, kvstore
with kvstore.open(sys.argv[1], readonly=True) as ro:
    print(ro.keyspaces(), ro.keyspace("late").get(b"k"), flush=True)
    sys.stdin.readline()  # the writer made the keyspace
    print(ro.keyspaces(), ro.keyspace("late").get(b"k"), list(ro.keyspace("late").scan()), flush=True)
"""


def test_a_readonly_process_sees_keyspaces_created_after_it_opened(tmp_path):
    with kvstore.open(tmp_path / "s", overlay=False) as db:
        db.put(b"a", b"1")
        reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path / "s")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert reader.stdout is not None and reader.stdin is not None
            assert reader.stdout.readline().strip() == "[] None"
            db.keyspace("late").put(b"k", b"v")
            reader.stdin.write("go\n")
            reader.stdin.flush()
            assert reader.stdout.readline().strip() == "['late'] b'v' [(b'k', b'v')]"
        finally:
            reader.stdin.close()  # type: ignore[union-attr]
            assert reader.wait(timeout=60) == 0


def test_the_async_front_has_keyspaces(tmp_path):
    import asyncio

    async def main() -> None:
        async with kvstore.open_async(tmp_path / "s") as adb:
            users = adb.keyspace("users")
            lsns = await asyncio.gather(*(users.put(b"k%d" % i, b"v%d" % i) for i in range(50)))
            assert sorted(lsns) == list(range(1, 51))
            async with adb.batch() as b:
                b.put(b"k0", b"default")
                b.put(b"k0", b"again", keyspace="users")
            assert await users.get(b"k0") == b"again" and await adb.get(b"k0") == b"default"
            assert await users.compare_and_set(b"k0", b"again", b"cas")
            assert await users.get_many([b"k0", b"k1", b"nope"]) == [b"cas", b"v1", None]
            assert await users.count() == 50 and await adb.keyspaces() == ["users"]
            await users.delete_range(b"k1", b"k2")  # k1, k10..k19
            assert await users.count() == 39
            await adb.drop_keyspace("users")
            assert await adb.keyspaces() == [] and await adb.count() == 1

    asyncio.run(main())


def test_the_cli_takes_keyspace(tmp_path):
    from tests.test_cli import one_line_error, walkv

    s = str(tmp_path / "s")
    assert walkv("put", s, "k", "in-users", "--keyspace", "users").returncode == 0
    assert walkv("put", s, "k", "default").returncode == 0
    assert walkv("get", s, "k", "--keyspace", "users").stdout == "in-users\n"
    assert walkv("get", s, "k").stdout == "default\n"
    rows = '{"key": "a", "value": "1"}\n{"key": "b", "value": "2"}\n'
    assert walkv("load", s, "-", "--format", "jsonl", "--keyspace", "users", input=rows).returncode == 0
    assert walkv("scan", s, "--keyspace", "users", "--keys-only").stdout.split() == ["a", "b", "k"]
    assert walkv("scan", s, "--keys-only").stdout.split() == ["k"]
    assert walkv("delete", s, "a", "b", "--keyspace", "users").returncode == 0
    assert walkv("scan", s, "--keyspace", "users").stdout == "k\tin-users\n"
    missing = walkv("get", s, "a", "--keyspace", "users")
    assert missing.returncode == 1 and "keyspace 'users'" in one_line_error(missing)
    bad = walkv("put", s, "k", "v", "--keyspace", "no/slash")
    assert bad.returncode == 2 and "--keyspace 'no/slash'" in one_line_error(bad)
    with kvstore.open(s) as db:
        assert db.keyspaces() == ["users"] and db.last_lsn == 4  # put, put, one load batch, one delete batch


def test_a_batch_counts_writes_not_keyspace_switches(tmp_path):
    with kvstore.open(tmp_path / "s") as db:
        with db.batch() as b:
            b.put(b"a", b"1", keyspace="x")
            b.put(b"a", b"1")
            b.delete(b"a", keyspace="y")
            assert len(b) == 3
        assert b.lsn == 1 and db.keyspace("x").get(b"a") == b"1"
