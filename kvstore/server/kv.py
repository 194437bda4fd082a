"""Reads and writes of keys: ``/v1/kv/{key}``, ``get_many``, ``scan``,
``count``, ``info``, ``delete_range``, ``batch``, ``txn`` (docs/http-api.md).

Writes go through the store's asyncio front
(:class:`~kvstore.store.aio.AsyncKVStore`), so the writes of every connection
share group commit; a 2xx answer means what the embedded call returning
means under the store's sync mode. Arguments are checked by the same code
that checks the embedded API's (the batch and transaction classes), so a key
or value the embedded API refuses is refused here with the same error.

Reads answer from LMDB on the event loop's thread (microseconds). The LSN a
read answers with (``Walkv-Lsn``, ``lsn``) is the applied LSN read just
before it: the read saw at least every write up to it. A scan page and a
``get_many`` read through one view: everything as of that one LSN.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from typing import Any

from aiohttp import web

from kvstore.client.wire import MAX_GET_MANY, BadRequest, ConditionFailed, b64encode
from kvstore.server.context import Query, json_response, key_field, read_body, read_json, served
from kvstore.server.routes import RouteMatch
from kvstore.store.aio_batch import AsyncTransaction, AsyncWriteBatch

DEFAULT_PAGE = 1000


def lsn_response(lsn: int) -> web.Response:
    """``{"lsn": N}``, the answer of every single-key write (made directly: the hot path)."""
    return web.Response(body=b'{"lsn":%d}' % lsn, headers=_JSON)


_JSON = {"Content-Type": "application/json"}


def path_key(match: RouteMatch) -> bytes:
    """The key: everything after ``/v1/kv/`` in the raw path, decoded (the route's ``{key*}``)."""
    key = match.param("key")
    if not key:
        raise BadRequest("the key is empty: GET/PUT/DELETE /v1/kv/{key} with the key percent-encoded")
    return key


async def get_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    await s.wait_applied(match.query)
    key = path_key(match)
    lsn = s.store.applied_lsn
    value = s.store.get(key)
    if value is None:
        return json_response({"error": {"type": "NotFound", "message": f"no key {key[:64]!r}", "lsn": lsn}},
                             404, {"Walkv-Lsn": str(lsn)})
    return web.Response(body=value, content_type="application/octet-stream", headers={"Walkv-Lsn": str(lsn)})


async def put_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    key = path_key(match)
    value = await read_body(request, s)
    return lsn_response(await s.front.put(key, value))


async def delete_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    return lsn_response(await s.front.delete(path_key(match)))


async def get_many(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    doc = await read_json(request, s)
    await s.wait_applied(_lsn_query(match.query, doc))
    keys = doc.get("keys")
    if not isinstance(keys, list) or len(keys) > MAX_GET_MANY:
        raise BadRequest(f"field 'keys' must be a list of at most {MAX_GET_MANY} base64 keys")
    decoded = [key_field({"key": k}, "key") for k in keys]
    with s.store.view() as v:
        values = [v.get(k) for k in decoded]
        lsn = v.lsn
    return json_response({"values": [None if x is None else b64encode(x) for x in values], "lsn": lsn})


def _lsn_query(q: Query, doc: dict[str, Any]) -> Query:
    """The query, with a body's ``min_lsn``/``min_lsn_timeout`` when it has them."""
    for name in ("min_lsn", "min_lsn_timeout"):
        if name in doc:
            q.values[name] = str(doc[name]).encode()
    return q


def _token(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode("ascii")


_TOKEN = re.compile(rb"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?")


def _untoken(token: bytes) -> bytes:
    """The last key of the page before (the token is its URL-safe base64)."""
    try:
        if not token or not _TOKEN.fullmatch(token):
            raise ValueError(token)
        return base64.urlsafe_b64decode(token)
    except (binascii.Error, ValueError):
        raise BadRequest("parameter 'after' is not a continuation token this server gave") from None


async def scan(request: web.Request, match: RouteMatch) -> web.Response:
    """One page of a scan: at most ``limit`` items, ``after`` to go on."""
    s = served(request)
    q = match.query
    await s.wait_applied(q)
    start, stop, prefix = q.bytes("start"), q.bytes("stop"), q.bytes("prefix")
    reverse = q.flag("reverse")
    limit = q.integer("limit", DEFAULT_PAGE, 1, s.limits.max_page)
    assert limit is not None
    after = q.bytes("after")
    if after is not None:
        last = _untoken(after)
        if reverse:
            stop = last if stop is None else min(stop, last)
        else:
            nxt = last + b"\x00"
            start = nxt if start is None else max(start, nxt)
    with s.store.view() as v:
        items = list(itertools.islice(v.scan(start, stop, prefix=prefix, reverse=reverse), limit + 1))
        lsn = v.lsn
    more = len(items) > limit
    items = items[:limit]
    return json_response({"items": [[b64encode(k), b64encode(val)] for k, val in items], "lsn": lsn,
                          "after": _token(items[-1][0]) if more else None})


async def count(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    await s.wait_applied(match.query)
    with s.store.view() as v:
        return json_response({"count": len(v), "lsn": v.lsn})


async def info(request: web.Request, match: RouteMatch) -> web.Response:
    """What a client checks its arguments against, as the embedded store does."""
    store = served(request).store
    return json_response({"api": 1, "store_id": store.store_id, "readonly": store.readonly,
                          "max_value_bytes": store.max_value_bytes, "max_record_bytes": store.max_record_bytes,
                          "max_payload_bytes": store._max_payload})


async def delete_range(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    doc = await read_json(request, s)
    lsn = await s.front.delete_range(key_field(doc, "start", nullable=True),
                                                        key_field(doc, "end", nullable=True))
    return json_response({"lsn": lsn})


def _add_ops(target: AsyncWriteBatch | AsyncTransaction, ops: Any) -> None:
    if not isinstance(ops, list):
        raise BadRequest("field 'ops' must be a list of operations")
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise BadRequest(f"ops[{i}] must be an object")
        kind = op.get("op")
        if kind == "put":
            target.put(key_field(op, "key"), key_field(op, "value"))  # type: ignore[arg-type]
        elif kind == "delete":
            target.delete(key_field(op, "key"))  # type: ignore[arg-type]
        elif kind == "delete_range":
            target.delete_range(key_field(op, "start", nullable=True), key_field(op, "end", nullable=True))
        else:
            raise BadRequest(f"ops[{i}]: 'op' must be put, delete or delete_range, not {kind!r}")


async def batch(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    doc = await read_json(request, s)
    b = s.front.batch()
    _add_ops(b, doc.get("ops"))
    return json_response({"lsn": await b.acommit()})


async def txn(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    doc = await read_json(request, s)
    t = s.front.transaction()
    conds = doc.get("conditions", [])
    if not isinstance(conds, list):
        raise BadRequest("field 'conditions' must be a list")
    for i, cond in enumerate(conds):
        if not isinstance(cond, dict):
            raise BadRequest(f"conditions[{i}] must be an object")
        key = key_field(cond, "key")
        if "equals" in cond:
            t.require(key, equals=key_field(cond, "equals"))  # type: ignore[arg-type]
        elif cond.get("absent") is True:
            t.require(key, absent=True)  # type: ignore[arg-type]
        elif cond.get("present") is True:
            t.require(key, present=True)  # type: ignore[arg-type]
        else:
            raise BadRequest(f"conditions[{i}] needs one of equals, absent: true, present: true")
    _add_ops(t, doc.get("ops", []))
    if not await t.acommit():
        err = ConditionFailed(f"condition {t.failed_index} of the transaction did not hold at LSN {t.lsn}; "
                              f"nothing was written (the attempt is logged at that LSN)")
        err.lsn, err.failed = t.lsn, t.failed_index
        raise err
    return json_response({"lsn": t.lsn, "succeeded": True})
