"""Pub/sub on the RESP face: who is subscribed to what, and the messages
they are sent (Redis's SUBSCRIBE, PSUBSCRIBE, PUBLISH).

:class:`PubSub` holds every connection's channels and patterns (Redis's
globs, :mod:`kvstore.server.resp.glob`) and sends each message to the
subscribers of its channel (``message``) and of each pattern it matches
(``pmessage``): an array in RESP2, a push frame (``>``) in RESP3. Messages
come from PUBLISH (at once, held nowhere: a subscriber that is not connected
misses them, as in Redis) and from the store's writes as keyspace
notifications (:mod:`kvstore.server.resp.keyspace_feed`, which runs only
while someone is subscribed to a pattern or to a ``__keyspace@``/``__keyevent@``
channel; :mod:`kvstore.server.resp.notify` names the events).

A slow subscriber: messages go to its transport's buffer without waiting (the
loop never waits for a reader); when that buffer holds more than
:attr:`~kvstore.server.resp.limits.RespLimits.max_pubsub_output_bytes` the
connection is dropped, its buffer with it, as Redis's ``client-output-buffer-limit
pubsub`` hard limit does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from kvstore.server.resp.glob import Match, compile_glob
from kvstore.server.resp.keyspace_feed import KeyspaceFeed
from kvstore.server.resp.notify import CLASS_OF, DEFAULT_FLAGS, KEYEVENT, KEYSPACE, Event, parse_flags
from kvstore.store.store import KVStore

_KEYSPACE_PREFIXES = (b"__keyspace@", b"__keyevent@")


class Subscriber(Protocol):
    """What pub/sub needs of a connection."""

    id: int
    resp3: bool
    channels: dict[bytes, None]
    patterns: dict[bytes, None]

    def push(self, frame: bytes) -> None: ...


def bulk(data: bytes | None, resp3: bool) -> bytes:
    if data is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    return b"$%d\r\n%b\r\n" % (len(data), data)


def confirmation(kind: bytes, name: bytes | None, count: int, resp3: bool) -> bytes:
    """The answer of (P)SUBSCRIBE / (P)UNSUBSCRIBE for one channel or pattern."""
    return (b">3\r\n" if resp3 else b"*3\r\n") + bulk(kind, resp3) + bulk(name, resp3) + b":%d\r\n" % count


class PubSub:
    """Every subscription of one RESP listener, and the keyspace feed they need."""

    def __init__(self, store: KVStore, on_feed_failed: Callable[[BaseException], None] | None = None) -> None:
        self.store = store
        self.channels: dict[bytes, dict[Subscriber, None]] = {}
        self.patterns: dict[bytes, tuple[Match, dict[Subscriber, None]]] = {}
        self.flags = parse_flags(DEFAULT_FLAGS)
        """``notify-keyspace-events`` (CONFIG GET/SET)."""
        self.feed: KeyspaceFeed | None = None
        """The store's writes as notifications, while a subscription needs them."""
        self._keyspace_channels = 0
        self._on_feed_failed = on_feed_failed

    # -- subscriptions ----------------------------------------------------------------------

    def subscribe(self, who: Subscriber, channel: bytes) -> None:
        if channel in who.channels:
            return
        who.channels[channel] = None
        self.channels.setdefault(channel, {})[who] = None
        if channel.startswith(_KEYSPACE_PREFIXES):
            self._keyspace_channels += 1
        self._need_feed()

    def unsubscribe(self, who: Subscriber, channel: bytes) -> bool:
        if who.channels.pop(channel, self) is self:
            return False
        subscribers = self.channels[channel]
        del subscribers[who]
        if not subscribers:
            del self.channels[channel]
        if channel.startswith(_KEYSPACE_PREFIXES):
            self._keyspace_channels -= 1
        self._need_feed()
        return True

    def psubscribe(self, who: Subscriber, pattern: bytes) -> None:
        if pattern in who.patterns:
            return
        who.patterns[pattern] = None
        if pattern not in self.patterns:
            self.patterns[pattern] = (compile_glob(pattern), {})
        self.patterns[pattern][1][who] = None
        self._need_feed()

    def punsubscribe(self, who: Subscriber, pattern: bytes) -> bool:
        if who.patterns.pop(pattern, self) is self:
            return False
        subscribers = self.patterns[pattern][1]
        del subscribers[who]
        if not subscribers:
            del self.patterns[pattern]
        self._need_feed()
        return True

    def drop(self, who: Subscriber) -> None:
        """``who`` is gone (or RESET): every subscription of it ends."""
        for channel in list(who.channels):
            self.unsubscribe(who, channel)
        for pattern in list(who.patterns):
            self.punsubscribe(who, pattern)

    def _need_feed(self) -> None:
        wanted = bool(self.patterns or self._keyspace_channels)
        if wanted and self.feed is None:
            self.feed = KeyspaceFeed(self.store, asyncio.get_running_loop(), self.notify, lambda: self.flags,
                                     self._feed_failed)
        elif not wanted and self.feed is not None:
            self.close()

    def _feed_failed(self, exc: BaseException) -> None:
        self.feed = None
        if self._on_feed_failed is not None:
            self._on_feed_failed(exc)

    def close(self) -> None:
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.close()

    # -- messages ----------------------------------------------------------------------------

    def publish(self, channel: bytes, message: bytes) -> int:
        """Send ``message`` to the subscribers of ``channel`` and of the
        patterns it matches; how many it was sent to."""
        sent = 0
        subscribers = self.channels.get(channel)
        if subscribers:
            body = b"$7\r\nmessage\r\n" + bulk(channel, False) + bulk(message, False)
            for who in list(subscribers):
                who.push((b">3\r\n" if who.resp3 else b"*3\r\n") + body)
            sent += len(subscribers)
        for pattern, (match, subscribers) in list(self.patterns.items()):
            if match(channel):
                body = b"$8\r\npmessage\r\n" + bulk(pattern, False) + bulk(channel, False) + bulk(message, False)
                for who in list(subscribers):
                    who.push((b">4\r\n" if who.resp3 else b"*4\r\n") + body)
                sent += len(subscribers)
        return sent

    def notify(self, events: list[Event], flags: int) -> None:
        """Publish keyspace notifications (:mod:`kvstore.server.resp.notify`) as ``flags`` choose."""
        for db, key, event in events:
            if not flags & CLASS_OF.get(event, 0):
                continue
            if flags & KEYSPACE:
                self.publish(b"__keyspace@%d__:%b" % (db, key), event)
            if flags & KEYEVENT:
                self.publish(b"__keyevent@%d__:%b" % (db, event), key)

    def numpat(self) -> int:
        return len(self.patterns)
