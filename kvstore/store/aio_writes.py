"""The asyncio front's writes between the event loop and the log: what
:class:`kvstore.store.aio.AsyncKVStore` hands its writes to, compiled with the
core (wal/compiled.py) because each write passes through it twice on the
loop's thread (queued, resolved) and the loop's thread is what limits durable
writes from many coroutines.

Durability is the log's: a future resolves (with its entry's LSN) only in the
loop turn after the log's callback said its run was acknowledged, which a
store's log says only once the group is written, synced as the store's
``sync`` mode asks (fsynced, with ``sync="always"``) and applied.

The path of one write, and why each step is there:

- :meth:`PendingWrites.submit` (on the loop): a future of the write's own and
  a place in the turn's *batch*; the first write of a batch schedules one
  :meth:`~PendingWrites.flush` (``call_soon``), so the flush runs after every
  coroutine that was ready has had its turn.
- :meth:`~PendingWrites.flush` (on the loop): the whole batch goes to the log
  as one run (``append_many_nowait``: one mutex round, consecutive LSNs, one
  callback, never split between groups). The run's futures are kept under its
  first LSN. A run the log refuses as a whole (closed, failed, a write too
  big) is queued again write by write, so an error reaches exactly the writes
  it concerns.
- :meth:`~PendingWrites.on_durable` (on the log's committing thread, once per
  run): appends ``(first_lsn, error)`` to a deque and, the first time since
  the loop last drained it, schedules one :meth:`~PendingWrites.drain`
  (``call_soon_threadsafe``): one wake-up of the loop for every run finished
  meanwhile.
- :meth:`~PendingWrites.drain` (on the loop): each finished run's futures
  resolve, the i-th with ``first_lsn + i``, or fail with the run's error.

Queuing a turn's writes at once also keeps groups whole: N coroutines that
write in a loop are all resumed by one drain and all queue in the next turn,
so each group holds all N. Queued one by one, the committer starts a group
with the first few while the rest are still being queued, and the writers
settle into two alternating halves, each paying its own fsync (issue 15: with
256 coroutines, groups of ~130 before, 256 after).

Each write keeps a future of its own (rather than awaiting one shared per
run): cancelling a task cancels the future it awaits, so a shared one would
cancel its neighbours. A cancelled write stays queued and is written; only its
result is dropped. The futures are the loop's own (``loop.create_future()``):
what awaits them (tasks, ``gather``, ``wait_for``) sees plain asyncio futures.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, final

from kvstore.entry.codec import put_entry
from wal.commit import Callback
from wal.segment import Payload


class RunLog(Protocol):
    """What :class:`PendingWrites` needs of a log (:class:`wal.Log` is one)."""

    def append_many_nowait(self, payloads: Sequence[Payload], callback: Callback,
                           contexts: Sequence[object]) -> int: ...


@final
class PendingWrites:
    """The writes of one event loop not yet resolved: the batch collected in
    this loop turn, the runs queued with ``log``, the runs the log finished.

    ``log`` None refuses every write (read-only), as :meth:`refuse` does from
    then on (closing); a refused write raises ``refusal()`` at once.
    ``max_value``: the store's limit on a value.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, log: RunLog | None, max_value: int,
                 refusal: Callable[[], BaseException]) -> None:
        self._log = log
        self._max_value = max_value
        self._refusal = refusal
        self._create_future = loop.create_future
        self._call_soon = loop.call_soon
        self._call_soon_threadsafe = loop.call_soon_threadsafe
        # The batch being collected on the loop (flushed by flush).
        self._payloads: list[Payload] = []
        self._ops: list[list] = []
        self._futures: list[asyncio.Future[int]] = []
        self._runs: dict[int, list[asyncio.Future[int]]] = {}  # first LSN -> a queued run's futures
        self._done: deque[tuple[int, BaseException | None]] = deque()  # runs the log finished
        self._wake_scheduled = False
        # Bound once: each is handed over per batch or per run.
        self._flush_soon: Callable[[], None] = self.flush
        self._drain_soon: Callable[[], None] = self.drain
        self._on_durable: Callback = self.on_durable

    # -- on the loop: writes in ------------------------------------------------

    def put(self, key: object, value: object) -> asyncio.Future[int]:
        """:meth:`submit` a put of ``key`` (its arguments checked as every put's)."""
        payload, ops = put_entry(key, value, self._max_value)
        return self.submit(payload, ops)

    def submit(self, payload: Payload, ops: list) -> asyncio.Future[int]:
        """Join the batch; the future resolves to the entry's LSN once the log
        acknowledged it (durable and applied), or fails with the log's error."""
        if self._log is None:
            raise self._refusal()
        fut: asyncio.Future[int] = self._create_future()
        if not self._payloads:
            self._call_soon(self._flush_soon)
        self._payloads.append(payload)
        self._ops.append(ops)
        self._futures.append(fut)
        return fut

    def flush(self) -> None:
        """Queue the batch collected on the loop with the log, as one run."""
        payloads, ops, futures = self._payloads, self._ops, self._futures
        if not payloads:
            return
        self._payloads, self._ops, self._futures = [], [], []
        try:
            # No await between the append and the insert: drain runs on this
            # same loop thread, so it cannot look the run up before it is there.
            self._runs[self._append_run(payloads, ops)] = futures
        except Exception as e:
            if len(payloads) == 1:
                fail(futures, e)
                return
            # Refused as a whole (nothing was queued): write by write, so each
            # error reaches only the write it concerns.
            for i in range(len(futures)):
                try:
                    self._runs[self._append_run([payloads[i]], [ops[i]])] = [futures[i]]
                except Exception as e1:
                    fail([futures[i]], e1)

    def _append_run(self, payloads: list[Payload], ops: list[list]) -> int:
        """Queue one run with the log; its first LSN."""
        log = self._log
        if log is None:
            raise self._refusal()
        return log.append_many_nowait(payloads, self._on_durable, ops)

    # -- the way back ---------------------------------------------------------

    def on_durable(self, first: int, error: BaseException | None) -> None:
        """The log's callback for the run at ``first`` (on its committing
        thread): record it and wake the loop, once per drain."""
        self._done.append((first, error))
        if not self._wake_scheduled:
            self._wake_scheduled = True
            try:
                self._call_soon_threadsafe(self._drain_soon)
            except RuntimeError:  # the loop is closed; nobody is waiting
                self._wake_scheduled = False

    def drain(self) -> None:
        """On the loop: resolve every future of every finished run."""
        # The flag first, so that a callback that runs while we drain either
        # lands in this drain or schedules the next one.
        self._wake_scheduled = False
        done, runs = self._done, self._runs
        while done:
            first, error = done.popleft()
            futures = runs.pop(first, None)
            if futures is None:
                continue
            if error is None:
                lsn = first
                for fut in futures:
                    try:
                        fut.set_result(lsn)
                    except asyncio.InvalidStateError:  # cancelled: written all the same
                        pass
                    lsn += 1
            else:
                fail(futures, error)

    # -- closing --------------------------------------------------------------

    def refuse(self) -> None:
        """Refuse every write from now on (what was flushed still resolves)."""
        self._log = None

    def fail_unfinished(self, error: BaseException) -> None:
        """Fail every write still queued (after the log was closed: it will not call back)."""
        for futures in self._runs.values():
            fail(futures, error)
        self._runs.clear()

    @property
    def pending(self) -> int:
        """Writes asked for and not yet resolved."""
        return len(self._payloads) + sum(len(f) for f in self._runs.values())


def fail(futures: list[asyncio.Future[int]], error: BaseException) -> None:
    """Fail each future not already done (cancelled) with ``error``."""
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)
