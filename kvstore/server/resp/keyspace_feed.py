"""The store's writes as keyspace notifications, fed by walkv's watch.

:class:`KeyspaceFeed` follows the store with a :class:`kvstore.watch.Watcher`
over every keyspace, from the LSN after the last one logged when it starts,
on a thread of its own (it reads the log files, never the writers' memory),
and hands the changes to the event loop in batches; there each entry's
events (:mod:`kvstore.server.resp.notify`) are published, in log order. So
a subscriber is told of a write once it is durable, whichever face wrote it
(RESP, HTTP, the embedded API, the expiry sweeper), and never of one a crash
could take back.

Names. A change says "put" or "delete", not INCR or RENAME; so each RESP
write of this listener is noted (:meth:`KeyspaceFeed.track`: its ops as
logged and the commands that made them, by LSN once it is durable) and
named from its commands. Before an entry is published, every RESP write
in flight then is awaited (one group commit at most), since any of them
may have an LSN at or below the entry's: a write handed to the log after
the watch read an entry comes after it in the log. Writes of other faces
are named from their changes.

Bounds: at most :data:`MAX_BUFFERED` changes wait for the loop (the watcher's
thread then waits, and the watch falls behind on the files, not in memory),
and at most :data:`MAX_NOTES` notes are kept (the oldest then go: their
entries are named from their changes).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from kvstore.server.resp.notify import Event, Span, change_events, entry_events
from kvstore.store.store import KVStore

logger = logging.getLogger("kvstore.server.resp")

MAX_BUFFERED: Final = 100_000
MAX_NOTES: Final = 100_000
EVERY_OP: Final = 1 << 62
"""A span's end that covers every op of its entry (one command)."""


class KeyspaceFeed:
    """Keyspace notifications of ``store`` to ``publish``, on ``loop``
    (module docstring); ``failed`` is called on the loop when the watch ends
    with an error (the store closed, its history forked)."""

    def __init__(self, store: KVStore, loop: asyncio.AbstractEventLoop, publish: Callable[[list[Event], int], None],
                 flags: Callable[[], int], failed: Callable[[BaseException], None]) -> None:
        self._loop = loop
        self._publish = publish
        self._flags = flags
        self._failed = failed
        self._notes: dict[int, tuple[Sequence[Any], Sequence[Span], int]] = {}
        self._in_flight: set[asyncio.Future[int]] = set()
        self._buffer: list[Any] = []
        self._cond = threading.Condition()
        self._ready = asyncio.Event()
        self._closed = False
        self._last_lsn = 0  # the entry published last, and whether from its note
        self._last_named = False
        self._watcher = store.watch(keyspace=None, from_lsn=store.last_lsn + 1)
        self._thread = threading.Thread(target=self._follow, name="walkv-resp-keyspace", daemon=True)
        self._thread.start()
        self._task = loop.create_task(self._run())

    def track(self, future: asyncio.Future[int], ops: Sequence[Any], spans: Sequence[Span]) -> None:
        """A RESP write in flight: ``ops``, made by the commands of ``spans``
        (notified as the flags are now, when the commands run, as in Redis)."""
        self._in_flight.add(future)
        flags = self._flags()
        future.add_done_callback(lambda done: self._noted(done, ops, spans, flags))

    def _noted(self, done: asyncio.Future[int], ops: Sequence[Any], spans: Sequence[Span], flags: int) -> None:
        self._in_flight.discard(done)
        if done.cancelled() or done.exception() is not None:
            return
        notes = self._notes
        if len(notes) >= MAX_NOTES:
            del notes[next(iter(notes))]
        notes[done.result()] = (ops, spans, flags)

    # -- the watcher's thread --------------------------------------------------------------

    def _follow(self) -> None:
        try:
            for change in self._watcher:
                with self._cond:
                    while len(self._buffer) >= MAX_BUFFERED and not self._closed:
                        self._cond.wait(0.1)
                    if self._closed:
                        return
                    self._buffer.append(change)
                    if len(self._buffer) == 1:
                        self._loop.call_soon_threadsafe(self._ready.set)
        except BaseException as exc:
            if not self._closed:
                try:
                    self._loop.call_soon_threadsafe(self._fail, exc)
                except RuntimeError:  # the loop is closed: nobody listens any more
                    pass

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._cond:
                changes, self._buffer = self._buffer, []
                self._cond.notify_all()
            if self._in_flight:
                await asyncio.wait(list(self._in_flight))
            try:
                self._deliver(changes)
            except Exception:  # a bug: logged, and the feed goes on
                logger.exception("walkv RESP: keyspace notifications of %d changes failed", len(changes))

    def _deliver(self, changes: list[Any]) -> None:
        notes = self._notes
        i, n = 0, len(changes)
        while i < n:
            lsn = changes[i].lsn
            j = i + 1
            while j < n and changes[j].lsn == lsn:
                j += 1
            flags = self._flags()
            if lsn == self._last_lsn:  # the rest of an entry the last batch began
                events = [] if self._last_named else change_events(changes[i:j])
            else:
                note = notes.pop(lsn, None)
                self._last_lsn, self._last_named = lsn, note is not None
                if note is not None:
                    events, flags = entry_events(note[0], note[1]), note[2]
                else:
                    events = change_events(changes[i:j])
            if events:
                self._publish(events, flags)
            i = j
        if changes:  # notes of entries that changed nothing (a failed INCR, a block of reads)
            last = changes[-1].lsn
            for lsn in [lsn for lsn in notes if lsn <= last]:
                del notes[lsn]

    def _fail(self, exc: BaseException) -> None:
        if self._closed:
            return
        logger.warning("walkv RESP: keyspace notifications stopped: %s", exc)
        self.close()
        self._failed(exc)

    def close(self) -> None:
        """Stop following the store (from the loop)."""
        self._closed = True
        self._watcher.close()
        with self._cond:
            self._cond.notify_all()
        self._task.cancel()
