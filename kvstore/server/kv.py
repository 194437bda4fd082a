"""Keys: ``/v1/kv/{key}``, ``get_many``, ``scan``, ``count``, ``ttl``,
``info`` and the keyspaces (docs/http-api.md).

Every one takes ``keyspace=NAME`` (absent or empty: the default keyspace),
as the embedded ``db.keyspace(NAME)`` handle does. Writes go through the
store's asyncio front (:class:`~kvstore.store.aio.AsyncKVStore`), so the
writes of every connection share group commit; a 2xx answer means what the
embedded call returning means under the store's sync mode. Arguments are
checked by the same code that checks the embedded API's, so a key or value
the embedded API refuses is refused here with the same error.

Reads answer from LMDB on the event loop's thread. The LSN a read answers
with (``Walkv-Lsn``, ``lsn``) is the one it read at, exactly: a GET and a
ttl read the state as of that LSN, no later write in it
(:meth:`kvstore.KVStore.read_at`); a scan page and a ``get_many`` read
through one view: everything as of its LSN.

Answers are bounded (:attr:`~kvstore.server.context.Limits.max_answer_bytes`
of keys and values; one item always fits): a scan page ends early, with its
``after``; a ``get_many`` whose values are over it is 413
``AnswerTooLarge``, whose ``fits`` says how many of its keys fit (issue 33:
one 15 KiB request naming a 256 KiB key 2,000 times made a 666 MiB answer).
A page is read and encoded :data:`STEP` items at a time, letting the other
requests on the loop run between the steps, and ends after about
:data:`PAGE_SECONDS` of work: 40 clients paging through big ranges no
longer hold a point GET for seconds (``benchmarks/server_abuse.py``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from kvstore.client.wire import MAX_GET_MANY, AnswerTooLarge, BadRequest
from kvstore.entry.codec import MAX_LEASE_ID
from kvstore.server.bodies import key_field, parse_json, read_body
from kvstore.server.context import MAX_LSN, Query, Served, json_response, served
from kvstore.server.routes import RouteMatch
from kvstore.store.aio import AsyncKeyspace, AsyncKVStore
from kvstore.store.keyspace import Keyspace
from kvstore.store.store import KVStore

DEFAULT_PAGE = 1000
STEP = 64
"""Items read or encoded between two turns of the event loop."""
PAGE_SECONDS = 0.02
"""A scan page ends after about this much work (its ``after`` goes on), so
that many big scans at once hold neither the loop nor much memory."""
KEYSPACE = ("keyspace",)


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


def keyspace_of(q: Query) -> str:
    """The ``keyspace`` parameter ("" when absent: the default keyspace)."""
    return q.text("keyspace", "") or ""


def space(s: Served, q: Query) -> KVStore | Keyspace:
    """What a read reads: the store, or its keyspace ``keyspace=``."""
    name = keyspace_of(q)
    return s.store.keyspace(name) if name else s.store


def writer(s: Served, q: Query) -> AsyncKVStore | AsyncKeyspace:
    """What a write writes through: the asyncio front, or its keyspace ``keyspace=``."""
    name = keyspace_of(q)
    return s.front.keyspace(name) if name else s.front


# -- one key ---------------------------------------------------------------------


async def get_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    await s.wait_applied(match.query)
    key = path_key(match)
    keys = space(s, match.query)
    value, lsn = s.store.read_at(lambda: keys.get(key))
    if value is None:
        return json_response({"error": {"type": "NotFound", "message": f"no key {key[:64]!r}", "lsn": lsn}},
                             404, {"Walkv-Lsn": str(lsn)})
    return web.Response(body=value, content_type="application/octet-stream", headers={"Walkv-Lsn": str(lsn)})


async def put_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    q = match.query
    key = path_key(match)
    ttl = q.number_or_none("ttl", 0.0, float(MAX_LSN))
    lease = q.integer("lease", None, 1, MAX_LEASE_ID)
    value = await read_body(request, s)
    return lsn_response(await writer(s, q).put(key, value, ttl, lease))


async def delete_key(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    return lsn_response(await writer(s, match.query).delete(path_key(match)))


async def ttl(request: web.Request, match: RouteMatch) -> web.Response:
    """``{"ttl": seconds | null, "lsn"}``, as ``db.ttl(key)``."""
    s = served(request)
    await s.wait_applied(match.query)
    key = path_key(match)
    keys = space(s, match.query)
    seconds, lsn = s.store.read_at(lambda: keys.ttl(key))
    return json_response({"ttl": seconds, "lsn": lsn})


# -- many keys -------------------------------------------------------------------


def _keys(doc: dict[str, Any]) -> list[bytes]:
    keys = doc.get("keys")
    if not isinstance(keys, list) or len(keys) > MAX_GET_MANY:
        raise BadRequest(f"field 'keys' must be a list of at most {MAX_GET_MANY} base64 keys")
    return [key_field({"key": k}, "key") for k in keys]  # type: ignore[misc]


async def get_many(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    q = match.query
    keys, body_lsn = await parse_json(request, s, lambda doc: (_keys(doc), _lsn_options(doc)))
    for name, text in body_lsn.items():  # the body's min_lsn/min_lsn_timeout, as the query's
        if name in q.values:
            raise BadRequest(f"{name} is given both in the query and in the body")
        q.values[name] = text
    await s.wait_applied(q)
    budget = s.limits.max_answer_bytes
    pieces: list[bytes] = []
    size = 0
    with space(s, q).view() as v:
        lsn = v.lsn
        for i, key in enumerate(keys):
            value = v.get(key)
            if value is not None:
                size += len(value)
                if size > budget and i:
                    raise AnswerTooLarge(
                        f"the values of these {len(keys)} keys come to over {budget} bytes, this server's answer "
                        f"budget (--max-answer-bytes); the first {i} fit: ask for fewer keys at a time",
                        fits=i)
            pieces.append(b"null" if value is None else b'"%s"' % base64.b64encode(value))
            if i % STEP == STEP - 1:
                await asyncio.sleep(0)
    return web.Response(body=b'{"values":[%s],"lsn":%d}' % (b",".join(pieces), lsn), headers=_JSON)


def _lsn_options(doc: dict[str, Any]) -> dict[str, bytes]:
    """A body's ``min_lsn``/``min_lsn_timeout``, as query values."""
    return {name: str(doc[name]).encode() for name in ("min_lsn", "min_lsn_timeout") if name in doc}


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
    """One page of a scan: at most ``limit`` items and about
    :attr:`~Limits.max_answer_bytes`, ``after`` to go on."""
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
    with space(s, q).view() as v:
        lsn = v.lsn
        pieces, last_key = await _page(v.scan(start, stop, prefix=prefix, reverse=reverse), limit,
                                       s.limits.max_answer_bytes)
    more = b"null" if last_key is None else b'"%s"' % _token(last_key).encode()
    return web.Response(body=b'{"items":[%s],"lsn":%d,"after":%s}' % (b",".join(pieces), lsn, more),
                        headers=_JSON)


