"""A linearizability checker for histories of registers (Wing & Gong's search
with Lowe's cache, as Knossos and Porcupine do it), for the cluster tests.

A history is what many clients saw: each operation was *invoked* at some
time and then either completed (``ok``, with its result), definitely did not
happen (``fail``: refused before it was applied, e.g. 421 NotLeader), or has
an unknown outcome (``info``: the connection broke after the request was
sent). It is linearizable when every operation that completed, and any
subset of the unknown ones, can be put in one sequential order that respects
real time (an operation that completed before another was invoked comes
first) and in which each operation's result is what a register would give.

The register model, one per key (the initial value is ``None``, "absent"):

* ``write(v)``: the register becomes ``v`` (``None`` is a delete);
* ``read() -> v``: ``v`` is the register's value;
* ``cas(expected, new) -> True``: the value was ``expected``, now ``new``;
  ``-> False``: the value was not ``expected`` (unchanged). A compare-and-set
  refused with 409 ConditionFailed completed, with result False: that says
  something about the register, unlike a ``fail``.

How, and why it is fast enough:

* Registers are independent, so the history is checked key by key
  (linearizability is local: Herlihy & Wing; Horn & Kroening's
  P-compositionality). Each key's search is small.
* Wing & Gong: walk the history's calls and returns in time order; at a
  call, try to linearize that operation now (the model accepts it); at a
  return of an operation not yet linearized, undo the last choice
  (backtrack). Lowe's cache remembers each (set of linearized operations,
  register value) already explored and never explores it twice, which cuts
  the search from factorial to about (operations x concurrent operations).
* An unknown (``info``) operation's return is placed after everything: it
  may take effect at any point after it was invoked, or never. Once only
  unknown operations remain, the history is linearizable. ``fail``
  operations and unknown reads are dropped (they changed nothing).
* The search is bounded (:data:`MAX_CONFIGURATIONS` per key): past it the
  answer is "unknown" (``Result.ok is None``), never a guess.

:class:`History` records operations as they happen (thread-safe, one
monotonic clock); :func:`from_events` reads a Knossos-style list of
invoke/ok/fail/info events; :func:`check` checks; :meth:`Result.explain`
says where a key went wrong.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

READ, WRITE, CAS = "read", "write", "cas"
OK, FAIL, INFO = "ok", "fail", "info"
MAX_CONFIGURATIONS = 500_000
"""Configurations (linearized set, value) one key's search may visit before
it answers "unknown"."""


@dataclass(frozen=True)
class Op:
    """One operation on one register, as a client saw it.

    ``value``: what a write writes, ``(expected, new)`` for a cas, ``None``
    for a read. ``result``: what a read returned, True/False for a cas that
    completed. ``completed`` is ``None`` when the outcome is unknown.
    ``meta`` is the caller's (node, epoch, LSN...), for reports only."""

    process: Hashable
    kind: str
    key: Hashable
    value: Any
    result: Any
    invoked: float
    completed: float | None
    status: str = OK
    meta: tuple = ()

    def __str__(self) -> str:
        if self.kind == READ:
            what = f"read() -> {self.result!r}"
        elif self.kind == WRITE:
            what = f"write({self.value!r})"
        else:
            what = f"cas({self.value[0]!r} -> {self.value[1]!r})" + (f" -> {self.result}" if self.status == OK else "")
        end = f"{self.completed:.6f}" if self.completed is not None else "?"
        return (f"process {self.process} {what} on {self.key!r} [{self.status}] "
                f"{self.invoked:.6f}..{end}{' ' + repr(self.meta) if self.meta else ''}")


class Event(NamedTuple):
    """A Knossos-style event: ``("invoke", process, kind, key, value, time)``
    or ``(OK | FAIL | INFO, process, kind, key, result, time)``."""

    type: str
    process: Hashable
    kind: str
    key: Hashable
    value: Any
    time: float


