"""Leases over HTTP (docs/http-api.md), as etcd's: ``POST /v1/leases``
``{"ttl": S}`` grants one (``db.grant(S)``), ``GET /v1/leases/{id}`` says
its TTLs (``db.lease(id)``, ``lease.ttl()``), ``POST
/v1/leases/{id}/keepalive`` extends it (``lease.keepalive()``), ``DELETE
/v1/leases/{id}`` revokes it and deletes its keys (``db.revoke``). Keys are
put under one with ``PUT /v1/kv/{key}?lease=ID`` or a batch op's ``"lease"``.
A lease that is not alive is 404 ``LeaseNotFoundError`` (its ``lease_id``),
as the embedded call raises it. Every instant is the server's: the client's
clock is never consulted.
"""

from __future__ import annotations

from aiohttp import web

from kvstore.client.wire import NotFound
from kvstore.entry.codec import MAX_LEASE_ID
from kvstore.server.bodies import read_json
from kvstore.server.context import json_response, served
from kvstore.server.kv import lsn_response
from kvstore.server.routes import RouteMatch
from kvstore.store.leases import Lease


def _lease(request: web.Request, match: RouteMatch) -> Lease:
    """The lease the path names, alive now (else LeaseNotFoundError)."""
    text = match.param("id").decode("ascii", "replace")
    if not text.isdigit() or not 0 < int(text) <= MAX_LEASE_ID:
        raise NotFound(f"no lease {text[:40]!r}: a lease id is an integer from 1 to {MAX_LEASE_ID}")
    return served(request).store.lease(int(text))


def _doc(lease: Lease) -> dict[str, object]:
    return {"id": lease.id, "granted_ttl": lease.granted_ttl, "ttl": lease.ttl()}


async def grant(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    lease = await s.front.grant((await read_json(request, s)).get("ttl"))  # type: ignore[arg-type]
    return json_response(_doc(lease))


async def lease_info(request: web.Request, match: RouteMatch) -> web.Response:
    return json_response(_doc(_lease(request, match)))


async def keepalive(request: web.Request, match: RouteMatch) -> web.Response:
    lease = _lease(request, match)
    await served(request).front.keepalive(lease)
    return json_response(_doc(lease))


async def revoke(request: web.Request, match: RouteMatch) -> web.Response:
    return lsn_response(await served(request).front.revoke(_lease(request, match)))
