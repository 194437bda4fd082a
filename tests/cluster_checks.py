"""What a cluster test checks once its nodes are stopped: their logs, read
with wal's one segment scanner, against what the clients saw
(tests/cluster_workload.py).

* :func:`read_log`: a node's entries, each with the timeline it was written
  on: the timeline whose range in the log's history (its newest segment's
  header) holds the entry's LSN (PostgreSQL's rule; wal/timeline.py).
* :func:`forks`: no ``(timeline, LSN)`` holds two different entries across
  the nodes (two writers in one epoch, or a timeline reused).
* :func:`final_history`: the entries of the final leader's lineage, LSN 1 to
  its last, gathered from every node (a node bootstrapped from a snapshot
  lacks the start of the log; another has it); and the value of every key
  at every LSN (:class:`States`).
* :func:`lost_writes`: every acknowledged write is there with its value, at
  the LSN and on the timeline (= epoch) its acknowledgement named; every
  write surely refused is not.
* :func:`shared_epochs`: no two nodes acknowledged writes in one epoch.
* :func:`forked_reads`: every read a node served at LSN ``L`` returned the
  final history's value at ``L``.
* the history of the registers is linearizable (tests/linearizability.py).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.cluster_workload import REGISTERS, Write
from tests.linearizability import CAS, FAIL, OK, READ, WRITE, Op, Result, check


@dataclass
class NodeLog:
    """A stopped node's log: ``entries[lsn] = (timeline, payload)``."""

    name: str
    history: tuple[tuple[int, int], ...]
    entries: dict[int, tuple[int, bytes]]

    @property
    def last_lsn(self) -> int:
        return max(self.entries, default=0)


def timeline_at(history: tuple[tuple[int, int], ...], lsn: int) -> int:
    """The timeline of ``lsn`` in ``history`` ((timeline, first LSN) pairs,
    oldest first): the last one beginning at or before it."""
    starts = [first for _, first in history]
    i = bisect.bisect_right(starts, lsn) - 1
    return history[max(i, 0)][0]


def read_log(name: str, wal_dir: str) -> NodeLog:
    """Every valid entry of a stopped node's log (a torn tail ends it, as
    recovery would cut it)."""
    from wal.segment import iter_entries, list_segments, read_header

    segments = list_segments(wal_dir)
    history: tuple[tuple[int, int], ...] = ((1, 1),)
    raw: dict[int, bytes] = {}
    for seg in segments:
        with open(seg.path, "rb") as f:
            header = read_header(f, seg.path)[0]
            f.seek(0)
            raw.update((e.lsn, e.payload) for e in iter_entries(f, seg.path))
        lineage = getattr(header, "history", None)
        history = tuple((int(t[0]), int(t[1])) for t in lineage) if lineage else \
            ((int(getattr(header, "timeline", 1)), 1),)
    return NodeLog(name, history, {lsn: (timeline_at(history, lsn), p) for lsn, p in raw.items()})


def describe(payload: bytes) -> str:
    try:
        return repr(effective_writes(payload))
    except Exception as exc:  # noqa: BLE001 - for a message only
        return f"<{type(exc).__name__}: {exc}> {payload[:60]!r}"


def forks(logs: list[NodeLog]) -> list[str]:
    """``(timeline, LSN)`` pairs that hold different entries on different nodes."""
    seen: dict[tuple[int, int], tuple[str, bytes]] = {}
    problems = []
    for log in logs:
        for lsn, (timeline, payload) in sorted(log.entries.items()):
            first = seen.setdefault((timeline, lsn), (log.name, payload))
            if first[1] != payload:
                problems.append(f"timeline {timeline} LSN {lsn}: {first[0]} holds {describe(first[1])}, "
                                f"{log.name} holds {describe(payload)}")
    return problems


def effective_writes(payload: bytes) -> list[tuple[bytes, bytes | None]]:
    """What an entry did to keys: (key, value) puts and (key, None) deletes
    (a failed conditional batch: nothing). The workloads write nothing else."""
    from kvstore.entry import codec
    from kvstore.entry.conditions import writes_of

    out: list[tuple[bytes, bytes | None]] = []
    for op in writes_of(codec.decode(payload)):
        if op[0] == codec.OP_PUT:
            out.append((op[1], op[2]))
        elif op[0] == codec.OP_DELETE:
            out.append((op[1], None))
        elif not (op[0] == codec.OP_KEYSPACE and op[1] == ""):
            raise ValueError(f"an op the cluster workloads never write: {op!r}")
    return out


