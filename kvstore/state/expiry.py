"""Expiry metadata of the state machine: each key's TTL or lease, the leases,
and the indexes the sweeper and the reads use (op codes 8..14 of
:mod:`kvstore.entry.codec`; who decides what: :mod:`kvstore.entry.leases`).

LMDB named databases (beside ``data``; the layout: :mod:`kvstore.state.machine`)::

    ttl:keys      h(k) -> tag (1 byte: 8 TTL, 9 lease) + u64 (at_us or lease id) + k
    ttl:index     at_us + h(k) -> k             keys with a TTL, by instant
    lease:leases  lease -> ttl_us + at_us       every live lease
    lease:index   at_us + lease -> ""           leases by instant
    lease:keys    lease + h(k) -> k             the keys attached to a lease

Integers are u64 big-endian (so that LMDB's byte order is numeric order).
``k`` is a key named with its keyspace: one length byte, the keyspace's
name, the key (``b"\\x00" + key`` in the default keyspace), because a lease's
keys may live in several keyspaces. ``h(k)`` is its 16-byte BLAKE2b digest:
a named key may be longer than LMDB's 511-byte key limit, the digest never
is (a collision needs about 2**64 keys).

Why each rule:

* Metadata is written in the same LMDB write transaction as the data it
  describes, so a reader sees a key's value and its expiry together.
* Reads decide "expired" against the reader's clock (:class:`Expiry`'s
  ``now``), before any sweep: a key whose instant (or whose lease's
  instant) is at or before now is absent. A key attached to a lease that no
  longer exists is absent too.
* The indexes by instant make the sweeper's work bounded: it reads the
  first entries of ``ttl:index`` and ``lease:index`` up to now, never the
  whole store.
* Cost when nothing expires: :attr:`Expiry.keys` counts ``ttl:keys``. While
  it is 0, the state applies plain writes as before and reads take the
  plain path: nothing is looked up. Once a key has an expiry, a get reads
  the key's metadata beside its value, and every write drops the metadata
  its key had: plain puts and deletes still go through the overlay
  (:mod:`kvstore.state.overlay`, whose flush drops it), writes with an
  expiry and range deletes are written through to LMDB at once.

Snapshots carry each of these databases as a section of the same name
(:func:`sections`), so a rebuild from a snapshot and the log restores them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lmdb

from kvstore.entry.codec import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_GRANT,
    OP_KEEPALIVE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    OP_REVOKE,
)
from kvstore.entry.leases import LeaseRecord, Meta, SpacedKey
from kvstore.state.lmdb_ops import seek_ge

DB_NAMES = ("ttl:keys", "ttl:index", "lease:leases", "lease:index", "lease:keys")
"""The named databases (and snapshot sections) of expiry metadata."""
_U64 = struct.Struct(">Q")
_pack = _U64.pack
_unpack = _U64.unpack_from
_TWO = struct.Struct(">QQ")


def named(space: str, key: bytes) -> bytes:
    """``key`` of keyspace ``space``, as the metadata names it."""
    if not space:
        return b"\x00" + key
    s = space.encode("ascii")
    return bytes((len(s),)) + s + key


def unnamed(k: bytes) -> SpacedKey:
    n = k[0]
    return k[1:1 + n].decode("ascii"), k[1 + n:]


def digest(k: bytes) -> bytes:
    return hashlib.blake2b(k, digest_size=16).digest()


def expired(meta: bytes, now_us: int, lease_at: Callable[[int], int | None]) -> bool:
    """Whether a key whose ``ttl:keys`` value is ``meta`` is expired at ``now_us``."""
    n = _unpack(meta, 1)[0]
    if meta[0] == OP_PUT_EXPIRING:
        return n <= now_us
    at = lease_at(n)
    return at is None or at <= now_us


class Expiry:
    """The expiry metadata databases of one LMDB environment ``env``
    (``lmdb.Environment``); ``readonly``: opened beside a writer in another
    process, where missing databases mean no key ever had an expiry."""

    def __init__(self, env: lmdb.Environment, *, readonly: bool) -> None:
        self.dbs: dict[str, Any] = {}
        for name in DB_NAMES:
            try:
                self.dbs[name] = env.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:
                self.dbs = {}
                break
        self.keys = 0
        """Keys with a TTL or a lease (``ttl:keys`` entries), kept by the applying thread."""
        if self.dbs:
            with env.begin() as txn:
                self.keys = txn.stat(self.dbs["ttl:keys"])["entries"]
        self._keys_db = self.dbs.get("ttl:keys")
        self._leases_db = self.dbs.get("lease:leases")

    @property
    def present(self) -> bool:
        """The databases exist (always, in a read-write open)."""
        return bool(self.dbs)

    # -- reads ---------------------------------------------------------------------

    def alive(self, txn: lmdb.Transaction, space: str, key: bytes, now_us: int) -> bool:
        """Whether ``key`` (present in ``txn``'s data) is not expired at ``now_us``."""
        meta = txn.get(digest(named(space, key)), db=self._keys_db)
        if meta is None:
            return True
        return not expired(meta, now_us, lambda lease: self._lease_at(txn, lease))  # type: ignore[arg-type]  # bytes: never buffers=True

    def value_if_alive(self, data: Any, space: str, key: bytes, now_us: Callable[[], int],
                       txn: lmdb.Transaction) -> bytes | None:
        """``key``'s value in ``data`` (keyspace ``space``'s database) unless
        it is absent or expired at ``now_us()`` (read only when the key has
        an expiry)."""
        try:
            v = txn.get(key, db=data)
        except lmdb.BadValsizeError:
            return None  # an empty or over-long key: no such key can exist
        if v is None:
            return None
        meta = txn.get(digest(named(space, key)), db=self._keys_db)
        if meta is None or not expired(meta, now_us(), lambda lease: self._lease_at(txn, lease)):  # type: ignore[arg-type]
            return v  # type: ignore[return-value]  # bytes: never buffers=True
        return None

    def _lease_at(self, txn: lmdb.Transaction, lease_id: int) -> int | None:
        v = txn.get(_pack(lease_id), db=self._leases_db)
        return None if v is None else _TWO.unpack(v)[1]

    def remaining_us(self, txn: lmdb.Transaction, space: str, key: bytes) -> int | None:
        """The instant ``key`` expires at (None: it has no expiry)."""
        meta = txn.get(digest(named(space, key)), db=self._keys_db)
        if meta is None:
            return None
        n = _unpack(meta, 1)[0]
        if meta[0] == OP_PUT_EXPIRING:
            return n
        at = self._lease_at(txn, n)
        return 0 if at is None else at

    def key_meta(self, txn: lmdb.Transaction, space: str, key: bytes) -> Meta | None:
        meta = txn.get(digest(named(space, key)), db=self._keys_db)
        return None if meta is None else (meta[0], _unpack(meta, 1)[0])

    def lease(self, txn: lmdb.Transaction, lease_id: int) -> LeaseRecord | None:
        v = txn.get(_pack(lease_id), db=self._leases_db)
        return None if v is None else _TWO.unpack(v)

    def lease_keys(self, txn: lmdb.Transaction, lease_id: int, limit: int) -> list[SpacedKey]:
        prefix = _pack(lease_id)
        cur = txn.cursor(db=self.dbs["lease:keys"])
        out: list[SpacedKey] = []
        if not cur.set_range(prefix):
            return out
        for k, v in cur:
            if not k.startswith(prefix) or len(out) >= limit:  # type: ignore[union-attr]  # bytes: never buffers=True
                break
            out.append(unnamed(v))  # type: ignore[arg-type]  # bytes: never buffers=True
        return out

    def due(self, txn: lmdb.Transaction, now_us: int, limit: int
            ) -> tuple[list[tuple[str, bytes, int]], list[tuple[int, int]]]:
        """What the sweeper may end at ``now_us``: up to ``limit`` keys
        ``(space, key, at_us)`` and leases ``(lease, at_us)``, earliest first."""
        keys: list[tuple[str, bytes, int]] = []
        if not self.dbs:
            return keys, []
        for k, v in txn.cursor(db=self.dbs["ttl:index"]):
            at = _unpack(k)[0]
            if at > now_us or len(keys) >= limit:
                break
            keys.append((*unnamed(v), at))  # type: ignore[arg-type]  # bytes: never buffers=True
        leases: list[tuple[int, int]] = []
        for k in txn.cursor(db=self.dbs["lease:index"]).iternext(values=False):
            at, lease_id = _TWO.unpack(k)
            if at > now_us or len(leases) >= limit:
                break
            leases.append((lease_id, at))
        return keys, leases

    def next_at(self, txn: lmdb.Transaction) -> int | None:
        """The earliest instant a key or a lease expires at (None: none does)."""
        if not self.dbs:
            return None
        firsts = []
        for name in ("ttl:index", "lease:index"):
            cur = txn.cursor(db=self.dbs[name])
            if cur.first():
                firsts.append(_unpack(cur.key())[0])
        return min(firsts) if firsts else None

    def expired_keys(self, txn: lmdb.Transaction, now_us: int, space: str) -> int:
        """How many keys of keyspace ``space`` present in LMDB are expired at
        ``now_us`` (not yet swept): the sweeper keeps this small, so it is counted."""
        keys, leases = self.due(txn, now_us, 1 << 62)
        n = sum(1 for k in keys if k[0] == space)
        for lease_id, _at in leases:
            n += sum(1 for k in self.lease_keys(txn, lease_id, 1 << 62) if k[0] == space)
        return n

    # -- writes (the applying thread, inside one LMDB write transaction) ---------

    def apply(self, txn: lmdb.Transaction, ops: Sequence[Sequence[Any]],
              keyspace_db: Callable[[lmdb.Transaction, str], Any]) -> None:
        """Apply ``ops`` (any codes a batch's writes have, keyspace switches
        and drops too; starting in the default keyspace) in order to the
        keyspaces' databases (``keyspace_db(txn, name)``) and to the
        metadata. :attr:`keys` is counted again from ``txn`` first, so a
        transaction that is redone (the map grew) counts right."""
        self.keys = txn.stat(self._keys_db)["entries"]
        space = ""
        data = keyspace_db(txn, space)
        for op in ops:
            code = op[0]
            if code == OP_KEYSPACE:
                space = op[1]
                data = keyspace_db(txn, space)
            elif code == OP_DROP_KEYSPACE:
                dropped = keyspace_db(txn, op[1])
                self._drop_space(txn, op[1], dropped)
                txn.drop(dropped, delete=False)  # emptied, not deleted (as kvstore.state.lmdb_ops does)
            elif code == OP_PUT:
                self._drop(txn, space, op[1])
                txn.put(op[1], op[2], db=data)
            elif code == OP_DELETE or code == OP_EXPIRE:
                self._drop(txn, space, op[1])
                txn.delete(op[1], db=data)
            elif code == OP_DELETE_RANGE:
                self._delete_range(txn, data, space, op[1], op[2])
            elif code == OP_PUT_EXPIRING or code == OP_PUT_LEASED:
                self._put(txn, data, space, op)
            elif code == OP_GRANT:
                self._set_lease(txn, op[1], op[2], op[3])
            elif code == OP_KEEPALIVE:
                record = self.lease(txn, op[1])
                if record is not None:
                    self._set_lease(txn, op[1], record[0], op[2])
            elif code == OP_REVOKE:
                self._end_lease(txn, op[1])

    def drop(self, txn: lmdb.Transaction, keys: Iterable[bytes], space: str = "") -> None:
        """Drop the expiry of ``keys`` (an overlay's, written by plain puts
        and deletes in ``txn``)."""
        self.keys = txn.stat(self._keys_db)["entries"]
        for key in keys:
            if not self.keys:
                return
            self._drop(txn, space, key)

    def _put(self, txn: lmdb.Transaction, data: Any, space: str, op: Sequence[Any]) -> None:
        code, key, value, n = op
        k = named(space, key)
        h = digest(k)
        self._drop_named(txn, h)
        txn.put(key, value, db=data)
        txn.put(h, bytes((code,)) + _pack(n) + k, db=self._keys_db)
        if code == OP_PUT_EXPIRING:
            txn.put(_pack(n) + h, k, db=self.dbs["ttl:index"])
        else:
            txn.put(_pack(n) + h, k, db=self.dbs["lease:keys"])
        self.keys += 1

    def _drop(self, txn: lmdb.Transaction, space: str, key: bytes) -> None:
        if self.keys:
            self._drop_named(txn, digest(named(space, key)))

    def _drop_named(self, txn: lmdb.Transaction, h: bytes) -> None:
        meta = txn.pop(h, db=self._keys_db)
        if meta is None:
            return
        self.keys -= 1
        index = "ttl:index" if meta[0] == OP_PUT_EXPIRING else "lease:keys"
        txn.delete(meta[1:9] + h, db=self.dbs[index])  # type: ignore[operator]  # bytes: never buffers=True

    def _delete_range(self, txn: lmdb.Transaction, data: Any, space: str, start: bytes, end: bytes) -> None:
        if start >= end:
            return
        cur = txn.cursor(db=data)
        if not seek_ge(cur, start):
            return
        while True:
            k: bytes = cur.key()  # type: ignore[assignment]  # bytes: walkv never sets buffers=True
            if not k or k >= end:
                return
            self._drop(txn, space, k)
            cur.delete()

    def _drop_space(self, txn: lmdb.Transaction, space: str, data: Any) -> None:
        """Drop the expiry of every key of keyspace ``space`` (about to be
        dropped): by its keys, or by the metadata's indexes, whichever is fewer."""
        if not self.keys:
            return
        if txn.stat(data)["entries"] <= self.keys:
            for k in txn.cursor(db=data).iternext(keys=True, values=False):
                self._drop(txn, space, k)  # type: ignore[arg-type]  # bytes: never buffers=True
            return
        hashes = []
        for index in ("ttl:index", "lease:keys"):
            for k, v in txn.cursor(db=self.dbs[index]):
                if unnamed(v)[0] == space:  # type: ignore[arg-type]  # bytes: never buffers=True
                    hashes.append(k[8:])
        for h in hashes:
            self._drop_named(txn, h)  # type: ignore[arg-type]

    def _set_lease(self, txn: lmdb.Transaction, lease_id: int, ttl_us: int, at_us: int) -> None:
        old = self.lease(txn, lease_id)
        index = self.dbs["lease:index"]
        if old is not None:
            txn.delete(_TWO.pack(old[1], lease_id), db=index)
        txn.put(_pack(lease_id), _TWO.pack(ttl_us, at_us), db=self._leases_db)
        txn.put(_TWO.pack(at_us, lease_id), b"", db=index)

    def _end_lease(self, txn: lmdb.Transaction, lease_id: int) -> None:
        old = txn.pop(_pack(lease_id), db=self._leases_db)
        if old is not None:
            txn.delete(_TWO.pack(_TWO.unpack(old)[1], lease_id), db=self.dbs["lease:index"])

    # -- snapshots ------------------------------------------------------------------

    def sections(self, txn: lmdb.Transaction) -> dict[str, Any]:
        """The metadata databases that hold anything in ``txn``, by name: each
        is a snapshot section of the same name."""
        return {name: db for name, db in self.dbs.items() if txn.stat(db)["entries"]}

    def load(self, txn: lmdb.Transaction, *, name: str, pairs: list[tuple[bytes, bytes]]) -> None:
        """Bulk-load a snapshot section's pairs into database ``name``."""
        txn.cursor(db=self.dbs[name]).putmulti(pairs, dupdata=False, overwrite=True, append=False)
        self.keys = txn.stat(self._keys_db)["entries"]