async def _page(items: Iterator[tuple[bytes, bytes]], limit: int, budget: int) -> tuple[list[bytes], bytes | None]:
    """The JSON items of one page of ``items`` (a view's scan), and the
    last key when more remain (None: the scan is done)."""
    pieces: list[bytes] = []
    size = 0
    last: bytes | None = None
    deadline = time.monotonic() + PAGE_SECONDS
    for key, value in items:
        if len(pieces) == limit or size >= budget:
            return pieces, last
        if len(pieces) % STEP == 0 and pieces:
            if time.monotonic() > deadline:
                return pieces, last
            await asyncio.sleep(0)  # the other requests on the loop run (the view stays open)
        pieces.append(b'["%s","%s"]' % (base64.b64encode(key), base64.b64encode(value)))
        size += len(key) + len(value)
        last = key
    return pieces, None


async def count(request: web.Request, match: RouteMatch) -> web.Response:
    s = served(request)
    await s.wait_applied(match.query)
    with space(s, match.query).view() as v:
        return json_response({"count": len(v), "lsn": v.lsn})


async def info(request: web.Request, match: RouteMatch) -> web.Response:
    """What a client checks its arguments against, as the embedded store does."""
    s = served(request)
    store = s.store
    return json_response({"api": 1, "store_id": store.store_id, "readonly": store.readonly,
                          "max_value_bytes": store.max_value_bytes, "max_record_bytes": store.max_record_bytes,
                          "max_payload_bytes": store._max_payload, "max_json_bytes": s.limits.max_json_bytes,
                          "max_json_items": s.limits.max_json_items,
                          "max_answer_bytes": s.limits.max_answer_bytes})


# -- keyspaces -------------------------------------------------------------------


async def keyspaces(request: web.Request, match: RouteMatch) -> web.Response:
    """``{"keyspaces": [...]}``: the named keyspaces that hold a key, as ``db.keyspaces()``."""
    return json_response({"keyspaces": served(request).store.keyspaces()})


async def drop_keyspace(request: web.Request, match: RouteMatch) -> web.Response:
    """Every key of the keyspace, in one entry (``db.drop_keyspace(name)``)."""
    return lsn_response(await served(request).front.drop_keyspace(match.text("name")))