UNKNOWN = object()
"""A key's value at an LSN the final history cannot tell (its last write
before that LSN is in a trimmed prefix)."""


@dataclass
class States:
    """The final history: ``entries[lsn] = (timeline, payload)`` from LSN
    ``first`` to ``last`` (``first`` > 1 when every node's log was trimmed
    after a snapshot), and each key's values by LSN."""

    entries: dict[int, tuple[int, bytes]]
    changes: dict[bytes, tuple[list[int], list[bytes | None]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_key: dict[bytes, tuple[list[int], list[bytes | None]]] = defaultdict(lambda: ([], []))
        for lsn in sorted(self.entries):
            for key, value in effective_writes(self.entries[lsn][1]):
                lsns, values = by_key[key]
                lsns.append(lsn)
                values.append(value)
        self.changes = dict(by_key)

    @property
    def first(self) -> int:
        return min(self.entries, default=1)

    @property
    def last(self) -> int:
        return max(self.entries, default=0)

    def value_at(self, key: bytes, lsn: int) -> Any:
        """The key's value after ``lsn`` (None: absent), or :data:`UNKNOWN`."""
        lsns, values = self.changes.get(key, ([], []))
        i = bisect.bisect_right(lsns, lsn)
        return values[i - 1] if i else None if self.first == 1 else UNKNOWN

    def final(self, key: bytes) -> Any:
        return self.value_at(key, self.last)


def final_history(logs: list[NodeLog], leader: str) -> tuple[States, list[str]]:
    """The final leader's lineage, each LSN's entry taken from any node that
    holds it on the right timeline; problems when an LSN past the first one
    any node holds is held by none (a prefix trimmed everywhere after a
    snapshot is not one: the checks then skip what it would tell)."""
    lineage = next(log for log in logs if log.name == leader)
    entries: dict[int, tuple[int, bytes]] = {}
    for lsn in range(1, lineage.last_lsn + 1):
        timeline = timeline_at(lineage.history, lsn)
        for log in logs:
            held = log.entries.get(lsn)
            if held is not None and held[0] == timeline:
                entries[lsn] = held
                break
    first = min(entries, default=1)
    missing = [lsn for lsn in range(first, lineage.last_lsn + 1) if lsn not in entries]
    problems = [f"no node holds LSN {_ranges(missing)} of the final history (timelines {lineage.history}): "
                f"the checks that need the whole history are incomplete"] if missing else []
    return States(entries), problems


def _ranges(lsns: list[int]) -> str:
    return f"{lsns[0]}..{lsns[-1]} ({len(lsns)} LSNs)" if len(lsns) > 1 else str(lsns[0])


def lost_writes(writes: list[Write], states: States, found: dict[bytes, bytes]) -> list[str]:
    """Acknowledged writes missing (from the final leader's answers and from
    the final history), at the wrong LSN or timeline; refused ones present."""
    problems = []
    for w in writes:
        present = found.get(w.key)
        if w.status == OK:
            if present != w.value:
                problems.append(f"LOST: {w.via} write of {w.key!r} = {w.value!r} acknowledged by {w.node} "
                                f"(epoch {w.epoch}, LSN {w.lsn}); the final leader has {present!r}")
            if states.final(w.key) not in (w.value, UNKNOWN):
                problems.append(f"LOST: {w.key!r} = {w.value!r} (LSN {w.lsn}) is not in the final history")
            if w.lsn is not None and w.lsn in states.entries:
                timeline, payload = states.entries[w.lsn]
                if (w.key, w.value) not in effective_writes(payload):
                    problems.append(f"write of {w.key!r} acknowledged at LSN {w.lsn}, but the final history "
                                    f"holds {describe(payload)} there")
                elif w.epoch is not None and timeline != w.epoch:
                    problems.append(f"write of {w.key!r} acknowledged in epoch {w.epoch} is on timeline "
                                    f"{timeline} at LSN {w.lsn}")
        elif w.status == FAIL and w.via != "client-cas" and present is not None:
            problems.append(f"a write refused ({w.error}) is present: {w.key!r} = {present!r}")
    return problems


def shared_epochs(writes: list[Write], ops: list[Op]) -> list[str]:
    """Epochs in which more than one node acknowledged a write, and
    acknowledgements without the epoch and node headers."""
    by_epoch: dict[int, set[str]] = defaultdict(set)
    problems = []
    acks = [(w.node, w.epoch, w.sent_to, f"{w.key!r}") for w in writes if w.status == OK and w.via == "raw"]
    acks += [(op.meta[0], op.meta[1], op.meta[3], str(op)) for op in ops
             if op.status == OK and op.kind in (WRITE, CAS) and (op.kind == WRITE or op.result)]
    for node, epoch, sent_to, what in acks:
        if node is None or epoch is None:
            problems.append(f"an acknowledgement without Walkv-Node/Walkv-Epoch: {what}")
            continue
        if node != sent_to:
            problems.append(f"{what} was sent to {sent_to} but acknowledged as {node}")
        by_epoch[epoch].add(node)
    problems += [f"epoch {epoch}: writes acknowledged by {sorted(nodes)}" for epoch, nodes in sorted(by_epoch.items())
                 if len(nodes) > 1]
    return problems


def forked_reads(ops: list[Op], states: States) -> tuple[list[str], int]:
    """Reads whose value is not the final history's at the LSN they were
    served at; and how many reads were checked."""
    problems, checked = [], 0
    for op in ops:
        if op.kind != READ or op.status != OK or len(op.meta) < 2 or op.meta[1] is None:
            continue
        node, served = op.meta[0], op.meta[1]
        if served <= states.last and states.value_at(op.key, served) is UNKNOWN:
            continue
        checked += 1
        if served > states.last:
            problems.append(f"{node} served {op.key!r} = {op.result!r} at LSN {served}, past the final "
                            f"history's last LSN {states.last}")
        elif states.value_at(op.key, served) != op.result:
            problems.append(f"{node} served {op.key!r} = {op.result!r} at LSN {served}; the final history "
                            f"has {states.value_at(op.key, served)!r} there")
    return problems, checked


def linearizable(ops: list[Op]) -> Result:
    return check([op for op in ops if op.key in REGISTERS])


@dataclass
class Verdict:
    """Every check's problems (empty: passed) and what was measured."""

    problems: dict[str, list[str]]
    stats: dict[str, Any]
    linearizability: Result | None = None

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def text(self, limit: int = 15) -> str:
        lines = [f"{name}: {len(found)} problem(s)\n  " + "\n  ".join(found[:limit])
                 for name, found in self.problems.items() if found]
        if self.linearizability is not None and self.linearizability.ok is not True:
            lines.append(self.linearizability.explain())
        return "\n".join(lines)


def verdict(logs: list[NodeLog], leader: str, writes: list[Write], ops: list[Op],
            found: dict[bytes, bytes]) -> Verdict:
    """Every check of the module docstring."""
    states, incomplete = final_history(logs, leader)
    reads, checked = forked_reads(ops, states)
    result = linearizable(ops)
    problems = {
        "history complete": incomplete,
        "no (timeline, LSN) holds two entries": forks(logs),
        "0 acknowledged writes lost": lost_writes(writes, states, found),
        "one node acknowledges per epoch": shared_epochs(writes, ops),
        "no read from a forked history": reads,
        "registers linearizable": [] if result.ok is True else [result.explain().splitlines()[0]],
    }
    stats = {"acknowledged": sum(w.status == OK for w in writes) + sum(
                 op.status == OK and op.kind != READ for op in ops),
             "unknown": sum(w.status != OK and w.status != FAIL for w in writes) + sum(
                 op.status not in (OK, FAIL) and op.kind != READ for op in ops),
             "refused": sum(w.status == FAIL for w in writes) + sum(op.status == FAIL and op.kind != READ
                                                                    for op in ops),
             "reads_checked": checked, "history_ops": result.ops, "checker_ms": round(result.seconds * 1000, 1),
             "registers": len(result.keys), "register_max_ops": max((k.ops for k in result.keys.values()), default=0),
             "history_unknown": sum(op.status not in (OK, FAIL) for op in ops),
             "configurations": sum(k.configurations for k in result.keys.values()),
             "first_lsn": states.first, "last_lsn": states.last}
    return Verdict(problems, stats, result)
