"""The sync client: ``kvstore.connect(url)``, a :class:`RemoteStore` with
:class:`~kvstore.KVStore`'s API over HTTP (docs/http-api.md)::

    with kvstore.connect("https://db.example:7379", token=TOKEN) as db:
        lsn = db.put(b"k", b"v"); db.get(b"k"); db[b"k"]; b"k" in db
        with db.batch() as b: b.put(b"a", b"1"); b.delete(b"b")
        with db.transaction() as t: t.require(b"a", equals=b"1"); t.put(b"a", b"2")
        for key, value in db.scan(prefix=b"user/"): ...   # pages fetched as the loop goes
        for change in db.watch(b"user/", from_lsn=lsn): ...  # resumes itself after a broken connection
        users = db.keyspace("users"); users.put(b"1", b"Ada", ttl=30)
        lease = db.grant(10); db.put(b"lock", b"me", lease=lease); lease.keepalive()

Semantics are the embedded store's, by construction: batches and
transactions are the same classes (:class:`~kvstore.store.write_batch.WriteBatch`,
:class:`~kvstore.store.txn.Transaction`), checking their arguments against the
server's limits (``GET /v1/info``) before anything is sent, with a commit
function that sends the operations; leases are the same class
(:class:`~kvstore.store.leases.Lease`, its keep-alive thread included);
errors are the same exception classes (:mod:`kvstore.client.wire`). Every
instant (a TTL's end, a lease's) is the server's: the client's clock is
never consulted. Durability: a write returns once the server answered 2xx,
which means what the embedded call returning means under the server store's
sync mode. A write whose connection broke raises
:class:`~kvstore.client.wire.ServerUnavailable` (it may or may not have been
applied); reads are retried (:mod:`kvstore.client.http`).

What an HTTP client cannot offer raises
:class:`~kvstore.client.wire.NotSupportedRemotelyError` naming the method:
``view()`` (a consistent read of several keys held open across calls; a scan
page and ``get_many`` are each read at one LSN instead), ``write(payload)``,
``sweep_expired()`` and the store's files (``list_snapshots()``, ...). The
README's table says what the client can and cannot do.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, NoReturn, TypeVar

from kvstore.client import batches, calls
from kvstore.client.batches import RemoteExpiry
from kvstore.client.calls import Call
from kvstore.client.events import RemoteWatcher, Resumption
from kvstore.client.http import Cert, Verify
from kvstore.client.leader import FAILOVER_TIMEOUT, transport
from kvstore.client.wire import NotFound, NotSupportedRemotelyError
from kvstore.state.lookups import MutableLookups
from kvstore.store import txn
from kvstore.store.keyspace import keyspace_name
from kvstore.store.leases import Lease
from kvstore.store.write_batch import WriteBatch
from kvstore.watch.consumers import SubscriptionInfo
from wal.errors import ClosedError, LeaseNotFoundError
from wal.timeline import History, history_from_json

T = TypeVar("T")


def not_remotely(method: str, why: str) -> NoReturn:
    raise NotSupportedRemotelyError(method, why)


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


class RemoteKeyspace(MutableLookups):
    """The keyspace ``name`` of a served store (``db.keyspace(name)``): the
    embedded :class:`~kvstore.store.keyspace.Keyspace`'s API over HTTP."""

    def __init__(self, store: "RemoteStore", name: str) -> None:
        self.store = store
        self.name = name

    def __repr__(self) -> str:
        return f"<walkv RemoteKeyspace {self.name!r} of {self.store.url!r}>"

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Any = None) -> int:
        return self.store._call(calls.put(key, value, self.store.max_value_bytes, ttl, lease, self.name))

    def delete(self, key: bytes) -> int:
        return self.store._call(calls.delete(key, self.name))

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        return self.store._call(calls.delete_range(start, end, self.name))

    def batch(self) -> WriteBatch:
        return self.store._batch(self.name)

    def transaction(self) -> txn.Transaction:
        return self.store._transaction(self.name)

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        return txn.compare_and_set(self.store._commit, self.store.max_value_bytes, key, expected, new, self.name)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        return txn.delete_if(self.store._commit, self.store.max_value_bytes, key, expected, self.name)

    def drop(self) -> int:
        return self.store.drop_keyspace(self.name)

    def ttl(self, key: bytes) -> float | None:
        return self.store._call(calls.ttl(key, self.name))

    def get(self, key: bytes, default: bytes | None = None, *, min_lsn: int | None = None) -> bytes | None:
        return self.store._get(key, default, min_lsn, self.name)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        return self.store._get_many(keys, default, self.name)

    def __len__(self) -> int:
        return self.store._call(calls.count(self.name))

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
             reverse: bool = False, page: int = 1000) -> Generator[tuple[bytes, bytes], None, None]:
        return self.store._scan(calls.ScanPages(start, stop, prefix, reverse, page, self.name))

    def view(self, max_seconds: float = 0.0) -> NoReturn:
        not_remotely("view()", "a view holds a read transaction of the server's LMDB open across calls")

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error") -> RemoteWatcher:
        return self.store.watch(prefix, start=start, stop=stop, from_lsn=from_lsn, timeout=timeout,
                                progress_every=progress_every, on_gap=on_gap, keyspace=self.name)


