"""Reading a change stream (``/v1/watch``, a subscription's events), shared by
the sync and the asyncio client.

:class:`EventParser` turns the lines of a Server-Sent Events body into
events; :class:`Resumption` turns events into :class:`~kvstore.watch.Change`
objects and knows where to resume after the connection breaks: at the LSN
of the last change (its batch is sent whole again) skipping the ``index``es
already delivered, or after the last progress LSN. So a broken connection
costs neither a lost nor a repeated change. A ``gap`` or ``error`` event
raises the error it carries; ``end`` ends the iteration.
:class:`Reconnecting` is the loop over connections, without the I/O: when
to reconnect and when to give up. :class:`RemoteWatcher` and
:class:`AsyncRemoteWatcher` are the clients' iterators over such a stream
(``db.watch``, a subscription's events), each only its own I/O around it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping
from typing import Any, NamedTuple

from kvstore.client.http import Params
from kvstore.client.leader import AsyncTransport, Transport
from kvstore.client.wire import ServerUnavailable, change_from_json, error_from_json
from kvstore.watch.watcher import PROGRESS, Change

RECONNECTS = 5
"""Reconnections in a row that deliver nothing before the client gives up
(raising :class:`~kvstore.client.wire.ServerUnavailable`)."""
BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)


class Event(NamedTuple):
    name: str
    data: str


class EventParser:
    """Server-Sent Events, a line at a time (``feed`` returns an event at its blank line)."""

    def __init__(self) -> None:
        self._name = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line == "":
            if not self._data:
                self._name = "message"
                return None
            event = Event(self._name, "\n".join(self._data))
            self._name, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None


END = object()
"""What :meth:`Resumption.handle` returns when the stream ended normally."""


class Resumption:
    """The position of a change stream (module docstring)."""

    def __init__(self, from_lsn: int | None, params: Mapping[str, Any]) -> None:
        self._params = dict(params)
        self.from_lsn = from_lsn
        self._lsn = 0          # the LSN of the last change delivered
        self._index = -1       # its index within its batch
        self.delivered = False  # since the last (re)connection

    def params(self) -> Params:
        return dict(self._params, from_lsn=self.from_lsn)

    def handle(self, event: Event) -> Change | object | None:
        """The change to deliver (None: nothing to deliver; :data:`END`: the stream ended)."""
        if event.name == "end":
            return END
        doc = json.loads(event.data)
        if event.name in ("gap", "error"):
            raise error_from_json(410 if event.name == "gap" else 503, doc.get("error"))
        if event.name == PROGRESS:
            lsn = int(doc["lsn"])
            self.from_lsn = max(self.from_lsn or 0, lsn + 1)
            self.delivered = True
            return Change(lsn, 0, PROGRESS, b"", None, None)
        change = change_from_json(doc)
        index = int(doc.get("index", 0))
        if change.lsn < self._lsn or (change.lsn == self._lsn and index <= self._index):
            return None  # delivered before the connection broke
        self._lsn, self._index = change.lsn, index
        self.from_lsn = change.lsn
        self.delivered = True
        return change


class Reconnecting:
    """The reading of one change stream across connections, without the
    I/O: the one loop both watchers drive. While :attr:`running`, each
    connection is made with the query :meth:`connect` gives, :meth:`line`
    turns each line of its body into a change to deliver, and once it ended
    (or broke) :meth:`after` says how long to wait before the next one, or
    gives up after :data:`RECONNECTS` connections in a row that delivered
    nothing."""

    def __init__(self, url: str, resumption: Resumption) -> None:
        self._url = url
        self.position = resumption
        self.finished = False  # the server ended the stream (an ``end`` event)
        self._parser = EventParser()
        self._failures = 0

    def running(self, closed: bool) -> bool:
        """Whether to make another connection: the watcher is not ``closed``
        and the server did not end the stream (an ``end`` event)."""
        return not (closed or self.finished)

    def connect(self) -> Params:
        self.position.delivered = False
        self._parser = EventParser()
        return self.position.params()

    def line(self, line: str) -> Change | None:
        """The change a line completes, if any (see :attr:`finished` after None)."""
        event = self._parser.feed(line)
        if event is None:
            return None
        out = self.position.handle(event)
        if out is END:
            self.finished = True
            return None
        if isinstance(out, Change):
            self._failures = 0
            return out
        return None

    def after(self, failure: ServerUnavailable | None, closed: bool) -> float:
        """Seconds to wait after a connection ended (``failure``: it broke)
        before the next; 0 when there is none (:meth:`running`). Raises when
        giving up."""
        if not self.running(closed):
            return 0.0
        return self.ended() if failure is None else self.broken(failure)

    def broken(self, exc: ServerUnavailable) -> float:
        """Seconds to wait after the connection broke; raises ``exc`` when giving up."""
        if not self.position.delivered:
            self._failures += 1
        if self._failures >= RECONNECTS:
            raise exc
        return BACKOFF[min(self._failures, len(BACKOFF) - 1)]

    def ended(self) -> float:
        """Seconds to wait after the server ended the stream without saying
        why (it is stopping); :class:`ServerUnavailable` when giving up."""
        self._failures += 1
        if self._failures >= RECONNECTS:
            raise ServerUnavailable(f"the watch stream from {self._url} kept ending; giving up")
        return BACKOFF[min(self._failures, len(BACKOFF) - 1)]


class RemoteWatcher:
    """Changes from a stream (``/v1/watch`` or a subscription's events), as
    :class:`kvstore.watch.Watcher` yields them; reconnects after a broken
    connection where it stopped (:mod:`kvstore.client.events`)."""

    def __init__(self, http: Transport, path: str, resumption: Resumption) -> None:
        self._http = http
        self._path = path
        self._stream = Reconnecting(http.url, resumption)
        self._closed = False
        self._gen: Iterator[Change] | None = None
        self._response: Any = None

    def __iter__(self) -> "RemoteWatcher":
        return self

    def __next__(self) -> Change:
        if self._gen is None:
            self._gen = self._run()
        return next(self._gen)

    def _run(self) -> Generator[Change, None, None]:
        stream = self._stream  # (the loop's logic: Reconnecting)
        while stream.running(self._closed):
            failure = None
            try:
                with self._http.stream("GET", self._path, params=stream.connect()) as response:
                    self._response = response
                    for line in response.iter_lines():
                        if self._closed:  # closed from another thread before the response was there to close
                            return
                        if (change := stream.line(line)) is not None:
                            yield change
                        elif stream.finished:  # an ``end`` event
                            return
            except ServerUnavailable as exc:
                failure = exc
            finally:
                self._response = None
            time.sleep(stream.after(failure, self._closed))

    def close(self) -> None:
        """Stop: the iteration ends."""
        self._closed = True
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing from another thread may race the reader
                pass

    def __enter__(self) -> "RemoteWatcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRemoteWatcher:
    """``async for change in db.watch(...)``: as the sync client's
    :class:`RemoteWatcher` (resumes after a broken connection)."""

    def __init__(self, http: AsyncTransport, path: str, resumption: Resumption) -> None:
        self._http = http
        self._path = path
        self._stream = Reconnecting(http.url, resumption)
        self._closed = False
        self._gen = self._run()

    def __aiter__(self) -> "AsyncRemoteWatcher":
        return self

    async def __anext__(self) -> Change:
        return await self._gen.__anext__()

    async def _run(self) -> AsyncGenerator[Change, None]:
        stream = self._stream  # (the loop's logic: Reconnecting)
        while stream.running(self._closed):
            failure = None
            try:
                async with self._http.stream("GET", self._path, params=stream.connect()) as response:
                    async for line in response.aiter_lines():
                        if (change := stream.line(line)) is not None:
                            yield change
                        elif stream.finished:  # an ``end`` event
                            return
            except ServerUnavailable as exc:
                failure = exc
            await asyncio.sleep(stream.after(failure, self._closed))

    async def aclose(self) -> None:
        self._closed = True
        await self._gen.aclose()

    async def __aenter__(self) -> "AsyncRemoteWatcher":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
