"""Writes of many keys, as JSON: ``delete_range``, ``batch``, ``txn``
(docs/http-api.md).

An operation is ``{"op": "put", "key", "value"}`` (with ``"ttl": seconds``
or ``"lease": id`` as ``db.put`` takes them), ``{"op": "delete", "key"}`` or
``{"op": "delete_range", "start", "end"}`` (null: unbounded), each with an
optional ``"keyspace"``; a condition is ``{"key", "equals": v}``, ``{"key",
"absent": true}`` or ``{"key", "present": true}``, with an optional
``"keyspace"``. They are added to the asyncio front's own batch and
transaction classes, so each argument gets the embedded API's check and
error, and the server's clock turns a TTL into its instant (as the writer
does embedded: :mod:`kvstore.store.expiring`). A big body is parsed and its
operations built off the event loop (:mod:`kvstore.server.bodies`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvstore.client.wire import BadRequest, ConditionFailed
from kvstore.server.bodies import key_field, parse_json, read_json
from kvstore.server.context import json_response, served
from kvstore.server.kv import lsn_response, writer
from kvstore.server.routes import RouteMatch
from kvstore.store.aio_batch import AsyncTransaction, AsyncWriteBatch


def _keyspace(doc: dict[str, Any]) -> Any:
    """An op's or condition's ``keyspace`` (None: the batch's, the default one)."""
    return doc.get("keyspace")


def add_ops(target: AsyncWriteBatch | AsyncTransaction, ops: Any) -> None:
    """Add the JSON operations ``ops`` to a batch or transaction."""
    if not isinstance(ops, list):
        raise BadRequest("field 'ops' must be a list of operations")
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise BadRequest(f"ops[{i}] must be an object")
        kind = op.get("op")
        if kind == "put":
            target.put(key_field(op, "key"), key_field(op, "value"), op.get("ttl"), op.get("lease"),  # type: ignore[arg-type]
                       keyspace=_keyspace(op))
        elif kind == "delete":
            target.delete(key_field(op, "key"), keyspace=_keyspace(op))  # type: ignore[arg-type]
        elif kind == "delete_range":
            target.delete_range(key_field(op, "start", nullable=True), key_field(op, "end", nullable=True),
                                keyspace=_keyspace(op))
        else:
            raise BadRequest(f"ops[{i}]: 'op' must be put, delete or delete_range, not {kind!r}")


def add_conditions(t: AsyncTransaction, conds: Any) -> None:
    if not isinstance(conds, list):
        raise BadRequest("field 'conditions' must be a list")
    for i, cond in enumerate(conds):
        if not isinstance(cond, dict):
            raise BadRequest(f"conditions[{i}] must be an object")
        key = key_field(cond, "key")
        if "equals" in cond:
            t.require(key, equals=key_field(cond, "equals"), keyspace=_keyspace(cond))  # type: ignore[arg-type]
        elif cond.get("absent") is True:
            t.require(key, absent=True, keyspace=_keyspace(cond))  # type: ignore[arg-type]
        elif cond.get("present") is True:
            t.require(key, present=True, keyspace=_keyspace(cond))  # type: ignore[arg-type]
        else:
            raise BadRequest(f"conditions[{i}] needs one of equals, absent: true, present: true")


async def delete_range(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    doc = await read_json(request, s)
    lsn = await writer(s, match.query).delete_range(key_field(doc, "start", nullable=True),
                                                    key_field(doc, "end", nullable=True))
    return lsn_response(lsn)


async def batch(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)

    def build(doc: dict[str, Any]) -> AsyncWriteBatch:
        b = s.front.batch()
        add_ops(b, doc.get("ops"))
        return b

    b = await parse_json(request, s, build)
    return json_response({"lsn": await b.acommit()})


async def txn(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)

    def build(doc: dict[str, Any]) -> AsyncTransaction:
        t = s.front.transaction()
        add_conditions(t, doc.get("conditions", []))
        add_ops(t, doc.get("ops", []))
        return t

    t = await parse_json(request, s, build)
    if not await t.acommit():
        err = ConditionFailed(f"condition {t.failed_index} of the transaction did not hold at LSN {t.lsn}; "
                              f"nothing was written (the attempt is logged at that LSN)")
        err.lsn, err.failed = t.lsn, t.failed_index
        raise err
    return json_response({"lsn": t.lsn, "succeeded": True})
