"""A cluster node served over HTTP (``walkv serve STORE --cluster NAME
--coordinator etcd://H:P --advertise URL``): :func:`serve_cluster`.

The node (:class:`kvstore.cluster.node.ClusterNode`) is served by the same
app as any store, with one route more, ``GET /v1/cluster`` (a read token):
the node's view of its cluster (``{"cluster", "node", "role", "leader",
"epoch", "timeline", "durable_lsn", "applied_lsn", "members": [...]}``,
docs/http-api.md). Every answer of a node carries ``Walkv-Node`` (its URL)
and ``Walkv-Epoch`` (the timeline its store is on: for a write the leader
answered, the epoch that acknowledged it). A write to a node that is not the
leader is refused with 421 ``NotLeader`` naming the leader (its store
refuses it: :class:`~wal.errors.NotLeaderError`), never answered 2xx.

With ``--resp`` the node speaks the Redis protocol too, on the same store
and under the same rules: a replica answers writes ``READONLY``, and every
command that reads keys is held to :meth:`ClusterNode.check_read
<kvstore.cluster.node.ClusterNode.check_read>` as the HTTP reads are
(``MASTERDOWN`` when refused, Redis's answer of a replica that may not
serve its data).

When the node must open its store again (it stepped down; its follower
needs it rebuilt), the app is stopped (streams end, requests in flight
finish), the store reopened, and a new app serves on the same address: for
that moment clients are refused and go to another node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kvstore.cluster.node import ClusterNode
from kvstore.server.app import ROUTES
from kvstore.server.auth import READ
from kvstore.server.context import json_response
from kvstore.server.routes import Handler, Route, RouteMatch, route
from kvstore.server.run import serve_async

log = logging.getLogger("walkv.cluster")

NODE: web.AppKey[ClusterNode] = web.AppKey("walkv_cluster_node", ClusterNode)


async def cluster_info(request: web.Request, match: RouteMatch) -> web.Response:
    return json_response(request.app[NODE].describe())


READS = ("/v1/kv/{key*}", "/v1/get_many", "/v1/scan", "/v1/count")


def _leader_reads(handler: Handler) -> Handler:
    """A read on the leader is answered only while its lease holds (so it
    sees every acknowledged write); a replica's only once its history is
    checked against its leader's (:meth:`ClusterNode.check_read
    <kvstore.cluster.node.ClusterNode.check_read>`), and may be stale: it says
    which LSN it saw (``Walkv-Lsn``)."""
    async def checked(request: web.Request, match: RouteMatch) -> web.StreamResponse:
        request.app[NODE].check_read()
        return await handler(request, match)
    return checked


CLUSTER_ROUTES = [Route(r.method, r.pattern, _leader_reads(r.handler), r.role, r.params) if r.pattern in READS else r
                  for r in ROUTES] + [route("GET", "/v1/cluster", cluster_info, READ)]


def _stamp(node: ClusterNode) -> Callable[[web.Request, web.StreamResponse], Any]:
    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        store = node.store
        response.headers["Walkv-Node"] = node.me
        if store is not None and not store.closed:
            response.headers["Walkv-Epoch"] = str(store.history[-1].timeline)
    return stamp


async def serve_cluster(path: str, host: str, port: int, *, cluster: str, coordinator: str, advertise: str,
                        sync_replicas: int = 0, lease_seconds: float = 5.0, sync_timeout: float = 10.0,
                        follow_token: str | None = None, store_options: dict[str, Any] | None = None,
                        on_listening: Callable[[str], None] | None = None, stop: asyncio.Event | None = None,
                        **server_options: Any) -> None:
    """Serve the node at ``path`` (module docstring) until ``stop`` is set or
    SIGTERM/SIGINT arrives; ``server_options`` as :func:`kvstore.server.serve_async`."""
    node = ClusterNode(path, cluster=cluster, coordinator=coordinator, advertise=advertise,
                       sync_replicas=sync_replicas, sync_timeout=sync_timeout, lease_seconds=lease_seconds,
                       token=follow_token, store_options=store_options)
    stop = stop or asyncio.Event()
    announced = False
    try:
        while not stop.is_set():
            store = await node.open()
            cycle = asyncio.Event()

            async def end_cycle(cycle: asyncio.Event) -> None:
                waits = [asyncio.ensure_future(node.reopen.wait()), asyncio.ensure_future(stop.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                cycle.set()

            def listening(url: str) -> None:
                nonlocal announced, port
                port = int(url.rsplit(":", 1)[1])  # the next cycle listens on the same port
                if not announced and on_listening is not None:
                    on_listening(url)
                announced = True

            def setup(app: web.Application) -> None:
                app[NODE] = node
                app.on_response_prepare.append(_stamp(node))

            watcher = asyncio.create_task(end_cycle(cycle))
            try:
                await serve_async(store, host, port, stop=cycle, routes=CLUSTER_ROUTES, setup=setup,
                                  resp_read_check=node.check_read, on_listening=listening, **server_options)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if not node.reopen.is_set():  # SIGTERM/SIGINT (serve_async set the cycle's event), or stop
                stop.set()
            await node.close_store()
            if not stop.is_set():
                log.warning("cluster %s: %s opens its store again", cluster, node.me)
    finally:
        await node.close()
