"""Servers for the RESP tests, all on loopback and stopped by the fixtures.

* :class:`InProcess`: a :class:`~kvstore.server.resp.RespServer` on an event
  loop of its own thread, over a store the test can also read and write
  directly (fast: no process to start);
* :func:`served_with_resp`: ``walkv serve STORE --resp 127.0.0.1:0`` as a
  subprocess (:class:`tests.server_fixture.ServedStore`), its RESP URL read
  from the line it prints;
* :func:`start_redis`: a real ``redis-server`` without persistence, the
  reference the differential tests compare walkv with.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

import pytest

import kvstore
from kvstore.server.auth import Tokens
from kvstore.server.resp import RespLimits, RespServer
from tests.server_fixture import ServedStore

RESP_LISTENING = re.compile(r"RESP listening on (rediss?://\S+)")


class InProcess:
    """A RESP server for the store at ``path`` in a thread of this process;
    :attr:`store` is the same store, :attr:`port` where it listens."""

    def __init__(self, path: str, *, tokens: Tokens | None = None, limits: RespLimits = RespLimits(),
                 **store_options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="resp-test-loop", daemon=True)
        self.thread.start()
        self.url = self.call(self._start(path, tokens, limits, store_options))
        self.port = int(self.url.rsplit(":", 1)[1])
        self.store: kvstore.KVStore = self.adb.store

    async def _start(self, path: str, tokens: Tokens | None, limits: RespLimits, options: dict) -> str:
        self.adb = await kvstore.open_async(path, **options)
        self.server = RespServer(self.adb, tokens=tokens, limits=limits)
        return await self.server.start("127.0.0.1", 0)

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def client(self, **kwargs: Any) -> Any:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs.setdefault("socket_timeout", 30)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))  # an error is the answer under test: no retries
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def close(self) -> None:
        async def stop() -> None:
            await self.server.stop(5)
            await self.adb.close()

        try:
            self.call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def served_with_resp(store: str, *args: str, **kwargs: Any) -> tuple[ServedStore, int]:
    """``walkv serve STORE --resp 127.0.0.1:0`` and the RESP port it printed."""
    served = ServedStore(store, args=("--resp", "127.0.0.1:0", *args), **kwargs)
    m = served.stdout.wait_for(RESP_LISTENING, 30)
    if m is None:
        served.kill()
        raise AssertionError(f"walkv serve printed no RESP line:\n{served.output()}")
    return served, int(m.group(1).rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(directory: str, *options: str) -> tuple[subprocess.Popen, int]:
    """A ``redis-server`` on a free loopback port, no persistence, with
    ``options`` (skips the test when not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", directory, *options], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("redis-server did not answer PING within 30 s")
