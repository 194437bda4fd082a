"""Named keyspaces: ``users = db.keyspace("users")``, a handle with the
store's API over its own keys.

A keyspace is a separate sorted map of keys in the same store, written
through the same log: LMDB's named databases, RocksDB's column families,
plyvel's ``prefixed_db``. A batch or transaction may span keyspaces and stays
one atomic entry (``b.put(k, v, keyspace="users")``); ``db.keyspaces()``
lists those that hold a key; ``db.drop_keyspace(name)`` removes every key of
one in ONE entry (one op, whatever the keyspace holds). The default keyspace
(``""``) is the store's own API, and what a store made before keyspaces
holds. The log format: :mod:`kvstore.entry.codec` (``[16, name]``,
``[17, name]``).

Keys of a keyspace expire as the store's do (:mod:`kvstore.store.expiring`):
``users.put(k, v, ttl=5)``, ``users.ttl(k)``, ``users.put(k, v,
lease=lease)``, and ``ttl=``/``lease=`` in a batch or transaction put into
any keyspace. A lease is the store's, not a keyspace's: it may hold keys of
several keyspaces, and its revoke or expiry deletes them all in one entry.
Dropping a keyspace drops the TTLs of its keys and detaches them from their
leases.

Durability, reads and watching are the store's (:mod:`kvstore.store.store`),
with one difference: a group that writes a keyspace is applied to LMDB at
once, not through the overlay (which holds the default keyspace only), so a
``readonly=True`` process sees it at once too.

Named LMDB databases, not a key prefix in ``data``, because of what was
measured (``python -m benchmarks --only kv.keyspace``, one run, 2-core Xeon,
ext4, ``sum(range(10**7))`` in 0.34 s; 16-byte keys, 100-byte values,
``sync="none"`` so the log's fsync does not hide the state machine):

==========================  =============  ===============  ==============
                            named (ks:)    default keyspace  key prefix
==========================  =============  ===============  ==============
put, 200,000, one thread    28,378/s       55,448/s          57,665/s
get, 500,000 random         261,088/s      342,841/s         444,756/s
drop 200,000 keys           387 M keys/s   -                 2.1 M keys/s
==========================  =============  ===============  ==============

* a drop is one LMDB ``mdb_drop`` of the keyspace's pages, and one op in the
  log: 183x faster than a ``delete_range`` of a prefix, which visits every
  key inside the commit (and holds every writer up meanwhile);
* keys keep their full 511 bytes (a prefix takes bytes from LMDB's key
  limit), a scan of one keyspace never crosses another's keys, and a
  snapshot writes each keyspace as its own section, which Spark prunes by
  keyspace without opening a chunk;
* the cost: a named keyspace's puts are 0.51x the default's because its
  groups are written to LMDB at once, one write transaction each, where the
  default keyspace's wait in the overlay (:mod:`kvstore.state.overlay`,
  which holds the default keyspace only); with ``sync="always"`` the fsync
  (milliseconds) dwarfs that transaction (microseconds). A get is 0.6-0.8x
  (two more Python calls and the database handle's lookup; both read
  through the thread's cached transaction).

What it costs: an LMDB environment holds at most
:data:`kvstore.state.lmdb_env.MAX_KEYSPACES` keyspaces (a new one past that
is :class:`~wal.errors.KeyspaceLimitError` before anything is logged); a
dropped keyspace keeps its emptied database (a handle other threads may hold
stays valid) until LMDB is next rebuilt.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any, Protocol

from kvstore.entry.codec import (
    OP_DROP_KEYSPACE,
    check_keyspace,
    delete_entry,
    delete_range_entry,
    in_keyspace,
    pack_ops,
    put_entry,
)
from kvstore.state import State
from kvstore.state.lmdb_env import MAX_KEYSPACES
from kvstore.state.lookups import MutableLookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, View, scan_bounds
from kvstore.store import txn
from kvstore.store.expiring import Expiring
from kvstore.store.fast_path import WritePath
from kvstore.store.write_batch import WriteBatch
from kvstore.watch import watcher as watching
from wal.errors import KeyspaceLimitError


class Store(Protocol):
    """What a keyspace needs of its store (:class:`kvstore.KVStore`): its one
    write path (``_writes``) and the parts it composes."""

    path: str
    max_value_bytes: int
    _max_payload: int
    _state: State
    _expiring: Expiring
    _writes: WritePath
    _keyspaces: Keyspaces

    def _check_open(self) -> None: ...
    def drop_keyspace(self, name: str) -> int: ...
    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None,
              progress_every: float | None = None, on_gap: str = "error",
              keyspace: str | None = "") -> watching.Watcher: ...


def keyspace_name(name: object) -> str:
    """``name`` checked as what ``db.keyspace(name)`` takes: a keyspace's
    name; ``""`` is none (the default keyspace is the store itself)."""
    if name == "":
        raise ValueError('db.keyspace("") names no keyspace: the default keyspace is the store itself '
                         "(db.put, db.get, db.scan... work in it)")
    return check_keyspace(name, default_ok=False)


class Keyspaces:
    """The keyspaces of the store at ``path``, whose state is ``state`` and
    whose writes go through ``writes``: the check of a keyspace before a
    write into it, the names, the drop."""

    def __init__(self, state: State, path: str, writes: WritePath) -> None:
        self._state = state
        self._path = path
        self._writes = writes

    def writable(self, name: object) -> str:
        """``name``, checked, before a write into it is logged: a keyspace the
        state does not hold yet past :data:`MAX_KEYSPACES` is refused (nothing
        is logged). Where no write may be appended (read-only, closed, forked)
        only the name is checked: the write's own refusal says why (not LMDB)."""
        name = check_keyspace(name)
        if not (name and self._writes.writes):
            return name
        lmdb = self._state.lmdb
        if lmdb.keyspace_db(name) is None and lmdb.keyspace_slots_left() <= 0:
            raise KeyspaceLimitError(
                f"the store {self._path} holds {MAX_KEYSPACES} keyspaces, its most; keyspace {name!r} "
                f"would be one more. Nothing was written. Drop keyspaces no longer used (their "
                f"slots come back when LMDB is next rebuilt) or keep related data in one keyspace.")
        return name

    def names(self) -> list[str]:
        """The named keyspaces that hold at least one key, sorted."""
        return self._state.expiring_reads.keyspaces()

    def drop(self, name: str) -> int:
        """Log the drop of keyspace ``name`` (one op); its LSN."""
        ops = [[OP_DROP_KEYSPACE, check_keyspace(name, default_ok=False)]]
        return self._writes.append(pack_ops(ops), ops)


