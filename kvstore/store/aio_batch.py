"""The asyncio front's batches and transactions: :class:`AsyncWriteBatch`
(``async with adb.batch() as b:``) and :class:`AsyncTransaction`
(``async with adb.transaction() as t:``), and :class:`AsyncCommitOnExit`,
the ``async with`` rule they share.

Each is its synchronous twin (:class:`~kvstore.store.write_batch.WriteBatch`,
:class:`~kvstore.store.txn.Transaction`: the same checks as each write is
added, the same entry), committed by awaiting a ``submit(payload, ops)`` that
logs the entry and resolves to its LSN: the asyncio front's
(:mod:`kvstore.store.aio`, which shares fsyncs between coroutines) or the HTTP
client's (:mod:`kvstore.client.aremote`). Durability is the submitter's: with
the store's ``sync="always"``, an awaited commit has been fsynced and applied.
A synchronous ``commit()`` is a TypeError: it would block the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Self

from kvstore.entry.codec import check_keyspace
from kvstore.store.expiring import Expiring
from kvstore.store.txn import Transaction
from kvstore.store.write_batch import WriteBatch

Submit = Callable[[bytes, list], Awaitable[int]]
"""Logs an entry (payload, ops); resolves to its LSN once durable and applied."""


def _refuse_sync_commit(payload: bytes, ops: list) -> int:
    raise TypeError("an async batch or transaction is committed by `async with` (or `await b.acommit()`)")


class AsyncCommitOnExit:
    """``async with x:`` awaits the commit on a normal exit of the block and
    discards when it raises: the asyncio twin of
    :class:`~kvstore.store.write_batch.CommitOnExit`. Listed after the
    synchronous class among the bases, whose ``discard`` it uses."""

    __slots__ = ()
    _done: bool

    async def acommit(self) -> object:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if not self._done:
                await self.acommit()
        else:
            self.discard()


class AsyncWriteBatch(WriteBatch, AsyncCommitOnExit):
    """A :class:`~kvstore.store.write_batch.WriteBatch` committed with ``async
    with`` (or ``await b.acommit()``); ``submit(payload, ops)`` logs it and
    resolves to its LSN."""

    __slots__ = ("_submit",)

    def __init__(self, submit: Submit, max_value: int, max_payload: int, keyspace: str = "",
                 check_keyspace: Callable[[str], str] = check_keyspace, expiring: Expiring | None = None) -> None:
        super().__init__(_refuse_sync_commit, max_value, max_payload, keyspace, check_keyspace=check_keyspace,
                         expiring=expiring)
        self._submit = submit

    async def acommit(self) -> int | None:
        """Commit: one log entry, awaited until durable and applied."""
        sealed = self._seal()
        if sealed is None:
            return None
        self.lsn = await self._submit(sealed[0], sealed[1])
        self.check(sealed[1])
        return self.lsn


class AsyncTransaction(Transaction, AsyncCommitOnExit):
    """A :class:`~kvstore.store.txn.Transaction` committed with ``async with``
    (or ``await t.acommit()``); ``submit`` as :class:`AsyncWriteBatch`'s."""

    def __init__(self, submit: Submit, max_value: int, max_payload: int, keyspace: str = "",
                 check_keyspace: Callable[[str], str] = check_keyspace, expiring: Expiring | None = None) -> None:
        super().__init__(_refuse_sync_commit, max_value, max_payload, keyspace, check_keyspace=check_keyspace,
                         expiring=expiring)
        self._submit = submit

    async def acommit(self) -> bool:
        """Log the transaction (durable and decided when it returns); whether it succeeded."""
        sealed = self._seal()
        if sealed is None:
            return True
        return self._settle(await self._submit(sealed[0], sealed[1]), sealed[1])