def from_events(events: Iterable[Event | tuple]) -> list[Op]:
    """Pair each process's invoke with its next completion (a process has at
    most one operation in flight); an invoke never completed is ``info``."""
    pending: dict[Hashable, Event] = {}
    out: list[Op] = []
    for raw in events:
        ev = Event(*raw)
        if ev.type == "invoke":
            if ev.process in pending:
                raise ValueError(f"process {ev.process!r} invoked twice without a completion: {ev}")
            pending[ev.process] = ev
            continue
        if ev.type not in (OK, FAIL, INFO):
            raise ValueError(f"unknown event type {ev.type!r}: {ev}")
        call = pending.pop(ev.process, None)
        if call is None:
            raise ValueError(f"completion without an invoke: {ev}")
        done = ev.time if ev.type != INFO else None
        result = ev.value if ev.type == OK and call.kind != WRITE else None
        out.append(Op(call.process, call.kind, call.key, call.value, result, call.time, done, ev.type))
    out.extend(Op(c.process, c.kind, c.key, c.value, None, c.time, None, INFO) for c in pending.values())
    return out


class Pending:
    """An operation in flight in a :class:`History`: end it with exactly one
    of :meth:`ok`, :meth:`fail`, :meth:`info`."""

    __slots__ = ("_history", "invoked", "kind", "key", "process", "value")

    def __init__(self, history: History, process: Hashable, kind: str, key: Hashable, value: Any) -> None:
        self._history, self.process, self.kind, self.key, self.value = history, process, kind, key, value
        self.invoked = history.clock()

    def ok(self, result: Any = None, *meta: Any) -> Op:
        return self._end(OK, result, self._history.clock(), meta)

    def fail(self, *meta: Any) -> Op:
        return self._end(FAIL, None, self._history.clock(), meta)

    def info(self, *meta: Any) -> Op:
        return self._end(INFO, None, None, meta)

    def _end(self, status: str, result: Any, completed: float | None, meta: tuple) -> Op:
        op = Op(self.process, self.kind, self.key, self.value, result, self.invoked, completed, status, meta)
        self._history.add(op)
        return op


