"""The aiohttp application of walkv's HTTP API: :func:`make_app` (routes in
docs/http-api.md).

One middleware stands in front of every handler (:func:`_guard`): it
finds the handler (``/v1/kv/...`` by the RAW path, so that a key holding
``/``, ``..`` or ``%2F`` is never taken for another route), checks the
token's role (:mod:`kvstore.server.auth`), and turns every exception into
the one JSON error shape with its status (:func:`kvstore.client.wire.error_body`):
4xx for what the request did wrong, 503 for a failing store, 500 only for a
bug, whose traceback goes to the server's log, never to the client. It
also counts the requests in flight, which a stopping server lets finish
(:func:`drain`).

An app mounted in a server of your own: ``await drain(app, timeout)``
(:func:`drain`) before ``runner.cleanup()``, as :func:`kvstore.server.serve`
does, or a request whose body is still arriving at the stop is cut
(aiohttp's cleanup closes connections first and reads nothing more from them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from kvstore.client.wire import BadRequest, NotFound, PayloadTooLarge, error_body
from kvstore.server import admin, kv, log, streams
from kvstore.server.auth import ADMIN, OPEN, READ, WRITE, Tokens
from kvstore.server.context import SERVED, Limits, Served, json_response
from kvstore.store.aio import AsyncKVStore
from kvstore.store.store import KVStore

logger = logging.getLogger("kvstore.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_KV: dict[str, tuple[Handler, int]] = {
    "GET": (kv.get_key, READ), "HEAD": (kv.get_key, READ),
    "PUT": (kv.put_key, WRITE), "DELETE": (kv.delete_key, WRITE),
}
ROUTES: list[tuple[str, str, Handler, int]] = [
    ("GET", "/v1/info", kv.info, READ),
    ("GET", "/v1/count", kv.count, READ),
    ("GET", "/v1/scan", kv.scan, READ),
    ("POST", "/v1/get_many", kv.get_many, READ),
    ("POST", "/v1/delete_range", kv.delete_range, WRITE),
    ("POST", "/v1/batch", kv.batch, WRITE),
    ("POST", "/v1/txn", kv.txn, WRITE),
    ("GET", "/v1/watch", streams.watch, READ),
    ("GET", "/v1/subscriptions", streams.subscriptions, READ),
    ("GET", "/v1/subscriptions/{name}/events", streams.subscription_events, WRITE),
    ("POST", "/v1/subscriptions/{name}/ack", streams.subscription_ack, WRITE),
    ("DELETE", "/v1/subscriptions/{name}", streams.subscription_drop, WRITE),
    ("GET", "/v1/log/bounds", log.bounds, READ),
    ("GET", "/v1/log/entries", log.entries, READ),
    ("GET", "/v1/log/segment", log.segment, READ),
    ("GET", "/v1/snapshots", log.snapshots, READ),
    ("GET", "/v1/snapshots/{lsn}/{name}", log.snapshot_file, READ),
    ("POST", "/v1/admin/snapshot", admin.take_snapshot, ADMIN),
    ("POST", "/v1/admin/sync", admin.sync, WRITE),
    ("GET", "/v1/stats", admin.stats, ADMIN),
    ("GET", "/metrics", admin.metrics, ADMIN),
    ("GET", "/healthz", admin.healthz, OPEN),
    ("GET", "/readyz", admin.readyz, OPEN),
]
_ROLE: dict[Handler, int] = {handler: role for _, _, handler, role in ROUTES}


def _http_error(exc: web.HTTPException) -> Exception:
    if exc.status == 404:
        return NotFound("no such route; see docs/http-api.md for the /v1 API")
    if exc.status == 405:
        return BadRequest(f"method not allowed here (allowed: {exc.headers.get('Allow', '?')})")
    if exc.status == 413:
        return PayloadTooLarge(f"the request body is over this server's limit: {exc.text}")
    return BadRequest(f"HTTP {exc.status}: {exc.reason}")


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    s = request.app[SERVED]
    with s.in_flight:  # a stopping server waits for it (drain)
        response = await _answer(request, handler, s)
    if s.shutting_down:
        response.force_close()  # the client's next request goes on a new connection, to a server that runs
    return response


async def _answer(request: web.Request, handler: Handler, s: Served) -> web.StreamResponse:
    try:
        if request.raw_path.startswith(kv.KV_PREFIX):
            found = _KV.get(request.method)
            if found is None:
                raise BadRequest(f"{request.method} is not allowed on /v1/kv/{{key}} (GET, HEAD, PUT, DELETE)")
            handler, role = found
        else:
            route_handler = getattr(request.match_info.route, "handler", None)
            role = _ROLE.get(route_handler, READ)  # type: ignore[arg-type]
        if s.tokens is not None:
            s.tokens.check(request.headers.get("Authorization"), role)
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        problem: BaseException = _http_error(exc)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        problem = exc
    status, body = error_body(problem)
    if status == 500:
        logger.error("walkv server: internal error on %s %s", request.method, request.path, exc_info=problem)
    return json_response(body, status)


async def _on_startup(app: web.Application) -> None:
    app[SERVED].attach(asyncio.get_running_loop())


async def _on_shutdown(app: web.Application) -> None:
    await app[SERVED].end_streams()


async def _on_cleanup(app: web.Application) -> None:
    app[log.CURSORS].close()
    s = app[SERVED]
    if s.owns_store:
        if s.adb is not None:
            await s.adb.close()
        else:
            await asyncio.get_running_loop().run_in_executor(None, s.store.close)


async def drain(app: web.Application, timeout: float) -> bool:
    """Before stopping ``app``'s server (its listening socket closed, its
    connections not yet): end the open streams, then wait until no request
    is in a handler, at most ``timeout`` seconds; whether none is. A
    response sent meanwhile says ``Connection: close``."""
    return await app[SERVED].drain(timeout)


def make_app(db: KVStore | AsyncKVStore, *, tokens: Tokens | None = None, limits: Limits = Limits(),
             close_store: bool = False) -> web.Application:
    """The aiohttp application serving ``db`` (a store, or its asyncio
    front) under ``/v1`` (docs/http-api.md); mount it in an aiohttp server
    of your own (and :func:`drain` it before its cleanup), or run it with
    :func:`kvstore.server.serve`. Without
    ``tokens`` every request is allowed (serve it on loopback only). With
    ``close_store`` the app closes the store at its cleanup."""
    served = Served(db, tokens, limits, owns_store=close_store)
    app = web.Application(middlewares=[_guard], client_max_size=served.max_body,
                          handler_args={"max_field_size": 16 * 1024, "max_line_size": 16 * 1024})
    app[SERVED] = served
    app[log.CURSORS] = log.LogCursors()
    for method, (handler, _role) in _KV.items():  # matched first and fast; the handler is chosen by raw path
        if method != "HEAD":
            app.router.add_route(method, kv.KV_PREFIX + "{key:.*}", handler)
    for method, path, handler, _role in ROUTES:
        app.router.add_route(method, path, handler)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_on_shutdown)
    app.on_cleanup.append(_on_cleanup)
    return app
