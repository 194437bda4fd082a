"""Named, durable subscriptions: a watcher whose position is stored in the
store, so that it resumes after the last acknowledged change, and that the
writer's log retention waits for (its record: :mod:`kvstore.watch.consumers`).

::

    sub = db.subscribe("billing", prefix=b"order:", from_lsn=1)
    for change in sub:
        handle(change)
        sub.ack(change.lsn)          # at least once; ack every change: none is seen twice

A subscription is created (its record written, durably) by the first
``subscribe(name, ...)``; ``from_lsn`` (default: the next LSN) is where it
starts then, and is ignored later; its key range (``prefix``, ``start``,
``stop``) is fixed at creation, and a later ``subscribe`` with another one is
a ValueError. Any process may iterate it, the writer or a ``readonly=True``
process beside it; one at a time is the consumer's business.

Position, precisely. The changes of one batch share its LSN, so the record
keeps ``(lsn, skip)``: resume at LSN ``lsn``, skipping the first ``skip`` of
its changes. ``ack(lsn)`` acknowledges every change delivered so far up to
and including LSN ``lsn`` (the changes of ``lsn`` delivered by then, or all
of them once a later LSN, or a progress marker at or after ``lsn``, was
delivered: a progress marker's LSN may be acknowledged too). While every
delivered change is acknowledged, the position also moves over LSNs that
hold no change of the subscription (checked about once a second), so a
narrow prefix does not keep the log back to its last match. An
acknowledgement survives a crash of any process; after a crash of the
machine the newest may be lost, and those changes come again (module
:mod:`kvstore.watch.consumers`).

Timelines. A position is an LSN on a timeline (:mod:`wal.timeline`): after a
repair that cut, or a failover, the same LSNs hold other entries. So the
record keeps the history its acknowledged changes are on (written before
timelines: timeline 1), and:

* when the store's history left that timeline at or before the acknowledged
  LSN (a repair cut changes the consumer handled, a failover discarded
  them), those changes are in no history the store has: the subscription is
  invalidated (its record says why, and retention stops keeping the log for
  it) and raises :class:`~wal.errors.SubscriptionForkedError` naming both
  timelines and the fork LSN, and what to do: undo what was done with the
  changes after it and subscribe again from ``fork_lsn + 1``, or start
  again from a snapshot. It sees the fork at open, or while iterating as
  soon as its log tail does (:mod:`kvstore.watch.log_tail`) or within about
  a second when idle;
* a subscription whose acknowledged position is at or before the fork goes
  on normally, along the store's history: changes it delivered past the
  fork without their acknowledgement are delivered again, from the new
  history (at least once, as after a restart), and acknowledging one of the
  old ones raises :class:`~wal.errors.ForkedHistoryError`.

Why an invalidation (a subclass of :class:`~wal.errors.SubscriptionInvalidatedError`)
rather than a bare :class:`~wal.errors.ForkedHistoryError`: its remedy is an
invalidated subscription's (drop it, subscribe again), retention must stop
waiting for it, and consumers and the HTTP streams of subscriptions already
end on an invalidation (410, a ``gap`` event); it is a ForkedHistoryError too,
for code that handles every reader's fork alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Self

from kvstore.entry.codec import as_bytes
from kvstore.watch import consumers
from kvstore.watch.log_tail import log_history
from kvstore.watch.watcher import PROGRESS, Change, Source, Watcher
from wal.errors import ClosedError, ForkedHistoryError, LogGapError
from wal.timeline import History, check_follows, fork_point, history_until, timeline_at

log = logging.getLogger("walkv.subscriptions")

_IDLE_ADVANCE_SECONDS = 1.0


class Subscription:
    """An iterator of :class:`~kvstore.watch.watcher.Change` from the
    subscription's position (module docstring); a context manager too.
    Create with ``db.subscribe``."""

    def __init__(self, store_path: str, source: Source, rec: consumers.Record, *,
                 timeout: float | None = None, progress_every: float | None = None) -> None:
        self.name = rec.name
        self._store = store_path
        self._source = source
        self._rec = rec
        self._timeout = timeout
        self._progress_every = progress_every
        self._progress_at = time.monotonic()
        self._fork: ForkedHistoryError | None = None  # the last fork it went on across (module docstring)
        self._history = self._check()  # the history of the changes it delivers
        self._start(rec.next_lsn, rec.skip)

    def _start(self, lsn: int, skip: int) -> None:
        """Deliver from position ``(lsn, skip)``, the stored one."""
        # Positions are (LSN, changes of it to skip): where a restart would resume.
        self._delivered = (lsn, skip)  # after the last change delivered
        self._last_lsn = 0             # the LSN of that change (0: none yet)
        self._through = lsn - 1        # every change up to it was delivered (a progress marker says so)
        self._acked = (lsn, skip)      # as stored
        self._to_skip = skip
        rec = self._rec
        self._watcher = Watcher(self._source, rec.prefix, start=rec.start, stop=rec.stop, from_lsn=lsn,
                                timeout=self._timeout, on_gap="error",
                                progress_every=min(self._progress_every or _IDLE_ADVANCE_SECONDS,
                                                   _IDLE_ADVANCE_SECONDS))

    def _check(self) -> History:
        """Raise SubscriptionInvalidatedError when retention or a fork gave up
        on it (a fork found now invalidates it), ClosedError when it was
        dropped; return the log's history."""
        rec = consumers.read(self._store, self.name)
        if rec is None:
            raise ClosedError(f"the subscription {self.name!r} of {self._store} was dropped")
        if rec.invalidated is not None:
            raise consumers.invalidated_error(self._store, rec)
        history = log_history(self._source.wal_dir, self._source.fs)
        if fork_point(rec.history, _through(rec.next_lsn, rec.skip), history) is not None:
            rec = self._invalidate(history)
            if rec.invalidated is not None:
                raise consumers.invalidated_error(self._store, rec)
        return history

    def _invalidate(self, history: History) -> consumers.Record:
        """Mark the record invalidated by the fork of ``history`` from its
        own (unless something invalidated it first); the record then."""
        def change(now: consumers.Record) -> consumers.Record | None:
            acked = _through(now.next_lsn, now.skip)
            fork = fork_point(now.history, acked, history)
            if now.invalidated is not None or fork is None:
                return None
            mine, theirs = timeline_at(now.history, fork + 1), timeline_at(history, fork + 1)
            why = (f"it acknowledged changes up to LSN {acked} on {mine}, but the store's history left that "
                   f"timeline after LSN {fork} (its LSN {fork + 1} on is {theirs}): a repair cut them, or a "
                   "failover discarded them")
            return now._replace(invalidated=why, forked=consumers.Fork(fork, mine, theirs))
        rec = consumers.update(self._store, self.name, change)
        if rec.forked is not None:
            log.warning("subscription %r of %s was invalidated: %s", self.name, self._store, rec.invalidated)
        return rec

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Change:
        while True:
            try:
                change = next(self._watcher)
            except LogGapError:
                self._check()  # retention gave up on it: say so, naming it
                raise
            except ForkedHistoryError as fork:
                self._go_on_across(fork)
                continue
            history = self._watcher.history
            if history is not None:
                self._history = history
            if change.op == PROGRESS:
                self._through = change.lsn
                self._idle(change.lsn)
                every = self._progress_every
                if every is not None and time.monotonic() - self._progress_at >= every:
                    self._progress_at = time.monotonic()
                    return change
                continue
            lsn, seen = self._delivered
            if change.lsn == lsn and self._to_skip:  # resumed inside a batch: seen before the restart
                self._to_skip -= 1
                continue
            if self._watcher.batch_left == 0:
                self._delivered = (change.lsn + 1, 0)
            else:
                self._delivered = (lsn, seen + 1) if change.lsn == lsn else (change.lsn, 1)
            self._last_lsn = change.lsn
            self._progress_at = time.monotonic()
            return change

    def _go_on_across(self, fork: ForkedHistoryError) -> None:
        """The log's history left the one of the changes delivered, after
        ``fork.fork_lsn``: invalidated when the acknowledged position is past
        it, else deliver again from that position (module docstring)."""
        if _through(*self._acked) > fork.fork_lsn:
            self._watcher.close()
            self._check()  # finds the fork past the stored position, and invalidates
            raise fork
        log.warning("subscription %r of %s: the store's history left %s after LSN %d; the changes delivered after "
                    "that LSN were not acknowledged, and are delivered again from LSN %d, on %s", self.name,
                    self._store, fork.mine, fork.fork_lsn, self._acked[0], fork.theirs)
        self._fork = fork
        self._watcher.close()
        self._history = log_history(self._source.wal_dir, self._source.fs)
        self._start(*self._acked)

    def _idle(self, through: int) -> None:
        """Every change up to LSN ``through`` was delivered: check it was not
        invalidated, nor the changes delivered forked away; when all of them
        are acknowledged, move the stored position past LSNs without a change
        of this subscription."""
        history = self._check()
        try:  # the changes it read (delivered or passed over), against the log's history now
            check_follows(self._history, max(through, _through(*self._delivered)), history,
                          what=f"the subscription {self.name!r}", source=self._store,
                          hint="it delivers again from its acknowledged position")
        except ForkedHistoryError as fork:
            self._go_on_across(fork)
            return
        if (self._acked >= self._delivered and through + 1 > self._acked[0]
                and through <= self._source.durable_lsn()):  # not over LSNs a cut under way is taking out
            self._store_position(through + 1, 0)

    def ack(self, lsn: int) -> None:
        """Acknowledge every change delivered up to and including LSN ``lsn``
        (module docstring); a progress marker's LSN too. An LSN after the last
        delivered one is a ValueError."""
        if type(lsn) is not int:
            raise TypeError(f"ack takes a change's LSN (an int), not {type(lsn).__name__}")
        reached = max(self._last_lsn, self._through)
        fork = self._fork
        if lsn > reached and fork is not None and lsn > fork.fork_lsn:
            raise ForkedHistoryError(
                f"cannot acknowledge LSN {lsn}: the subscription {self.name!r} delivered it on {fork.mine}, which "
                f"the store's history left after LSN {fork.fork_lsn} (its LSN {fork.fork_lsn + 1} on is "
                f"{fork.theirs}); undo what was done with the changes after LSN {fork.fork_lsn}: they are "
                f"delivered again from LSN {self._acked[0]}, from the store's history", mine=fork.mine,
                theirs=fork.theirs, fork_lsn=fork.fork_lsn)
        if lsn > reached:
            raise ValueError(f"cannot acknowledge LSN {lsn}: the subscription {self.name!r} has delivered "
                             + (f"changes up to LSN {reached} only" if reached else "no change yet"))
        position = self._delivered if lsn == self._last_lsn and lsn > self._through else (lsn + 1, 0)
        if position > self._acked:
            self._store_position(*position)

    def _store_position(self, lsn: int, skip: int) -> None:
        history = history_until(self._history, _through(lsn, skip))
        rec = consumers.update(self._store, self.name, lambda now: None if now.invalidated else now._replace(
            next_lsn=lsn, skip=skip, history=history))
        if rec.invalidated is not None:
            raise consumers.invalidated_error(self._store, rec)
        self._acked = (lsn, skip)

    @property
    def acked_lsn(self) -> int:
        """Every change up to this LSN is acknowledged."""
        return self._acked[0] - 1

    def close(self) -> None:
        """Stop iterating (from any thread); the position stays as acknowledged."""
        self._watcher.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(store_path: str, source: Source, name: str, *, prefix: bytes | None, start: bytes | None,
              stop: bytes | None, from_lsn: int | None, next_lsn: Callable[[], int],
              timeout: float | None = None, progress_every: float | None = None) -> Subscription:
    """Open subscription ``name`` of the store at ``store_path``, creating it
    at ``from_lsn`` (default ``next_lsn()``) when it does not exist (module
    docstring)."""
    consumers.check_name(name)
    prefix, start, stop = (None if b is None else as_bytes(b, what)
                           for b, what in ((prefix, "prefix"), (start, "start"), (stop, "stop")))
    rec = consumers.read(store_path, name)
    if rec is None:
        first = next_lsn() if from_lsn is None else from_lsn
        if type(first) is not int or first < 1:
            raise ValueError(f"from_lsn must be an int >= 1, not {from_lsn!r}")
        history = history_until(log_history(source.wal_dir, source.fs), first - 1)
        rec = consumers.Record(name, first, 0, prefix, start, stop, time.time_ns() // 1000, None, history)
        consumers.write(store_path, rec, new=True)
    elif (rec.prefix, rec.start, rec.stop) != (prefix, start, stop):
        raise ValueError(f"the subscription {name!r} watches prefix={rec.prefix!r}, start={rec.start!r}, "
                         f"stop={rec.stop!r}; drop it to change what it watches")
    return Subscription(store_path, source, rec, timeout=timeout, progress_every=progress_every)


def _through(lsn: int, skip: int) -> int:
    """The last LSN position ``(lsn, skip)`` has changes of (some of ``lsn``'s when ``skip``)."""
    return lsn if skip else lsn - 1
