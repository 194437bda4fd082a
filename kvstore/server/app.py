"""The aiohttp application of walkv's HTTP API: :func:`make_app` (routes in
docs/http-api.md).

The route table is :data:`ROUTES`: method, path pattern, handler, the role
a token needs, the query parameters taken. The application has no aiohttp
routes (aiohttp's router matches the decoded path): its one middleware
(:func:`_guard`) is the router. It parses the request's raw target once
(:mod:`kvstore.server.routes`), which gives the route, and so the role and
the handler, and the values of the path's parameters (the key, a
subscription's name), which the handler reads from that match; it checks the
token's role (:mod:`kvstore.server.auth`; a request no route serves is
refused, never given a role of its own), and turns every exception into the
one JSON error shape with its status (:func:`kvstore.client.wire.error_body`):
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

from kvstore.client.wire import BadRequest, MethodNotAllowed, PayloadTooLarge, error_body
from kvstore.server import admin, batches, kv, leases, log, streams
from kvstore.server.auth import ADMIN, OPEN, READ, WRITE, Tokens
from kvstore.server.context import SERVED, Limits, Query, Served, json_response
from kvstore.server.routes import Route, RouteMatch, Router, RouteRefusal, route
from kvstore.store.aio import AsyncKVStore
from kvstore.store.store import KVStore

logger = logging.getLogger("kvstore.server")

MIN_LSN = ("min_lsn", "min_lsn_timeout")
KS = ("keyspace",)
STREAM = ("prefix", "start", "stop", "from_lsn", "timeout", "progress_every", "format")

ROUTES: list[Route] = [
    route("GET", "/v1/kv/{key*}", kv.get_key, READ, (*KS, *MIN_LSN)),
    route("HEAD", "/v1/kv/{key*}", kv.get_key, READ, (*KS, *MIN_LSN)),
    route("PUT", "/v1/kv/{key*}", kv.put_key, WRITE, (*KS, "ttl", "lease")),
    route("DELETE", "/v1/kv/{key*}", kv.delete_key, WRITE, KS),
    route("GET", "/v1/ttl/{key*}", kv.ttl, READ, (*KS, *MIN_LSN)),
    route("GET", "/v1/info", kv.info, READ),
    route("GET", "/v1/count", kv.count, READ, (*KS, *MIN_LSN)),
    route("GET", "/v1/scan", kv.scan, READ, ("start", "stop", "prefix", "reverse", "limit", "after", *KS, *MIN_LSN)),
    route("POST", "/v1/get_many", kv.get_many, READ, (*KS, *MIN_LSN)),
    route("POST", "/v1/delete_range", batches.delete_range, WRITE, KS),
    route("POST", "/v1/batch", batches.batch, WRITE),
    route("POST", "/v1/txn", batches.txn, WRITE),
    route("GET", "/v1/keyspaces", kv.keyspaces, READ),
    route("DELETE", "/v1/keyspaces/{name}", kv.drop_keyspace, WRITE),
    route("POST", "/v1/leases", leases.grant, WRITE),
    route("GET", "/v1/leases/{id}", leases.lease_info, READ),
    route("POST", "/v1/leases/{id}/keepalive", leases.keepalive, WRITE),
    route("DELETE", "/v1/leases/{id}", leases.revoke, WRITE),
    route("GET", "/v1/watch", streams.watch, READ, (*STREAM, "on_gap", *KS)),
    route("GET", "/v1/subscriptions", streams.subscriptions, READ),
    route("POST", "/v1/subscriptions/{name}", streams.subscription_create, WRITE),
    route("GET", "/v1/subscriptions/{name}/events", streams.subscription_events, WRITE, STREAM),
    route("POST", "/v1/subscriptions/{name}/ack", streams.subscription_ack, WRITE),
    route("DELETE", "/v1/subscriptions/{name}", streams.subscription_drop, WRITE),
    route("GET", "/v1/log/bounds", log.bounds, READ),
    route("GET", "/v1/log/entries", log.entries, READ, ("from_lsn", "limit", "wait")),
    route("GET", "/v1/log/segment", log.segment, READ, ("from_lsn", "wait", "replica", "epoch")),
    route("GET", "/v1/snapshots", log.snapshots, READ),
    route("GET", "/v1/snapshots/{lsn}/{name}", log.snapshot_file, READ),
    route("POST", "/v1/admin/snapshot", admin.take_snapshot, ADMIN),
    route("POST", "/v1/admin/sync", admin.sync, WRITE),
    route("GET", "/v1/stats", admin.stats, ADMIN),
    route("GET", "/metrics", admin.metrics, ADMIN),
    route("GET", "/healthz", admin.healthz, OPEN),
    route("GET", "/readyz", admin.readyz, OPEN),
]
"""Every route the server has (docs/http-api.md). Nothing else is served."""

ROUTER: web.AppKey[Router] = web.AppKey("walkv_router", Router)


def _http_error(exc: web.HTTPException) -> Exception:
    if exc.status == 413:
        return PayloadTooLarge(f"the request body is over this server's limit: {exc.text}")
    return BadRequest(f"HTTP {exc.status}: {exc.reason}")


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    """The router (module docstring): aiohttp's own match (``handler``,
    always its 404: the app has no aiohttp routes) is never used."""
    s = request.app[SERVED]
    with s.in_flight:  # a stopping server waits for it (drain)
        response = await _answer(request, request.app[ROUTER], s)
    if s.shutting_down:
        response.force_close()  # the client's next request goes on a new connection, to a server that runs
    return response


async def _answer(request: web.Request, router: Router, s: Served) -> web.StreamResponse:
    try:
        found, values, query = router.resolve(request.method, request.raw_path)
        token = None if s.tokens is None else s.tokens.check(request.headers.get("Authorization"), found.role)
        if isinstance(found, RouteRefusal):
            raise found.error
        return await found.handler(request, RouteMatch(found, values, Query(query, found.params), token))
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
    allow = problem.allow if isinstance(problem, MethodNotAllowed) else None
    return json_response(body, status, {"Allow": allow} if allow else None)


async def _on_startup(app: web.Application) -> None:
    loop = asyncio.get_running_loop()
    app[SERVED].attach(loop)
    app[log.DURABLE].attach(loop, app[SERVED].store)


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
             close_store: bool = False, routes: list[Route] = ROUTES) -> web.Application:
    """The aiohttp application serving ``db`` (a store, or its asyncio
    front) under ``/v1`` (docs/http-api.md); mount it in an aiohttp server
    of your own (and :func:`drain` it before its cleanup), or run it with
    :func:`kvstore.server.serve`. Without
    ``tokens`` every request is allowed (serve it on loopback only). With
    ``close_store`` the app closes the store at its cleanup. ``routes``:
    the route table (a cluster node's adds ``/v1/cluster``)."""
    served = Served(db, tokens, limits, owns_store=close_store)
    app = web.Application(middlewares=[_guard], client_max_size=served.max_body,
                          handler_args={"max_field_size": 16 * 1024, "max_line_size": 16 * 1024})
    app[SERVED] = served
    app[ROUTER] = Router(routes)
    app[log.CURSORS] = log.LogCursors()
    app[log.DURABLE] = log.DurableSignal()
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_on_shutdown)
    app.on_cleanup.append(_on_cleanup)
    return app
