"""Deciding conditional batches, and writing the decision into the log.

A batch may start with conditions (``kvstore.entry.codec`` op codes 4..6:
require-equals, require-absent, require-present). They are decided by the
group commit's leader, just before the group is written (the log's
``on_prepare`` hook, :func:`decide_group`), in LSN order, against the state
every earlier entry leaves: LMDB holds everything of the groups before
(applied before their writers were released, and groups are written one at a
time), and a :class:`GroupSoFar` holds the writes of the earlier entries of the
same group. The decision then goes into the log with the batch
(``kvstore.entry.codec``: a failed batch is logged as ``[[7, i], conditions...]``),
so that:

* replay and rebuilds apply the log as it is and never decide again: a store
  rebuilt from any snapshot plus the log reaches the same outcomes by
  construction;
* everything that reads the log without the state (watchers, replicas, the
  archive, the Spark ``changes`` and ``state`` tables) sees what happened;
* two writers racing on one key are ordered by the log, and only the first
  one's condition sees the value it expected.

The writer learns the outcome through its context (an :class:`Outcome`, the
ops with a ``failed`` slot) that travels with the payload: it is decided
before the group is written, so before the writer is released. Plain writes
pass bare op lists, and a group without conditions costs one scan of its op
codes.

Keyspaces: a condition is decided in the keyspace the batch is in at that
point (``[16, name]`` ops may stand among the leading conditions), and the
state a group leaves is tracked per keyspace, drops included.

Decided writes (:class:`Decided`): a read-modify-write whose ops the writer
computes, in the same pass and the same log order, from the state as every
earlier entry leaves it (the value and the expiry of the keys it reads):
Redis's INCR, APPEND, SETNX or a MULTI/EXEC block (:mod:`kvstore.server.resp`).
It is logged as the ordinary ops it computed (an empty batch when it writes
nothing), so the entry format does not change and nothing reading the log
ever decides again; what it answers travels back in its context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from mypy_extensions import mypyc_attr

from kvstore.entry.codec import (
    CONDITION_CODES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_FAILED,
    OP_KEYSPACE,
    OP_PUT,
    OP_REQUIRE_ABSENT,
    OP_REQUIRE_EQUALS,
    PUT_CODES,
    pack_ops,
)
from kvstore.entry.limits import DEFAULT_KEYSPACE

Ops = Sequence[Sequence[Any]]
Payload = bytes | tuple[bytes, ...]  # wal.segment.Payload: a large put arrives in pieces
Read = Callable[[str, bytes], "bytes | None"]
"""``read(keyspace, key)``: a key's value as the state holds it ("": the default keyspace)."""
Meta = tuple[int, int]
"""A key's expiry: ``(OP_PUT_EXPIRING, at_us)`` or ``(OP_PUT_LEASED, lease id)`` (:mod:`kvstore.entry.leases`)."""
ReadMeta = Callable[[str, bytes], "Meta | None"]
"""``read_meta(keyspace, key)``: a key's expiry as the state holds it (None: it has none)."""
_LEADING: Final = CONDITION_CODES | {OP_KEYSPACE}


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of list: this one stays a Python class
class Outcome(list):  # a list of ops, as every context is
    """A conditional batch's operations, as the context that travels with its
    payload through the log; :func:`decide_group` sets :attr:`failed` (the
    index of the first failing condition, or None) and :attr:`decided`."""

    __slots__ = ("failed", "decided")

    def __init__(self, ops: Ops) -> None:
        super().__init__(ops)
        self.failed: int | None = None
        self.decided = False


@mypyc_attr(native_class=False)
class Decided(Outcome):
    """A write the writer decides (module docstring): empty until
    :func:`decide_group` calls ``compute(so_far)`` (a :class:`GroupSoFar`)
    in log order, which returns ``(ops, result)``: the ops to log (checked
    as any write's are, at most ``max_payload`` bytes packed) and what the
    caller is answered. Then the list holds the ops as logged, :attr:`result`
    the answer, or :attr:`error` what ``compute`` raised (nothing is
    written then); :attr:`failed` is set when a lease a put needed was not
    alive there (:mod:`kvstore.entry.leases`). ``compute`` runs on the
    group's leader thread: it may read ``so_far`` and nothing of the caller's."""

    __slots__ = ("compute", "max_payload", "result", "error")

    def __init__(self, compute: Callable[["GroupSoFar"], tuple[list, Any]], max_payload: int) -> None:
        super().__init__(())
        self.compute = compute
        self.max_payload = max_payload
        self.result: Any = None
        self.error: Exception | None = None

    def decide(self, so_far: "GroupSoFar") -> bytes:
        """Compute the ops (module docstring) and return their payload."""
        try:
            ops, self.result = self.compute(so_far)
            payload = pack_ops(ops)
            if len(payload) > self.max_payload:
                raise ValueError(f"the write would be a {len(payload)}-byte log entry, over the log's "
                                 f"record limit of {self.max_payload} bytes; nothing was written")
        except Exception as exc:  # the caller's: reported to it, never the group's
            ops, payload, self.error = [], pack_ops([]), exc
        self[:] = ops
        self.decided = True
        return payload


