"""A store (and a log) used across fork(): the child is refused, the parent
loses nothing (issue 16, item 1). Real os.fork() and multiprocessing."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys

import pytest

import kvstore
import wal
from kvstore.layout import LMDB_DIR

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

_DB: kvstore.KVStore | None = None  # the module-level store multiprocessing children inherit
_HELD: tuple = ()  # its put and get, taken before the fork (callers hold them: kvstore/store/fast_path.py)


def _outcome(fn) -> str:
    try:
        fn()
    except kvstore.ForkedError:
        return "ForkedError"
    except BaseException as exc:  # noqa: BLE001  reported to the parent
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _fork_child(report) -> list[str]:
    """What the child may do with what it inherited."""
    db = _DB
    assert db is not None
    out = [_outcome(lambda: db.put(b"child", b"x")),
           _outcome(lambda: db.get(b"k0")),
           _outcome(lambda: list(db.scan())),
           _outcome(lambda: db.delete(b"k0")),
           _outcome(lambda: db._log.append(b"raw")),  # the log itself refuses too
           _outcome(db.close)]
    out.append(_outcome(lambda: kvstore.open(db.path, readonly=True).close()))
    put, get = _HELD
    out += [_outcome(lambda: put(b"child", b"y")), _outcome(lambda: get(b"k0"))]
    report(out)
    return out


def test_forked_child_cannot_use_the_store_and_the_parent_loses_nothing(tmp_path):
    global _DB, _HELD
    path = str(tmp_path / "s")
    _DB = db = kvstore.open(path)
    _HELD = (db.put, db.get)
    try:
        acked = {b"k0": db.put(b"k0", b"v0")}
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.close(r)
                _fork_child(lambda out: os.write(w, "\n".join(out).encode()))
            finally:
                os._exit(0)
        os.close(w)
        for i in range(1, 50):  # the parent writes on while the child tries
            acked[b"k%d" % i] = db.put(b"k%d" % i, b"v%d" % i)
        with os.fdopen(r, "rb") as fh:
            child = fh.read().decode().split("\n")
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert child[:5] == ["ForkedError"] * 5, child
        assert child[5] == "ok"                  # close() in the child: a no-op
        assert child[6] == "ForkedError", child  # it inherited the environment open
        assert child[7:] == ["ForkedError"] * 2, child  # a put and a get held from before the fork
        # the child's close released nothing: the parent's lock holds, it writes on
        with pytest.raises(kvstore.LockedError):
            kvstore.open(path)
        acked[b"after"] = db.put(b"after", b"1")
        assert sorted(acked.values()) == list(range(1, 52))  # no LSN handed out twice
        assert db.get(b"child") is None
    finally:
        _DB, _HELD = None, ()
        db.close()
    shutil.rmtree(os.path.join(path, LMDB_DIR))  # rebuild LMDB from the log
    with kvstore.open(path) as db2:
        assert db2.rebuilt is not None
        for key, lsn in acked.items():
            assert db2.get(key) is not None, (key, lsn)
        assert db2.get(b"child") is None
        assert db2.last_lsn == 51


def test_forked_child_gets_forked_error_from_a_bare_log(tmp_path):
    log = wal.open(str(tmp_path / "w"))
    try:
        log.append(b"one")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log.append(b"two")
            except wal.ForkedError:
                code = 0
            log.close()  # a no-op: must not write the parent's index or release its lock
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with pytest.raises(wal.LockedError):
            wal.open(str(tmp_path / "w"))
        assert log.append(b"two") == 2
    finally:
        log.close()
    with wal.open(str(tmp_path / "w")) as again:
        assert [p for _, p in again.read()] == [b"one", b"two"]


def _mp_worker(q) -> None:
    _fork_child(q.put)


def _mp_reader(path: str, q) -> None:
    with kvstore.open(path, readonly=True) as ro:
        q.put(ro.get(b"k0"))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_module_level_store_with_multiprocessing(tmp_path):
    global _DB, _HELD
    path = str(tmp_path / "s")
    _DB = db = kvstore.open(path)
    _HELD = (db.put, db.get)
    try:
        db.put(b"k0", b"v0")
        fork = multiprocessing.get_context("fork")
        q = fork.Queue()
        p = fork.Process(target=_mp_worker, args=(q,))
        p.start()
        out = q.get(timeout=60)
        p.join(60)
        assert p.exitcode == 0
        assert out[:5] == ["ForkedError"] * 5, out
        assert out[7:] == ["ForkedError"] * 2, out
        assert db.put(b"k1", b"v1") == 2
        # what the error says to do works: a child that did not inherit the store open
        spawn = multiprocessing.get_context("spawn")
        q2 = spawn.Queue()
        p2 = spawn.Process(target=_mp_reader, args=(path, q2))
        p2.start()
        assert q2.get(timeout=120) == b"v0"
        p2.join(60)
        assert p2.exitcode == 0
    finally:
        _DB, _HELD = None, ()
        db.close()
