"""The keyspace limit (kvstore/store/keyspace.py, ``Keyspaces.writable``): a
write into a keyspace the store does not hold yet, past
:data:`kvstore.state.lmdb_env.MAX_KEYSPACES`, is refused before anything is
logged, by every write path that can name a keyspace; keyspaces it holds stay
writable, and a read-only store refuses the write as read-only."""

from __future__ import annotations

import asyncio

import pytest

import kvstore
from kvstore.state.lmdb_env import MAX_KEYSPACES
from wal.errors import KeyspaceLimitError, ReadOnlyError


def test_a_keyspace_past_the_limit_is_refused_before_it_is_logged(tmp_path) -> None:
    path = tmp_path / "s"
    with kvstore.open(path, sync="none") as db:
        for i in range(MAX_KEYSPACES):
            db.keyspace(f"ks{i}").put(b"k", b"v")
        full = db.last_lsn
        one_more = db.keyspace("one-more")
        attempts = [
            lambda: one_more.put(b"k", b"v"),
            lambda: one_more.put(b"k", b"v", ttl=60),
            lambda: one_more.delete(b"k"),
            lambda: one_more.delete_range(None, None),
            lambda: one_more.compare_and_set(b"k", None, b"v"),
            lambda: one_more.batch(),
            lambda: db.batch().put(b"k", b"v", keyspace="one-more"),
            lambda: db.transaction().put(b"k", b"v", keyspace="one-more"),
        ]
        for attempt in attempts:
            with pytest.raises(KeyspaceLimitError, match=f"holds {MAX_KEYSPACES} keyspaces.*'one-more'"):
                attempt()
        assert db.last_lsn == full
        # a keyspace it holds, and the default one, stay writable; so does a dropped one
        assert db.keyspace("ks7").put(b"k2", b"v2") == full + 1
        db.keyspace("ks8").drop()
        assert db.keyspace("ks8").put(b"k", b"v") == full + 3
        assert db.put(b"k", b"v") == full + 4

    async def from_the_loop() -> None:
        async with kvstore.open_async(path, sync="none") as adb:
            for attempt in (lambda: adb.batch("one-more"), lambda: adb.transaction("one-more"),
                            lambda: adb.keyspace("one-more").put(b"k", b"v", ttl=60),
                            lambda: adb.keyspace("one-more").delete(b"k")):
                with pytest.raises(KeyspaceLimitError):
                    attempt()
            assert await adb.keyspace("ks9").put(b"k", b"v") == full + 5
            assert await adb.keyspaces() == sorted(f"ks{i}" for i in range(MAX_KEYSPACES))
    asyncio.run(from_the_loop())
    with kvstore.open(path, readonly=True) as ro:
        with pytest.raises(ReadOnlyError):
            ro.keyspace("one-more").put(b"k", b"v")
