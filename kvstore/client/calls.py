"""The requests of walkv's HTTP API (docs/http-api.md) as data, built once
for both clients: each operation is a :class:`Call` (method, path, query,
body), with how to read its answer and which error answers it turns into a
result (``NotFound`` is a missing key's default, ``ConditionFailed`` a
transaction's failed outcome). The sync client sends a call with
:class:`~kvstore.client.http.Http`, the asyncio client with
:class:`~kvstore.client.http.AsyncHttp` (:func:`send`, :func:`send_async`);
nothing here does I/O.

Arguments are checked here, before anything is sent, against the limits
the server announced (``GET /v1/info``, :class:`ServerInfo`): a bad key or
an oversized value raises what the embedded store raises.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from kvstore.client.http import Params
from kvstore.client.leader import AsyncTransport, Transport
from kvstore.client.wire import (
    MAX_GET_MANY,
    AnswerTooLarge,
    NotFound,
    PayloadTooLarge,
    b64_or_none,
    b64decode,
    b64encode,
    quote,
)
from kvstore.entry.codec import (
    END_OF_KEYS,
    MAX_KEY_BYTES,
    as_bytes,
    check_key,
    check_keyspace,
    check_range,
    check_value,
)
from kvstore.store.clock import seconds_to_us
from kvstore.store.expiring import expiring_put_op, lease_id_of
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.watcher import ON_GAP

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and what its answer means: ``answer(response)`` for a
    2xx; an error answer of a class in ``expected`` is ``recover(error)``
    (any other raises). ``json``: the body, already serialized (:func:`json_body`)."""

    method: str
    path: str
    answer: Callable[[httpx.Response], T]
    params: Params | None = None
    json: bytes | None = None
    content: bytes | None = None
    expected: tuple[type[Exception], ...] = ()
    recover: Callable[[Exception], T] | None = None

    def body(self) -> tuple[bytes | None, dict[str, str] | None]:
        if self.json is not None:
            return self.json, _JSON
        return self.content, None


_JSON = {"Content-Type": "application/json"}


def send(http: Transport, call: Call[T]) -> T:
    """What ``call`` answers, over the sync transport."""
    content, headers = call.body()
    try:
        response = http.request(call.method, call.path, params=call.params, content=content, headers=headers)
    except call.expected as exc:
        assert call.recover is not None
        return call.recover(exc)
    return call.answer(response)


async def send_async(http: AsyncTransport, call: Call[T]) -> T:
    """What ``call`` answers, over the asyncio transport."""
    content, headers = call.body()
    try:
        response = await http.request(call.method, call.path, params=call.params, content=content, headers=headers)
    except call.expected as exc:
        assert call.recover is not None
        return call.recover(exc)
    return call.answer(response)


def json_body(doc: Any, info: "ServerInfo | None" = None, what: str = "request") -> bytes:
    """``doc`` as the JSON body of a request; over the server's JSON bounds
    (``info``): :class:`PayloadTooLarge` (a RecordTooLargeError, as an
    embedded batch over the record limit raises), nothing sent."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    if info is not None:
        items = body.count(b"[") + body.count(b"{") + body.count(b",")
        if len(body) > info.max_json_bytes or items > info.max_json_items:
            raise PayloadTooLarge(f"this {what} is {len(body)} bytes of JSON with {items} elements, over the "
                                  f"server's limits ({info.max_json_bytes} bytes, {info.max_json_items} elements: "
                                  f"its --max-json-bytes, --max-json-items); split it. Nothing was written.")
    return body


def lsn_of(response: httpx.Response) -> int:
    return int(response.json()["lsn"])


def _doc(response: httpx.Response) -> dict[str, Any]:
    doc: dict[str, Any] = response.json()
    return doc


def _kv(key: bytes) -> str:
    return "/v1/kv/" + quote(key)


def _subscription(name: str) -> str:
    return "/v1/subscriptions/" + quote(name.encode())


def _space(keyspace: str) -> dict[str, Any]:
    """The ``keyspace`` parameter ("" left out: the default keyspace)."""
    return {"keyspace": keyspace or None}


# -- the server ------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """What ``GET /v1/info`` says: the store's id and the limits a client checks against."""

    store_id: str | None
    readonly: bool
    max_value_bytes: int
    max_payload_bytes: int
    max_json_bytes: int
    max_json_items: int


_UNBOUNDED = 1 << 62  # a server before the JSON bounds (it announced none)


def info() -> Call[ServerInfo]:
    def answer(response: httpx.Response) -> ServerInfo:
        doc = response.json()
        return ServerInfo(doc.get("store_id"), bool(doc.get("readonly")), int(doc["max_value_bytes"]),
                          int(doc["max_payload_bytes"]), int(doc.get("max_json_bytes", _UNBOUNDED)),
                          int(doc.get("max_json_items", _UNBOUNDED)))

    return Call("GET", "/v1/info", answer)


# -- writes ----------------------------------------------------------------------


