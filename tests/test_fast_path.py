"""A store's ``put`` and ``get`` are compiled (:mod:`kvstore.store.fast_path`):
they must do what :meth:`KVStore.put` and :meth:`KVStore.get` do, for as long
as a caller holds them."""

from __future__ import annotations

import os

import pytest

import kvstore
import wal
from kvstore import KVStore
from kvstore.store.fast_path import GetPath, WritePath

BIG = b"v" * (1 << 20)  # logged as pieces (codec.put_payload)


def _payloads(path: str) -> list[bytes]:
    return [bytes(e.payload) for e in wal.read_log(os.path.join(path, "wal"))]


def test_put_path_logs_what_the_method_logs(tmp_path) -> None:
    paths = [str(tmp_path / "path"), str(tmp_path / "method")]
    for path, by_path in zip(paths, (True, False)):
        with kvstore.open(path, sync="none") as db:
            assert isinstance(db.put.__self__, WritePath)
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
    put = db.put
    put(b"k", b"v")
    db.close()
    for held in (put, db.put, db.keyspace("ks").put):  # the store's words, however it was reached
        with pytest.raises(kvstore.ClosedError, match=f"^the store {path} is closed$"):
            held(b"k", b"w")
    with kvstore.open(path, readonly=True) as ro:
        assert isinstance(ro.put.__self__, WritePath)  # with no log: it refuses
        with pytest.raises(kvstore.ReadOnlyError):
            ro.put(b"k", b"w")
        assert ro.get(b"k") == b"v"


def test_a_held_get_follows_the_overlay_expiry_and_close(tmp_path) -> None:
    # The state's get changes as the overlay fills and empties and keys gain expiries;
    # a get taken once, before all of that, must see every write.
    db = kvstore.open(str(tmp_path / "s"), sync="none")
    get = db.get
    assert isinstance(get.__self__, GetPath)
    assert get(b"k") is None and get(b"k", b"d") == b"d"  # empty overlay: LMDB only
    db.put(b"k", b"1")
    assert get(b"k") == b"1"  # in the overlay
    assert len(db) == 1 and len(db._state.overlay) == 0  # a count flushes the overlay: LMDB only again
    assert get(b"k") == b"1"
    db.put(b"k", b"2")
    assert get(b"k") == b"2"
    db.put(b"t", b"x", ttl=3600)  # a key with an expiry: the get that checks it
    assert db._state.gets.checking
    assert get(b"t") == b"x" and get(b"k") == b"2"
    db.delete(b"k")
    assert get(b"k") is None
    for key in (1, "k", None):
        with pytest.raises(Exception) as by_path:
            get(key)
        with pytest.raises(Exception) as by_method:
            KVStore.get(db, key)
        assert (type(by_path.value), str(by_path.value)) == (type(by_method.value), str(by_method.value))
    db.close()
    with pytest.raises(kvstore.ClosedError):
        get(b"k")
