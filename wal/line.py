"""The waiting line of a group commit (:mod:`wal.commit`): the appenders
asleep until the group that holds their entries is written, and the
operations waiting to hold the log exclusively, in the order they came
(which is LSN order: LSNs are handed out under the same mutex).

Each waiter sleeps on a lock of its own (:class:`Waiter`, one per thread,
made once and kept in a thread-local), so a wake-up is one lock release to
one thread, with no thundering herd on the mutex.

How a written group wakes its appenders (:meth:`WaitingLine.wake_acknowledged`):
the acknowledged waiters at the head of the line are linked into a chain
(``Waiter.next``) and only the first is released; each appender, as it
wakes, releases the next (:mod:`wal.commit` says why: woken all at once, a
group's threads all ran for the GIL, and all but one slept again on it).
Only waiters already acknowledged are chained, so no appender returns
before the fsync that covers it, however late its predecessor wakes. A
failed group releases every appender at once, each told the failure
(``Waiter.failed``).

Every method is called with the group commit's mutex held.
"""

from __future__ import annotations

import threading
from collections import deque

from wal.mutex import Mutex


class Waiter:
    """One thread's place in the line: its lock (held while it sleeps,
    released to wake it), what it waits for, and what it is told."""

    __slots__ = ("exclusive", "failed", "lead", "lock", "lsn", "next")

    def __init__(self) -> None:
        self.lock = Mutex()
        self.lock.acquire()
        self.lsn = 0  # the last LSN it waits to see acknowledged
        self.lead = False  # set with its release: the leadership is handed to it
        self.exclusive = False  # waits to hold the log itself (GroupCommit.exclusive), not for a group
        self.next: Waiter | None = None  # set with its release: the next acknowledged waiter, for it to wake
        self.failed: BaseException | None = None  # set with its release: why its group failed (None: acknowledged)


class WaitingLine:
    """The waiters of one group commit, oldest first (module docstring)."""

    def __init__(self) -> None:
        self.waiters: deque[Waiter] = deque()
        self._local = threading.local()

    def join(self, lsn: int, exclusive: bool = False) -> Waiter:
        """Put the calling thread at the end of the line, to wait until
        ``lsn`` is acknowledged (or, ``exclusive``, for its turn to hold the
        log); its waiter, for it to sleep on (``waiter.lock.acquire()``)."""
        w: Waiter | None = getattr(self._local, "waiter", None)
        if w is None:
            w = self._local.waiter = Waiter()
        w.lsn = lsn
        w.lead = False
        w.exclusive = exclusive
        self.waiters.append(w)
        return w

    def leave(self, w: Waiter) -> bool:
        """After ``w``'s sleep was cut short (an interrupt): take it out of
        the line if it is still in it (True), or say it was released (False:
        it holds what its releaser set, ``next`` and ``lead``). Either way
        its lock's state is its own from now on, so its thread gets a new
        waiter next time."""
        self._local.waiter = None
        if w in self.waiters:
            self.waiters.remove(w)
            return True
        return False

    def wake_acknowledged(self, acked: int, error: BaseException | None) -> int:
        """A group was written up to LSN ``acked`` (``error`` None), or
        failed: wake the waiters it covered, along a chain (module
        docstring); when it failed, every other appender too, told
        ``error``. Exclusive waiters stay for their turn. Returns how many
        were chained."""
        waiters = self.waiters
        woken = 0
        head: Waiter | None = None
        tail: Waiter | None = None
        while waiters and not waiters[0].exclusive and (waiters[0].lsn <= acked or error is not None):
            w = waiters.popleft()
            w.failed = error
            if tail is None:
                head = w
            else:
                tail.next = w
            tail = w
            woken += 1
        if head is not None:
            head.lock.release()
        if error is not None and waiters:
            self.waiters = deque(w for w in waiters if w.exclusive)
            for w in waiters:
                if not w.exclusive:
                    w.failed = error
                    w.lock.release()
        return woken

    def pass_leadership(self) -> bool:
        """Hand the leadership to the oldest waiter, waking it; False when
        nobody waits."""
        if not self.waiters:
            return False
        w = self.waiters.popleft()
        w.lead = True
        w.lock.release()
        return True
