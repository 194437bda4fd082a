"""The one load generator of the server benchmarks (:mod:`benchmarks.server`),
run in a child process of its own (:func:`benchmarks.timing.in_child`) so
that its CPU is never the measuring process's.

``clients`` coroutines on one asyncio loop, each with a connection of its
own (HTTP/1.1 keep-alive through one aiohttp ``ClientSession`` whose pool
holds ``clients`` connections; redis-py's asyncio client with a pool of the
same size), each doing one request at a time until the deadline. Every
operation's latency (request sent to answer read) is kept; the result is
``ops``, ``seconds`` and the p50/p99/max latency in milliseconds.

The HTTP servers are driven by the SAME client code: only the request a
dialect builds differs (:class:`Dialect`):

* walkv (``/v1``, docs/http-api.md): ``PUT /v1/kv/{key}`` with the raw value,
  ``GET /v1/kv/{key}``;
* etcd's HTTP JSON gateway (v3 API): ``POST /v3/kv/put`` ``{"key", "value"}``
  and ``POST /v3/kv/range`` ``{"key"}``, base64 in JSON.

Keys are :func:`benchmarks.data.key` (16 bytes; each client its own stream
for puts), values :func:`benchmarks.data.value` (100 bytes). A key in a URL
is percent-encoded bytes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import data

PRELOAD_CLIENTS = 64


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes | None
    headers: dict[str, str]


class Dialect:
    """How one kind of server is asked to put and get a key."""

    def __init__(self, kind: str, token: str | None = None) -> None:
        if kind not in ("walkv", "etcd"):
            raise ValueError(f"no HTTP dialect {kind!r}")
        self.kind = kind
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}

    def put(self, key: bytes, value: bytes) -> Request:
        if self.kind == "walkv":
            return Request("PUT", "/v1/kv/" + urllib.parse.quote(key, safe=""), value,
                           {**self.auth, "Content-Type": "application/octet-stream"})
        body = json.dumps({"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()})
        return Request("POST", "/v3/kv/put", body.encode(), {"Content-Type": "application/json"})

    def get(self, key: bytes) -> Request:
        if self.kind == "walkv":
            return Request("GET", "/v1/kv/" + urllib.parse.quote(key, safe=""), None, self.auth)
        body = json.dumps({"key": base64.b64encode(key).decode()})
        return Request("POST", "/v3/kv/range", body.encode(), {"Content-Type": "application/json"})

    def check_get(self, status: int, body: bytes) -> None:
        """A get must find its key (preloaded): a 404 or an empty range is an error."""
        if status != 200 or (self.kind == "etcd" and b'"kvs"' not in body):
            raise RuntimeError(f"{self.kind} get answered {status}: {body[:200]!r}")


def _summary(latencies: list[float], ops: int, seconds: float, clients: int) -> dict[str, Any]:
    latencies.sort()
    n = len(latencies)
    out: dict[str, Any] = {"ops": ops, "seconds": seconds, "clients": clients}
    if n:
        out.update(p50_ms=round(latencies[n // 2] * 1000, 3), p99_ms=round(latencies[int(n * 0.99)] * 1000, 3),
                   max_ms=round(latencies[-1] * 1000, 3))
    return out


async def _clients(clients: int, seconds: float, one: Callable[[int, int], Awaitable[None]]) -> dict[str, Any]:
    """``clients`` coroutines each awaiting ``one(client, n)`` for n = 1, 2, ...
    until ``seconds`` have passed (after ``one(client, 0)`` for all of them at
    once, untimed: every connection open before the clock starts)."""
    await asyncio.gather(*(one(c, 0) for c in range(clients)))
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    latencies: list[float] = []
    counts = [0] * clients
    start = clock()
    end = loop.time() + seconds

    async def worker(client: int) -> None:
        n = 1
        add = latencies.append
        while loop.time() < end:
            t0 = clock()
            await one(client, n)
            add(clock() - t0)
            n += 1
        counts[client] = n - 1

    await asyncio.gather(*(worker(c) for c in range(clients)))
    return _summary(latencies, sum(counts), clock() - start, clients)


def _key(op: str, client: int, n: int, keys: int) -> bytes:
    if op == "put":
        return data.key(n, client + 1)  # each client its own keys (stream 0 is the preloaded set)
    return data.key((n * 7919 + client * 104729) % keys)


async def _http(url: str, kind: str, op: str, clients: int, seconds: float, keys: int,
                token: str | None) -> dict[str, Any]:
    import aiohttp

    dialect = Dialect(kind, token)
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:
        async def one(client: int, n: int) -> None:
            key = _key(op, client, n, keys)
            req = dialect.put(key, data.value(n)) if op == "put" else dialect.get(key)
            async with session.request(req.method, req.path, data=req.body, headers=req.headers) as resp:
                body = await resp.read()
                if op == "get":
                    dialect.check_get(resp.status, body)
                elif resp.status != 200:
                    raise RuntimeError(f"{kind} {op} answered {resp.status}: {body[:200]!r}")

        return await _clients(clients, seconds, one)


async def _redis(url: str, op: str, clients: int, seconds: float, keys: int) -> dict[str, Any]:
    import redis.asyncio as aioredis

    pool = aioredis.ConnectionPool.from_url(url, max_connections=clients)
    r = aioredis.Redis(connection_pool=pool)
    try:
        async def one(client: int, n: int) -> None:
            key = _key(op, client, n, keys)
            if op == "put":
                await r.set(key, data.value(n))
            elif await r.get(key) is None:
                raise RuntimeError(f"redis get of a preloaded key {key!r} found nothing")

        return await _clients(clients, seconds, one)
    finally:
        await r.aclose()
        await pool.aclose()


def load(url: str, kind: str, op: str, clients: int, seconds: float, keys: int = 10_000,
         token: str | None = None) -> dict[str, Any]:
    """``clients`` clients doing ``op`` (``put`` or ``get``) against ``url``
    for ``seconds`` (module docstring); ``kind``: ``walkv``, ``etcd`` or
    ``redis``. Gets read the ``keys`` keys :func:`preload` wrote."""
    if op not in ("put", "get"):
        raise ValueError(f"no operation {op!r}")
    cpu = time.process_time()
    if kind == "redis":
        out = asyncio.run(_redis(url, op, clients, seconds, keys))
    else:
        out = asyncio.run(_http(url, kind, op, clients, seconds, keys, token))
    out["client_cpu_s"] = round(time.process_time() - cpu, 2)  # near `seconds`: the generator was the limit
    return out


async def _preload_http(url: str, kind: str, keys: int, token: str | None) -> None:
    import aiohttp

    dialect = Dialect(kind, token)
    todo = iter(range(keys))
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=PRELOAD_CLIENTS)) as session:
        async def worker() -> None:
            for i in todo:
                req = dialect.put(data.key(i), data.value(i))
                async with session.request(req.method, req.path, data=req.body, headers=req.headers) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"{kind} preload put answered {resp.status}: {await resp.text()}")

        await asyncio.gather(*(worker() for _ in range(PRELOAD_CLIENTS)))


def preload(url: str, kind: str, keys: int, token: str | None = None) -> dict[str, Any]:
    """Write keys ``0..keys-1`` of stream 0 (what :func:`load`'s gets read)."""
    t0 = time.perf_counter()
    if kind == "redis":
        import redis

        r = redis.Redis.from_url(url)
        try:
            pipe = r.pipeline(transaction=False)
            for i in range(keys):
                pipe.set(data.key(i), data.value(i))
            pipe.execute()
        finally:
            r.close()
    else:
        asyncio.run(_preload_http(url, kind, keys, token))
    return {"ops": keys, "seconds": time.perf_counter() - t0}


WATCH_PREFIX = b"w:"


def _stamped(n: int) -> bytes:
    """A 100-byte value starting with the time it was sent (ns since the epoch)."""
    return time.time_ns().to_bytes(8, "big") + data.value(n)[8:]


async def _watch(url: str, kind: str, writers: int, seconds: float, token: str | None) -> dict[str, Any]:
    import aiohttp

    dialect = Dialect(kind, token)
    delays: list[float] = []
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=writers + 1),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_read=30)) as session:
        if kind == "walkv":
            stream = session.get("/v1/watch", params={"prefix": WATCH_PREFIX.decode()},
                                 headers={**dialect.auth, "Accept": "text/event-stream"})
        else:
            prefix_end = WATCH_PREFIX[:-1] + bytes([WATCH_PREFIX[-1] + 1])
            create = {"create_request": {"key": base64.b64encode(WATCH_PREFIX).decode(),
                                         "range_end": base64.b64encode(prefix_end).decode()}}
            stream = session.post("/v3/watch", json=create)
        async with stream as resp:
            if resp.status != 200:
                raise RuntimeError(f"{kind} watch answered {resp.status}: {await resp.text()}")
            if kind == "etcd":
                await resp.content.readline()  # {"result": {"created": true}}: the watch is in place
            stop = asyncio.Event()

            async def follow() -> None:
                while not stop.is_set():
                    line = await resp.content.readline()
                    if not line:
                        return
                    if kind == "walkv":
                        if not line.startswith(b"data:"):
                            continue
                        event = json.loads(line[5:])
                        values = [event.get("value")]
                    else:
                        values = [e["kv"].get("value") for e in json.loads(line)["result"].get("events", [])]
                    now = time.time_ns()
                    for v in values:
                        if v is not None:
                            delays.append((now - int.from_bytes(base64.b64decode(v)[:8], "big")) / 1e9)

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.2)  # walkv's stream has no "created" event: let it start
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            counts = [0] * writers

            async def writer(client: int) -> None:
                n = 0
                while loop.time() < end:
                    req = dialect.put(WATCH_PREFIX + data.key(n, client), _stamped(n))
                    async with session.request(req.method, req.path, data=req.body, headers=req.headers) as r:
                        if r.status != 200:
                            raise RuntimeError(f"{kind} put answered {r.status}: {await r.text()}")
                    n += 1
                counts[client] = n

            start = time.perf_counter()
            await asyncio.gather(*(writer(c) for c in range(writers)))
            total = sum(counts)
            deadline = loop.time() + 10
            while len(delays) < total and loop.time() < deadline and not follower.done():
                await asyncio.sleep(0.01)
            took = time.perf_counter() - start
            stop.set()
            follower.cancel()
    out = _summary(delays, len(delays), took, writers)
    out["puts"] = total
    return out


