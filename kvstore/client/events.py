"""Reading a change stream (``/v1/watch``, a subscription's events), shared by
the sync and the asyncio client.

:class:`EventParser` turns the lines of a Server-Sent Events body into
events; :class:`Resumption` turns events into :class:`~kvstore.watch.Change`
objects and knows where to resume after the connection breaks: at the LSN
of the last change (its batch is sent whole again) skipping the ``index``es
already delivered, or after the last progress LSN. So a broken connection
costs neither a lost nor a repeated change. A ``gap`` or ``error`` event
raises the error it carries; ``end`` ends the iteration.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from kvstore.client.http import Params
from kvstore.client.wire import change_from_json, error_from_json
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
