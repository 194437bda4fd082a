"""Keys that expire: the store's TTL and lease front, and the sweeper.

::

    db.put(b"session:1", b"...", ttl=30)          # gone 30 s from now
    db.ttl(b"session:1")                           # seconds left (None: no expiry)
    lease = db.grant(10)                           # etcd's leases
    db.put(b"lock:42", b"me", lease=lease)         # lives as long as the lease
    lease.keepalive()                              # 10 s more; or lease.keep_alive() in the background
    db.revoke(lease)                               # deletes its keys, in one entry

Time. The store reads a clock (``kvstore.open(path, clock=...)``, default
the system clock; :mod:`kvstore.store.clock`) through an
:class:`~kvstore.store.clock.ExpiryClock`. A TTL becomes an absolute instant
when the put is made (now + ttl, microseconds since the epoch, UTC), and that
instant is logged with the put; so are a lease's instants. Replay, rebuilds,
restore, replicas, watch and Spark read instants from the log and never
consult a clock to change state: a key goes when the log says it went.

Reads decide "expired" against the reader's clock at once, before any
sweep: a key whose instant is at or before now is absent to get, get_many,
scan, view, len and :meth:`Expiring.ttl`. The key is deleted from the state,
by a log entry (``expire`` to watchers and Spark), by the sweeper: a thread
of the writing process that every ``sweep_interval`` seconds (default 0.5)
reads the earliest instants from the expiry indexes up to now, and logs one
entry of at most ``sweep_keys`` of them (and one per expired lease, its keys
in runs of at most as many); a full run is followed by the next at once. The
writer decides in log order which of them still expire
(:mod:`kvstore.entry.leases`), so a key written again meanwhile keeps its
new value. Work per entry is bounded; nothing scans the store.

When the clock goes backwards. The :class:`~kvstore.store.clock.ExpiryClock`
never does: it is the largest reading so far, so time for expiry stands
still until the clock catches up. A key that was absent stays absent, TTLs
given meanwhile count from that high-water mark, and a key the sweeper
deleted is deleted in the log for good. Across a restart the high-water mark
starts again from the clock: a key that expired but was not swept yet (at
most about ``sweep_interval`` of them) is present again until the clock
passes its instant once more. A clock stepped forward expires keys early,
as Redis and etcd do.

Durability: every entry here (grant, keep-alive, revoke, a sweep) is a
write like any other (:mod:`kvstore.store.store`): durable per the sync mode
and applied when the call returns.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from kvstore.entry.codec import (
    EXPIRY_CODES,
    GROUP_CODES,
    MAX_LEASE_ID,
    OP_GRANT,
    OP_KEEPALIVE,
    OP_KEYSPACE,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    PUT_CODES,
    check_key,
    check_value,
    pack_ops,
)
from kvstore.entry.conditions import Outcome, count_conditions
from kvstore.entry.leases import ExpireKeys, ExpireLease, LeaseRecord, Listing, Meta, Revoke, SpacedKey
from kvstore.entry.leases import decide_group as decide_leases
from kvstore.state import State
from kvstore.store.clock import Clock, ExpiryClock, SystemClock, seconds_to_us
from wal.errors import ClosedError, LeaseNotFoundError, WalkvError
from wal.segment import Payload

log = logging.getLogger("walkv.expiry")

DEFAULT_SWEEP_INTERVAL = 0.5
"""Seconds between the sweeper's looks at the expiry indexes (etcd's lessor: 0.5)."""
DEFAULT_SWEEP_KEYS = 1000
"""Most keys one sweep entry deletes."""
_EMPTY = pack_ops([])

Append = Callable[[Payload, Any], int]


def sweep_seconds(interval: object) -> float | None:
    """``sweep_interval`` checked: a positive number of seconds, or None (no
    sweeper thread); else ValueError."""
    if interval is None:
        return None
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ValueError(f"sweep_interval must be a positive number of seconds or None, not {interval!r}")
    return float(interval)


def lease_id_of(lease: object) -> int:
    """The id of ``lease`` (a :class:`~kvstore.store.leases.Lease` or an int)."""
    lease_id = getattr(lease, "id", lease)
    if isinstance(lease_id, bool) or not isinstance(lease_id, int) or not 0 < lease_id <= MAX_LEASE_ID:
        raise TypeError(f"lease must be a Lease (from db.grant) or its id, not {lease!r}")
    return lease_id


def expiring_put_op(key: object, value: object, max_value: int, ttl: object, lease: object, now_us: int) -> list:
    """The op of a put with ``ttl`` (seconds from ``now_us``) or under
    ``lease``, its arguments checked (a client of a server passes ``now_us``
    0: its op then holds the TTL itself, for the server's clock)."""
    key = check_key(key)
    value = check_value(value, max_value)
    if lease is not None:
        if ttl is not None:
            raise ValueError("a put takes ttl= or lease=, not both (a key has one expiry)")
        return [OP_PUT_LEASED, key, value, lease_id_of(lease)]
    return [OP_PUT_EXPIRING, key, value, now_us + seconds_to_us(ttl, "ttl")]


class _StateMeta:
    """The state's expiry metadata as the writer's decision reads it
    (:class:`kvstore.entry.leases.MetaReader`), each question one read
    transaction of LMDB (metadata is never in the overlay)."""

    def __init__(self, state: State) -> None:
        self._state = state

    def key_meta(self, space: str, key: bytes) -> Meta | None:
        return self._state.expiring_reads.read_expiry(lambda txn, e: e.key_meta(txn, space, key))

    def lease(self, lease_id: int) -> LeaseRecord | None:
        return self._state.expiring_reads.read_expiry(lambda txn, e: e.lease(txn, lease_id))

    def lease_keys(self, lease_id: int, limit: int) -> list[SpacedKey]:
        return self._state.expiring_reads.read_expiry(lambda txn, e: e.lease_keys(txn, lease_id, limit))


class Expiring:
    """A store's TTLs, leases and sweeper (module docstring), for the store
    at ``path``. Its writes go through ``append`` (the store's one write
    path, :class:`kvstore.store.fast_path.WritePath`); the asyncio front appends the
    entries it builds itself, then :meth:`check` tells whether a lease they
    needed was alive."""

    def __init__(self, state: State, clock: ExpiryClock, max_value: int, max_payload: int, append: Append,
                 path: str) -> None:
        self._state = state
        self.clock = clock
        self._append = append
        self._path = path
        self._max_value = max_value
        self._max_payload = max_payload
        self.sweep_keys = max(1, min(DEFAULT_SWEEP_KEYS, max_payload // 600))
        self._meta = _StateMeta(state)
        self._sweeper: threading.Thread | None = None
        self._paused = False
        self._stop = threading.Event()
        self.swept = 0
        """Keys the sweeper deleted (this process)."""

    @classmethod
    def wired(cls, state: State, clock: Clock | None, max_value: int, max_payload: int, append: Append,
              path: str) -> Expiring:
        """The store's expiry, reading ``clock`` (None: the system clock)
        through an :class:`~kvstore.store.clock.ExpiryClock`, which ``state``'s
        reads decide "expired" by too. The sweeper starts with
        :meth:`start_sweeper`, once the store is open."""
        expiry_clock = ExpiryClock(clock or SystemClock())
        state.expiring_reads.now_us = expiry_clock.now_us
        return cls(state, expiry_clock, max_value, max_payload, append, path)

    # -- entries ------------------------------------------------------------------

    def put_op(self, key: object, value: object, ttl: object, lease: object) -> list:
        """The op of a put with ``ttl`` (seconds) or under ``lease``, checked."""
        return expiring_put_op(key, value, self._max_value, ttl, lease, self.clock.now_us())

    def put_entry(self, key: object, value: object, ttl: object, lease: object,
                  keyspace: str = "") -> tuple[bytes, list]:
        """``(payload, ops)`` of a put with ``ttl`` or under ``lease`` into
        ``keyspace`` (checked by the caller; "": the default one)."""
        op = self.put_op(key, value, ttl, lease)
        ops: list = [[OP_KEYSPACE, keyspace], op] if keyspace else [op]
        if op[0] == OP_PUT_LEASED:
            ops = Outcome(ops)
        return pack_ops(ops), ops

    def grant_entry(self, ttl: float) -> tuple[bytes, list, int, int]:
        """``(payload, ops, lease id, ttl_us)`` of a grant: a new random id."""
        ttl_us = seconds_to_us(ttl, "ttl")
        lease_id = secrets.randbelow(MAX_LEASE_ID) + 1
        ops = [[OP_GRANT, lease_id, ttl_us, self.clock.now_us() + ttl_us]]
        return pack_ops(ops), ops, lease_id, ttl_us

    def keepalive_entry(self, lease_id: int, ttl_us: int) -> tuple[bytes, list]:
        ops = Outcome([[OP_KEEPALIVE, lease_id, self.clock.now_us() + ttl_us]])
        return pack_ops(ops), ops

    @staticmethod
    def revoke_entry(lease_id: int) -> tuple[bytes, Revoke]:
        return _EMPTY, Revoke(lease_id)

    @staticmethod
    def writable_ops(ops: list) -> list:
        """The ops of a pre-encoded batch (``db.write(payload)``) as they are
        appended: ValueError for what only the writer decides (grants,
        revokes, expiries); an :class:`Outcome` when a lease must be alive."""
        codes = {op[0] for op in ops}
        if not codes.isdisjoint(GROUP_CODES):
            raise ValueError("a staged group's entry is written by db.write_group, which keeps its parts and "
                             "commit together: it cannot be written as bytes")
        if not codes.isdisjoint(EXPIRY_CODES - PUT_CODES - {OP_KEEPALIVE}):
            raise ValueError("a batch that grants, revokes or expires is decided by the writer "
                             "(db.grant, db.revoke, the sweeper): it cannot be written as bytes")
        if OP_PUT_LEASED in codes or OP_KEEPALIVE in codes:
            return Outcome(ops)
        return ops

    @staticmethod
    def check(ops: list, lsn: int) -> None:
        """Raise :class:`LeaseNotFoundError` when the entry just logged at
        ``lsn`` failed because a lease it needed was not alive there."""
        if isinstance(ops, Listing):
            if ops.failed:
                lease_id = getattr(ops, "lease_id", 0)
                raise LeaseNotFoundError(f"lease {lease_id} does not exist at LSN {lsn} (it expired or was "
                                         f"revoked); nothing was deleted", lease_id=lease_id)
            return
        if not isinstance(ops, Outcome) or ops.failed is None or ops.failed < count_conditions(ops):
            return
        lease_id = next(op[3] if op[0] == OP_PUT_LEASED else op[1] for op in ops
                        if op[0] == OP_PUT_LEASED or op[0] == OP_KEEPALIVE)
        raise LeaseNotFoundError(
            f"lease {lease_id} is not alive at LSN {lsn} (it expired or was revoked): the write was not "
            f"applied (its LSN is consumed). Grant a new lease.", lease_id=lease_id)

    # -- writes (the store's grant, revoke, keep-alive, puts with an expiry) ---------

    def append_checked(self, payload: Payload, ops: list) -> int:
        """Append an entry; its LSN, or :class:`LeaseNotFoundError` (after
        :meth:`check`) when a lease it needed was not alive at that LSN."""
        lsn = self._append(payload, ops)
        self.check(ops, lsn)
        return lsn

    def put(self, key: object, value: object, ttl: object, lease: object, keyspace: str = "") -> int:
        """Log a put with ``ttl`` or under ``lease`` (:meth:`put_entry`); its LSN."""
        return self.append_checked(*self.put_entry(key, value, ttl, lease, keyspace))

    def grant(self, ttl: float) -> tuple[int, int]:
        """Log a new lease of ``ttl`` seconds; ``(lease id, ttl_us)``."""
        payload, ops, lease_id, ttl_us = self.grant_entry(ttl)
        self._append(payload, ops)
        return lease_id, ttl_us

    def keepalive(self, lease_id: int, ttl_us: int) -> float:
        """Log the extension of lease ``lease_id`` to now + ``ttl_us``; its seconds."""
        self.append_checked(*self.keepalive_entry(lease_id, ttl_us))
        return ttl_us / 1e6

    def revoke(self, lease: object) -> int:
        """Log the end of ``lease`` and the deletion of its keys; the LSN."""
        return self.append_checked(*self.revoke_entry(lease_id_of(lease)))

    # -- the writer's decision (the log's on_prepare) -------------------------------

    def decide(self, payloads: list[Payload], contexts: list[Any]) -> list[Payload] | None:
        """Decide the group's expiry entries in log order (:mod:`kvstore.entry.leases`):
        for a group one of whose contexts is an Outcome (the log's prepare hook,
        :mod:`kvstore.store.group_hooks`, calls it only then)."""
        return decide_leases(payloads, contexts, self._meta, self.clock.now_us(), self._max_payload)

    # -- reads ----------------------------------------------------------------------

    def key_meta(self, space: str, key: bytes) -> Meta | None:
        """``key``'s expiry in keyspace ``space`` as LMDB holds it (the overlay
        flushed first; nothing is read while no key has an expiry): what a
        write the writer decides reads (:class:`kvstore.entry.conditions.Decided`)."""
        if not self._state.expiry.keys:
            return None
        return self._meta.key_meta(space, key)

    def ttl(self, key: object, keyspace: str = "") -> float | None:
        """Seconds until ``key`` (of ``keyspace``) expires; None when it has
        no expiry, or is absent (expired included)."""
        key = check_key(key)
        now = self.clock.now_us()
        if not self._state.expiry.keys and not self._state.readonly:
            return None
        data = self._state.lmdb.keyspace_db(keyspace)
        if data is None:
            return None

        def read(txn: Any, expiry: Any) -> int | None:
            if txn.get(key, db=data) is None:
                return None
            return expiry.remaining_us(txn, keyspace, key)
        at = self._state.expiring_reads.read_expiry(read)
        if at is None or at <= now:
            return None
        return (at - now) / 1e6

    def lease_ttl(self, lease_id: int) -> float | None:
        """Seconds until lease ``lease_id`` expires; None when it is not alive."""
        record = self._meta.lease(lease_id)
        now = self.clock.now_us()
        if record is None or record[1] <= now:
            return None
        return (record[1] - now) / 1e6

    def granted_ttl_us(self, lease: object) -> int:
        """The TTL lease ``lease`` was granted with (microseconds), when it is
        alive now; else :class:`LeaseNotFoundError`."""
        lease_id = lease_id_of(lease)
        record = self._meta.lease(lease_id)
        if record is None or record[1] <= self.clock.now_us():
            raise LeaseNotFoundError(f"lease {lease_id} is not alive in {self._path}", lease_id=lease_id)
        return record[0]

    # -- the sweeper ----------------------------------------------------------------

    def sweep(self, max_keys: int | None = None) -> int:
        """One bounded round: log the deletion of up to ``max_keys`` (default
        ``sweep_keys``) keys expired now, and the end of expired leases while
        the round has room; return how many keys were deleted."""
        limit = self.sweep_keys if max_keys is None else max(1, int(max_keys))
        now = self.clock.now_us()
        keys, leases = self._state.expiring_reads.read_expiry(lambda txn, e: e.due(txn, now, limit))
        deleted = 0
        if keys:
            req: Listing = ExpireKeys(keys)
            self._append(_EMPTY, req)
            deleted += len(req.deleted)
        for lease_id, at in leases:
            room = limit - deleted
            if room <= 0:
                break
            req = ExpireLease(lease_id, at, room)
            self._append(_EMPTY, req)
            deleted += len(req.deleted)
        self.swept += deleted
        return deleted

    def start_sweeper(self, interval: float) -> None:
        """Sweep every ``interval`` seconds in a daemon thread until :meth:`stop`."""
        self._sweeper = threading.Thread(target=self._run, args=(interval,), name="walkv-expiry", daemon=True)
        self._sweeper.start()

    def pause_sweeper(self, paused: bool) -> None:
        """While paused the sweeper skips its rounds (a follower's store: the
        leader's sweeps arrive through its log)."""
        self._paused = paused

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if self._paused:
                continue
            try:
                while self.sweep() >= self.sweep_keys and not self._stop.is_set():
                    pass
            except ClosedError:
                return
            except WalkvError as exc:
                log.warning("expiry sweep failed: %s (retried in %g s)", exc, interval)

    def stop(self) -> None:
        """Stop the sweeper (waits for a round in progress)."""
        self._stop.set()
        t = self._sweeper
        if t is not None and t is not threading.current_thread():
            t.join()
