"""The sync client: ``kvstore.connect(url)``, a :class:`RemoteStore` with
:class:`~kvstore.KVStore`'s API over HTTP (docs/http-api.md)::

    with kvstore.connect("https://db.example:7379", token=TOKEN) as db:
        lsn = db.put(b"k", b"v"); db.get(b"k"); db[b"k"]; b"k" in db
        with db.batch() as b: b.put(b"a", b"1"); b.delete(b"b")
        with db.transaction() as t: t.require(b"a", equals=b"1"); t.put(b"a", b"2")
        for key, value in db.scan(prefix=b"user/"): ...   # pages fetched as the loop goes
        for change in db.watch(b"user/", from_lsn=lsn): ...  # resumes itself after a broken connection

Semantics are the embedded store's, by construction: batches and
transactions are the same classes (:class:`~kvstore.store.write_batch.WriteBatch`,
:class:`~kvstore.store.txn.Transaction`), checking their arguments against the
server's limits (``GET /v1/info``) before anything is sent, with a commit
function that sends the operations; errors are the same exception classes
(:mod:`kvstore.client.wire`). Durability: a write returns once the server
answered 2xx, which means what the embedded call returning means under the
server store's sync mode. A write whose connection broke raises
:class:`~kvstore.client.wire.ServerUnavailable` (it may or may not have been
applied); reads are retried (:mod:`kvstore.client.http`).

What an HTTP client cannot offer: ``view()`` (a consistent read of several
keys held open across calls; a scan page and ``get_many`` are each read at
one LSN instead), ``write(payload)``, and the store's files.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from typing import Any

from kvstore.client.events import RemoteWatcher, Resumption
from kvstore.client.http import Cert, Http, Verify
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
from kvstore.state.readers import Lookups
from kvstore.store import txn
from kvstore.store.write_batch import WriteBatch
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.watcher import ON_GAP
from wal.errors import ClosedError

_CONDITIONS = {OP_REQUIRE_EQUALS, OP_REQUIRE_ABSENT, OP_REQUIRE_PRESENT}


def ops_request(ops: list) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body that log ``ops`` (a batch's, or a
    transaction's :class:`Outcome`, whose conditions come first)."""
    conds = [op for op in ops if op[0] in _CONDITIONS]
    writes = [op_json(op) for op in ops if op[0] not in _CONDITIONS]
    if not isinstance(ops, Outcome):
        return "/v1/batch", {"ops": writes}
    out: list[dict[str, Any]] = []
    for op in conds:
        if op[0] == OP_REQUIRE_EQUALS:
            out.append({"key": b64encode(op[1]), "equals": b64encode(op[2])})
        else:
            out.append({"key": b64encode(op[1]), "absent" if op[0] == OP_REQUIRE_ABSENT else "present": True})
    return "/v1/txn", {"conditions": out, "ops": writes}


def settle(ops: list, answer: dict[str, Any] | ConditionFailed) -> int:
    """The LSN of a logged entry, its outcome recorded in ``ops`` when it is a transaction's."""
    if isinstance(ops, Outcome):
        ops.decided = True
        ops.failed = answer.failed if isinstance(answer, ConditionFailed) else None
    lsn = answer.lsn if isinstance(answer, ConditionFailed) else answer["lsn"]
    return int(lsn) if lsn is not None else 0


def scan_params(start: bytes | None, stop: bytes | None, prefix: bytes | None, reverse: bool,
                page: int) -> dict[str, Any]:
    return {"start": _key_or_none(start, "start"), "stop": _key_or_none(stop, "stop"),
            "prefix": _key_or_none(prefix, "prefix"), "reverse": reverse or None, "limit": page}


