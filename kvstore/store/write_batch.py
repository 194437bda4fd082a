"""Collecting writes to commit as one log entry: :class:`WriteBatch` (``with
db.batch() as b:``), and :class:`CommitOnExit`, the ``with`` rule it shares
with transactions (commit on a normal exit, discard on an exception). The
entry's format, and the checks each argument gets, are :mod:`kvstore.entry.codec`'s.

Compiled with the core (wal/compiled.py): a bulk load calls :meth:`WriteBatch.put`
once per pair, and compiled that call costs about two thirds of what it costs
interpreted (100,000 puts: 19 ms instead of 29). Both classes take interpreted
subclasses (the transaction, the asyncio front's twins). Adding to a batch
that was committed or discarded checks ``_done`` (mypyc's ``list.append`` would
not call an override on a list subclass). Arguments are declared ``object``
where the codec's checks give the error (a compiled signature would refuse
them first, with mypyc's message).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Self

from mypy_extensions import mypyc_attr

from kvstore.entry.codec import (
    MAX_KEY_BYTES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_LEASED,
    PlainPuts,
    check_key,
    check_keyspace,
    check_range,
    check_value,
    pack_ops,
)
from kvstore.entry.conditions import Outcome
from wal.errors import ClosedError, RecordTooLargeError


def _closed() -> ClosedError:
    return ClosedError("this batch was already committed or discarded; start a new one with db.batch()")


@mypyc_attr(allow_interpreted_subclasses=True)  # transactions, the asyncio front's classes
class CommitOnExit:
    """``with x:`` commits on a normal exit of the block and discards when it
    raises (a batch, a transaction)."""

    __slots__ = ()
    _done: bool

    def commit(self) -> object:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if not self._done:
                self.commit()
        else:
            self.discard()


@mypyc_attr(allow_interpreted_subclasses=True)  # AsyncWriteBatch
class WriteBatch(CommitOnExit):
    """Operations collected to be written atomically, as one log entry.

    Use it as a context manager (``with db.batch() as b:``): on a normal exit
    the batch is committed (one LSN, durable per the store's sync mode when the
    ``with`` block returns, then visible to reads); when the block raises,
    nothing is written. Every argument is validated as it is added, so a bad
    key raises at the call that adds it. After commit, :attr:`lsn` holds the
    entry's LSN (``None`` for an empty batch, which writes nothing).

    ``commit`` is called as ``commit(payload, ops)`` and returns the LSN: the
    ops travel with the payload through the log, so that the store applies
    them without decoding its own payload again.

    Keyspaces: each write goes to ``keyspace=`` when given ("": the default
    keyspace), else to the batch's own (``keyspace``: the one of the handle
    that made it, "" for the store's), so one batch may span keyspaces and
    stays one atomic entry (a ``[16, name]`` op goes before each change of
    keyspace, :mod:`kvstore.entry.codec`).
    """

    __slots__ = ("_ops", "_commit", "_max_value", "_max_payload", "_done",
                 "lsn", "_keyspace", "_at", "_check_keyspace", "_switches", "_expiring", "_leased", "_plain")

    def __init__(self, commit: Callable[[bytes, list], int], max_value: int,
                 max_payload: int, keyspace: str = "",
                 check_keyspace: Callable[[str], str] = check_keyspace, expiring: Any = None) -> None:
        """``expiring``: the store's :class:`kvstore.store.expiring.Expiring`
        (puts with ``ttl=``/``lease=``)."""
        self._ops: list = []
        self._commit = commit
        self._max_value = max_value
        self._max_payload = max_payload
        self._expiring = expiring
        self._done = False
        self.lsn: int | None = None
        self._keyspace = keyspace  # where writes without keyspace= go
        self._at = ""  # the keyspace the ops so far leave the entry in
        self._check_keyspace = check_keyspace
        self._switches = 0  # [16, name] ops among _ops (not writes)
        self._leased = False  # a put under a lease is among _ops: the batch is decided at commit
        self._plain = True  # _ops are puts only, in the default keyspace (handed on as PlainPuts)

    def _switch(self, keyspace: str | None) -> None:
        """Make the next op go to ``keyspace`` (None: the batch's own)."""
        ks = self._keyspace if keyspace is None else self._check_keyspace(keyspace)
        if ks != self._at:
            self._plain = False
            self._ops.append((OP_KEYSPACE, ks))
            self._at = ks
            self._switches += 1

    def put(self, key: object, value: object, ttl: Any = None, lease: Any = None, *,
            keyspace: str | None = None) -> None:
        """Set ``key`` to ``value`` (in ``keyspace``) when the batch commits;
        ``ttl``/``lease`` as :meth:`kvstore.KVStore.put` takes them (a lease
        not alive at the batch's place in the log fails the whole batch at
        commit)."""
        if self._done:
            raise _closed()
        if ttl is not None or lease is not None:
            op = self._expiring.put_op(key, value, ttl, lease)
            self._plain = False
            if op[0] == OP_PUT_LEASED:
                self._leased = True
            if keyspace is not None or self._keyspace != self._at:
                self._switch(keyspace)
            self._ops.append(op)
            return
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
            key = check_key(key)
        if type(value) is not bytes or len(value) > self._max_value:
            value = check_value(value, self._max_value)
        if keyspace is not None or self._keyspace != self._at:
            self._switch(keyspace)
        self._ops.append((OP_PUT, key, value))

    def update(self, pairs: "Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]", *,
               keyspace: str | None = None) -> None:
        """Add a put for every (key, value) of ``pairs`` (a mapping or an
        iterable of pairs), checked as :meth:`put` checks them, in one pass:
        the fast way to load many pairs. A pair refused raises, and none of
        ``pairs`` is added."""
        if self._done:
            raise _closed()
        items: Iterable[Any] = pairs.items() if isinstance(pairs, Mapping) else pairs
        max_value = self._max_value
        ops: list = []
        add = ops.append
        for key, value in items:  # (a loop, compiled: twice as fast as six passes of map() over the pairs)
            if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
                key = check_key(key)
            if type(value) is not bytes or len(value) > max_value:
                value = check_value(value, max_value)
            add((OP_PUT, key, value))
        if not ops:
            return
        if keyspace is not None or self._keyspace != self._at:
            self._switch(keyspace)
        self._ops.extend(ops)

    def delete(self, key: object, *, keyspace: str | None = None) -> None:
        """Remove ``key`` (in ``keyspace``) when the batch commits."""
        if self._done:
            raise _closed()
        key = check_key(key)
        self._switch(keyspace)
        self._plain = False
        self._ops.append((OP_DELETE, key))

    def delete_range(self, start: object, end: object, *, keyspace: str | None = None) -> None:
        """Delete every key with ``start <= key < end`` (``None``: unbounded), in ``keyspace``."""
        if self._done:
            raise _closed()
        start, end = check_range(start, end)
        self._switch(keyspace)
        self._plain = False
        self._ops.append((OP_DELETE_RANGE, start, end))

    def __len__(self) -> int:
        """The writes collected (keyspace switches are not writes)."""
        return 0 if self._done else len(self._ops) - self._switches

    def _seal(self) -> tuple[bytes, list] | None:
        """Close the batch; return its payload and operations (None if
        empty). Over the log's record size: RecordTooLargeError, nothing
        written."""
        if self._done:
            raise ClosedError("this batch was already committed or discarded")
        self._done = True
        ops, self._ops = self._ops, []
        if not ops:
            return None
        if self._leased:  # (flagged by put: a pass over 100,000 ops here cost 5 ms)
            ops = Outcome(ops)
        elif self._plain:  # (so that applying it need not look at each op again)
            ops = PlainPuts(ops)
        payload = pack_ops(ops)
        if len(payload) > self._max_payload:
            raise RecordTooLargeError(
                f"batch of {len(ops)} operations is {len(payload)} bytes, over the "
                f"log's record limit of {self._max_payload} bytes; split it. "
                f"Nothing was written.")
        return payload, ops

    def commit(self) -> int | None:
        """Write the batch as one log entry; returns its LSN (None if empty).
        A batch over the log's record size raises RecordTooLargeError here,
        and nothing is written."""
        sealed = self._seal()
        if sealed is None:
            return None
        self.lsn = self._commit(sealed[0], sealed[1])
        self.check(sealed[1])
        return self.lsn

    def check(self, ops: list) -> None:
        """After commit: :class:`~kvstore.LeaseNotFoundError` when a lease the
        batch's puts needed was not alive (nothing was applied)."""
        if isinstance(ops, Outcome) and self.lsn is not None:
            self._expiring.check(ops, self.lsn)

    def discard(self) -> None:
        """Drop every collected operation; nothing is written."""
        self._done = True
        self._ops = []

