"""Deciding a batch's conditions at apply, and recording the outcome.

A batch may start with conditions (``kvstore.batch`` op codes 4..6:
require-equals, require-absent, require-present). :func:`apply_batches`
applies a run of log entries that holds at least one such batch, entry by
entry in LSN order, inside the caller's ONE LMDB write transaction (the one
:meth:`kvstore.state.State.apply` opened, which also records the applied
LSN): each entry's conditions are read in that transaction, so they see the
writes of every entry before it, including earlier entries of the same group.
All conditions hold: the entry's writes apply. One fails: nothing of the
entry applies, its LSN is consumed all the same, and the index of the first
failing condition is recorded in LMDB's main database under
``walkv.failed.`` + the LSN (8 bytes, big-endian), in the same transaction.
Replay and rebuild run the same code on the same log, so they decide the same
outcomes and write the same records.

Who learns the outcome:

* the writer that logged the batch: its context (an :class:`Outcome`, a list
  of the ops with a ``failed`` slot) travels with the payload through the log
  to ``on_commit``, and apply writes the decision into it before the writer is
  released. Plain puts pass bare lists and pay nothing;
* anyone later (a watcher reading the log files, in any process): the
  ``walkv.failed.<lsn>`` record, read from LMDB once the entry is applied
  (:func:`failed_at`). Outcomes are known from ``walkv.outcomes_from`` on:
  the LSN LMDB was (re)built from. Entries at or below it were decided
  before the last rebuild, and their records are gone with the old LMDB
  (:func:`outcomes_from`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import lmdb

from kvstore.batch import CONDITION_CODES, OP_REQUIRE_ABSENT, OP_REQUIRE_EQUALS

K_FAILED = b"walkv.failed."
K_OUTCOMES_FROM = b"walkv.outcomes_from"
_U64 = struct.Struct("<Q")
_BE64 = struct.Struct(">Q")

ApplyOps = Callable[[lmdb.Transaction, Sequence[Sequence[Any]]], "tuple[int, int, int]"]


class Outcome(list):
    """A conditional batch's operations, as the context that travels with its
    payload through the log; apply sets :attr:`failed` (the index of the
    first failing condition, or None) and :attr:`decided`."""

    __slots__ = ("failed", "decided")

    def __init__(self, ops: Sequence[Sequence[Any]]) -> None:
        super().__init__(ops)
        self.failed: int | None = None
        self.decided = False


def failed_key(lsn: int) -> bytes:
    return K_FAILED + _BE64.pack(lsn)


def check(txn: lmdb.Transaction, ops: Sequence[Sequence[Any]]) -> tuple[int | None, int]:
    """Decide the leading conditions of ``ops`` in ``txn``: (index of the
    first failing one or None, number of conditions)."""
    n = 0
    for op in ops:
        code = op[0]
        if code not in CONDITION_CODES:
            break
        value = txn.get(op[1])
        if code == OP_REQUIRE_EQUALS:
            ok = value is not None and value == op[2]
        elif code == OP_REQUIRE_ABSENT:
            ok = value is None
        else:
            ok = value is not None
        if not ok:
            return n, n
        n += 1
    return None, n


def apply_batches(txn: lmdb.Transaction, first_lsn: int, batches: Sequence[Sequence[Sequence[Any]]],
                  apply_ops: ApplyOps, main_db: lmdb._Database) -> tuple[int, int, int]:
    """Apply entries ``first_lsn, first_lsn + 1, ...`` in order inside
    ``txn``, deciding each one's conditions first (module docstring).
    Returns the numbers of puts, deletes and range deletes applied."""
    puts = deletes = ranges = 0
    for i, ops in enumerate(batches):
        writes: Sequence[Sequence[Any]] = ops
        if ops and ops[0][0] in CONDITION_CODES:
            failed, n = check(txn, ops)
            if type(ops) is Outcome:
                ops.failed = failed
                ops.decided = True
            if failed is not None:
                txn.put(failed_key(first_lsn + i), str(failed).encode("ascii"), db=main_db)
                continue
            writes = ops[n:]
        p, d, r = apply_ops(txn, writes)
        puts += p
        deletes += d
        ranges += r
    return puts, deletes, ranges


def record_outcomes_from(txn: lmdb.Transaction, main_db: lmdb._Database, base_lsn: int) -> None:
    """Record that outcomes are known for entries after ``base_lsn`` (an
    environment being initialized or rebuilt at that LSN)."""
    txn.put(K_OUTCOMES_FROM, _U64.pack(base_lsn), db=main_db)


def outcomes_from(txn: lmdb.Transaction, main_db: lmdb._Database) -> int:
    """The LSN after which outcomes are recorded (0: all of them; an
    environment from before conditions existed has none to record)."""
    v = txn.get(K_OUTCOMES_FROM, db=main_db)
    return _U64.unpack(v)[0] if v is not None and len(v) == 8 else 0


def failed_at(txn: lmdb.Transaction, main_db: lmdb._Database, lsn: int) -> int | None:
    """The failing condition's index of the conditional entry ``lsn`` (None:
    it succeeded). Meaningful only for an applied entry after
    :func:`outcomes_from`."""
    v = txn.get(failed_key(lsn), db=main_db)
    return None if v is None else int(v)
