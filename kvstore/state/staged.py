"""A bulk group applied while the log writes and syncs it: the log's
:class:`~wal.hooks.Staged` for a state machine
(:meth:`kvstore.state.machine.State.stage`).

The order that makes it safe, all on the log's leader thread (LMDB's write
lock belongs to the thread that took it): :meth:`StagedApply.run` applies
the group as :meth:`~kvstore.state.machine.State.apply` would, except that
the one write transaction (the overlay's frozen writes, then the group's) is
left open, with the overlay's flush lock held
(:class:`~kvstore.state.commits.ThroughWrite`), while the log writes and
fsyncs the group on another thread; :meth:`StagedApply.publish` commits
it once the fsync returned; :meth:`StagedApply.abort` drops it when the
write, the fsync or the run failed. No reader sees a staged write before it
is durable, and LMDB's applied LSN never passes the log's durable LSN.

A part of the state machine, kept in a room of its own: it sets
:class:`~kvstore.state.machine.State`'s staging mode around an apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvstore.state.commits import ThroughWrite
from wal.errors import LogFailedError
from wal.segment import Payload

Ops = Sequence[Sequence[Any]]


class StagingState(Protocol):
    """What a staged group needs of its state machine
    (:class:`kvstore.state.machine.State`, which imports this module): its
    apply, and its staging mode (while set, apply leaves its write-through
    transaction open in :attr:`StagedApply.through`)."""

    path: str
    _staging: StagedApply | None
    applied_lsn: int
    applying_lsn: int

    def apply(self, first_lsn: int, batches: Sequence[Ops], payloads: Sequence[Payload] = ()) -> None: ...


class StagedApply:
    """A bulk group applied while the log writes and syncs it
    (:meth:`kvstore.state.machine.State.stage`; the log's
    :class:`~wal.hooks.Staged`), all on the log's leader thread.

    Durability: :meth:`run` writes the group (after the overlay's writes)
    into an LMDB write transaction it leaves open, while the log writes and
    fsyncs the group on another thread; no reader sees any of it. :meth:`publish`, called once
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
            try:
                through.commit()
            except BaseException:
                state = self.state
                state.applying_lsn = state.applied_lsn  # (the commit failed: nothing of it is visible)
                raise

    def abort(self) -> None:
        through, self.through = self.through, None
        if through is not None:
            last = self.first_lsn + len(self.batches) - 1
            through.abort(LogFailedError(
                f"LSNs up to {last} were not applied to LMDB ({self.state.path}): writing or syncing "
                f"them to the log failed; reopen the store (the log holds what it acknowledged)"))