class GroupSoFar:
    """The state as the entries decided so far in a group leave it: their
    writes over ``read`` (LMDB as the previous group left it), values and,
    with ``read_meta``, expiry. Not the state machine's overlay
    (:mod:`kvstore.state.overlay`): this one lives for one decision of one
    group."""

    def __init__(self, read: Read, read_meta: ReadMeta | None = None) -> None:
        self._read = read
        self._read_meta = read_meta
        self._values: dict[tuple[str, bytes], bytes | None] = {}
        self._metas: dict[tuple[str, bytes], Meta | None] = {}
        # deleted since (keyspace, start, end; a drop is the whole keyspace), unless in _values
        self._ranges: list[tuple[str, bytes, bytes | None]] = []

    def get(self, keyspace: str, key: bytes) -> bytes | None:
        v = self._values.get((keyspace, key), self)
        if v is not self:
            return v  # type: ignore[return-value]  # bytes or None: the sentinel was not found
        if self._deleted(keyspace, key):
            return None
        return self._read(keyspace, key)

    def meta(self, keyspace: str, key: bytes) -> Meta | None:
        """``key``'s expiry (None: it has none, or no ``read_meta`` was given)."""
        m = self._metas.get((keyspace, key), self)
        if m is not self:
            return m  # type: ignore[return-value]  # a Meta or None: the sentinel was not found
        if self._read_meta is None or self._deleted(keyspace, key):
            return None
        return self._read_meta(keyspace, key)

    def _deleted(self, keyspace: str, key: bytes) -> bool:
        for ks, start, end in self._ranges:
            if ks == keyspace and start <= key and (end is None or key < end):
                return True
        return False

    def write(self, ops: Ops) -> None:
        """Record the writes of one batch (which starts in the default keyspace)."""
        keyspace = DEFAULT_KEYSPACE
        for op in ops:
            code = op[0]
            if code in PUT_CODES:
                self._values[(keyspace, op[1])] = op[2]
                self._metas[(keyspace, op[1])] = None if code == OP_PUT else (code, op[3])
            elif code == OP_DELETE or code == OP_EXPIRE:
                self._values[(keyspace, op[1])] = None
                self._metas[(keyspace, op[1])] = None
            elif code == OP_KEYSPACE:
                keyspace = op[1]
            elif code == OP_DELETE_RANGE or code == OP_DROP_KEYSPACE:
                ks = keyspace if code == OP_DELETE_RANGE else op[1]
                start, end = (op[1], op[2]) if code == OP_DELETE_RANGE else (b"", None)
                if end is None or start < end:
                    self._ranges.append((ks, start, end))
                    for k in [k for k in self._values
                              if k[0] == ks and start <= k[1] and (end is None or k[1] < end)]:
                        self._values[k] = None
                        self._metas[k] = None


def count_conditions(ops: Ops) -> int:
    """How many ops lead ``ops`` before its first write: conditions, and the
    keyspace switches among them."""
    n = 0
    while n < len(ops) and ops[n][0] in _LEADING:
        n += 1
    return n


def is_conditional(ops: Ops) -> bool:
    """Whether ``ops`` starts with a condition (after any keyspace switches)."""
    for op in ops:
        if op[0] != OP_KEYSPACE:
            return op[0] in CONDITION_CODES
    return False


def first_failing(conditions: Ops, get: Read) -> int | None:
    """The index (in ``conditions``) of the first condition that does not
    hold, or None; each is decided in the keyspace the ops before it chose."""
    keyspace = DEFAULT_KEYSPACE
    for i, op in enumerate(conditions):
        code = op[0]
        if code == OP_KEYSPACE:
            keyspace = op[1]
            continue
        value = get(keyspace, op[1])
        if code == OP_REQUIRE_EQUALS:
            ok = value is not None and value == op[2]
        elif code == OP_REQUIRE_ABSENT:
            ok = value is None
        else:
            ok = value is not None
        if not ok:
            return i
    return None


def decide_group(payloads: Sequence[Payload], contexts: list[Any], read: Read,
                 read_meta: ReadMeta | None = None) -> list[Payload] | None:
    """Decide the conditional batches and the :class:`Decided` writes of one
    group (module docstring), in log order: the payloads to write instead,
    or ``None`` when the group holds neither. ``contexts[i]`` is entry i's
    ops; a failed entry's is replaced by the ops it is logged as (``[[7, i],
    conditions...]``), a decided one filled with its ops, so that applying
    the contexts applies exactly what the log says. ``read_meta``: the
    expiry a decided write reads (None: it reads none)."""
    if len(contexts) == 1:  # the common group: one entry, most often not conditional
        ops = contexts[0]
        if (not ops or ops[0][0] not in _LEADING) and type(ops) is not Decided:
            return None
    first = next((i for i, ops in enumerate(contexts)
                  if type(ops) is Decided or (ops and ops[0][0] in _LEADING and is_conditional(ops))), None)
    if first is None:
        return None
    so_far = GroupSoFar(read, read_meta)
    for ops in contexts[:first]:
        so_far.write(ops)
    out = list(payloads)
    for i in range(first, len(contexts)):
        ops = contexts[i]
        if type(ops) is Decided:
            out[i] = ops.decide(so_far)
            so_far.write(ops)
            continue
        if not is_conditional(ops):
            so_far.write(ops)
            continue
        n = count_conditions(ops)
        failed = first_failing(ops[:n], so_far.get)
        if isinstance(ops, Outcome):
            ops.failed, ops.decided = failed, True
        if failed is None:
            so_far.write(writes_of(ops))
        else:
            logged = [[OP_FAILED, failed], *ops[:n]]
            out[i] = pack_ops(logged)
            contexts[i] = logged
    return out


def writes_of(ops: Ops) -> Ops:
    """The writes a logged batch applies: none when it failed (its first op
    is ``OP_FAILED``), else the ops after its conditions, led by the last
    keyspace switch among the conditions (the keyspace they are in)."""
    if not ops or ops[0][0] == OP_FAILED:
        return ()
    n = count_conditions(ops)
    if not n:
        return ops
    switch = next((op for op in reversed(ops[:n]) if op[0] == OP_KEYSPACE), None)
    return ops[n:] if switch is None else [switch, *ops[n:]]
