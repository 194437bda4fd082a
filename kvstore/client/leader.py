"""Clients of a cluster (``kvstore.connect([url, url, url])``): a transport
with :class:`~kvstore.client.http.Http`'s face that finds the leader, sends
writes to it, and follows a change of leader (:class:`ClusterHttp`, and
:class:`AsyncClusterHttp` for asyncio).

* The leader is learned from ``GET /v1/cluster`` on any node, and from a
  node's 421 ``NotLeader`` answer, which names it. A write refused with 421
  was not written: it is sent again to the leader named (or found).
* Reads go to the leader by default (``reads="leader"``: a leader answers
  only while its lease holds, so a read sees every acknowledged write), or
  to any node (``reads="any"``: spread over the nodes, possibly stale; pass
  ``min_lsn`` for read-your-writes). A read whose node does not answer is
  sent to another.
* A write whose outcome is unknown (the connection broke after it was sent;
  the leader answered 503: it lost its replicas or its lease with the write
  in its log) raises :class:`~kvstore.client.wire.WriteOutcomeUnknown`, a
  :class:`~wal.errors.OutcomeUnknownError`. It is sent again only when it is
  idempotent: a put of a key to a value, a delete of a key (``PUT`` and
  ``DELETE`` of ``/v1/kv/{key}``). Compare-and-set, transactions, batches and
  conditional deletes are never sent twice by the client. A write that
  never left (the connection was refused) is sent to another node.
* It keeps trying for ``failover_timeout`` seconds (default 30: an election
  takes about a lease), then raises what it met last.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from kvstore.client.http import AsyncHttp, Cert, Http, Params, Verify
from kvstore.client.wire import ServerUnavailable, WriteOutcomeUnknown
from wal.errors import NotLeaderError, OutcomeUnknownError

FAILOVER_TIMEOUT = 30.0
_PAUSES = (0.02, 0.05, 0.1, 0.2, 0.3)


def idempotent(method: str, path: str) -> bool:
    """May this request be sent twice with the same result?"""
    return method in ("GET", "HEAD") or (method in ("PUT", "DELETE") and path.startswith("/v1/kv/"))


def _never_sent(exc: BaseException) -> bool:
    """The request never reached a server (refused, or no connection made)."""
    cause = exc.__cause__
    return isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout))


class _Routing:
    """Which node a request goes to (module docstring); no I/O."""

    def __init__(self, urls: list[str], reads: str, failover_timeout: float) -> None:
        if not urls:
            raise ValueError("kvstore.connect needs at least one URL")
        if reads not in ("leader", "any"):
            raise ValueError(f"reads must be 'leader' or 'any', not {reads!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.reads = reads
        self.failover_timeout = failover_timeout
        self.leader: str | None = None
        self.epoch = 0
        self._spread = itertools.cycle(self.urls)

    def target(self, write: bool) -> str | None:
        if not write and self.reads == "any":
            return next(self._spread)
        return self.leader

    def learn(self, doc: Any) -> None:
        if isinstance(doc, dict) and isinstance(doc.get("leader"), str):
            epoch = doc.get("epoch")
            if type(epoch) is int and epoch < self.epoch:
                return  # an older view than the one we have
            self.leader = doc["leader"].rstrip("/")
            self.epoch = epoch if type(epoch) is int else self.epoch

    def refused(self, exc: NotLeaderError) -> None:
        self.leader = exc.leader.rstrip("/") if isinstance(exc.leader, str) else None
        if isinstance(exc.epoch, int):
            self.epoch = max(self.epoch, exc.epoch)

    def gave_up(self, started: float) -> bool:
        return time.monotonic() - started >= self.failover_timeout

    def after(self, exc: BaseException, method: str, path: str, started: float) -> None:
        """A request failed with ``exc``: return to send it again (elsewhere,
        after a pause), or raise (module docstring)."""
        if isinstance(exc, NotLeaderError):  # refused: nothing was written
            self.refused(exc)
        elif isinstance(exc, (ServerUnavailable, OutcomeUnknownError)):
            self.leader = None
            if method not in ("GET", "HEAD") and not idempotent(method, path) and not _never_sent(exc):
                raise WriteOutcomeUnknown.of(exc, method, path) from exc
        else:
            raise exc
        if self.gave_up(started):
            raise exc

    def no_leader(self, started: float) -> None:
        if self.gave_up(started):
            raise ServerUnavailable(f"no leader among {', '.join(self.urls)} within {self.failover_timeout:g} s "
                                    "(an election, or too few nodes up)")


class ClusterHttp:
    """:class:`~kvstore.client.http.Http`'s face over a cluster's nodes (module docstring)."""

    def __init__(self, urls: list[str], *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
                 cert: Cert = None, max_connections: int = 100, reads: str = "leader",
                 failover_timeout: float = FAILOVER_TIMEOUT) -> None:
        self._route = _Routing(urls, reads, failover_timeout)
        self._options = dict(token=token, timeout=timeout, verify=verify, cert=cert, max_connections=max_connections)
        self._nodes: dict[str, Http] = {}
        self._closed = False
        self.url = self._route.urls[0]

    def _node(self, url: str) -> Http:
        node = self._nodes.get(url)
        if node is None:
            node = self._nodes[url] = Http(url, **self._options)  # type: ignore[arg-type]
        return node

    def _find_leader(self) -> str | None:
        for url in self._route.urls + ([self._route.leader] if self._route.leader else []):
            try:
                self._route.learn(self._node(url).request("GET", "/v1/cluster").json())
            except Exception:  # noqa: BLE001 - a node down or no cluster member: try the next
                continue
            if self._route.leader is not None:
                return self._route.leader
        return None

    def request(self, method: str, path: str, *, params: Params | None = None, json: Any = None,
                content: bytes | None = None, headers: Mapping[str, str] | None = None) -> httpx.Response:
        write = method not in ("GET", "HEAD")
        started = time.monotonic()
        for attempt in itertools.count():
            url = self._route.target(write) or self._find_leader()
            if url is None:
                self._route.no_leader(started)
            else:
                try:
                    return self._node(url).request(method, path, params=params, json=json, content=content,
                                                   headers=headers)
                except (NotLeaderError, ServerUnavailable, OutcomeUnknownError) as exc:
                    self._route.after(exc, method, path, started)
            time.sleep(_PAUSES[min(attempt, len(_PAUSES) - 1)])
        raise AssertionError("unreachable")

    @contextmanager
    def stream(self, method: str, path: str, *, params: Params | None = None,
               headers: Mapping[str, str] | None = None, read_timeout: float | None = None
               ) -> Iterator[httpx.Response]:
        url = self._route.target(False) or self._find_leader() or self._route.urls[0]
        with self._node(url).stream(method, path, params=params, headers=headers,
                                    read_timeout=read_timeout) as resp:
            yield resp

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for node in self._nodes.values():
            node.close()


class AsyncClusterHttp:
    """:class:`ClusterHttp` for asyncio (:class:`~kvstore.client.http.AsyncHttp`'s face)."""

    def __init__(self, urls: list[str], *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
                 cert: Cert = None, max_connections: int = 100, reads: str = "leader",
                 failover_timeout: float = FAILOVER_TIMEOUT) -> None:
        self._route = _Routing(urls, reads, failover_timeout)
        self._options = dict(token=token, timeout=timeout, verify=verify, cert=cert, max_connections=max_connections)
        self._nodes: dict[str, AsyncHttp] = {}
        self._closed = False
        self.url = self._route.urls[0]

    def _node(self, url: str) -> AsyncHttp:
        node = self._nodes.get(url)
        if node is None:
            node = self._nodes[url] = AsyncHttp(url, **self._options)  # type: ignore[arg-type]
        return node

    async def _find_leader(self) -> str | None:
        for url in self._route.urls + ([self._route.leader] if self._route.leader else []):
            try:
                self._route.learn((await self._node(url).request("GET", "/v1/cluster")).json())
            except Exception:  # noqa: BLE001 - a node down or no cluster member: try the next
                continue
            if self._route.leader is not None:
                return self._route.leader
        return None

    async def request(self, method: str, path: str, *, params: Params | None = None, json: Any = None,
                      content: bytes | None = None, headers: Mapping[str, str] | None = None) -> httpx.Response:
        write = method not in ("GET", "HEAD")
        started = time.monotonic()
        for attempt in itertools.count():
            url = self._route.target(write) or await self._find_leader()
            if url is None:
                self._route.no_leader(started)
            else:
                try:
                    return await self._node(url).request(method, path, params=params, json=json, content=content,
                                                         headers=headers)
                except (NotLeaderError, ServerUnavailable, OutcomeUnknownError) as exc:
                    self._route.after(exc, method, path, started)
            await asyncio.sleep(_PAUSES[min(attempt, len(_PAUSES) - 1)])
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def stream(self, method: str, path: str, *, params: Params | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[httpx.Response]:
        url = self._route.target(False) or await self._find_leader() or self._route.urls[0]
        async with self._node(url).stream(method, path, params=params, headers=headers) as resp:
            yield resp

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        for node in self._nodes.values():
            await node.aclose()


Transport = Http | ClusterHttp
"""What a sync client sends through: one server, or a cluster's nodes."""
AsyncTransport = AsyncHttp | AsyncClusterHttp


def transport(url: str | list[str], **options: Any) -> Transport:
    """A list of URLs is a cluster (:class:`ClusterHttp`), one URL one server."""
    if isinstance(url, (list, tuple)):
        return ClusterHttp(list(url), **options)
    options.pop("reads", None)
    options.pop("failover_timeout", None)
    return Http(url, **options)


def async_transport(url: str | list[str], **options: Any) -> AsyncTransport:
    if isinstance(url, (list, tuple)):
        return AsyncClusterHttp(list(url), **options)
    options.pop("reads", None)
    options.pop("failover_timeout", None)
    return AsyncHttp(url, **options)
