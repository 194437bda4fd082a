"""A writable store's ``put`` is the compiled :class:`kvstore.store.put.PutPath`:
it must log what :meth:`KVStore.put` logs and refuse what it refuses."""

from __future__ import annotations

import os

import pytest

import kvstore
import wal
from kvstore import KVStore
from kvstore.store.put import PutPath

BIG = b"v" * (1 << 20)  # logged as pieces (codec.put_payload)


def _payloads(path: str) -> list[bytes]:
    return [bytes(e.payload) for e in wal.read_log(os.path.join(path, "wal"))]


def test_put_path_logs_what_the_method_logs(tmp_path) -> None:
    paths = [str(tmp_path / "path"), str(tmp_path / "method")]
    for path, by_path in zip(paths, (True, False)):
        with kvstore.open(path, sync="none") as db:
            assert isinstance(db.put.__self__, PutPath)
            put = db.put if by_path else (lambda *a, **kw: KVStore.put(db, *a, **kw))  # noqa: B023
            assert [put(b"k", b"v"), put(b"k" * 511, b""), put(b"big", BIG), put(b"t", b"x", ttl=30)] == [1, 2, 3, 4]
            assert [db.get(b"k"), db.get(b"k" * 511), db.get(b"big"), db.get(b"t")] == [b"v", b"", BIG, b"x"]
            assert db.ttl(b"t") is not None
    by_path, by_method = (_payloads(p) for p in paths)
    assert by_path[:3] == by_method[:3]
    assert len(by_path) == len(by_method) == 4  # (the TTL entry holds the clock's time)


@pytest.mark.parametrize("args, kwargs", [
    ((1, b"v"), {}), ((b"k", "v"), {}), ((b"", b"v"), {}), ((b"k" * 512, b"v"), {}),
    ((b"k", b"v"), {"ttl": "x"}), ((b"k", b"v"), {"ttl": -1}), ((b"k", b"v"), {"ttl": 1, "lease": 5}),
])
def test_put_path_refuses_what_the_method_refuses(tmp_path, args, kwargs) -> None:
    with kvstore.open(str(tmp_path / "s"), sync="none") as db:
        with pytest.raises(Exception) as by_path:
            db.put(*args, **kwargs)
        with pytest.raises(Exception) as by_method:
            KVStore.put(db, *args, **kwargs)
        assert (type(by_path.value), str(by_path.value)) == (type(by_method.value), str(by_method.value))
        assert db.last_lsn == 0  # nothing logged


def test_read_only_and_closed_stores_refuse_puts(tmp_path) -> None:
    path = str(tmp_path / "s")
    db = kvstore.open(path, sync="none")
    db.put(b"k", b"v")
    db.close()
    with pytest.raises(kvstore.ClosedError):
        db.put(b"k", b"w")
    with kvstore.open(path, readonly=True) as ro:
        assert "put" not in vars(ro)  # no log: the method, which refuses
        with pytest.raises(kvstore.ReadOnlyError):
            ro.put(b"k", b"w")
        assert ro.get(b"k") == b"v"
