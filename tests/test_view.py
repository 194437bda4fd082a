"""db.view(): a consistent multi-key read as of one LSN, beside writers and
growth of LMDB's map (issue 16, item 6)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

import kvstore
import kvstore.state.view as view_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_view_sees_one_lsn_while_writers_commit_and_the_map_grows(tmp_path):
    with kvstore.open(str(tmp_path / "s"), sync="none", map_size=1 << 20) as db:
        db.update({b"a": b"0", b"b": b"0"})
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                i = 0
                while not stop.is_set() and i < 3000:
                    i += 1
                    with db.batch() as b:  # a and b are always equal, and the store grows
                        b.put(b"a", b"%d" % i)
                        b.put(b"pad%06d" % i, b"x" * 2000)
                        b.put(b"b", b"%d" % i)
                    time.sleep(0.0002)  # let the views interleave with the writes
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        lsns = []
        try:
            while t.is_alive() or len(lsns) < 50:
                with db.view() as v:
                    a = v.get(b"a")
                    pads = sum(1 for _ in v.scan(prefix=b"pad"))
                    assert v[b"b"] == a, (v.lsn, a)
                    assert b"a" in v and len(v) == pads + 2
                    lsns.append(v.lsn)
        finally:
            stop.set()
            t.join()
        assert not errors, errors
        assert lsns == sorted(lsns) and len(set(lsns)) > 10
        assert db.stats()["map_grows"] >= 2
        with pytest.raises(kvstore.ClosedError):
            v.get(b"a")
        with pytest.raises(kvstore.ClosedError):
            list(v.scan())


def test_a_view_is_one_snapshot_and_reads_like_the_store(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.update({b"k%d" % i: b"v%d" % i for i in range(10)})
        with db.view() as v:
            lsn = v.lsn
            db.put(b"k1", b"new")
            db.delete(b"k2")
            assert v.lsn == lsn == db.applied_lsn - 2
            assert v.get(b"k1") == b"v1" and v[b"k2"] == b"v2" and v.get(b"zz", b"d") == b"d"
            assert [k for k, _ in v.scan(b"k3", b"k6")] == [b"k3", b"k4", b"k5"]
            assert [k for k, _ in v.scan(prefix=b"k", reverse=True)][:2] == [b"k9", b"k8"]
            with pytest.raises(KeyError):
                v[b"nope"]
        assert db.get(b"k1") == b"new"
    with pytest.raises(kvstore.ClosedError):
        db.view()


READONLY_VIEW = """
import sys, kvstore
with kvstore.open(sys.argv[1], readonly=True) as ro, ro.view() as v:
    print(v.lsn, v.get(b"a").decode(), flush=True)
    sys.stdin.readline()               # the writer overwrites a meanwhile
    print(v.get(b"a").decode(), ro.get(b"a").decode(), flush=True)
"""


def test_views_on_a_readonly_store_and_from_asyncio(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path, overlay=False) as db:  # the reader sees each write at once
        db.put(b"a", b"1")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, "-c", READONLY_VIEW, path], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env, text=True)
        assert child.stdout.readline().split() == ["1", "1"]  # type: ignore[union-attr]
        db.put(b"a", b"2")
        out, _ = child.communicate("go\n", timeout=120)
        assert out.split() == ["1", "2"]  # the view kept LSN 1; the store moved on
        assert child.returncode == 0

    async def main() -> None:
        async with kvstore.open_async(path) as adb:
            with adb.view() as v:
                await adb.put(b"a", b"3")
                assert v.get(b"a") == b"2"
            async with adb.view() as v2:
                assert v2.get(b"a") == b"3" and v2.lsn == 3
    asyncio.run(main())


def test_an_old_view_expires_instead_of_stalling_the_writer(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(view_module, "_monotonic", lambda: now[0])
    with kvstore.open(str(tmp_path / "s"), sync="none", map_size=1 << 20) as db:
        db.put(b"a", b"1")
        v = db.view(max_seconds=5)
        assert v.get(b"a") == b"1"
        now[0] += 6  # older than its limit
        with pytest.raises(kvstore.ViewExpiredError, match="max_seconds=5"):
            v.get(b"a")
        with pytest.raises(kvstore.ViewExpiredError):
            len(v)
        v.close()

        # a view older than its limit, held by another thread, does not stop growth
        ready, done = threading.Event(), threading.Event()
        seen: list[BaseException] = []

        def holder() -> None:
            with db.view(max_seconds=5) as old:
                ready.set()
                done.wait(60)
                try:
                    old.get(b"a")
                except kvstore.ViewExpiredError as exc:
                    seen.append(exc)
        t = threading.Thread(target=holder)
        t.start()
        ready.wait(60)
        now[0] += 6
        grows = db.stats()["map_grows"]
        for i in range(300):
            db.put(b"p%05d" % i, b"x" * 10000)  # grows the map
        assert db.stats()["map_grows"] > grows
        done.set()
        t.join()
        assert len(seen) == 1

        # a view of the writing thread itself never deadlocks growth
        with db.view() as mine:
            grows = db.stats()["map_grows"]
            for i in range(600):
                db.put(b"q%05d" % i, b"x" * 10000)
            assert db.stats()["map_grows"] > grows
            with pytest.raises(kvstore.ViewExpiredError, match="had to grow"):
                mine.get(b"a")