class RemoteStore(MutableLookups):
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
        self._info = info
        self.store_id = info.store_id
        self.readonly = info.readonly
        self.max_value_bytes = info.max_value_bytes
        self._max_payload = info.max_payload_bytes
        self._expiry = RemoteExpiry(info.max_value_bytes)

    def _call(self, call: Call[T]) -> T:
        self._check_open()
        return calls.send(self._http, call)

    # -- writes --------------------------------------------------------------

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Any = None) -> int:
        """As :meth:`KVStore.put` (``ttl`` seconds by the server's clock, or under ``lease``)."""
        return self._call(calls.put(key, value, self.max_value_bytes, ttl, lease))

    def delete(self, key: bytes) -> int:
        return self._call(calls.delete(key))

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        return self._call(calls.delete_range(start, end))

    def _commit(self, payload: bytes, ops: list) -> int:
        """Log ``ops`` (a batch's or a transaction's; ``payload`` was only
        for the size check) through the server."""
        return self._call(batches.commit(ops, self._info))

    def _batch(self, keyspace: str) -> WriteBatch:
        self._check_open()
        return WriteBatch(self._commit, self.max_value_bytes, self._max_payload, keyspace, expiring=self._expiry)

    def _transaction(self, keyspace: str) -> txn.Transaction:
        self._check_open()
        return txn.Transaction(self._commit, self.max_value_bytes, self._max_payload, keyspace,
                               expiring=self._expiry)

    def batch(self) -> WriteBatch:
        return self._batch("")

    def transaction(self) -> txn.Transaction:
        return self._transaction("")

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        return txn.compare_and_set(self._commit, self.max_value_bytes, key, expected, new)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        return txn.delete_if(self._commit, self.max_value_bytes, key, expected)

    def write(self, payload: bytes) -> NoReturn:
        not_remotely("write(payload)", "the server takes batches as JSON operations: use batch()")

    def write_group(self, parts: Any, ops: Any = (), **options: Any) -> NoReturn:
        not_remotely("write_group(parts)", "a staged group's parts need consecutive LSNs, so its writer must be the "
                                           "store's only one: write it where the store is (the Spark writer does)")

    def committed_version(self, app_id: str) -> NoReturn:
        not_remotely("committed_version(app_id)", "staged groups are written where the store is (write_group)")

    # -- keyspaces, expiry -----------------------------------------------------

    def keyspace(self, name: str) -> RemoteKeyspace:
        """The keyspace ``name`` (as :meth:`KVStore.keyspace`)."""
        return RemoteKeyspace(self, keyspace_name(name))

    def keyspaces(self) -> list[str]:
        return self._call(calls.keyspaces())

    def drop_keyspace(self, name: str) -> int:
        return self._call(calls.drop_keyspace(name))

    def ttl(self, key: bytes) -> float | None:
        """Seconds until ``key`` expires (None: no TTL or lease, or absent), by the server's clock."""
        return self._call(calls.ttl(key))

    def grant(self, ttl: float) -> Lease:
        """A new lease of ``ttl`` seconds (:meth:`KVStore.grant`): its
        ``keepalive()``, ``ttl()``, ``revoke()`` and ``keep_alive()`` thread
        go through the server."""
        lease_id, ttl_us = self._call(calls.grant(ttl))
        return Lease(self, lease_id, ttl_us)

    def lease(self, lease_id: int) -> Lease:
        """The lease ``lease_id``, alive now (else :class:`LeaseNotFoundError`)."""
        doc = self._call(calls.lease(lease_id))
        return Lease(self, int(doc["id"]), round(float(doc["granted_ttl"]) * 1e6))

    def revoke(self, lease: Lease | int) -> int:
        return self._call(calls.revoke(lease))

    def _keepalive(self, lease_id: int, ttl_us: int) -> float:
        self._call(calls.keepalive(lease_id))
        return ttl_us / 1e6

    def _lease_ttl(self, lease_id: int) -> float | None:
        try:
            return self._call(calls.lease(lease_id))["ttl"]
        except LeaseNotFoundError:
            return None

    def sweep_expired(self, max_keys: int | None = None) -> NoReturn:
        not_remotely("sweep_expired()", "the server's own sweeper deletes expired keys")

    def read_at(self, read: Callable[[], T]) -> NoReturn:
        not_remotely("read_at()", "the server runs each read at an exact LSN and says which (Walkv-Lsn, or "
                     "the answer's lsn); a function of several requests has no one LSN")

    # -- reads ---------------------------------------------------------------

    def get(self, key: bytes, default: bytes | None = None, *, min_lsn: int | None = None) -> bytes | None:
        """The value of ``key`` or ``default``; ``min_lsn``: first wait until the server applied it."""
        return self._get(key, default, min_lsn, "")

    def _get(self, key: bytes, default: bytes | None, min_lsn: int | None, keyspace: str) -> bytes | None:
        call = calls.get(key, default, min_lsn, keyspace)
        return default if call is None else self._call(call)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """As :meth:`KVStore.get_many`: each request of up to :data:`~kvstore.client.wire.MAX_GET_MANY`
        keys (and the server's answer budget) is read at one LSN (not one snapshot across requests)."""
        return self._get_many(keys, default, "")

    def _get_many(self, keys: Iterable[bytes], default: bytes | None, keyspace: str) -> list[bytes | None]:
        many = calls.ManyGets(keys, default, keyspace, self._info)
        while (call := many.next()) is not None:
            self._call(call)
        return many.values

    def __len__(self) -> int:
        return self._call(calls.count())

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
             reverse: bool = False, page: int = 1000) -> Generator[tuple[bytes, bytes], None, None]:
        """As :meth:`KVStore.scan`, fetched ``page`` items at a time as the iteration goes."""
        return self._scan(calls.ScanPages(start, stop, prefix, reverse, page))

    def _scan(self, pages: calls.ScanPages) -> Generator[tuple[bytes, bytes], None, None]:
        self._check_open()
        return self._pages(pages)

    def _pages(self, pages: calls.ScanPages) -> Generator[tuple[bytes, bytes], None, None]:
        while (call := pages.next()) is not None:
            yield from self._call(call)

    def view(self, max_seconds: float = 0.0) -> NoReturn:
        not_remotely("view()", "a view holds a read transaction of the server's LMDB open across calls")

    # -- watching ------------------------------------------------------------

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error", keyspace: str | None = "") -> RemoteWatcher:
        """As :meth:`KVStore.watch`: from ``from_lsn`` (default: the LSN after
        the server's durable one), in ``keyspace`` (None: every keyspace)."""
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, on_gap, keyspace)
        if from_lsn is None:
            from_lsn = self.durable_lsn + 1
        return RemoteWatcher(self._http, "/v1/watch", Resumption(from_lsn, params))

    def subscribe(self, name: str, prefix: bytes | None = None, *, start: bytes | None = None,
                  stop: bytes | None = None, from_lsn: int | None = None, timeout: float | None = None,
                  progress_every: float | None = None) -> RemoteSubscription:
        """As :meth:`KVStore.subscribe`: the subscription exists (created at
        ``from_lsn``) when this returns; iterating it streams its changes
        from after the last one acknowledged."""
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, None)
        self._call(calls.subscribe(name, prefix, start, stop, from_lsn))
        return RemoteSubscription(self, name, Resumption(None, params))

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
    def history(self) -> History:
        """The server's log's timeline history (:mod:`wal.timeline`)."""
        return history_from_json(self.bounds().get("history", [[1, 1, 0]]), f"{self.url}/v1/log/bounds")

    # -- a cluster node's own controls: `walkv serve --cluster` runs them -------------

    @property
    def failure(self) -> NoReturn:
        not_remotely("failure", "whether its log failed is the server's: its /healthz and /metrics say")

    def start_timeline(self, number: int | None = None, **_: Any) -> NoReturn:
        not_remotely("start_timeline()", "a timeline begins in the server's own log (a promote, a failover)")

    @property
    def following(self) -> NoReturn:
        not_remotely("following", "a cluster's follower copies its leader's log into its own store, in its own process")

    @property
    def closed(self) -> bool:
        return self._closed

    def snapshot(self) -> dict[str, Any]:
        """Take a snapshot on the server (an admin token): ``{"lsn", "count", "bytes", "created_us"}``."""
        return self._call(calls.snapshot())

    def list_snapshots(self) -> NoReturn:
        not_remotely("list_snapshots()", "snapshots are the server's files (GET /v1/snapshots lists them)")

    def wait_for_snapshots(self, timeout: float | None = None) -> NoReturn:
        not_remotely("wait_for_snapshots()", "automatic snapshots run in the server's process")

    def flush_archive(self, timeout: float | None = 30.0) -> NoReturn:
        not_remotely("flush_archive()", "the archiver runs in the server's process")

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

