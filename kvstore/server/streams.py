"""Streams of changes: ``GET /v1/watch`` and named subscriptions (docs/http-api.md).

A stream is Server-Sent Events (``text/event-stream``) or, with ``Accept:
application/x-ndjson`` or ``format=ndjson``, one JSON object a line. Each
change is one event, ``id: LSN`` and ``data:`` its JSON
(:func:`kvstore.client.wire.change_json`, ``index`` its place in its batch);
while idle, with ``progress_every=S``, ``event: progress`` ``{"lsn": N}``
(every change up to N was sent). When the log no longer holds what the
stream needs (``on_gap=error``): ``event: gap`` with the error JSON, and the
stream ends; any other error likewise ends it with ``event: error``. With
``timeout=S`` the stream ends after S seconds without a change, with
``event: end``; a stream that ends without ``end``, ``gap`` or ``error``
broke (the client resumes it). ``Last-Event-ID: L`` resumes at LSN ``L``: the
batch ``L`` is sent whole again (at least once, never a lost change).

``keyspace=K`` watches keyspace K, ``keyspace=*`` every one. A
subscription is created by ``POST /v1/subscriptions/{name}`` (as the
embedded ``db.subscribe`` creates it, at once) or by its first stream; never
at an LSN past the log's next one (it would skip the changes in between).

Each stream holds one of :attr:`~kvstore.server.context.Limits.max_streams`
slots, within its token's share (429 past either), and one thread, where
the blocking watcher runs (:class:`kvstore.watch.aio.AsyncWatcher`). Server shutdown closes every
stream (they end without ``end``: clients resume elsewhere or later); a
stream asked for after that is a 503 (``ServerUnavailable``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from kvstore.client.wire import NotFound, ServerUnavailable, change_json, error_body
from kvstore.server.bodies import key_field, lsn_field, read_json
from kvstore.server.context import MAX_LSN, Query, Served, dumps, json_response, served
from kvstore.server.routes import RouteMatch
from kvstore.watch.aio import AsyncWatcher, Changes
from kvstore.watch.consumers import check_name
from kvstore.watch.consumers import read as read_subscription
from kvstore.watch.subscription import Subscription
from kvstore.watch.watcher import ON_GAP, PROGRESS, Change
from wal.errors import LogGapError, SubscriptionInvalidatedError

MAX_PROGRESS_EVERY = 3600.0


class _Stream:
    """Writes events to one response as SSE or NDJSON. A write that cannot
    go on for ``write_timeout`` seconds (the client stopped reading, its
    buffers are full) aborts the connection: a stuck reader does not keep
    its stream slot, its coroutine and the events buffered for it."""

    def __init__(self, request: web.Request, response: web.StreamResponse, ndjson: bool,
                 write_timeout: float) -> None:
        self.request = request
        self.response = response
        self.ndjson = ndjson
        self.write_timeout = write_timeout
        self._lsn = -1
        self._index = 0

    async def write(self, data: bytes) -> None:
        try:
            async with asyncio.timeout(self.write_timeout):
                await self.response.write(data)
        except TimeoutError:
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionResetError(f"the client read nothing for {self.write_timeout:g} s; "
                                       f"its stream was dropped") from None

    async def change(self, change: Change) -> None:
        if change.op == PROGRESS:
            await self.event("progress", {"lsn": change.lsn})
            return
        self._index = self._index + 1 if change.lsn == self._lsn else 0
        self._lsn = change.lsn
        doc = change_json(change, self._index)
        if self.ndjson:
            await self.write(dumps(doc) + b"\n")
        else:
            await self.write(b"id: %d\ndata: %s\n\n" % (change.lsn, dumps(doc)))

    async def event(self, name: str, doc: dict[str, Any]) -> None:
        if self.ndjson:
            await self.write(dumps(dict(doc, op=name) if name == "progress" else {"event": name, **doc}) + b"\n")
        else:
            await self.write(b"event: %s\ndata: %s\n\n" % (name.encode(), dumps(doc)))


def _wants_ndjson(request: web.Request, q: Query) -> bool:
    fmt = q.text("format")
    if fmt is not None:
        return fmt == "ndjson"
    return "application/x-ndjson" in request.headers.get("Accept", "")


def _from_lsn(request: web.Request, q: Query) -> int | None:
    last = request.headers.get("Last-Event-ID")
    if last is not None:
        q.values["from_lsn"] = last.strip().encode()
    return q.integer("from_lsn", None, 1, MAX_LSN)


async def _pump(request: web.Request, s: Served, changes: Changes, ndjson: bool) -> web.StreamResponse:
    """Send ``changes`` as a stream until it ends, breaks or the server stops."""
    watcher = AsyncWatcher(changes)
    response = web.StreamResponse(headers={
        "Content-Type": "application/x-ndjson" if ndjson else "text/event-stream",
        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    s.streams.add(watcher)
    try:
        if s.shutting_down:  # it began after the server ended its streams: 503, the client resumes later
            raise ServerUnavailable("this server is stopping; open the stream again once it is back (or on another)")
        await response.prepare(request)
        stream = _Stream(request, response, ndjson, s.limits.idle_timeout)
        try:
            async for change in watcher:
                await stream.change(change)
            if not s.shutting_down:
                await stream.event("end", {})
        except (LogGapError, SubscriptionInvalidatedError) as exc:
            await stream.event("gap", error_body(exc)[1])
        except ConnectionError:  # the client went away or stopped reading (aborted): nobody to tell
            pass
        except Exception as exc:  # the store failed or closed: say so, then end
            await stream.event("error", error_body(exc)[1])
    finally:
        await watcher.aclose()
    return response


def _keyspace(q: Query) -> str | None:
    """``keyspace=``: absent or empty, the default keyspace; ``*``, every one
    (each change names its own, as ``watch(keyspace=None)``)."""
    name = q.text("keyspace", "") or ""
    return None if name == "*" else name


async def watch(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    s = served(request)
    q = match.query
    on_gap = q.text("on_gap", "error")
    if on_gap not in ON_GAP:
        raise ValueError(f"on_gap must be one of {ON_GAP}, not {on_gap!r}")
    options = dict(start=q.bytes("start"), stop=q.bytes("stop"), from_lsn=_from_lsn(request, q),
                   timeout=q.number_or_none("timeout", 0.0, MAX_PROGRESS_EVERY),
                   progress_every=q.number_or_none("progress_every", 0.01, MAX_PROGRESS_EVERY), on_gap=on_gap,
                   keyspace=_keyspace(q))
    async with s.stream_slot(match.token):
        watcher = s.store.watch(q.bytes("prefix"), **options)  # type: ignore[arg-type]
        return await _pump(request, s, watcher, _wants_ndjson(request, q))


def _name(match: RouteMatch) -> str:
    """The subscription's name, from the path (names are plain letters,
    digits, ``.``, ``_``, ``-``, checked by the store)."""
    return check_name(match.text("name"))


async def subscriptions(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    return json_response({"subscriptions": [info._asdict() for info in s.store.subscriptions()]})


def _check_from_lsn(s: Served, from_lsn: int | None) -> None:
    """A subscription starts at most at the log's next LSN: one created
    further on would skip the changes in between without a word."""
    if from_lsn is not None and from_lsn > s.store.last_lsn + 1:
        raise ValueError(f"from_lsn {from_lsn} is past the end of the log (its next LSN is "
                         f"{s.store.last_lsn + 1}): a subscription there would skip every change up to it")


async def _subscribe(s: Served, name: str, prefix: bytes | None, options: dict[str, Any]) -> Subscription:
    """Open subscription ``name`` (created by the first call), on a thread (its files)."""
    _check_from_lsn(s, options.get("from_lsn"))
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: s.store.subscribe(name, prefix, **options))


async def subscription_create(request: web.Request, match: RouteMatch) -> web.Response:
    """``POST /v1/subscriptions/{name}`` ``{"prefix", "start", "stop", "from_lsn"}``
    (each optional): create the subscription now, as the embedded
    ``db.subscribe(name, ...)`` does (an existing one: its key range must be
    the same); its information, as ``GET /v1/subscriptions`` lists it."""
    s = served(request)
    name = _name(match)
    doc = await read_json(request, s)
    bounds = {field: key_field(doc, field, nullable=True) if field in doc else None
              for field in ("prefix", "start", "stop")}
    from_lsn = doc.get("from_lsn")
    if from_lsn is not None:
        from_lsn = lsn_field(doc, "from_lsn")
    sub = await _subscribe(s, name, bounds["prefix"], dict(start=bounds["start"], stop=bounds["stop"],
                                                           from_lsn=from_lsn))
    sub.close()
    for info in s.store.subscriptions():
        if info.name == name:
            return json_response(info._asdict())
    raise NotFound(f"no subscription {name!r}: it was dropped meanwhile")


async def subscription_events(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    """The subscription's changes from after its last acknowledged LSN
    (created at ``from_lsn`` by the first call, over ``prefix``/``start``/``stop``)."""
    s = served(request)
    q = match.query
    name = _name(match)
    options = dict(start=q.bytes("start"), stop=q.bytes("stop"), from_lsn=_from_lsn(request, q),
                   timeout=q.number_or_none("timeout", 0.0, MAX_PROGRESS_EVERY),
                   progress_every=q.number_or_none("progress_every", 0.01, MAX_PROGRESS_EVERY))
    async with s.stream_slot(match.token):
        sub = await _subscribe(s, name, q.bytes("prefix"), options)
        s.subscriptions[name] = sub  # acks go to the newest stream's position
        return await _pump(request, s, sub, _wants_ndjson(request, q))


async def subscription_ack(request: web.Request, match: RouteMatch) -> web.Response:
    """Acknowledge every change up to ``lsn`` that the subscription's newest
    stream delivered (durable when it answers), as ``Subscription.ack`` does:
    the server keeps each subscription's newest stream's position for this."""
    s = served(request)
    name = _name(match)
    lsn = lsn_field(await read_json(request, s), "lsn")
    sub = s.subscriptions.get(name)
    if sub is None:
        if read_subscription(s.store.path, name) is None:
            raise NotFound(f"no subscription {name!r}")
        raise ValueError(f"cannot acknowledge LSN {lsn}: no stream of the subscription {name!r} delivered a "
                         f"change since this server started; read its events first")
    await asyncio.get_running_loop().run_in_executor(None, sub.ack, lsn)
    return json_response({"acked_lsn": sub.acked_lsn})


async def subscription_drop(request: web.Request, match: RouteMatch) -> web.Response:
    name = _name(match)
    served(request).subscriptions.pop(name, None)
    if not served(request).store.drop_subscription(name):
        raise NotFound(f"no subscription {name!r}")
    return json_response({"dropped": name})
