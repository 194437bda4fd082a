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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from kvstore.client.http import Params
from kvstore.client.leader import AsyncTransport, Transport
from kvstore.client.wire import (
    MAX_GET_MANY,
    ConditionFailed,
    NotFound,
    b64_or_none,
    b64decode,
    b64encode,
    op_json,
    quote,
)
from kvstore.entry.codec import (
    MAX_KEY_BYTES,
    OP_REQUIRE_ABSENT,
    OP_REQUIRE_EQUALS,
    OP_REQUIRE_PRESENT,
    as_bytes,
    check_key,
    check_range,
    check_value,
)
from kvstore.entry.conditions import Outcome
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.watcher import ON_GAP

T = TypeVar("T")
_CONDITIONS = {OP_REQUIRE_EQUALS, OP_REQUIRE_ABSENT, OP_REQUIRE_PRESENT}


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and what its answer means: ``answer(response)`` for a
    2xx; an error answer of a class in ``expected`` is ``recover(error)``
    (any other raises)."""

    method: str
    path: str
    answer: Callable[[httpx.Response], T]
    params: Params | None = None
    json: Any = None
    content: bytes | None = None
    expected: tuple[type[Exception], ...] = ()
    recover: Callable[[Exception], T] | None = None


def send(http: Transport, call: Call[T]) -> T:
    """What ``call`` answers, over the sync transport."""
    try:
        response = http.request(call.method, call.path, params=call.params, json=call.json, content=call.content)
    except call.expected as exc:
        assert call.recover is not None
        return call.recover(exc)
    return call.answer(response)


async def send_async(http: AsyncTransport, call: Call[T]) -> T:
    """What ``call`` answers, over the asyncio transport."""
    try:
        response = await http.request(call.method, call.path, params=call.params, json=call.json,
                                      content=call.content)
    except call.expected as exc:
        assert call.recover is not None
        return call.recover(exc)
    return call.answer(response)


def _lsn(response: httpx.Response) -> int:
    return int(response.json()["lsn"])


def _doc(response: httpx.Response) -> dict[str, Any]:
    doc: dict[str, Any] = response.json()
    return doc


def _kv(key: bytes) -> str:
    return "/v1/kv/" + quote(key)


def _subscription(name: str) -> str:
    return "/v1/subscriptions/" + quote(name.encode())


# -- the server ------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """What ``GET /v1/info`` says: the store's id and the limits a client checks against."""

    store_id: str | None
    readonly: bool
    max_value_bytes: int
    max_payload_bytes: int


def info() -> Call[ServerInfo]:
    def answer(response: httpx.Response) -> ServerInfo:
        doc = response.json()
        return ServerInfo(doc.get("store_id"), bool(doc.get("readonly")), int(doc["max_value_bytes"]),
                          int(doc["max_payload_bytes"]))

    return Call("GET", "/v1/info", answer)


# -- writes ----------------------------------------------------------------------


def put(key: bytes, value: bytes, max_value_bytes: int) -> Call[int]:
    path = _kv(check_key(key))
    return Call("PUT", path, _lsn, content=check_value(value, max_value_bytes))


def delete(key: bytes) -> Call[int]:
    return Call("DELETE", _kv(check_key(key)), _lsn)


def delete_range(start: bytes | None, end: bytes | None) -> Call[int]:
    start, end = check_range(start, end)
    return Call("POST", "/v1/delete_range", _lsn, json={"start": b64_or_none(start), "end": b64_or_none(end)})


def commit(ops: list) -> Call[int]:
    """Log ``ops`` (a batch's, or a transaction's :class:`Outcome`, whose
    conditions come first); the answer is the entry's LSN, and a
    transaction's outcome is recorded in ``ops``."""
    writes = [op_json(op) for op in ops if op[0] not in _CONDITIONS]
    if not isinstance(ops, Outcome):
        return Call("POST", "/v1/batch", _lsn, json={"ops": writes})
    conditions: list[dict[str, Any]] = []
    for op in ops:
        if op[0] == OP_REQUIRE_EQUALS:
            conditions.append({"key": b64encode(op[1]), "equals": b64encode(op[2])})
        elif op[0] in _CONDITIONS:
            conditions.append({"key": b64encode(op[1]), "absent" if op[0] == OP_REQUIRE_ABSENT else "present": True})

    def held(response: httpx.Response) -> int:
        ops.decided, ops.failed = True, None
        lsn = response.json()["lsn"]
        return int(lsn) if lsn is not None else 0

    def failed(exc: Exception) -> int:
        assert isinstance(exc, ConditionFailed)
        ops.decided, ops.failed = True, exc.failed
        return int(exc.lsn) if exc.lsn is not None else 0

    return Call("POST", "/v1/txn", held, json={"conditions": conditions, "ops": writes},
                expected=(ConditionFailed,), recover=failed)


# -- reads -----------------------------------------------------------------------


def read_key(key: Any) -> bytes | None:
    """A key to read (None: one no key can be, so absent, as the embedded get answers)."""
    checked = key if type(key) is bytes else as_bytes(key, "key")
    return checked if 0 < len(checked) <= MAX_KEY_BYTES else None


def get(key: bytes, default: bytes | None, min_lsn: int | None) -> Call[bytes | None] | None:
    """The value of ``key`` or ``default``; None: nothing to ask, the answer
    is ``default`` (no key can be ``key``)."""
    checked = read_key(key)
    if checked is None:
        return None
    return Call("GET", _kv(checked), lambda response: response.content, params={"min_lsn": min_lsn},
                expected=(NotFound,), recover=lambda _exc: default)


def get_many(keys: Iterable[bytes], default: bytes | None) -> list[Call[list[bytes | None]]]:
    """One call per :data:`MAX_GET_MANY` keys, each read at one LSN."""
    encoded = [b64encode(k if type(k) is bytes else as_bytes(k, "key")) for k in keys]

    def values(response: httpx.Response) -> list[bytes | None]:
        return [default if v is None else b64decode(v) for v in response.json()["values"]]

    return [Call("POST", "/v1/get_many", values, json={"keys": encoded[i:i + MAX_GET_MANY]})
            for i in range(0, len(encoded), MAX_GET_MANY)]


def count() -> Call[int]:
    return Call("GET", "/v1/count", lambda response: int(response.json()["count"]))


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
                 page: int) -> None:
        self._params: dict[str, Any] = {
            "start": _key_or_none(start, "start"), "stop": _key_or_none(stop, "stop"),
            "prefix": _key_or_none(prefix, "prefix"), "reverse": reverse or None, "limit": page}
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
                 progress_every: float | None, on_gap: str | None) -> dict[str, Any]:
    """The query of ``/v1/watch`` (``on_gap`` None: a subscription's, which has none)."""
    params: dict[str, Any] = {
        "prefix": _key_or_none(prefix, "prefix"), "start": _key_or_none(start, "start"),
        "stop": _key_or_none(stop, "stop"), "timeout": timeout, "progress_every": progress_every}
    if on_gap is not None:
        if on_gap not in ON_GAP:
            raise ValueError(f"on_gap must be one of {ON_GAP}, not {on_gap!r}")
        params["on_gap"] = on_gap
    return params


def subscription_events(name: str) -> str:
    """The path of a subscription's change stream."""
    return _subscription(name) + "/events"


def ack(name: str, lsn: int) -> Call[None]:
    return Call("POST", _subscription(name) + "/ack", lambda _response: None, json={"lsn": lsn})


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


def stats() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/stats", _doc)