def _key_or_none(value: bytes | None, what: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


def watch_params(prefix: bytes | None, start: bytes | None, stop: bytes | None, timeout: float | None,
                 progress_every: float | None, on_gap: str) -> dict[str, Any]:
    if on_gap not in ON_GAP:
        raise ValueError(f"on_gap must be one of {ON_GAP}, not {on_gap!r}")
    return {"prefix": _key_or_none(prefix, "prefix"), "start": _key_or_none(start, "start"),
            "stop": _key_or_none(stop, "stop"), "timeout": timeout, "progress_every": progress_every,
            "on_gap": on_gap}


class RemoteSubscription(RemoteWatcher):
    """A named, durable subscription (:class:`kvstore.watch.subscription.Subscription`) over HTTP."""

    def __init__(self, store: "RemoteStore", name: str, resumption: Resumption) -> None:
        super().__init__(store._http, f"/v1/subscriptions/{quote(name.encode())}/events", resumption)
        self.name = name
        self._store = store

    def ack(self, lsn: int) -> None:
        """Every change up to ``lsn`` was handled (durable when it returns)."""
        self._http.request("POST", f"/v1/subscriptions/{quote(self.name.encode())}/ack", json={"lsn": lsn})

    @property
    def acked_lsn(self) -> int:
        for info in self._store.subscriptions():
            if info.name == self.name:
                return info.acked_lsn
        raise NotFound(f"no subscription {self.name!r}")


class RemoteStore(Lookups):
    """A store served over HTTP (module docstring). Thread-safe: threads
    share the connection pool."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
                 cert: Cert = None, max_connections: int = 100) -> None:
        self.url = url
        self._http = Http(url, token=token, timeout=timeout, verify=verify, cert=cert,
                          max_connections=max_connections)
        self._closed = False
        try:
            info = self._http.request("GET", "/v1/info").json()
        except BaseException:
            self._http.close()
            raise
        self.store_id: str | None = info.get("store_id")
        self.readonly = bool(info.get("readonly"))
        self.max_value_bytes = int(info["max_value_bytes"])
        self._max_payload = int(info["max_payload_bytes"])

    # -- writes --------------------------------------------------------------

    def _kv(self, key: bytes) -> str:
        return "/v1/kv/" + quote(check_key(key))

    def put(self, key: bytes, value: bytes) -> int:
        value = check_value(value, self.max_value_bytes)
        return int(self._request("PUT", self._kv(key), content=value).json()["lsn"])

    def delete(self, key: bytes) -> int:
        return int(self._request("DELETE", self._kv(key)).json()["lsn"])

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        start, end = check_range(start, end)
        return int(self._request("POST", "/v1/delete_range",
                                 json={"start": b64_or_none(start), "end": b64_or_none(end)}).json()["lsn"])

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.delete(key)

    def _commit(self, payload: bytes, ops: list) -> int:
        """Log ``ops`` (a batch's or a transaction's; ``payload`` was only
        for the size check) through the server."""
        path, body = ops_request(ops)
        try:
            answer: dict[str, Any] | ConditionFailed = self._request("POST", path, json=body).json()
        except ConditionFailed as failed:
            answer = failed
        return settle(ops, answer)

    def batch(self) -> WriteBatch:
        self._check_open()
        return WriteBatch(self._commit, self.max_value_bytes, self._max_payload)

    def update(self, pairs: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> int | None:
        with self.batch() as b:
            b.update(pairs)
        return b.lsn

    def transaction(self) -> txn.Transaction:
        self._check_open()
        return txn.Transaction(self._commit, self.max_value_bytes, self._max_payload)

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        return txn.compare_and_set(self._commit, self.max_value_bytes, key, expected, new)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        return txn.delete_if(self._commit, self.max_value_bytes, key, expected)

    # -- reads ---------------------------------------------------------------

    def get(self, key: bytes, default: bytes | None = None, *, min_lsn: int | None = None) -> bytes | None:
        """The value of ``key`` or ``default``; ``min_lsn``: first wait until the server applied it."""
        checked = read_key(key)
        if checked is None:
            return default
        try:
            return self._request("GET", "/v1/kv/" + quote(checked), params={"min_lsn": min_lsn}).content
        except NotFound:
            return default

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """As :meth:`KVStore.get_many`: each request of up to :data:`MAX_GET_MANY`
        keys is read at one LSN (not one snapshot across requests)."""
        encoded = [b64encode(k if type(k) is bytes else _as_key(k)) for k in keys]
        out: list[bytes | None] = []
        for i in range(0, len(encoded), MAX_GET_MANY):
            body = {"keys": encoded[i:i + MAX_GET_MANY]}
            out.extend(default if v is None else b64decode(v)
                       for v in self._request("POST", "/v1/get_many", json=body).json()["values"])
        return out

    def __len__(self) -> int:
        return int(self._request("GET", "/v1/count").json()["count"])

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
             reverse: bool = False, page: int = 1000) -> Generator[tuple[bytes, bytes], None, None]:
        """As :meth:`KVStore.scan`, fetched ``page`` items at a time as the iteration goes."""
        params = scan_params(start, stop, prefix, reverse, page)
        self._check_open()
        return self._scan(params)

    def _scan(self, params: dict[str, Any]) -> Generator[tuple[bytes, bytes], None, None]:
        while True:
            doc = self._request("GET", "/v1/scan", params=params).json()
            for k, v in doc["items"]:
                yield b64decode(k), b64decode(v)
            if doc["after"] is None:
                return
            params["after"] = doc["after"].encode()

    # -- watching ------------------------------------------------------------

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error") -> RemoteWatcher:
        """As :meth:`KVStore.watch`: from ``from_lsn`` (default: the LSN after the server's durable one)."""
        params = watch_params(prefix, start, stop, timeout, progress_every, on_gap)
        if from_lsn is None:
            from_lsn = self.durable_lsn + 1
        return RemoteWatcher(self._http, "/v1/watch", Resumption(from_lsn, params))

    def subscribe(self, name: str, prefix: bytes | None = None, *, start: bytes | None = None,
                  stop: bytes | None = None, from_lsn: int | None = None, timeout: float | None = None,
                  progress_every: float | None = None) -> RemoteSubscription:
        params = watch_params(prefix, start, stop, timeout, progress_every, "error")
        del params["on_gap"]
        return RemoteSubscription(self, name, Resumption(from_lsn, params))

    def subscriptions(self) -> list[SubscriptionInfo]:
        return [SubscriptionInfo(**s) for s in self._request("GET", "/v1/subscriptions").json()["subscriptions"]]

    def drop_subscription(self, name: str) -> bool:
        try:
            self._request("DELETE", f"/v1/subscriptions/{quote(name.encode())}")
        except NotFound:
            return False
        return True

    # -- LSNs, admin ---------------------------------------------------------

    def bounds(self) -> dict[str, Any]:
        """``{"first_lsn", "durable_lsn", "last_lsn", "store_id"}`` of the server's log."""
        return self._request("GET", "/v1/log/bounds").json()

    @property
    def last_lsn(self) -> int:
        return int(self.bounds()["last_lsn"])

    @property
    def durable_lsn(self) -> int:
        return int(self.bounds()["durable_lsn"])

    @property
    def applied_lsn(self) -> int:
        """The last LSN the server applied (what its reads see)."""
        return int(self.bounds()["applied_lsn"])

    @property
    def closed(self) -> bool:
        return self._closed

    def snapshot(self) -> dict[str, Any]:
        """Take a snapshot on the server (an admin token): ``{"lsn", "count", "bytes", "created_us"}``."""
        return self._request("POST", "/v1/admin/snapshot").json()

    def sync(self) -> int:
        return int(self._request("POST", "/v1/admin/sync").json()["durable_lsn"])

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/v1/stats").json()

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        self._check_open()
        return self._http.request(method, path, **kw)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the connection to {self.url} is closed")

    def close(self) -> None:
        """Close the connection pool (idempotent); the server's store stays open."""
        if not self._closed:
            self._closed = True
            self._http.close()

    def __enter__(self) -> "RemoteStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteStore {self.url}{' closed' if self._closed else ''}>"


def _as_key(key: Any) -> bytes:
    return as_bytes(key, "key")


def read_key(key: Any) -> bytes | None:
    """A key to read (None: one no key can be, so absent, as the embedded get answers)."""
    checked = key if type(key) is bytes else _as_key(key)
    return checked if 0 < len(checked) <= MAX_KEY_BYTES else None


def connect(url: str, *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
            cert: Cert = None, max_connections: int = 100) -> RemoteStore:
    """Connect to a walkv server (``walkv serve``); ``verify``: False, a CA
    bundle's path or an :class:`ssl.SSLContext`, for a server whose certificate
    the system does not trust; ``cert``: the client certificate a server with
    ``--tls-client-ca`` requires (a PEM file with its key, or ``(certfile, keyfile)``)."""
    return RemoteStore(url, token=token, timeout=timeout, verify=verify, cert=cert, max_connections=max_connections)