def watch(url: str, kind: str, writers: int, seconds: float, token: str | None = None) -> dict[str, Any]:
    """One watcher of a prefix while ``writers`` clients put into it for
    ``seconds``; each value carries the time its put was sent, so the
    latencies are "put sent -> change in the watcher's hands" (the put's
    fsync included). ``ops``: changes delivered."""
    return asyncio.run(_watch(url, kind, writers, seconds, token))


async def _paced(url: str, kind: str, rate: float, clients: int, seconds: float, token: str | None,
                 acks: list[tuple[int, int]] | None) -> dict[str, Any]:
    import aiohttp

    dialect = Dialect(kind, token)
    latencies: list[float] = []
    counts = [0] * clients
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients)) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        step = clients / rate

        async def worker(client: int) -> None:
            n = 0
            while True:
                due = start + (n + client / clients) * step
                now = loop.time()
                if now - start >= seconds:
                    break
                if due > now:
                    await asyncio.sleep(due - now)
                req = dialect.put(data.key(n % 10_000, client + 1), data.value(n))
                t0 = time.perf_counter()
                async with session.request(req.method, req.path, data=req.body, headers=req.headers) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{kind} put answered {r.status}: {body[:200]!r}")
                latencies.append(time.perf_counter() - t0)
                if acks is not None:
                    acks.append((json.loads(body)["lsn"], time.time_ns()))
                n += 1
            counts[client] = n

        await asyncio.gather(*(worker(c) for c in range(clients)))
        took = loop.time() - start
    return _summary(latencies, sum(counts), took, clients)


def paced(url: str, kind: str, rate: float, clients: int, seconds: float, token: str | None = None,
          acks_path: str | None = None) -> dict[str, Any]:
    """Puts at ``rate`` per second in all (each of ``clients`` clients paced
    at ``rate / clients``; a client behind its schedule goes on at once, so
    the rate achieved is what the server sustains when it is less).
    ``acks_path`` (walkv): write each put's ``LSN ack_time_ns`` there, a line each."""
    acks: list[tuple[int, int]] | None = [] if acks_path else None
    out = asyncio.run(_paced(url, kind, rate, clients, seconds, token, acks))
    if acks_path and acks is not None:
        with open(acks_path, "w") as f:
            f.writelines(f"{lsn} {ns}\n" for lsn, ns in acks)
    return out