def put(key: bytes, value: bytes, max_value_bytes: int, ttl: float | None = None, lease: Any = None,
        keyspace: str = "") -> Call[int]:
    """A put; with ``ttl`` or ``lease`` checked as the embedded put checks them."""
    params = _space(keyspace)
    if ttl is None and lease is None:
        key, value = check_key(key), check_value(value, max_value_bytes)
    else:
        op = expiring_put_op(key, value, max_value_bytes, ttl, lease, 0)  # op[3]: the lease, or the TTL in µs
        key, value = op[1], op[2]
        params.update({"lease": op[3]} if lease is not None else {"ttl": op[3] / 1e6})
    return Call("PUT", _kv(key), lsn_of, params=params, content=value)


def delete(key: bytes, keyspace: str = "") -> Call[int]:
    return Call("DELETE", _kv(check_key(key)), lsn_of, params=_space(keyspace))


def delete_range(start: bytes | None, end: bytes | None, keyspace: str = "") -> Call[int]:
    start, end = check_range(start, end)
    return Call("POST", "/v1/delete_range", lsn_of, params=_space(keyspace),
                json=json_body({"start": b64_or_none(start or None),
                                "end": None if end == END_OF_KEYS else b64encode(end)}))


# -- reads -----------------------------------------------------------------------


def read_key(key: Any) -> bytes | None:
    """A key to read (None: one no key can be, so absent, as the embedded get answers)."""
    checked = key if type(key) is bytes else as_bytes(key, "key")
    return checked if 0 < len(checked) <= MAX_KEY_BYTES else None


def get(key: bytes, default: bytes | None, min_lsn: int | None, keyspace: str = "") -> Call[bytes | None] | None:
    """The value of ``key`` or ``default``; None: nothing to ask, the answer
    is ``default`` (no key can be ``key``)."""
    checked = read_key(key)
    if checked is None:
        return None
    return Call("GET", _kv(checked), lambda response: response.content,
                params={"min_lsn": min_lsn, **_space(keyspace)}, expected=(NotFound,), recover=lambda _exc: default)


class ManyGets:
    """A ``get_many`` as requests (:meth:`next`, None when every value is
    in :attr:`values`): chunks of at most :data:`MAX_GET_MANY` keys and
    of the server's JSON bounds, each read at one LSN; a chunk whose values
    are over the server's answer budget (``AnswerTooLarge``) is asked again
    as the keys that fit, then the rest."""

    def __init__(self, keys: Iterable[bytes], default: bytes | None, keyspace: str, info: ServerInfo) -> None:
        self._keys = [b64encode(k if type(k) is bytes else as_bytes(k, "key")) for k in keys]
        self._default = default
        self._params = _space(keyspace)
        self.values: list[bytes | None] = []
        self._chunks: deque[tuple[int, int]] = deque()
        room = max(1, min(info.max_json_bytes, 1 << 40) - 64)
        start = size = 0
        for i, key in enumerate(self._keys):
            if i > start and (i - start == MAX_GET_MANY or size + len(key) + 3 > room):
                self._chunks.append((start, i))
                start, size = i, 0
            size += len(key) + 3
        if start < len(self._keys):
            self._chunks.append((start, len(self._keys)))

    def next(self) -> Call[None] | None:
        if not self._chunks:
            return None
        lo, hi = self._chunks[0]
        return Call("POST", "/v1/get_many", self._answer, params=self._params,
                    json=json_body({"keys": self._keys[lo:hi]}), expected=(AnswerTooLarge,), recover=self._split)

    def _answer(self, response: httpx.Response) -> None:
        self._chunks.popleft()
        default = self._default
        self.values.extend(default if v is None else b64decode(v) for v in response.json()["values"])

    def _split(self, exc: Exception) -> None:
        lo, hi = self._chunks.popleft()
        fits = min(max(1, int(getattr(exc, "fits", None) or 1)), hi - lo)  # (one key always fits)
        if lo + fits < hi:
            self._chunks.appendleft((lo + fits, hi))
        self._chunks.appendleft((lo, lo + fits))


def count(keyspace: str = "") -> Call[int]:
    return Call("GET", "/v1/count", lambda response: int(response.json()["count"]), params=_space(keyspace))


def ttl(key: bytes, keyspace: str = "") -> Call[float | None]:
    """Seconds until ``key`` expires (None: no expiry, or absent), as ``db.ttl``."""
    def answer(response: httpx.Response) -> float | None:
        seconds = response.json()["ttl"]
        return None if seconds is None else float(seconds)

    return Call("GET", "/v1/ttl/" + quote(check_key(key)), answer, params=_space(keyspace))


