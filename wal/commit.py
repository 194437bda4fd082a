"""Group commit: many appenders, one write and one fsync (LevelDB's writer queue).

Appenders queue their payloads under one mutex, which also assigns LSNs, so
the queue is always in LSN order. The first appender to find no leader leads:
it takes the whole queue, releases the mutex, has the log write (and sync) it
as one group, then wakes the appenders the group covered and hands the
leadership to the oldest appender still waiting, whose entries are already
queued behind. The appenders wait in a line (:mod:`wal.line`), each
asleep on a lock of its own, so waking a group costs one lock release per
thread and no thundering herd on the mutex.

The leader releases only the first appender of the group it wrote; each
appender, as it wakes, releases the next (a chain). Woken all at once, the
group's threads all ran for the GIL, and all but one went back to sleep on
it, to be woken once more when it was free: with 32 threads, 3.9 context
switches per append and 80% of the time in the kernel. Along the chain, a
thread's successor is scheduled while it returns and appends again, and
mostly finds the GIL free: 2.7 switches per append, and 20-25% more
durable appends per second from 32 threads (5% from 8).

One appender with nobody else writing pays for none of that: when nobody
leads, nothing is queued and the last group woke at most one other appender,
it takes its LSNs and the leadership, writes its own group at once and
acknowledges it (the direct path: two uncontended mutex acquisitions, no
queue, waiter lock or callback). Appenders arriving while it writes queue
behind it as behind any leader, so contended appends still share each fsync.

A group that woke several appenders means they will most likely append
again at once. The next leader then *gathers*: it waits, at most
:data:`GATHER_SECONDS`, until as many entries are queued, and writes them as
one group. Without it, the first appender back (each must get the GIL in
turn) would write alone, and with 8 threads the groups alternated between 1
and 7 entries: 4.6 entries per fsync instead of 7.3, and 10-13% fewer durable
puts per second from 8 threads (an A/B of the two, interleaved, 3 rounds).

Each payload travels with a *context*, an object the log never looks at
(the store passes the decoded operations), and reaches the log's
``commit`` hook (:mod:`wal.hooks`) with it in a :class:`Group`, so the layer above never has
to decode what it just encoded.

Appenders that must not block (``submit_nowait``, the asyncio front) pass a
callback instead, one per *run* of entries queued together (a run is never
split between groups), so a thousand entries queued at once cost one callback,
not a thousand; a committer thread leads when no appender thread is there to,
and callbacks run on whichever thread led their group, after the mutex is
released.

Operations that need the log to themselves (sync, truncate, close) wait their
turn in the same line with :meth:`GroupCommit.exclusive`.

Ctrl-C: a KeyboardInterrupt reaches the main thread in whichever blocking
acquire it is in. An appender interrupted while it waits leaves the line
and passes on what it was handed (:meth:`GroupCommit._wait`); a leader, or
an appender handed the leadership, keeps the interrupt until its group is
written and the leadership passed on (:meth:`GroupCommit._relock`), and
each waiter is told its own group's outcome (``Waiter.failed``), so an
interrupt never leaves the log with nobody leading or a waiter asleep. An
interrupted append's entries may still be written: its caller cannot know.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

from wal.forkguard import forked_error
from wal.group import Group
from wal.line import Waiter, WaitingLine
from wal.log_writer import LogWriter
from wal.mutex import Mutex, condition
from wal.segment import Payload

logger = logging.getLogger("walkv.wal")

GATHER_SECONDS: Final = 0.0002
"""The longest a new leader waits for the appenders the last group woke (an
fsync costs 0.1-0.2 ms on an SSD: the wait is paid back when it doubles a group)."""

Callback = Callable[[int, "BaseException | None"], None]
# What a group's leader runs once the mutex is released: ``(first_lsn,
# callback)`` for each run of nowait entries in the group, and the error that
# failed them (None: all acknowledged).
Done = tuple[list[tuple[int, Callback]], "BaseException | None"]


class GroupCommit:
    """The queue and leadership of one log.

    ``writer.write_group(group)`` does the I/O for a :class:`Group` (called
    by one leader at a time, without the mutex); when it raises,
    ``on_failure(error, first_lsn)`` returns the exception every later caller
    gets. ``check()`` raises when the log is closed or failed. ``mutex`` is
    the log's: what the writer changes for readers is changed under it too.
    """

    def __init__(
        self,
        writer: LogWriter,
        on_failure: Callable[[BaseException, int], BaseException],
        check: Callable[[], None],
        next_lsn: int,
        mutex: Mutex,
    ) -> None:
        self.mutex = mutex
        self._work = condition(self.mutex)
        self._writer = writer  # (a LogWriter, not a callable: compiled, a direct call)
        self._on_failure = on_failure
        self._check = check
        self._queue: list[Payload] = []
        self._contexts: list[object] = []
        self._callbacks: list[tuple[int, Callback]] = []  # (first LSN of a run, its callback)
        self._line = WaitingLine()  # the appenders asleep until their group is written (wal/line.py)
        self._leading = False
        self._committer: threading.Thread | None = None
        self.stopping = False
        self._frozen = False  # no LSN may be handed out (truncate_after renumbers)
        self._thawed = condition(self.mutex)
        self._arrived: threading.Lock | None = None  # released when enough entries are queued for a gathering leader
        self._kept: BaseException | None = None  # an interrupt the leader kept until its group is done (_relock)
        self._woken = 0  # appenders the last group released
        self.gather_seconds = GATHER_SECONDS
        self.next_lsn = next_lsn
        self.acked_lsn = next_lsn - 1  # what appenders may be told is done
        self.failure: BaseException | None = None
        self.closed = False  # the log's own closed state (Log.closed), set as it closes: appends then get check()'s error
        self.refusal: BaseException | None = None  # while set, appends raise it (Log.refuse_appends)
        self._forked: tuple[str, int] | None = None  # (what, owner pid) in a forked child

    def refuse_in_fork(self, what: str, owner_pid: int) -> None:
        """In a forked child (:mod:`wal.forkguard`): every later submit raises
        ForkedError, before it touches the mutex (a thread of the parent may
        have held it at the fork, and no thread of the child will release it)."""
        self._forked = (what, owner_pid)

    def _group_failure(self) -> BaseException:
        """Why a group was not acknowledged: a group fails only by setting
        ``failure`` (before its appenders wake)."""
        if self.failure is None:
            raise RuntimeError("group commit: a group was neither acknowledged nor failed")
        return self.failure

    # -- appending -------------------------------------------------------------

    def submit(self, payloads: list[Payload], contexts: list[object]) -> int:
        """Queue ``payloads`` (each with its context) and return once they are
        acknowledged; return the first LSN. Raises the log's failure if their
        group failed.

        The direct path: when nobody leads and nothing is queued (one writer,
        or writers taking turns), the caller writes its own group at once,
        with no queue, no waiter lock and no callback: take the mutex, take
        the LSNs and the leadership, write without the mutex, then take it
        again only to mark the group acknowledged and give the leadership
        up. Appenders arriving meanwhile queue as they would behind any
        leader and get the leadership handed to them
        (:meth:`_after_direct`); the durability is the same, since the group
        is acknowledged only after ``write_group`` returned."""
        if self._forked is not None:
            raise forked_error(*self._forked)
        m = self.mutex  # (a Mutex: compiled, acquire and release are C calls)
        m.acquire()
        if self._leading or self._queue or self._woken > 1:
            return self._submit_queued(payloads, contexts)  # releases the mutex
        first = self._take_lsns(len(payloads))
        last = first + len(payloads) - 1
        self._leading = True
        m.release()
        error: BaseException | None = None
        try:
            self._writer.write_group(Group(first, payloads, contexts))
        except BaseException as e:  # noqa: BLE001 - any failure here fails the log
            error = e
        if error is not None:
            self._after_direct(first, last, error)
            raise self._group_failure()
        self._relock()
        if self._line.waiters or self._queue:
            self._after_direct(first, last, None)  # releases the mutex
        else:
            self.acked_lsn = last
            self._leading = False
            self._release_leadership()
        return first

    def _take_lsns(self, count: int) -> int:
        """Mutex held: the first of ``count`` LSNs handed out in order, or the
        log's refusal (closed, failed; the mutex released). The log's
        ``check()`` says why, and is called only then (compiled, the looks
        are in C; the call is not)."""
        if self.closed or self.failure is not None:
            try:
                self._check()
                raise RuntimeError("group commit: appends are refused, but the log's check() passed")
            finally:
                self.mutex.release()
        refusal = self.refusal
        if refusal is not None:
            self.mutex.release()
            raise refusal
        first = self.next_lsn
        self.next_lsn = first + count
        return first

    def _after_direct(self, first: int, last: int, error: BaseException | None) -> None:
        """After a direct write (mutex held when it succeeded, not held when
        it failed; released on return): acknowledge or fail the group and
        wake or fail whoever queued meanwhile, then hand the leadership on."""
        if error is not None:
            self._relock()
        done = self._acknowledge(first, last, error, [])
        self._handoff()
        self._release_leadership(done)

    def _submit_queued(self, payloads: list[Payload], contexts: list[object]) -> int:
        """:meth:`submit` (mutex held, released on return) when a leader is
        writing or entries are queued: join the queue; wait to be
        acknowledged, or lead the next group."""
        m = self.mutex
        try:
            while self._frozen:
                self._thawed.wait()
        except BaseException:
            m.release()
            raise
        first = self._take_lsns(len(payloads))
        last = first + len(payloads) - 1
        if len(payloads) == 1:
            self._queue.append(payloads[0])
            self._contexts.append(contexts[0])
        else:
            self._queue.extend(payloads)
            self._contexts.extend(contexts)
        if self._leading:
            arrived = self._arrived
            if arrived is not None and len(self._queue) >= self._woken:
                self._arrived = None
                arrived.release()
            w = self._line.join(last)
            m.release()
            self._wait(w)  # released by the leader: done, failed, or our turn to lead
            after = w.next  # the next acknowledged appender: wake it first (module docstring)
            if after is not None:
                w.next = None
                after.lock.release()
            if not w.lead:
                if w.failed is not None:
                    raise w.failed
                return first
            self._relock()
        else:
            self._leading = True
        self._gather()
        done = self._lead_group()
        self._handoff()
        self._release_leadership(done)
        if self.acked_lsn < last:
            raise self._group_failure()
        return first

    def _wait(self, w: Waiter) -> None:
        """Sleep until the leader releases ``w`` (mutex not held). When the
        wait is interrupted (KeyboardInterrupt in the main thread), the
        appender leaves the line before the exception goes on: its entries
        stay queued, for the next group; and what the leader handed it, the
        wake-up of the next appender of its chain or the leadership, is
        passed on, so that no other appender waits for it."""
        try:
            w.lock.acquire()
        except BaseException:
            self._relock()
            if not self._line.leave(w):  # released as the exception came: pass on what the leader set before it released it
                after, w.next = w.next, None
                if after is not None:
                    after.lock.release()
                if w.lead:
                    self._handoff()
            self._kept = None  # (the one raised now)
            self.mutex.release()
            raise

    def _relock(self) -> None:
        """Take the mutex again while leading, or while owing the line
        something: a blocked acquire interrupted (KeyboardInterrupt in the
        main thread) is retried, and the interrupt kept in ``_kept``, raised
        once the leadership is passed on (:meth:`_release_leadership`), so
        that no group is left half done with nobody leading."""
        m = self.mutex
        while True:
            try:
                m.acquire()
                return
            except BaseException as e:  # noqa: BLE001 - kept, raised by _release_leadership
                self._kept = e

    def _release_leadership(self, done: Done | None = None) -> None:
        """Mutex held, the leadership passed on or given up: release the
        mutex, run the group's callbacks, then raise an interrupt that
        :meth:`_relock` or :meth:`_gather` kept."""
        kept, self._kept = self._kept, None
        self.mutex.release()
        _run_callbacks(done)
        if kept is not None:
            raise kept

    def _gather(self) -> None:
        """Mutex held, leading a group not yet taken: when the last group
        woke several appenders, wait (at most ``gather_seconds``) until as
        many entries are queued, so that they share this group's fsync
        (module docstring). The wait releases the mutex, on a lock of its
        own that the appender who fills the group releases (not a
        condition's wait, whose taking the mutex back could be interrupted
        and leave it not held); an interrupted wait ends it, and is kept
        (:meth:`_relock`)."""
        if self._woken > 1 and len(self._queue) < self._woken and self.failure is None:
            arrived = self._arrived = threading.Lock()
            arrived.acquire()
            self.mutex.release()
            try:
                arrived.acquire(timeout=self.gather_seconds)
            except BaseException as e:  # noqa: BLE001 - kept, raised once the group is done
                self._kept = e
            self._relock()
            self._arrived = None

    def submit_nowait(self, payloads: list[Payload], contexts: Sequence[object], callback: Callback) -> int:
        """Queue ``payloads`` (each with its context) as one run without
        blocking; return the first LSN at once (the run has ``first ..
        first + len(payloads) - 1``). ``callback(first, error)`` runs once, on
        the committing thread, when the whole run is acknowledged (``error``
        None) or failed: a run is always written in one group."""
        if self._forked is not None:
            raise forked_error(*self._forked)
        with self.mutex:
            while self._frozen:
                self._thawed.wait()
            self._check()
            if self.refusal is not None:
                raise self.refusal
            first = self.next_lsn
            self.next_lsn = first + len(payloads)
            self._queue.extend(payloads)
            self._contexts.extend(contexts)
            self._callbacks.append((first, callback))
            if self._committer is None:
                self._committer = threading.Thread(target=self._commit_loop, name="walkv-committer", daemon=True)
                self._committer.start()
            if not self._leading:
                self._work.notify()
        return first

    # -- leading -----------------------------------------------------------------

    def _lead_group(self) -> Done | None:
        """Mutex held, leading: write the queue as one group and wake the
        appenders it covered. Returns the callbacks to run, if any."""
        payloads, callbacks = self._queue, self._callbacks
        if not payloads:
            return None
        group = Group(self.acked_lsn + 1, payloads, self._contexts)
        self._queue, self._contexts, self._callbacks = [], [], []
        return self._write_and_wake(group, callbacks)

    def _write_and_wake(self, group: Group, callbacks: list[tuple[int, Callback]]) -> Done | None:
        """Mutex held, leading: write one group (releasing the mutex for the
        I/O), then wake the appenders it covered, or fail everything queued
        if it failed. Returns the callbacks to run, if any."""
        error: BaseException | None = self.failure
        if error is None:
            self.mutex.release()
            try:
                self._writer.write_group(group)
            except BaseException as e:  # noqa: BLE001 - any failure here fails the log
                error = e
            self._relock()
        return self._acknowledge(group.first_lsn, group.last_lsn, error, callbacks)

    def _acknowledge(self, first: int, last: int, error: BaseException | None,
                     callbacks: list[tuple[int, Callback]]) -> Done | None:
        """Mutex held, leading: the group ``first .. last`` was written
        (``error`` None) or failed: wake the appenders it covered, or fail
        everything queued. Returns the callbacks to run, if any."""
        if error is None:
            self.acked_lsn = last
        else:
            if self.failure is None:
                self.failure = self._on_failure(error, first)
            error = self.failure
            # What is queued behind a failed group will never be written.
            callbacks = callbacks + self._callbacks
            self._queue, self._contexts, self._callbacks = [], [], []
        self._woken = self._line.wake_acknowledged(self.acked_lsn, error)
        return (callbacks, error) if callbacks else None

    def _handoff(self) -> None:
        """Mutex held, leading: pass the leadership on, or give it up."""
        if not self._line.pass_leadership():
            self._leading = False
            if self._queue:
                self._work.notify()

    def _commit_loop(self) -> None:
        m = self.mutex
        with m:
            while not self.stopping:
                if self._queue and not self._leading and self.failure is None:
                    self._leading = True
                    done = self._lead_group()
                    self._handoff()
                    if done is not None:
                        m.release()
                        try:
                            _run_callbacks(done)
                        finally:
                            m.acquire()
                else:
                    self._work.wait()

    @contextmanager
    def exclusive(self, *, drain: bool = True, freeze: bool = False) -> Iterator[None]:
        """Hold the leadership (no group is written meanwhile). With
        ``drain``, everything queued before is written first; with
        ``freeze``, new appends wait (they get no LSN) until the end."""
        m = self.mutex
        m.acquire()
        try:
            self._check()
        except BaseException:
            m.release()
            raise
        if self._leading:
            w = self._line.join(self.next_lsn - 1, exclusive=True)
            m.release()
            self._wait(w)
            self._relock()
        else:
            self._leading = True
        done = []
        while drain and self._queue and self.failure is None:
            done.append(self._lead_group())
        failure = self.failure
        kept, self._kept = self._kept, None  # (an interrupt while draining: the leadership goes on, then it is raised)
        if failure is not None or kept is not None:
            self._handoff()
        elif freeze:
            self._frozen = True
        m.release()
        for d in done:
            _run_callbacks(d)
        if kept is not None:
            raise kept
        if failure is not None:
            raise failure
        try:
            yield
        finally:
            with m:
                if freeze:
                    self._frozen = False
                    self._thawed.notify_all()
                self._handoff()

    def fail(self, error: BaseException, first_lsn: int) -> BaseException:
        """Fail the log from outside a group (a sync or a truncation failed at
        LSN ``first_lsn``): every later append gets the failure, which is
        returned (the first one, if the log had already failed)."""
        with self.mutex:
            if self.failure is None:
                self.failure = self._on_failure(error, first_lsn)
            return self.failure

    def renumber(self, next_lsn: int) -> None:
        """The log was cut (``truncate_after``, inside ``exclusive(freeze=True)``,
        so no LSN is handed out meanwhile): the next append gets ``next_lsn``."""
        with self.mutex:
            self.next_lsn = next_lsn
            self.acked_lsn = next_lsn - 1

    def stop(self, error: BaseException) -> None:
        """Stop the committer thread and fail whatever is still queued."""
        with self.mutex:
            self.stopping = True
            self._frozen = False
            self._thawed.notify_all()
            self._work.notify_all()
            callbacks, self._queue, self._contexts, self._callbacks = self._callbacks, [], [], []
        _run_callbacks((callbacks, error))
        t = self._committer
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


def _run_callbacks(done: Done | None) -> None:
    if done is None:
        return
    callbacks, error = done
    for first, cb in callbacks:
        try:
            cb(first, error)
        except Exception:  # a callback's bug must not fail the log
            logger.exception("append_nowait callback raised")