def new_batch(store: Store, keyspace: str) -> WriteBatch:
    """A batch of ``store`` whose writes go to ``keyspace`` ("": the default
    one) unless they name another: :meth:`kvstore.KVStore.batch`, :meth:`Keyspace.batch`.
    ``keyspace`` is checked now, as a keyspace a write names is when it is added."""
    store._check_open()
    store._writes.check()
    check = store._keyspaces.writable
    return WriteBatch(store._writes.append, store.max_value_bytes, store._max_payload, check(keyspace),
                      check_keyspace=check, expiring=store._expiring)


def new_transaction(store: Store, keyspace: str) -> txn.Transaction:
    """A transaction of ``store`` whose conditions and writes are in
    ``keyspace`` unless they name another (as :func:`new_batch`)."""
    store._check_open()
    store._writes.check()
    check = store._keyspaces.writable
    return txn.Transaction(store._writes.append, store.max_value_bytes, store._max_payload, check(keyspace),
                           check_keyspace=check, expiring=store._expiring)


class Keyspace(MutableLookups):
    """The keyspace ``name`` of ``store`` (module docstring): the store's API,
    over this keyspace's keys. Made by :meth:`kvstore.KVStore.keyspace`;
    holds nothing but the two, so it costs nothing to keep or to make again.
    Its writes go through the store's one write path.
    """

    __slots__ = ("store", "name")

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name

    def __repr__(self) -> str:
        return f"<walkv Keyspace {self.name!r} of {self.store.path!r}>"

    # -- writes ------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Any = None) -> int:
        """Set ``key`` to ``value`` in this keyspace; return the LSN (as
        :meth:`kvstore.KVStore.put`: ``ttl`` seconds, or under ``lease``, a
        lease of the store, which may hold keys of several keyspaces)."""
        store = self.store
        keyspace = store._keyspaces.writable(self.name)
        if ttl is None and lease is None:
            payload, ops = put_entry(key, value, store.max_value_bytes)
            return store._writes.append(*in_keyspace(keyspace, payload, ops))
        return store._expiring.put(key, value, ttl, lease, keyspace)

    def ttl(self, key: bytes) -> float | None:
        """Seconds until ``key`` of this keyspace expires (as :meth:`kvstore.KVStore.ttl`)."""
        self.store._check_open()
        return self.store._expiring.ttl(key, self.name)

    def delete(self, key: bytes) -> int:
        """Remove ``key`` from this keyspace; return the LSN."""
        payload, ops = delete_entry(key)
        return self.store._writes.append(*in_keyspace(self.store._keyspaces.writable(self.name), payload, ops))

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        """Remove every key with ``start <= key < end`` from this keyspace; return the LSN."""
        payload, ops = delete_range_entry(start, end)
        return self.store._writes.append(*in_keyspace(self.store._keyspaces.writable(self.name), payload, ops))

    def batch(self) -> WriteBatch:
        """A batch whose writes go to this keyspace unless they name another
        (``keyspace=``): one atomic entry either way."""
        return new_batch(self.store, self.name)

    def transaction(self) -> txn.Transaction:
        """A transaction whose conditions and writes are in this keyspace
        unless they name another (``keyspace=``)."""
        return new_transaction(self.store, self.name)

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """:meth:`kvstore.KVStore.compare_and_set` in this keyspace."""
        return txn.compare_and_set(self.store._writes.append, self.store.max_value_bytes, key, expected, new,
                                   self.store._keyspaces.writable(self.name))

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        """:meth:`kvstore.KVStore.delete_if` in this keyspace."""
        return txn.delete_if(self.store._writes.append, self.store.max_value_bytes, key, expected,
                             self.store._keyspaces.writable(self.name))

    def drop(self) -> int:
        """Remove every key of this keyspace in one entry; return its LSN."""
        return self.store.drop_keyspace(self.name)

    # -- reads -------------------------------------------------------------------

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` in this keyspace, or ``default``; sees every
        write that returned before it was called."""
        self.store._check_open()
        return self.store._state.expiring_reads.get_in(self.name, key, default)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` in this keyspace, in order, from one LMDB read transaction."""
        self.store._check_open()
        return self.store._state.expiring_reads.get_many_in(self.name, keys, default)

    def __len__(self) -> int:
        self.store._check_open()
        return self.store._state.expiring_reads.count_in(self.name)

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """:meth:`kvstore.KVStore.scan` of this keyspace."""
        lo, hi = scan_bounds(start, stop, prefix)
        self.store._check_open()
        return self.store._state.expiring_reads.scan_in(self.name, lo, hi, reverse)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """:meth:`kvstore.KVStore.view` of this keyspace."""
        self.store._check_open()
        return self.store._state.expiring_reads.view_in(self.name, max_seconds)

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None,
              progress_every: float | None = None, on_gap: str = "error") -> watching.Watcher:
        """:meth:`kvstore.KVStore.watch` of this keyspace's changes."""
        return self.store.watch(prefix, start=start, stop=stop, from_lsn=from_lsn, timeout=timeout,
                                progress_every=progress_every, on_gap=on_gap, keyspace=self.name)