def _key_or_none(value: bytes | None, what: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


class ScanPages:
    """A scan fetched a page at a time: :meth:`next` is the call for the
    next page's items, None after the last page."""

    def __init__(self, start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool,
                 page: int, keyspace: str = "") -> None:
        self._params: dict[str, Any] = {
            "start": _key_or_none(start, "start"), "stop": _key_or_none(stop, "stop"),
            "prefix": _key_or_none(prefix, "prefix"), "reverse": reverse or None, "limit": page,
            **_space(keyspace)}
        self._done = False

    def next(self) -> Call[list[tuple[bytes, bytes]]] | None:
        if self._done:
            return None
        return Call("GET", "/v1/scan", self._items, params=dict(self._params))

    def _items(self, response: httpx.Response) -> list[tuple[bytes, bytes]]:
        doc = response.json()
        if doc["after"] is None:
            self._done = True
        else:
            self._params["after"] = doc["after"].encode()
        return [(b64decode(k), b64decode(v)) for k, v in doc["items"]]


# -- watching --------------------------------------------------------------------


def watch_params(prefix: bytes | None, start: bytes | None, stop: bytes | None, timeout: float | None,
                 progress_every: float | None, on_gap: str | None, keyspace: str | None = "") -> dict[str, Any]:
    """The query of ``/v1/watch`` (``on_gap`` None: a subscription's, which
    has none, nor a keyspace); ``keyspace`` None: every keyspace."""
    params: dict[str, Any] = {
        "prefix": _key_or_none(prefix, "prefix"), "start": _key_or_none(start, "start"),
        "stop": _key_or_none(stop, "stop"), "timeout": timeout, "progress_every": progress_every}
    if on_gap is not None:
        if on_gap not in ON_GAP:
            raise ValueError(f"on_gap must be one of {ON_GAP}, not {on_gap!r}")
        params["on_gap"] = on_gap
        params["keyspace"] = "*" if keyspace is None else (check_keyspace(keyspace) or None)
    return params


def subscription_events(name: str) -> str:
    """The path of a subscription's change stream."""
    return _subscription(name) + "/events"


def ack(name: str, lsn: int) -> Call[None]:
    if type(lsn) is not int:
        raise TypeError(f"ack takes a change's LSN (an int), not {type(lsn).__name__}")
    return Call("POST", _subscription(name) + "/ack", lambda _response: None, json=json_body({"lsn": lsn}))


def subscribe(name: str, prefix: bytes | None, start: bytes | None, stop: bytes | None,
              from_lsn: int | None) -> Call[SubscriptionInfo]:
    """Create subscription ``name`` now (an existing one: the same key range), as ``db.subscribe`` does."""
    if from_lsn is not None and (type(from_lsn) is not int or from_lsn < 1):
        raise ValueError(f"from_lsn must be an int >= 1, not {from_lsn!r}")
    doc = {"prefix": b64_or_none(_key_or_none(prefix, "prefix")), "start": b64_or_none(_key_or_none(start, "start")),
           "stop": b64_or_none(_key_or_none(stop, "stop")), "from_lsn": from_lsn}
    return Call("POST", _subscription(name), lambda response: SubscriptionInfo(**response.json()),
                json=json_body(doc))


def subscriptions() -> Call[list[SubscriptionInfo]]:
    return Call("GET", "/v1/subscriptions",
                lambda response: [SubscriptionInfo(**s) for s in response.json()["subscriptions"]])


def drop_subscription(name: str) -> Call[bool]:
    return Call("DELETE", _subscription(name), lambda _response: True, expected=(NotFound,),
                recover=lambda _exc: False)


# -- LSNs, admin -----------------------------------------------------------------


def bounds() -> Call[dict[str, Any]]:
    """``{"first_lsn", "durable_lsn", "applied_lsn", "last_lsn", "store_id"}`` of the server's log."""
    return Call("GET", "/v1/log/bounds", _doc)


def snapshot() -> Call[dict[str, Any]]:
    """Take a snapshot on the server (an admin token): ``{"lsn", "count", "bytes", "created_us"}``."""
    return Call("POST", "/v1/admin/snapshot", _doc)


def sync() -> Call[int]:
    return Call("POST", "/v1/admin/sync", lambda response: int(response.json()["durable_lsn"]))


# -- keyspaces, leases ------------------------------------------------------------


def keyspaces() -> Call[list[str]]:
    return Call("GET", "/v1/keyspaces", lambda response: list(response.json()["keyspaces"]))


def drop_keyspace(name: str) -> Call[int]:
    return Call("DELETE", "/v1/keyspaces/" + quote(check_keyspace(name, default_ok=False).encode()), lsn_of)


def _lease_path(lease: Any) -> str:
    return f"/v1/leases/{lease_id_of(lease)}"


def grant(ttl: float) -> Call[tuple[int, int]]:
    """A new lease: ``(id, granted TTL in microseconds)``."""
    ttl_us = seconds_to_us(ttl, "ttl")
    return Call("POST", "/v1/leases", lambda response: (int(response.json()["id"]), ttl_us),
                json=json_body({"ttl": ttl}))


def lease(lease_id: Any) -> Call[dict[str, Any]]:
    """``{"id", "granted_ttl", "ttl"}`` of a lease alive now (else LeaseNotFoundError)."""
    return Call("GET", _lease_path(lease_id), _doc)


def keepalive(lease_id: Any) -> Call[dict[str, Any]]:
    return Call("POST", _lease_path(lease_id) + "/keepalive", _doc)


def revoke(lease_id: Any) -> Call[int]:
    return Call("DELETE", _lease_path(lease_id), lsn_of)


def stats() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/stats", _doc)
