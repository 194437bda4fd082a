"""What every handler of walkv's HTTP server shares: the served store
(:class:`Served`), the server's limits (:class:`Limits`) and the parsing of a
request's raw query and body into checked values (every bad value is
:class:`~kvstore.client.wire.BadRequest`, a 400)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kvstore.client.wire import MAX_PAGE, BadRequest, PayloadTooLarge, TooManyStreams, b64decode
from kvstore.server.auth import Tokens
from kvstore.store.aio import AsyncKVStore
from kvstore.store.store import KVStore
from kvstore.watch.subscription import Subscription
from kvstore.watch.watcher import AsyncWatcher
from wal.errors import ReplicaLagError

MAX_LSN = (1 << 63) - 1


@dataclass(frozen=True)
class Limits:
    """The server's limits (each bounds what one client can make it hold)."""

    max_body_bytes: int | None = None
    """Largest request body (None: the store's largest log record); over it: 413."""
    max_streams: int = 256
    """Open watch and subscription streams; one more: 429 ``TooManyStreams``."""
    max_connections: int = 1024
    """Open connections; more are closed at once (after a 503 when possible)."""
    idle_timeout: float = 15.0
    """Seconds a connection may stay idle, or take to send a request's
    headers, before it is closed (aiohttp's keep-alive timer, which runs from
    the connection's start and after each answer): a slow client is cut."""
    body_timeout: float = 30.0
    """Seconds a request may take to send its body."""
    max_page: int = MAX_PAGE
    """Most items of one scan page (the default page is 1,000)."""
    shutdown_timeout: float = 10.0
    """Seconds SIGTERM gives the requests in flight to finish (their bodies
    are still read meanwhile) before they are cancelled."""


class InFlight:
    """The requests inside a handler: ``with in_flight:`` around each
    (the app's middleware), :meth:`none` to wait until there are none."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()  # set while the count is 0
        self._idle.set()

    def __enter__(self) -> None:
        self.count += 1
        self._idle.clear()

    def __exit__(self, *exc: object) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def none(self, timeout: float) -> bool:
        """Wait until no request is in a handler, at most ``timeout`` seconds; whether none is."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


