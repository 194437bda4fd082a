"""The connections: their cap (:attr:`~kvstore.server.context.Limits.max_connections`)
and the answer to a request that is not HTTP.

:func:`guarded_server` wraps aiohttp's protocol factory: a connection
beyond the cap gets a ``429`` JSON answer (``TooManyStreams``) and is closed
at once, so it holds neither a slot nor a handler. Slow clients are the
keep-alive timer's (:attr:`~kvstore.server.context.Limits.idle_timeout`):
aiohttp closes a connection that has not sent a whole request's headers
within it. No connection holds a thread: each is a coroutine of the one
event loop.

A request aiohttp cannot parse (not HTTP, a header line over 16 KiB, ...)
is answered by :class:`JsonErrorsHandler`: the one JSON error shape, a 4xx,
and a message that echoes none of the request (a header may hold a token),
then the connection is closed; it is logged at debug level only (a port on
the internet gets such traffic all day).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from kvstore.client.wire import BadRequest, InternalError, PayloadTooLarge, TooManyStreams, error_body
from kvstore.server.context import Limits, dumps

logger = logging.getLogger("kvstore.server")


class JsonErrorsHandler(RequestHandler):
    """aiohttp's connection handler, answering unparsable requests in the
    JSON error shape (module docstring)."""

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already; the connection is closed")
        problem: Exception
        if status >= 500:
            logger.error("walkv server: internal error in the HTTP layer", exc_info=exc)
            problem = InternalError("internal error in the walkv server's HTTP layer; this is a bug")
        else:
            logger.debug("walkv server: an unparsable request (%s)", type(exc).__name__)
            kind = PayloadTooLarge if status == 413 else BadRequest
            problem = kind(f"the request is not valid HTTP/1.1 or is over this server's limits "
                           f"({type(exc).__name__}: a request line or header over 16 KiB, a bad method or "
                           f"header, ...); the connection is closed")
        response = web.Response(status=status, body=dumps(error_body(problem)[1]), content_type="application/json")
        response.force_close()
        return response


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
    """A protocol factory: aiohttp's handlers (:class:`JsonErrorsHandler`),
    until :attr:`Limits.max_connections` are open."""

    def factory() -> asyncio.BaseProtocol:
        if len(server.connections) >= limits.max_connections:
            return _Refused()
        # as web.Server() makes its handler, with the JSON error answers
        return JsonErrorsHandler(server, loop=server._loop, **server._kwargs)

    return factory
