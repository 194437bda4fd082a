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

from kvstore.client.wire import MAX_PAGE, BadRequest, ServerUnavailable, TooManyStreams
from kvstore.server.auth import Tokens
from kvstore.store.aio import AsyncKVStore
from kvstore.store.store import KVStore
from kvstore.watch.aio import AsyncWatcher
from kvstore.watch.subscription import Subscription
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
    max_answer_bytes: int = 8 << 20
    """Most key and value bytes in one answer of a scan page, a ``get_many``
    or ``/v1/log/entries`` (one item always fits, however big): a scan page
    or log answer ends early (its continuation says where to go on); a
    ``get_many`` over it is 413 ``AnswerTooLarge`` saying how many of its keys fit."""
    max_json_bytes: int = 8 << 20
    """Largest JSON request body (get_many, batch, txn, ...): far below a
    value's limit, as a JSON body is parsed whole (:mod:`kvstore.server.bodies`)."""
    max_json_items: int = 250_000
    """Most elements of one JSON body; over it: 413 before it is parsed."""
    max_streams_per_token: int | None = None
    """Open streams one token may hold (None: an equal share of
    :attr:`max_streams` per token of the tokens file); one more: 429."""
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
        self.streams_of: dict[int | None, int] = {}  # open streams per token (its index in the tokens file)
        self.subscriptions: dict[str, Subscription] = {}  # name -> its newest stream's (for acks)
        self.shutting_down = False
        self._stopping: asyncio.Event | None = None  # set with shutting_down (made on the serving loop)
        self.in_flight = InFlight()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the asyncio front on the serving loop (at the app's startup)
        unless the app was given one."""
        if self.adb is None:
            self.adb = AsyncKVStore(self.store, loop)
        self._stopping = asyncio.Event()

    async def pause(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when the server starts stopping meanwhile;
        whether it is stopping (a wait then ends at once, with an answer)."""
        if self._stopping is None or self.shutting_down:
            return self.shutting_down
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        return self.shutting_down

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
    async def stream_slot(self, token: int | None) -> AsyncIterator[None]:
        """One of the :attr:`Limits.max_streams` slots, for the block, within
        the share of ``token`` (its index in the tokens file; None: no tokens)."""
        share = self.stream_share()
        held = self.streams_of.get(token, 0)
        if self.stream_count >= self.limits.max_streams:
            raise TooManyStreams(f"this server already has {self.stream_count} open streams (its cap, "
                                 f"--max-streams); close one or retry later")
        if held >= share:
            raise TooManyStreams(f"this token already holds {held} open streams, its share of this server's "
                                 f"(--max-streams-per-token); close one or retry later")
        self.stream_count += 1
        self.streams_of[token] = held + 1
        try:
            yield
        finally:
            self.stream_count -= 1
            self.streams_of[token] -= 1

    def stream_share(self) -> int:
        """The streams one token may hold (:attr:`Limits.max_streams_per_token`)."""
        if self.limits.max_streams_per_token is not None:
            return self.limits.max_streams_per_token
        if not self.tokens:
            return self.limits.max_streams
        return max(1, -(-self.limits.max_streams // len(self.tokens)))

    async def end_streams(self) -> None:
        """The server is stopping: the open watch and subscription streams
        end now (their clients resume elsewhere or later), new ones are refused."""
        self.shutting_down = True
        if self._stopping is not None:
            self._stopping.set()  # long polls and min_lsn waits end now (pause)
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
        most 60) until that LSN is applied; ReplicaLagError (503) after, and
        ServerUnavailable (503) at once when the server starts stopping."""
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
            if await self.pause(min(pause, left)):
                raise ServerUnavailable(f"this server is stopping before LSN {target} was applied (applied: LSN "
                                        f"{applied}); read from another server, or once it is back")
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


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(doc), status=status, content_type="application/json", headers=headers)
