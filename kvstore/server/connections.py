"""The cap on open connections (:attr:`~kvstore.server.context.Limits.max_connections`).

:func:`guarded_server` wraps aiohttp's protocol factory: a connection
beyond the cap gets a ``429`` JSON answer (``TooManyStreams``) and is closed
at once, so it holds neither a slot nor a handler. Slow clients are the
keep-alive timer's (:attr:`~kvstore.server.context.Limits.idle_timeout`):
aiohttp closes a connection that has not sent a whole request's headers
within it. No connection holds a thread: each is a coroutine of the one
event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from kvstore.client.wire import TooManyStreams, error_body
from kvstore.server.context import Limits, dumps


class _Refused(asyncio.Protocol):
    """Answers 429 and closes: the connection is over the cap."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        status, body = error_body(TooManyStreams("this server is at its cap on open connections; retry later"))
        payload = dumps(body)
        head = (f"HTTP/1.1 {status} Too Many Requests\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        assert isinstance(transport, asyncio.Transport)
        transport.write(head + payload)
        transport.close()


def guarded_server(server: web.Server, limits: Limits) -> Callable[[], asyncio.BaseProtocol]:
    """A protocol factory: aiohttp's, until :attr:`Limits.max_connections` are open."""

    def factory() -> asyncio.BaseProtocol:
        if len(server.connections) >= limits.max_connections:
            return _Refused()
        return server()

    return factory
