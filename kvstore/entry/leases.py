"""Deciding what expiry changes, in log order, and writing the decision into the log.

Three kinds of entry need a decision that depends on the state at their place
in the log (the format: :mod:`kvstore.entry.codec`, codes 8..14):

* a put under a lease, or a keep-alive: its lease must be alive there, else
  the entry fails as a failed condition does (``[[7, i], conditions...,
  [10, lease]]``, its LSN consumed, nothing applied);
* a revoke (:class:`Revoke`): the keys it deletes are those attached to the
  lease there, listed in the entry;
* the sweeper's entries (:class:`ExpireKeys`, :class:`ExpireLease`): each
  candidate the sweeper read from the state is deleted only if it still has
  the expiry the sweeper saw and that instant is not after ``now`` (a key
  written again meanwhile keeps its new value).

They are decided by the group commit's leader just before the group is
written (the store's ``on_prepare``, after :func:`kvstore.entry.conditions.decide_group`),
against what LMDB holds (every earlier group: applied before their writers
were released) and a :class:`MetaSoFar` of the earlier entries of the same
group. ``now`` is the writer's clock, read once for the group. The decision
travels as the entry's new payload and context, so that applying the contexts
applies exactly what the log says, and replay never decides again.

Only entries whose context is not a plain list (an
:class:`~kvstore.entry.conditions.Outcome` or a :class:`Listing`) can need
a decision: a group of plain writes costs one pass over its contexts' types.

Keys are named with their keyspace (``space``, "" being the default): a
lease's keys may live in several keyspaces, and a sweep's keys too. A
decided listing switches keyspace (``[16, name]``) before each run of keys of
another keyspace than the one before (a batch starts in the default one), and
:meth:`MetaSoFar.write` follows the switches (and drops, code 17) of the
entries it takes in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvstore.entry.codec import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_FAILED,
    OP_GRANT,
    OP_KEEPALIVE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    OP_REQUIRE_LEASE,
    OP_REVOKE,
    PlainPuts,
    pack_ops,
)
from kvstore.entry.conditions import Outcome, count_conditions, writes_of

Meta = tuple[int, int]
"""A key's expiry: ``(OP_PUT_EXPIRING, at_us)`` or ``(OP_PUT_LEASED, lease id)``."""
LeaseRecord = tuple[int, int]
"""A lease: ``(ttl_us, at_us)``."""
SpacedKey = tuple[str, bytes]

LIST_BYTES_OVERHEAD = 8
"""Bytes an op of a listing adds to its key in the payload (msgpack framing)."""


class MetaReader(Protocol):
    """What the decision reads of the state as the previous group left it
    (:class:`kvstore.state.expiry.Expiry` provides it)."""

    def key_meta(self, space: str, key: bytes) -> Meta | None: ...
    def lease(self, lease_id: int) -> LeaseRecord | None: ...
    def lease_keys(self, lease_id: int, limit: int) -> list[SpacedKey]: ...


class Listing(list):  # a list of ops, as every context is
    """A request whose ops the writer decides (module docstring); after the
    decision the list holds the ops as logged and :attr:`deleted` the keys
    it deletes."""

    __slots__ = ("deleted", "failed", "decided")

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[SpacedKey] = []
        self.failed = False
        self.decided = False


class Revoke(Listing):
    """``db.revoke(lease)``: delete every key attached to ``lease_id`` and the
    lease; fails (``failed``) when the lease does not exist there."""

    __slots__ = ("lease_id",)

    def __init__(self, lease_id: int) -> None:
        super().__init__()
        self.lease_id = lease_id


class ExpireKeys(Listing):
    """The sweeper: delete the keys of ``candidates`` (space, key, at_us) whose
    TTL is still ``at_us``, an instant not after now."""

    __slots__ = ("candidates",)

    def __init__(self, candidates: Sequence[tuple[str, bytes, int]]) -> None:
        super().__init__()
        self.candidates = candidates


class ExpireLease(Listing):
    """The sweeper: end lease ``lease_id`` if it still expires at ``at_us``, an
    instant not after now: up to ``limit`` of its keys, and the lease itself
    with its last ones."""

    __slots__ = ("lease_id", "at_us", "limit")

    def __init__(self, lease_id: int, at_us: int, limit: int) -> None:
        super().__init__()
        self.lease_id = lease_id
        self.at_us = at_us
        self.limit = limit


