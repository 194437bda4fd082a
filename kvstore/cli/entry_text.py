"""How a logged batch reads in ``walkv inspect``: one line per op, for every
op code the entry format has (:data:`kvstore.entry.codec.OP_NAMES`, the one
full list; ``tests/test_cli_inspect.py`` holds :data:`OP_TEXT` to it), and a
one-line summary of the batch.

Keys, values and bounds are shown as ``walkv scan`` shows them (UTF-8, with
escapes), cut at 40 characters; instants as local time; keyspace names as
they are (they are text). An unbounded range bound is ``(first key)`` /
``(end of keys)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from kvstore.cli.common import escape_field
from kvstore.entry.codec import (
    CONDITION_CODES,
    END_OF_KEYS,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_EXPIRE,
    OP_FAILED,
    OP_GRANT,
    OP_GROUP_ABORT,
    OP_GROUP_COMMIT,
    OP_GROUP_PART,
    OP_KEEPALIVE,
    OP_KEYSPACE,
    OP_NAMES,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    OP_REQUIRE_ABSENT,
    OP_REQUIRE_EQUALS,
    OP_REQUIRE_LEASE,
    OP_REQUIRE_PRESENT,
    OP_REVOKE,
)


def fmt_time(us: int) -> str:
    """Unix microseconds as local time to the millisecond (the number itself when out of range)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(us / 1e6)) + f".{us % 1_000_000 // 1000:03d}"
    except (OverflowError, OSError, ValueError):
        return str(us)


def short(data: bytes, n: int = 40) -> str:
    """``data`` as text, cut to ``n`` characters."""
    text = escape_field(data)
    return text if len(text) <= n else text[: n - 1] + "…"


def _value(op: list[Any]) -> str:
    return f"{short(op[1])} = {short(op[2])} ({len(op[2])} B)"


def _bound(data: bytes, unbounded: str) -> str:
    return unbounded if data in (b"", END_OF_KEYS) else short(data)


def _keyspace(name: str) -> str:
    return f"keyspace {name}:" if name else "the default keyspace:"


OP_TEXT: Final[dict[int, Callable[[list[Any]], str]]] = {
    OP_PUT: lambda op: f"put {_value(op)}",
    OP_DELETE: lambda op: f"delete {short(op[1])}",
    OP_DELETE_RANGE: lambda op: f"delete_range [{_bound(op[1], '(first key)')}, {_bound(op[2], '(end of keys)')})",
    OP_REQUIRE_EQUALS: lambda op: f"require {short(op[1])} == {short(op[2])}",
    OP_REQUIRE_ABSENT: lambda op: f"require {short(op[1])} absent",
    OP_REQUIRE_PRESENT: lambda op: f"require {short(op[1])} present",
    OP_FAILED: lambda op: f"failed: condition {op[1] + 1} below did not hold (nothing is written)",
    OP_PUT_EXPIRING: lambda op: f"put {_value(op)}, expires {fmt_time(op[3])}",
    OP_PUT_LEASED: lambda op: f"put {_value(op)} under lease {op[3]}",
    OP_REQUIRE_LEASE: lambda op: f"require lease {op[1]} alive",
    OP_GRANT: lambda op: f"grant lease {op[1]} for {op[2] / 1e6:g} s, until {fmt_time(op[3])}",
    OP_KEEPALIVE: lambda op: f"keep lease {op[1]} alive until {fmt_time(op[2])}",
    OP_REVOKE: lambda op: f"revoke lease {op[1]}",
    OP_EXPIRE: lambda op: f"expire {short(op[1])} (its TTL or lease ran out)",
    OP_KEYSPACE: lambda op: f"in {_keyspace(op[1])}",
    OP_DROP_KEYSPACE: lambda op: f"drop keyspace {op[1]}",
    OP_GROUP_PART: lambda op: f"part {op[2]} of staged group {op[1].hex()} (applies at its commit)",
    OP_GROUP_COMMIT: lambda op: (f"commit staged group {op[1].hex()}: its {op[3]} part(s) from LSN {op[2]}, then "
                                 "the ops below" + (f" (app {op[4]} version {op[5]})" if op[4] else "")),
    OP_GROUP_ABORT: lambda op: f"abort staged group {op[1].hex()} (its parts are dropped)",
}
"""The line of each op code (every one of :data:`OP_NAMES`)."""


def op_line(op: list[Any]) -> str:
    """One op of a decoded batch, as a line."""
    return OP_TEXT[op[0]](op)


def summary(ops: list[list[Any]]) -> str:
    """A batch in one line: its one write as :func:`op_line` shows it (with
    its keyspace), or the count of each kind of op and the first write."""
    if not ops:
        return "empty batch (writes nothing: a sweep that found nothing, or an LSN a salvage filled)"
    if ops[0][0] == OP_FAILED:
        return f"{op_line(ops[0])}; {len(ops) - 1} condition(s)"
    space = ""
    writes: list[tuple[str, list[Any]]] = []
    for op in ops:
        if op[0] == OP_KEYSPACE:
            space = op[1]
        else:
            writes.append((space, op))
    where = {s for s, _ in writes}
    in_space = f" (keyspace {next(iter(where))})" if len(where) == 1 and "" not in where else ""
    if len(writes) == 1:
        return op_line(writes[0][1]) + in_space
    counts: dict[str, int] = {}
    for _s, op in writes:
        counts[OP_NAMES[op[0]]] = counts.get(OP_NAMES[op[0]], 0) + 1
    parts = ", ".join(f"{n} {name}" for name, n in counts.items())
    first = next((op for _s, op in writes if op[0] not in CONDITION_CODES), writes[0][1] if writes else None)
    tail = f"; first {op_line(first)}" if first is not None else ""
    return f"batch of {len(ops)}: {parts}{tail}{in_space}"
