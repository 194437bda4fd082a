"""Admin and health: ``POST /v1/admin/snapshot``, ``POST /v1/admin/sync``,
``GET /v1/stats``, ``GET /metrics`` (Prometheus text, made by
:func:`kvstore.store.metrics.prometheus_text` through prometheus-client, and
the server's own gauges: requests in flight, open streams),
``GET /healthz`` (200 while the process serves) and ``GET /readyz`` (200
when the store is open and its log accepts writes, else 503 with the error
JSON)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from aiohttp import web

from kvstore.client.wire import error_body
from kvstore.server.context import Served, json_response, served
from kvstore.server.routes import RouteMatch
from kvstore.store.metrics import CONTENT_TYPE, prometheus_text
from wal.errors import ClosedError


async def take_snapshot(request: web.Request, match: RouteMatch) -> web.Response:
    store = served(request).store
    info = await asyncio.get_running_loop().run_in_executor(None, store.snapshot)
    return json_response({"lsn": info.lsn, "count": info.count, "bytes": info.bytes, "created_us": info.created_us})


async def sync(request: web.Request, match: RouteMatch) -> web.Response:
    store = served(request).store
    return json_response({"durable_lsn": await asyncio.get_running_loop().run_in_executor(None, store.sync)})


async def stats(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    return json_response(s.adb.stats() if s.adb is not None else s.store.stats())


async def metrics(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    text = prometheus_text(s.store.stats()) + _server_metrics(s)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


def _server_metrics(s: Served) -> str:
    """The server's own gauges (the requests in a handler, the open streams), as the store's are labelled."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Collector:
        def collect(self) -> Iterator[GaugeMetricFamily]:
            for name, text, value in (
                    ("walkv_http_requests_in_flight", "Requests inside a handler of this server.", s.in_flight.count),
                    ("walkv_http_streams_open", "Open watch and subscription streams.", s.stream_count)):
                gauge = GaugeMetricFamily(name, text, labels=["store"])
                gauge.add_metric([s.store.path], value)
                yield gauge

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry).decode("utf-8")


async def healthz(request: web.Request, match: RouteMatch) -> web.Response:
    return json_response({"ok": True})


async def readyz(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    store = s.store
    problem: BaseException | None = None
    if store.closed or s.shutting_down:
        problem = ClosedError(f"the store {store.path} is closed (the server is stopping)")
    elif store._log is not None and store._log.failure is not None:
        problem = store._log.failure
    if problem is not None:
        status, body = error_body(problem)
        return json_response(body, status)
    return json_response({"ok": True, "applied_lsn": store.applied_lsn, "readonly": store.readonly})
