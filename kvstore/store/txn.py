"""Conditional writes: compare-and-set, delete-if, transactions.

A conditional write is ONE log entry (one LSN) whose batch starts with
conditions (``kvstore.entry.codec`` op codes 4..6) followed by writes. The
conditions are decided in log order when the entry's group is written, and
the decision is written into the log with it (:mod:`kvstore.entry.conditions`),
never by a read before logging: two threads racing on one key are ordered by
the log, and exactly the first one's condition sees the state it expected.
Replay, rebuilds and every reader of the log read the decision; none takes
it again.

Durability: as any write (``kvstore.store.store``): when the call returns, the entry
is durable per the sync mode and its outcome decided and applied. A failed
condition applies nothing but consumes the entry's LSN; the entry stays in
the log, marked failed (and a watcher skips it, :mod:`kvstore.watch.watcher`).

The outcome reaches the caller through the operations object that travels
with the payload through the log: an :class:`~kvstore.entry.conditions.Outcome`,
which the group's leader fills in before the group is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from kvstore.entry.codec import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_KEYSPACE,
    OP_PUT,
    OP_REQUIRE_ABSENT,
    OP_REQUIRE_EQUALS,
    OP_REQUIRE_PRESENT,
    check_key,
    check_keyspace,
    check_range,
    check_value,
    pack_ops,
)
from kvstore.entry.conditions import Outcome
from kvstore.store.write_batch import CommitOnExit
from wal.errors import ClosedError, RecordTooLargeError, WalkvError

Append = Callable[[bytes, list], int]

EQUALS = "equals"
ABSENT = "absent"
PRESENT = "present"


class Condition(NamedTuple):
    """One condition of a transaction: ``kind`` is ``"equals"`` (then
    ``value`` is the expected value), ``"absent"`` or ``"present"``, of
    ``key`` in ``keyspace`` ("": the default one)."""

    key: bytes
    kind: str
    value: bytes | None = None
    keyspace: str = ""

    def as_op(self) -> list:
        if self.kind == EQUALS:
            return [OP_REQUIRE_EQUALS, self.key, self.value]
        return [OP_REQUIRE_ABSENT if self.kind == ABSENT else OP_REQUIRE_PRESENT, self.key]


def decided(outcome: Outcome, lsn: int) -> int | None:
    """The index of the failed condition of the entry just logged (None:
    it succeeded)."""
    if not outcome.decided:  # decided before the group is written, so before the appender returns
        raise WalkvError(f"the outcome of LSN {lsn} was not decided when it was logged; "
                         f"close and reopen the store")
    return outcome.failed


def conditional_write(append: Append, conds: list[Condition], writes: list[list]) -> tuple[int, int | None]:
    """Log one entry: ``conds`` then ``writes`` (validated ops, in the
    keyspace of the last condition). Returns (LSN, index of the failed
    condition or None)."""
    ops, index = in_keyspaces([(c.keyspace, c.as_op()) for c in conds])
    outcome = Outcome(ops + writes)
    lsn = append(pack_ops(outcome), outcome)
    failed = decided(outcome, lsn)
    return lsn, None if failed is None else index[failed]


def in_keyspaces(ops: list[tuple[str, list]], at: str = "") -> tuple[list[list], dict[int, int]]:
    """``ops`` (each with its keyspace) as one entry's ops, a ``[16, name]``
    before each change of keyspace (starting from ``at``), and where each
    of them landed (its index in the entry -> its index in ``ops``)."""
    out: list[list] = []
    index: dict[int, int] = {}
    for i, (keyspace, op) in enumerate(ops):
        if keyspace != at:
            out.append([OP_KEYSPACE, keyspace])
            at = keyspace
        index[len(out)] = i
        out.append(op)
    return out, index


def cas_outcome(max_value: int, key: bytes, expected: bytes | None, new: bytes, keyspace: str = "") -> Outcome:
    """The validated operations of a compare-and-set (see :func:`compare_and_set`)."""
    key = check_key(key)
    new = check_value(new, max_value)
    cond = (Condition(key, ABSENT) if expected is None
            else Condition(key, EQUALS, check_value(expected, max_value)))
    head = [[OP_KEYSPACE, keyspace]] if keyspace else []
    return Outcome([*head, cond.as_op(), [OP_PUT, key, new]])


def compare_and_set(append: Append, max_value: int, key: bytes, expected: bytes | None,
                    new: bytes, keyspace: str = "") -> bool:
    """Set ``key`` to ``new`` if its value is ``expected`` (None: if it is
    absent), decided in log order, in ``keyspace``. True when it was set."""
    outcome = cas_outcome(max_value, key, expected, new, keyspace)
    lsn = append(pack_ops(outcome), outcome)
    return decided(outcome, lsn) is None


def delete_if(append: Append, max_value: int, key: bytes, expected: bytes, keyspace: str = "") -> bool:
    """Delete ``key`` if its value is ``expected`` (in ``keyspace``); True when it was deleted."""
    key = check_key(key)
    cond = Condition(key, EQUALS, check_value(expected, max_value), keyspace)
    return conditional_write(append, [cond], [[OP_DELETE, key]])[1] is None


class Transaction(CommitOnExit):
    """Conditions and writes applied atomically, as one log entry, only if
    every condition holds at the entry's place in the log::

        with db.transaction() as t:
            t.require(b"stock:42", equals=b"3")
            t.require(b"lock:42", absent=True)
            t.put(b"stock:42", b"2"); t.put(b"lock:42", b"me")
        t.lsn, t.succeeded, t.failed_condition

    Committed when the ``with`` block ends normally (durable per the sync
    mode, outcome decided), discarded when it raises. A transaction with no
    conditions and no writes writes nothing (``lsn`` None, ``succeeded``
    True). :attr:`failed_condition` is the first :class:`Condition` that did
    not hold (None on success), :attr:`failed_index` its index.
    """

    def __init__(self, append: Append, max_value: int, max_payload: int, keyspace: str = "",
                 check_keyspace: Callable[[str], str] = check_keyspace, expiring: Any = None) -> None:
        """``expiring``: the store's :class:`kvstore.store.expiring.Expiring`
        (puts with ``ttl=``/``lease=``)."""
        self._expiring = expiring
        self._append = append
        self._max_value = max_value
        self._max_payload = max_payload
        self._keyspace = keyspace  # where conditions and writes without keyspace= go
        self._check_keyspace = check_keyspace
        self._conds: list[Condition] = []
        self._writes: list[tuple[str, list]] = []
        self._done = False
        self.lsn: int | None = None
        self.succeeded: bool | None = None
        self.failed_condition: Condition | None = None
        self.failed_index: int | None = None
        self._placed: dict[int, int] = {}  # a logged op's index -> its condition's index (in_keyspaces)
        """The index of :attr:`failed_condition` among the conditions."""

    def _open(self) -> None:
        if self._done:
            raise ClosedError("this transaction was already committed or discarded; "
                              "start a new one with db.transaction()")

    def _in(self, keyspace: str | None) -> str:
        return self._keyspace if keyspace is None else self._check_keyspace(keyspace)

    def require(self, key: bytes, *, equals: bytes | None = None, absent: bool = False,
                present: bool = False, keyspace: str | None = None) -> None:
        """Require, in log order, that ``key``'s value equals ``equals``, or that
        ``key`` is ``absent``, or ``present`` (exactly one of the three), in
        ``keyspace`` (default: the transaction's)."""
        self._open()
        if (equals is not None) + bool(absent) + bool(present) != 1:
            raise ValueError("require() takes exactly one of equals=..., absent=True, present=True")
        key = check_key(key)
        ks = self._in(keyspace)
        if equals is not None:
            self._conds.append(Condition(key, EQUALS, check_value(equals, self._max_value), ks))
        else:
            self._conds.append(Condition(key, ABSENT if absent else PRESENT, None, ks))

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Any = None, *,
            keyspace: str | None = None) -> None:
        """Set ``key`` to ``value`` (in ``keyspace``) if the transaction
        succeeds; ``ttl``/``lease`` as :meth:`kvstore.KVStore.put` takes them
        (a lease not alive at the transaction's place in the log raises
        :class:`~kvstore.LeaseNotFoundError` at commit; nothing applied)."""
        self._open()
        if ttl is not None or lease is not None:
            op = self._expiring.put_op(key, value, ttl, lease)
        else:
            op = [OP_PUT, check_key(key), check_value(value, self._max_value)]
        self._writes.append((self._in(keyspace), op))

    def delete(self, key: bytes, *, keyspace: str | None = None) -> None:
        """Remove ``key`` (in ``keyspace``) if the transaction succeeds."""
        self._open()
        op = [OP_DELETE, check_key(key)]
        self._writes.append((self._in(keyspace), op))

    def delete_range(self, start: bytes | None, end: bytes | None, *, keyspace: str | None = None) -> None:
        """Delete every key with ``start <= key < end`` (None: unbounded), in
        ``keyspace``, if the transaction succeeds."""
        self._open()
        op = [OP_DELETE_RANGE, *check_range(start, end)]
        self._writes.append((self._in(keyspace), op))

    def commit(self) -> bool:
        """Log the transaction; return whether it succeeded (also in
        :attr:`succeeded`, with :attr:`lsn` and :attr:`failed_condition`).
        Over the log's record size: RecordTooLargeError, nothing written."""
        sealed = self._seal()
        if sealed is None:
            return True
        return self._settle(self._append(sealed[0], sealed[1]), sealed[1])

    def _seal(self) -> tuple[bytes, Outcome] | None:
        """Close the transaction; its payload and operations (None: nothing
        to write, and it succeeded)."""
        self._open()
        self._done = True
        if not self._conds and not self._writes:
            self.succeeded = True
            return None
        ops, self._placed = in_keyspaces([(c.keyspace, c.as_op()) for c in self._conds] + self._writes)
        outcome = Outcome(ops)
        payload = pack_ops(outcome)
        if len(payload) > self._max_payload:
            raise RecordTooLargeError(
                f"transaction of {len(ops)} operations is {len(payload)} bytes, over the "
                f"log's record limit of {self._max_payload} bytes. Nothing was written.")
        return payload, outcome

    def _settle(self, lsn: int, outcome: Outcome) -> bool:
        """Record the outcome of the entry logged at ``lsn``."""
        self.lsn = lsn
        if self._expiring is not None:
            try:
                self._expiring.check(outcome, lsn)
            except WalkvError:
                self.succeeded = False
                raise
        failed = decided(outcome, lsn) if self._conds else None
        self.succeeded = failed is None
        self.failed_index = None if failed is None else self._placed[failed]
        self.failed_condition = None if self.failed_index is None else self._conds[self.failed_index]
        return self.succeeded

    def discard(self) -> None:
        """Drop everything collected; nothing is written."""
        self._done = True

