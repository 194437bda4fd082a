"""A bulk group applied while the log syncs it: the log's
:class:`~wal.hooks.Staged` for a state machine
(:meth:`kvstore.state.machine.State.stage`).

The order that makes it safe, all on the log's leader thread (LMDB's write
lock belongs to the thread that took it): :meth:`StagedApply.run` applies
the group as :meth:`~kvstore.state.machine.State.apply` would, except that
the one write transaction (the overlay's frozen writes, then the group's) is
left open, with the overlay's flush lock held (:class:`ThroughWrite`), while
the log's fsync runs on another thread; :meth:`StagedApply.publish` commits
it once the fsync returned; :meth:`StagedApply.abort` drops it when the
write, the fsync or the run failed. No reader sees a staged write before it
is durable, and LMDB's applied LSN never passes the log's durable LSN.

These are the state machine's own parts, kept in a room of their own: they
reach into :class:`~kvstore.state.machine.State`'s private commit steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from lmdb import Transaction

from kvstore.state.environment import Environment
from kvstore.state.overlay import Overlay
from wal.errors import LogFailedError
from wal.segment import Payload

Ops = Sequence[Sequence[Any]]


class StagingState(Protocol):
    """What a staged group needs of its state machine
    (:class:`kvstore.state.machine.State`, which imports this module): its
    parts, and the steps of its write-through commit."""

    path: str
    overlay: Overlay
    lmdb: Environment
    _staging: StagedApply | None
    _failure: Exception | None

    def apply(self, first_lsn: int, batches: Sequence[Ops], payloads: Sequence[Payload] = ()) -> None: ...

    def _commit_applied(self, txn: Transaction, write: Callable[[Transaction], None], lsn: int,
                        seconds: float) -> None: ...

    def _written_through(self, last: int, thaw: bool, expiry: bool) -> None: ...


class ThroughWrite:
    """One write-through transaction of ``State._write_through``, written
    and open, with the overlay's lock held and its frozen part in it: to be
    committed (then the overlay is thawed and the LSN applied) or aborted,
    on the thread that began it."""

    __slots__ = ("state", "txn", "write", "last", "thaw", "expiry", "seconds")

    def __init__(self, state: StagingState, txn: Transaction, write: Callable[[Transaction], None], last: int,
                 thaw: bool, expiry: bool, seconds: float) -> None:
        self.state = state
        self.txn = txn
        self.write = write
        self.last = last
        self.thaw = thaw
        self.expiry = expiry
        self.seconds = seconds

    def commit(self) -> None:
        state = self.state
        try:
            state._commit_applied(self.txn, self.write, self.last, self.seconds)
            state._written_through(self.last, self.thaw, self.expiry)
        finally:
            state.overlay.flush_lock.release()

    def abort(self, why: Exception) -> None:
        """Drop the transaction; ``why`` is kept as the state's failure (the
        overlay stays frozen: its writes are not in LMDB)."""
        state = self.state
        try:
            state._failure = why
            state.lmdb.abort_write(self.txn)
        finally:
            state.overlay.flush_lock.release()


class StagedApply:
    """A bulk group applied while the log syncs it (:meth:`kvstore.state.machine.State.stage`; the
    log's :class:`~wal.hooks.Staged`), all on the log's leader thread.

    Durability: :meth:`run` writes the group (after the overlay's writes)
    into an LMDB write transaction it leaves open, while the log's fsync of
    the group runs; no reader sees any of it. :meth:`publish`, called once
    the fsync returned, commits that transaction: the group becomes visible
    and LMDB's applied LSN reaches it, never before the log holds it
    durably. :meth:`abort` (the write, the fsync or :meth:`run` failed)
    drops the transaction and fails the state machine as a failed apply
    does: LMDB keeps its applied LSN, and the next open replays the group
    from the log if the log has it."""

    __slots__ = ("state", "first_lsn", "batches", "payloads", "through")

    def __init__(self, state: StagingState, first_lsn: int, batches: Sequence[Ops], payloads: Sequence[Payload]) -> None:
        self.state = state
        self.first_lsn = first_lsn
        self.batches = batches
        self.payloads = payloads
        self.through: ThroughWrite | None = None

    def run(self) -> None:
        """:meth:`kvstore.state.machine.State.apply` of the group, its LMDB transaction left open."""
        state = self.state
        state._staging = self
        try:
            state.apply(self.first_lsn, self.batches, self.payloads)
        finally:
            state._staging = None

    def publish(self) -> None:
        """Commit what :meth:`run` wrote (nothing when the group was applied
        already, on a replay)."""
        through, self.through = self.through, None
        if through is not None:
            through.commit()

    def abort(self) -> None:
        through, self.through = self.through, None
        if through is not None:
            last = self.first_lsn + len(self.batches) - 1
            through.abort(LogFailedError(
                f"LSNs up to {last} were not applied to LMDB ({self.state.path}): writing or syncing "
                f"them to the log failed; reopen the store (the log holds what it acknowledged)"))
