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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Self

from kvstore.entry.codec import as_bytes
from kvstore.watch import consumers
from kvstore.watch.watcher import PROGRESS, Change, Source, Watcher
from wal.errors import ClosedError, LogGapError

_IDLE_ADVANCE_SECONDS = 1.0


class Subscription:
    """An iterator of :class:`~kvstore.watch.watcher.Change` from the
    subscription's position (module docstring); a context manager too.
    Create with ``db.subscribe``."""

    def __init__(self, store_path: str, source: Source, rec: consumers.Record, *,
                 timeout: float | None = None, progress_every: float | None = None) -> None:
        self.name = rec.name
        self._store = store_path
        self._rec = rec
        self._progress_every = progress_every
        self._progress_at = time.monotonic()
        # Positions are (LSN, changes of it to skip): where a restart would resume.
        self._delivered = (rec.next_lsn, rec.skip)  # after the last change delivered
        self._last_lsn = 0                           # the LSN of that change (0: none yet)
        self._through = rec.next_lsn - 1             # every change up to it was delivered (a progress marker says so)
        self._acked = (rec.next_lsn, rec.skip)       # as stored
        self._to_skip = rec.skip
        self._watcher = Watcher(source, rec.prefix, start=rec.start, stop=rec.stop, from_lsn=rec.next_lsn,
                                timeout=timeout, on_gap="error",
                                progress_every=min(progress_every or _IDLE_ADVANCE_SECONDS, _IDLE_ADVANCE_SECONDS))
        self._check()

    def _check(self) -> None:
        """Raise SubscriptionInvalidatedError when retention gave up on it,
        ClosedError when it was dropped."""
        rec = consumers.read(self._store, self.name)
        if rec is None:
            raise ClosedError(f"the subscription {self.name!r} of {self._store} was dropped")
        if rec.invalidated is not None:
            raise consumers.invalidated_error(self._store, rec)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Change:
        while True:
            try:
                change = next(self._watcher)
            except LogGapError:
                self._check()  # retention gave up on it: say so, naming it
                raise
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

    def _idle(self, through: int) -> None:
        """Every change up to LSN ``through`` was delivered: when all of them
        are acknowledged, move the stored position past LSNs without a change
        of this subscription; check it was not invalidated."""
        if self._acked >= self._delivered and through + 1 > self._acked[0]:
            self._store_position(through + 1, 0)
        self._check()

    def ack(self, lsn: int) -> None:
        """Acknowledge every change delivered up to and including LSN ``lsn``
        (module docstring); a progress marker's LSN too. An LSN after the last
        delivered one is a ValueError."""
        if type(lsn) is not int:
            raise TypeError(f"ack takes a change's LSN (an int), not {type(lsn).__name__}")
        reached = max(self._last_lsn, self._through)
        if lsn > reached:
            raise ValueError(f"cannot acknowledge LSN {lsn}: the subscription {self.name!r} has delivered "
                             + (f"changes up to LSN {reached} only" if reached else "no change yet"))
        position = self._delivered if lsn == self._last_lsn and lsn > self._through else (lsn + 1, 0)
        if position > self._acked:
            self._store_position(*position)

    def _store_position(self, lsn: int, skip: int) -> None:
        rec = consumers.update(self._store, self.name,
                               lambda now: None if now.invalidated else now._replace(next_lsn=lsn, skip=skip))
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
        rec = consumers.Record(name, first, 0, prefix, start, stop, time.time_ns() // 1000, None)
        consumers.write(store_path, rec, new=True)
    elif (rec.prefix, rec.start, rec.stop) != (prefix, start, stop):
        raise ValueError(f"the subscription {name!r} watches prefix={rec.prefix!r}, start={rec.start!r}, "
                         f"stop={rec.stop!r}; drop it to change what it watches")
    return Subscription(store_path, source, rec, timeout=timeout, progress_every=progress_every)
