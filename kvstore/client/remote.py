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
from typing import Any, TypeVar

from kvstore.client import calls
from kvstore.client.calls import Call
from kvstore.client.events import RemoteWatcher, Resumption
from kvstore.client.http import Cert, Verify
from kvstore.client.leader import FAILOVER_TIMEOUT, transport
from kvstore.client.wire import NotFound
from kvstore.state.lookups import Lookups
from kvstore.store import txn
from kvstore.store.write_batch import WriteBatch
from kvstore.watch.consumers import SubscriptionInfo
from wal.errors import ClosedError

T = TypeVar("T")


class RemoteSubscription(RemoteWatcher):
    """A named, durable subscription (:class:`kvstore.watch.subscription.Subscription`) over HTTP."""

    def __init__(self, store: "RemoteStore", name: str, resumption: Resumption) -> None:
        super().__init__(store._http, calls.subscription_events(name), resumption)
        self.name = name
        self._store = store

    def ack(self, lsn: int) -> None:
        """Every change up to ``lsn`` was handled (durable when it returns)."""
        self._store._call(calls.ack(self.name, lsn))

    @property
    def acked_lsn(self) -> int:
        for info in self._store.subscriptions():
            if info.name == self.name:
                return info.acked_lsn
        raise NotFound(f"no subscription {self.name!r}")


class RemoteStore(Lookups):
    """A store served over HTTP (module docstring). Thread-safe: threads
    share the connection pool."""

    def __init__(self, url: str | list[str], *, token: str | None = None, timeout: float = 10.0,
                 verify: Verify = True, cert: Cert = None, max_connections: int = 100, reads: str = "leader",
                 failover_timeout: float = FAILOVER_TIMEOUT) -> None:
        self.url = url if isinstance(url, str) else ",".join(url)
        self._http = transport(url, token=token, timeout=timeout, verify=verify, cert=cert,
                               max_connections=max_connections, reads=reads, failover_timeout=failover_timeout)
        self._closed = False
        try:
            info = calls.send(self._http, calls.info())
        except BaseException:
            self._http.close()
            raise
        self.store_id = info.store_id
        self.readonly = info.readonly
        self.max_value_bytes = info.max_value_bytes
        self._max_payload = info.max_payload_bytes

    def _call(self, call: Call[T]) -> T:
        self._check_open()
        return calls.send(self._http, call)

    # -- writes --------------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> int:
        return self._call(calls.put(key, value, self.max_value_bytes))

    def delete(self, key: bytes) -> int:
        return self._call(calls.delete(key))

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        return self._call(calls.delete_range(start, end))

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.delete(key)

    def _commit(self, payload: bytes, ops: list) -> int:
        """Log ``ops`` (a batch's or a transaction's; ``payload`` was only
        for the size check) through the server."""
        return self._call(calls.commit(ops))

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
        call = calls.get(key, default, min_lsn)
        return default if call is None else self._call(call)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """As :meth:`KVStore.get_many`: each request of up to :data:`~kvstore.client.wire.MAX_GET_MANY`
        keys is read at one LSN (not one snapshot across requests)."""
        return [value for call in calls.get_many(keys, default) for value in self._call(call)]

    def __len__(self) -> int:
        return self._call(calls.count())

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
             reverse: bool = False, page: int = 1000) -> Generator[tuple[bytes, bytes], None, None]:
        """As :meth:`KVStore.scan`, fetched ``page`` items at a time as the iteration goes."""
        pages = calls.ScanPages(start, stop, prefix, reverse, page)
        self._check_open()
        return self._scan(pages)

    def _scan(self, pages: calls.ScanPages) -> Generator[tuple[bytes, bytes], None, None]:
        while (call := pages.next()) is not None:
            yield from self._call(call)

    # -- watching ------------------------------------------------------------

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error") -> RemoteWatcher:
        """As :meth:`KVStore.watch`: from ``from_lsn`` (default: the LSN after the server's durable one)."""
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, on_gap)
        if from_lsn is None:
            from_lsn = self.durable_lsn + 1
        return RemoteWatcher(self._http, "/v1/watch", Resumption(from_lsn, params))

    def subscribe(self, name: str, prefix: bytes | None = None, *, start: bytes | None = None,
                  stop: bytes | None = None, from_lsn: int | None = None, timeout: float | None = None,
                  progress_every: float | None = None) -> RemoteSubscription:
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, None)
        return RemoteSubscription(self, name, Resumption(from_lsn, params))

    def subscriptions(self) -> list[SubscriptionInfo]:
        return self._call(calls.subscriptions())

    def drop_subscription(self, name: str) -> bool:
        return self._call(calls.drop_subscription(name))

    # -- LSNs, admin ---------------------------------------------------------

    def bounds(self) -> dict[str, Any]:
        """``{"first_lsn", "durable_lsn", "applied_lsn", "last_lsn", "store_id"}`` of the server's log."""
        return self._call(calls.bounds())

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
        return self._call(calls.snapshot())

    def sync(self) -> int:
        return self._call(calls.sync())

    def stats(self) -> dict[str, Any]:
        return self._call(calls.stats())

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


def connect(url: str | list[str], *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
            cert: Cert = None, max_connections: int = 100, reads: str = "leader",
            failover_timeout: float = FAILOVER_TIMEOUT) -> RemoteStore:
    """Connect to a walkv server (``walkv serve``), or to the nodes of a
    cluster (a list of URLs: the client follows the leader,
    :mod:`kvstore.client.leader`; ``reads``: "leader" or "any";
    ``failover_timeout``: how long it looks for a leader); ``verify``: False,
    a CA bundle's path or an :class:`ssl.SSLContext`, for a server whose
    certificate the system does not trust; ``cert``: the client certificate a
    server with ``--tls-client-ca`` requires (a PEM file with its key, or
    ``(certfile, keyfile)``)."""
    return RemoteStore(url, token=token, timeout=timeout, verify=verify, cert=cert, max_connections=max_connections,
                       reads=reads, failover_timeout=failover_timeout)