class MetaSoFar:
    """Expiry metadata as the entries decided so far in a group leave it:
    their writes over ``reader`` (LMDB as the previous group left it)."""

    def __init__(self, reader: MetaReader) -> None:
        self._reader = reader
        self._keys: dict[SpacedKey, Meta | None] = {}
        self._ranges: list[tuple[str, bytes, bytes]] = []  # (space, start, end): deleted since
        self._leases: dict[int, LeaseRecord | None] = {}

    def key_meta(self, space: str, key: bytes) -> Meta | None:
        sk = (space, key)
        if sk in self._keys:
            return self._keys[sk]
        for s, start, end in self._ranges:
            if s == space and start <= key < end:
                return None
        return self._reader.key_meta(space, key)

    def lease(self, lease_id: int) -> LeaseRecord | None:
        if lease_id in self._leases:
            return self._leases[lease_id]
        return self._reader.lease(lease_id)

    def alive(self, lease_id: int, now_us: int) -> bool:
        record = self.lease(lease_id)
        return record is not None and record[1] > now_us

    def attached(self, lease_id: int, limit: int) -> list[SpacedKey]:
        """Up to about ``limit`` keys attached to ``lease_id`` now."""
        want = (OP_PUT_LEASED, lease_id)
        out = [sk for sk in self._reader.lease_keys(lease_id, limit) if self.key_meta(*sk) == want]
        seen = set(out)
        out.extend(sk for sk, meta in self._keys.items() if meta == want and sk not in seen)
        return out

    def write(self, ops: Sequence[Sequence[Any]]) -> None:
        """Take in the writes of one decided entry."""
        space = ""
        keys = self._keys
        for op in ops:
            code = op[0]
            if code == OP_PUT or code == OP_DELETE or code == OP_EXPIRE:
                keys[(space, op[1])] = None
            elif code == OP_PUT_EXPIRING or code == OP_PUT_LEASED:
                keys[(space, op[1])] = (code, op[3])
            elif code == OP_DELETE_RANGE:
                start, end = op[1], op[2]
                if start < end:
                    self._ranges.append((space, start, end))
                    for sk in [sk for sk in keys if sk[0] == space and start <= sk[1] < end]:
                        keys[sk] = None
            elif code == OP_KEYSPACE:
                space = op[1]
            elif code == OP_DROP_KEYSPACE:
                dropped = op[1]
                self._ranges.append((dropped, b"", b"\xff" * 513))  # after every key: all of it
                for sk in [sk for sk in keys if sk[0] == dropped]:
                    keys[sk] = None
            elif code == OP_GRANT:
                self._leases[op[1]] = (op[2], op[3])
            elif code == OP_KEEPALIVE:
                record = self.lease(op[1])
                if record is not None:
                    self._leases[op[1]] = (record[0], op[2])
            elif code == OP_REVOKE:
                self._leases[op[1]] = None


def _needs_lease(ops: Sequence[Sequence[Any]]) -> list[int]:
    return [op[3] if op[0] == OP_PUT_LEASED else op[1] for op in ops
            if op[0] == OP_PUT_LEASED or op[0] == OP_KEEPALIVE]


def decide_group(payloads: Sequence[Any], contexts: list[Any], reader: MetaReader, now_us: int,
                 max_payload: int) -> list[Any] | None:
    """Decide the entries of one group that need it (module docstring): the
    payloads to write instead, or ``None`` when none does. ``contexts[i]`` is
    entry i's ops; a decided entry's is replaced by (or filled with) the ops
    it is logged as."""
    if all(type(c) is list or type(c) is PlainPuts for c in contexts):  # nothing to decide
        return None
    so_far = MetaSoFar(reader)
    out = list(payloads)
    changed = False
    for i, ops in enumerate(contexts):
        if isinstance(ops, Listing):
            _decide_listing(ops, so_far, now_us, max_payload)
            out[i] = pack_ops(ops)
            changed = True
            so_far.write(ops)
            continue
        if not ops or ops[0][0] == OP_FAILED:
            continue
        n = count_conditions(ops)
        writes = writes_of(ops)  # led by the keyspace the conditions leave the batch in
        dead = [lease for lease in _needs_lease(writes) if not so_far.alive(lease, now_us)]
        if dead:
            logged = [[OP_FAILED, n], *ops[:n], [OP_REQUIRE_LEASE, dead[0]]]
            if isinstance(ops, Outcome):
                ops.failed, ops.decided = n, True
            out[i] = pack_ops(logged)
            contexts[i] = logged
            changed = True
            continue
        if isinstance(ops, Outcome) and _needs_lease(writes):
            ops.decided = True
        so_far.write(writes)
    return out if changed else None


def _decide_listing(req: Listing, so_far: MetaSoFar, now_us: int, max_payload: int) -> None:
    req.decided = True
    if isinstance(req, ExpireKeys):
        due = [(space, key) for space, key, at_us in req.candidates
               if at_us <= now_us and so_far.key_meta(space, key) == (OP_PUT_EXPIRING, at_us)]
        _list_keys(req, OP_EXPIRE, due)
        return
    if isinstance(req, ExpireLease):
        record = so_far.lease(req.lease_id)
        if record is None or record[1] != req.at_us or req.at_us > now_us:
            return
        keys = so_far.attached(req.lease_id, req.limit + 1)
        if len(keys) <= req.limit:
            req.append([OP_REVOKE, req.lease_id])
        else:
            keys = keys[:req.limit]
        _list_keys(req, OP_EXPIRE, keys)
        return
    assert isinstance(req, Revoke)
    if so_far.lease(req.lease_id) is None:
        req.failed = True
        req[:] = [[OP_FAILED, 0], [OP_REQUIRE_LEASE, req.lease_id]]
        return
    budget = max_payload - 64
    limit = max(1, budget // (LIST_BYTES_OVERHEAD + 64))
    keys = so_far.attached(req.lease_id, limit + 1)
    room = budget
    listed: list[SpacedKey] = []
    for sk in keys:
        room -= len(sk[1]) + len(sk[0]) + 2 * LIST_BYTES_OVERHEAD
        if room < 0:
            break
        listed.append(sk)
    if len(listed) == len(keys) and len(keys) <= limit:
        req.append([OP_REVOKE, req.lease_id])
    else:  # too many for one entry: the lease ends now, the sweeper deletes the rest
        req.append([OP_KEEPALIVE, req.lease_id, now_us])
    _list_keys(req, OP_DELETE, listed)


def _list_keys(req: Listing, code: int, keys: Sequence[SpacedKey]) -> None:
    """Append ``[code, key]`` for each of ``keys`` to ``req``, grouped by
    keyspace, with a ``[16, name]`` before each group not in the keyspace
    the ops before it leave (a batch starts in the default one)."""
    ordered = sorted(keys, key=lambda sk: sk[0])  # by keyspace, the default one ("") first
    space = ""
    for sk in ordered:
        if sk[0] != space:
            space = sk[0]
            req.append([OP_KEYSPACE, space])
        req.append([code, sk[1]])
    req.deleted.extend(ordered)
