"""What every connection of the RESP face shares: the served store and its
asyncio front, the tokens, the limits, the SCAN cursors, the open
connections, their subscriptions and the counters INFO shows."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from kvstore.server.auth import ADMIN, OPEN, Tokens
from kvstore.server.resp.keyview import DATABASES, StateView, keyspace_of
from kvstore.server.resp.limits import RespLimits
from kvstore.server.resp.pubsub import PubSub
from kvstore.server.resp.replies import RespError
from kvstore.store.aio import AsyncKVStore
from kvstore.store.store import KVStore


class Client(Protocol):
    """What CLIENT LIST/INFO and the shutdown see of a connection."""

    id: int
    name: bytes | None
    db: int
    created: float
    peer: str

    channels: dict[bytes, None]
    patterns: dict[bytes, None]

    def describe(self) -> str: ...
    def in_flight(self) -> int: ...
    def close(self) -> None: ...


class Served:
    """The store one RESP listener serves (``front``: the asyncio front every
    write goes through, shared with the HTTP face in ``walkv serve``)."""

    def __init__(self, front: AsyncKVStore, tokens: Tokens | None, limits: RespLimits,
                 read_check: Callable[[], None] | None = None) -> None:
        self.front = front
        self.read_check = read_check
        """Raises while reads may not be answered (:class:`~kvstore.server.resp.server.RespServer`); None: never."""
        self.store: KVStore = front.store
        self.tokens = tokens
        self.limits = limits
        self.now_us: Callable[[], int] = self.store._expiring.clock.now_us  # the store's expiry clock
        self.max_value = self.store.max_value_bytes
        self.max_payload = self.store._max_payload
        self.max_request = (limits.max_request_bytes if limits.max_request_bytes is not None
                            else (self.store.max_record_bytes or self.max_value + 1024) + 64 * 1024)
        self.open_role = ADMIN if tokens is None else OPEN
        """The role of a connection before AUTH: every role without tokens, none with them."""
        self.clients: dict[int, Client] = {}
        self._ids = itertools.count(1)
        self.started = time.time()
        self.commands = 0
        self.connections_received = 0
        self.connections_rejected = 0
        self.stopping = False
        self._views: dict[int, StateView] = {}
        self.cursors = ScanCursors(limits.max_cursors)
        self.pubsub = PubSub(self.store, self._notifications_failed)
        self.output_limit_disconnections = 0

    def _notifications_failed(self, exc: BaseException) -> None:
        """The keyspace feed ended (the store closed, its history forked):
        its subscribers are disconnected, as a Redis client is when its
        server goes, rather than left waiting for messages that cannot come."""
        for client in list(self.clients.values()):
            if client.channels or client.patterns:
                client.close()

    def next_id(self) -> int:
        return next(self._ids)

    def view(self, db: int) -> StateView:
        """Database ``db``'s reads now."""
        view = self._views.get(db)
        if view is None:
            ks = keyspace_of(db)
            reads: Any = self.store.keyspace(ks) if ks else self.store
            view = self._views[db] = StateView(db, reads, self.now_us)
        return view

    def writable(self, db: int) -> str:
        """Database ``db``'s keyspace, checked before a write into it is logged."""
        if not 0 <= db < DATABASES:
            raise RespError("ERR DB index is out of range")
        return self.store._keyspaces.writable(keyspace_of(db))


class ScanCursors:
    """SCAN's cursors: a number that stands for (database, the last key
    returned), so that a scan goes on after that key however the keys
    changed meanwhile. The newest ``kept`` are remembered."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._after: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        self._ids = itertools.count(1)

    def issue(self, db: int, last_key: bytes) -> int:
        cursor = next(self._ids)
        self._after[cursor] = (db, last_key)
        while len(self._after) > self._kept:
            self._after.popitem(last=False)
        return cursor

    def resume(self, cursor: int, db: int) -> bytes | None:
        """The key a scan goes on after (None: from the start)."""
        if cursor == 0:
            return None
        found = self._after.get(cursor)
        if found is None or found[0] != db:
            raise RespError(f"ERR invalid cursor (this server keeps its {self._kept} newest cursors; "
                            f"start again from 0)")
        self._after.move_to_end(cursor)
        return found[1]
