"""The asyncio front's batches and transactions (kvstore/store/aio_batch.py):
``async with`` commits on a normal exit and discards on an exception, for a
batch and a transaction alike (one shared rule, AsyncCommitOnExit); a
synchronous ``commit()`` is refused, since it would block the event loop."""

from __future__ import annotations

import asyncio

import pytest

import kvstore
from wal.errors import ClosedError


def test_async_with_commits_or_discards_and_a_blocking_commit_is_refused(tmp_path) -> None:
    async def main() -> None:
        async with kvstore.open_async(tmp_path / "s") as adb:
            for make in (adb.batch, adb.transaction):
                with pytest.raises(RuntimeError):
                    async with make() as discarded:
                        discarded.put(b"never", b"1")
                        raise RuntimeError
                with pytest.raises(ClosedError):  # discarded: it takes nothing more
                    discarded.put(b"k", b"v")
                blocking = make()
                blocking.put(b"never", b"2")
                with pytest.raises(TypeError, match="async with"):
                    blocking.commit()
                async with make("users") as committed:
                    committed.put(b"k", make.__name__.encode())
                    committed.put(b"k", b"default", keyspace="")
                assert committed.lsn == adb.last_lsn
            assert adb.last_lsn == 2
            assert await adb.get(b"never") is None and await adb.get(b"k") == b"default"
            assert await adb.keyspace("users").get(b"k") == b"transaction"
            async with adb.transaction() as failed:
                failed.require(b"k", absent=True)
                failed.put(b"never", b"3")
            assert failed.succeeded is False and await adb.get(b"never") is None

    asyncio.run(main())