class Served:
    """The store an app serves, with the app's limits, tokens and open streams."""

    def __init__(self, db: KVStore | AsyncKVStore, tokens: Tokens | None, limits: Limits,
                 owns_store: bool) -> None:
        self._db = db
        self.tokens = tokens
        self.limits = limits
        self.owns_store = owns_store
        self.adb: AsyncKVStore | None = db if isinstance(db, AsyncKVStore) else None
        self.store: KVStore = db.store if isinstance(db, AsyncKVStore) else db
        self.streams: weakref.WeakSet[AsyncWatcher] = weakref.WeakSet()
        self.stream_count = 0
        self.subscriptions: dict[str, Subscription] = {}  # name -> its newest stream's (for acks)
        self.shutting_down = False
        self.in_flight = InFlight()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the asyncio front on the serving loop (at the app's startup)
        unless the app was given one."""
        if self.adb is None:
            self.adb = AsyncKVStore(self.store, loop)

    @property
    def front(self) -> AsyncKVStore:
        """The asyncio front every write goes through."""
        if self.adb is None:
            raise RuntimeError("the app was not started (aiohttp calls its on_startup hooks)")
        return self.adb

    @property
    def max_body(self) -> int:
        if self.limits.max_body_bytes is not None:
            return self.limits.max_body_bytes
        return self.store.max_record_bytes or (self.store.max_value_bytes + 64 * 1024)

    @contextlib.asynccontextmanager
    async def stream_slot(self) -> AsyncIterator[None]:
        """One of the :attr:`Limits.max_streams` slots, for the block."""
        if self.stream_count >= self.limits.max_streams:
            raise TooManyStreams(f"this server already has {self.stream_count} open streams (its cap, "
                                 f"--max-streams); close one or retry later")
        self.stream_count += 1
        try:
            yield
        finally:
            self.stream_count -= 1

    async def end_streams(self) -> None:
        """The server is stopping: the open watch and subscription streams
        end now (their clients resume elsewhere or later), new ones are refused."""
        self.shutting_down = True
        for watcher in list(self.streams):
            await watcher.aclose()

    async def drain(self, timeout: float) -> bool:
        """End the streams, then wait until no request is in a handler, at
        most ``timeout`` seconds; whether none is."""
        await self.end_streams()
        await asyncio.sleep(0)  # a request whose headers were read already enters its handler
        return await self.in_flight.none(timeout)

    async def wait_applied(self, q: "Query") -> None:
        """``min_lsn``: wait (bounded by ``min_lsn_timeout``, default 5 s, at
        most 60) until that LSN is applied; ReplicaLagError (503) after."""
        target = q.integer("min_lsn", None, 0, MAX_LSN)
        timeout = q.number("min_lsn_timeout", 5.0, 0.0, 60.0)  # checked whether or not a wait happens
        if target is None or self.store.applied_lsn >= target:
            return
        deadline = time.monotonic() + timeout
        pause = 0.001
        while (applied := self.store.applied_lsn) < target:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplicaLagError(f"LSN {target} was not applied within {timeout:g} s (applied: LSN {applied}); "
                                      f"retry, or read without min_lsn", applied_lsn=applied, target_lsn=target)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)


SERVED: web.AppKey[Served] = web.AppKey("walkv_served", Served)


def served(request: web.Request) -> Served:
    return request.app[SERVED]


class Query:
    """A request's query string, decoded from the raw target: names as text,
    values as bytes (``urllib.parse.unquote_to_bytes``), so a key parameter
    carries any byte string. A name not in ``allowed`` (the route's) is a
    400, and so is a name given twice: a parameter is never silently ignored
    or overridden."""

    def __init__(self, raw: str, allowed: frozenset[str]) -> None:
        self.values: dict[str, bytes] = {}
        for part in raw.split("&"):
            if not part:
                continue
            raw_name, _, value = part.partition("=")
            name = urllib.parse.unquote(raw_name.replace("+", " "))
            if name not in allowed:
                takes = ", ".join(sorted(allowed)) or "none"
                raise BadRequest(f"unknown query parameter {name[:40]!r} (this endpoint takes: {takes}; "
                                 f"docs/http-api.md)")
            if name in self.values:
                raise BadRequest(f"query parameter {name} is given twice")
            self.values[name] = urllib.parse.unquote_to_bytes(value)

    def bytes(self, name: str) -> bytes | None:
        return self.values.get(name)

    def text(self, name: str, default: str | None = None) -> str | None:
        raw = self.values.get(name)
        if raw is None:
            return default
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"query parameter {name} must be UTF-8 text") from None

    def integer(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        text = self.text(name)
        if text is None or text == "":
            return default
        try:
            value = int(text)
        except ValueError:
            raise BadRequest(f"query parameter {name} must be an integer, not {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise BadRequest(f"query parameter {name} must be between {lo} and {hi}, not {value}")
        return value

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        value = self.number_or_none(name, lo, hi)
        return default if value is None else value

    def number_or_none(self, name: str, lo: float, hi: float) -> float | None:
        text = self.text(name)
        if text is None or text == "":
            return None
        try:
            value = float(text)
        except ValueError:
            raise BadRequest(f"query parameter {name} must be a number, not {text[:40]!r}") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise BadRequest(f"query parameter {name} must be between {lo:g} and {hi:g}, not {text[:40]!r}")
        return value

    def flag(self, name: str) -> bool:
        text = self.text(name, "0")
        if text not in ("0", "1", "true", "false"):
            raise BadRequest(f"query parameter {name} must be 0 or 1, not {text!r}")
        return text in ("1", "true")


async def read_body(request: web.Request, served_: Served) -> bytes:
    """The request body, bounded in size (413) and in time (:attr:`Limits.body_timeout`)."""
    limit = served_.max_body
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the request body of {request.content_length} bytes is over this server's "
                              f"limit of {limit} bytes")
    length = request.content_length
    head = b""
    if length is not None:  # a small body usually arrived with the headers: no timer needed
        head = request.content.read_nowait(length)
        if len(head) == length:
            return head
    try:
        async with asyncio.timeout(served_.limits.body_timeout):
            if length is not None:
                return head + await request.content.readexactly(length - len(head))
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the request body is over this server's limit of {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise BadRequest(f"the request body took longer than {served_.limits.body_timeout:g} s") from None
    except asyncio.IncompleteReadError:
        raise BadRequest("the request body ended before its Content-Length") from None


async def read_json(request: web.Request, served_: Served) -> dict[str, Any]:
    """The JSON object of the body (BadRequest when it is not one)."""
    body = await read_body(request, served_)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the request body's JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(doc).__name__}")
    return doc


def key_field(doc: dict[str, Any], name: str, *, nullable: bool = False) -> bytes | None:
    """A base64 key or value field of a JSON object; ``nullable``: null is
    allowed (an unbounded range end). A missing field is always an error: a
    ``delete_range`` without its bounds must not mean "everything"."""
    if name not in doc:
        raise BadRequest(f"missing field {name!r}" + (" (null for unbounded)" if nullable else ""))
    value = doc[name]
    if value is None:
        if nullable:
            return None
        raise BadRequest(f"field {name!r} must not be null")
    return b64decode(value, name)


def lsn_field(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if type(value) is not int or not 0 <= value <= MAX_LSN:
        raise BadRequest(f"field {name!r} must be an LSN (an integer >= 0), not {value!r}")
    return value


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(doc), status=status, content_type="application/json", headers=headers)
