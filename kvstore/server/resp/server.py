"""The RESP listener: :class:`RespServer` accepts connections (each a
:class:`~kvstore.server.resp.connection.RespConnection`) on one address,
beside the HTTP face of ``walkv serve`` or alone, serving one store through
its asyncio front.

Stopping (:meth:`RespServer.stop`): stop accepting, give the commands in
flight up to :attr:`~kvstore.server.resp.limits.RespLimits.shutdown_timeout`
seconds to be answered (a write handed to the store is written either way),
then close every connection. The store is closed by whoever opened it, after.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from kvstore.server.auth import Tokens
from kvstore.server.resp.connection import RespConnection
from kvstore.server.resp.limits import RespLimits
from kvstore.server.resp.served import Served
from kvstore.store.aio import AsyncKVStore


class RespServer:
    """Serves ``front`` (the store's asyncio front) over RESP2/RESP3.
    ``read_check``: called before every command that reads keys, to refuse
    it (raising) while this node may not answer reads: a cluster node's
    (:meth:`kvstore.cluster.node.ClusterNode.check_read`)."""

    def __init__(self, front: AsyncKVStore, *, tokens: Tokens | None = None,
                 limits: RespLimits = RespLimits(), read_check: Callable[[], None] | None = None) -> None:
        self.served = Served(front, tokens, limits, read_check)
        self._server: asyncio.base_events.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 6379, *, tls: ssl.SSLContext | None = None) -> str:
        """Listen on ``host:port`` (0: any free port); the URL it answers on
        (``redis://`` or, with ``tls``, ``rediss://``)."""
        loop = asyncio.get_running_loop()
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    backlog=1024)
        self._server = await loop.create_server(lambda: RespConnection(self.served), sock=sock, ssl=tls)
        self.address = (host, sock.getsockname()[1])
        shown = f"[{host}]" if ":" in host else host
        return f"{'rediss' if tls else 'redis'}://{shown}:{self.address[1]}"

    def stop_accepting(self) -> None:
        self.served.stopping = True
        if self._server is not None:
            self._server.close()

    async def drain(self, timeout: float) -> bool:
        """Wait until no connection has an answer waiting for its write, at
        most ``timeout`` seconds; whether none has."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(c.in_flight() for c in list(self.served.clients.values())):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let the commands in flight be answered, close every connection."""
        self.stop_accepting()
        await self.drain(self.served.limits.shutdown_timeout if timeout is None else timeout)
        self.close()

    def close(self) -> None:
        """Stop accepting, stop the keyspace feed and close every connection now."""
        self.stop_accepting()
        self.served.pubsub.close()
        for client in list(self.served.clients.values()):
            client.close()