class History:
    """Operations recorded as they happen, from many threads, on one clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    def invoke(self, process: Hashable, kind: str, key: Hashable, value: Any = None) -> Pending:
        if kind not in (READ, WRITE, CAS):
            raise ValueError(f"unknown operation kind {kind!r}")
        return Pending(self, process, kind, key, value)

    def add(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)


# -- checking ---------------------------------------------------------------------------------


@dataclass
class KeyResult:
    """One register's verdict. ``ok``: True, False, or None (search bound hit).
    When False: ``culprit`` is the operation that could not be linearized at
    the deepest point the search reached, ``linearized`` how many operations
    were linearized before it, ``values`` the register values possible there."""

    key: Hashable
    ok: bool | None
    ops: int
    configurations: int
    culprit: Op | None = None
    linearized: int = 0
    values: list[Any] = field(default_factory=list)
    concurrent: list[Op] = field(default_factory=list)


@dataclass
class Result:
    ok: bool | None
    keys: dict[Hashable, KeyResult]
    seconds: float

    @property
    def ops(self) -> int:
        return sum(k.ops for k in self.keys.values())

    def explain(self) -> str:
        lines = [f"{len(self.keys)} keys, {self.ops} operations, {self.seconds * 1000:.1f} ms: "
                 + {True: "linearizable", False: "NOT linearizable", None: "unknown (search bound hit)"}[self.ok]]
        for k in self.keys.values():
            if k.ok is True:
                continue
            lines.append(f"key {k.key!r}: {k.ops} ops, {k.configurations} configurations: "
                         + ("search bound hit" if k.ok is None else
                            f"after {k.linearized} linearized operations (register then one of "
                            f"{k.values!r}) nothing can explain: {k.culprit}"))
            lines += [f"    concurrent: {op}" for op in k.concurrent[:12]]
        return "\n".join(lines)


def _step(state: Any, op: Op) -> tuple[bool, Any]:
    """The register model: (accepted, next value)."""
    if op.kind == READ:
        return state == op.result, state
    if op.kind == WRITE:
        return True, op.value
    expected, new = op.value
    if op.status == INFO:  # happened, with whichever result the value gives
        return True, new if state == expected else state
    if op.result:
        return state == expected, new
    return state != expected, state


def check_key(key: Hashable, ops: list[Op], initial: Any = None,
              max_configurations: int = MAX_CONFIGURATIONS) -> KeyResult:
    """One register (module docstring). First without the unknown writes
    whose new value nobody observed (no read returned it, no cas expected
    it): dropping an unknown operation is choosing "it never happened", so
    a linearization without them is one of the whole history, and the usual
    failure (a stale read) is found without trying every subset of them.
    Only when that reduced history fails is the whole one searched, since an
    unobserved write can still explain a cas that failed."""
    ops = [op for op in ops if op.status != FAIL and not (op.status == INFO and op.kind == READ)]
    observed = {op.result for op in ops if op.kind == READ} | {op.value[0] for op in ops if op.kind == CAS}
    reduced = [op for op in ops if op.status != INFO or _written(op) in observed]
    if len(reduced) == len(ops):
        return _search(key, ops, initial, max_configurations)
    first = _search(key, reduced, initial, max_configurations)
    if first.ok:
        first.ops = len(ops)
        return first
    full = _search(key, ops, initial, max_configurations)
    if full.ok is None and first.ok is False:  # say where the reduced history broke
        first.ok, first.ops = None, len(ops)
        first.configurations += full.configurations
        return first
    return full


def _written(op: Op) -> Any:
    return op.value if op.kind == WRITE else op.value[1]


def _search(key: Hashable, ops: list[Op], initial: Any, max_configurations: int) -> KeyResult:
    """Wing & Gong's search with Lowe's cache."""
    n = len(ops)
    # Entries 1..2n: a call (op i at 2i+1) and its return (2i+2), in time order; a
    # call before a return at the same instant (they overlap: fewer false alarms).
    order = sorted(range(2 * n), key=lambda e: (ops[e // 2].invoked, 0) if e % 2 == 0 else
                   (ops[e // 2].completed if ops[e // 2].completed is not None else math.inf, 1))
    size = 2 * n + 2  # 0: head; size - 1: tail
    nxt, prv = [0] * size, [0] * size
    chain = [0, *(e + 1 for e in order), size - 1]
    for a, b in itertools.pairwise(chain):
        nxt[a], prv[b] = b, a
    tail = size - 1

    def lift(call: int) -> None:
        ret = call + 1
        nxt[prv[call]], prv[nxt[call]] = nxt[call], prv[call]
        nxt[prv[ret]], prv[nxt[ret]] = nxt[ret], prv[ret]

    def unlift(call: int) -> None:
        ret = call + 1
        nxt[prv[ret]] = prv[nxt[ret]] = ret
        nxt[prv[call]] = prv[nxt[call]] = call

    state, linearized = initial, 0
    cache: set[tuple[int, Any]] = set()  # (operations linearized, value) explored
    calls: list[tuple[int, Any]] = []
    deepest: tuple[int, int, list[Any]] = (-1, 0, [])  # (depth, return entry, values) of the deepest dead end
    entry = nxt[0]
    while entry != tail:
        i = (entry - 1) // 2
        op = ops[i]
        if (entry - 1) % 2 == 0:  # a call
            accepted, after = _step(state, op)
            if accepted:
                mark = linearized | (1 << i)
                if (mark, after) not in cache:
                    if len(cache) >= max_configurations:
                        return KeyResult(key, None, n, len(cache))
                    cache.add((mark, after))
                    calls.append((entry, state))
                    state, linearized = after, mark
                    lift(entry)
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
            continue
        if op.completed is None:  # only operations of unknown outcome are left
            return KeyResult(key, True, n, len(cache))
        depth = len(calls)
        if depth > deepest[0]:
            deepest = (depth, entry, [state])
        elif depth == deepest[0] and entry == deepest[1] and state not in deepest[2]:
            deepest[2].append(state)
        if not calls:
            break
        entry, state = calls.pop()
        linearized &= ~(1 << ((entry - 1) // 2))
        unlift(entry)
        entry = nxt[entry]
    else:
        return KeyResult(key, True, n, len(cache))
    culprit = ops[(deepest[1] - 1) // 2]
    end = culprit.completed if culprit.completed is not None else math.inf
    concurrent = [op for op in ops if op is not culprit and op.invoked <= end
                  and (op.completed is None or op.completed >= culprit.invoked)]
    return KeyResult(key, False, n, len(cache), culprit, deepest[0], deepest[2], concurrent)


def check(ops: Iterable[Op], initial: dict[Hashable, Any] | None = None,
          max_configurations: int = MAX_CONFIGURATIONS) -> Result:
    """Check a history of operations on any number of registers, key by key;
    ``initial``: registers' values before the history (absent: ``None``)."""
    started = time.perf_counter()
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    results = {key: check_key(key, key_ops, (initial or {}).get(key), max_configurations)
               for key, key_ops in by_key.items()}
    verdicts = [r.ok for r in results.values()]
    ok = False if False in verdicts else None if None in verdicts else True
    return Result(ok, results, time.perf_counter() - started)
