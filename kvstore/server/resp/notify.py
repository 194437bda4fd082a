"""Keyspace notifications as Redis names them: which events a write makes,
and the ``notify-keyspace-events`` flags that choose what is delivered.

An event is ``(db, key, name)``, published on ``__keyspace@<db>__:<key>``
(message: the event's name) when the flags hold ``K``, and on
``__keyevent@<db>__:<name>`` (message: the key) when they hold ``E``, if the
flags also hold the event's class: ``g`` generic (del, expire, rename_from,
rename_to, persist), ``$`` strings (set, setrange, incrby, incrbyfloat,
append), ``x`` expired; ``A`` is every class. Redis's other classes (lists,
sets, hashes, sorted sets, streams, evicted, key misses, new keys, modules)
are accepted and never delivered: walkv has none of those events.

A RESP write's events are named from the command that made it
(:func:`entry_events`: INCR is ``incrby``, RENAME is ``rename_from`` then
``rename_to``, EXPIRE in the past is ``del``, as Redis says them); any other
write (HTTP, the embedded API, the expiry sweeper) from the change the watch
shows (:func:`change_events`: a put is ``set``, a delete ``del``, an expiry
``expired``). A FLUSHDB, FLUSHALL or range delete makes none, as Redis's
FLUSHDB makes none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from kvstore.entry.codec import (
    DELETE,
    EXPIRE,
    OP_DELETE,
    OP_EXPIRE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_EXPIRING,
    OP_PUT_LEASED,
    UPSERT,
)
from kvstore.server.resp.keyview import DATABASES
from kvstore.server.resp.replies import RespError

Event = tuple[int, bytes, bytes]
"""``(db, key, event name)``."""

KEYSPACE: Final = 1
KEYEVENT: Final = 2
GENERIC: Final = 4
STRING: Final = 8
EXPIRED: Final = 16
_CLASSES: Final = "g$lshzxetd"
"""Redis's event classes, in the order CONFIG GET prints them (A is all of them)."""
_BITS: Final = {"g": GENERIC, "$": STRING, "x": EXPIRED,
                **{c: 1 << (8 + n) for n, c in enumerate("lshzetdmn")}, "K": KEYSPACE, "E": KEYEVENT}
_ALL: Final = sum(_BITS[c] for c in _CLASSES)
DEFAULT_FLAGS: Final = "KEA"
"""walkv's default: every event on both channels (Redis's default is none;
the cost here is nothing until a connection subscribes)."""

CLASS_OF: Final[dict[bytes, int]] = {
    b"del": GENERIC, b"expire": GENERIC, b"rename_from": GENERIC, b"rename_to": GENERIC, b"persist": GENERIC,
    b"set": STRING, b"setrange": STRING, b"incrby": STRING, b"incrbyfloat": STRING, b"append": STRING,
    b"expired": EXPIRED,
}


def parse_flags(text: str) -> int:
    """``notify-keyspace-events``'s value as flags (Redis's error for an unknown letter)."""
    flags = 0
    for c in text:
        bit = _ALL if c == "A" else _BITS.get(c)
        if bit is None:
            raise RespError("ERR CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - "
                            "Invalid event class character. Use 'Ag$lshzxeKEtmdn'.")
        flags |= bit
    return flags


def format_flags(flags: int) -> str:
    """The flags as CONFIG GET shows them, as Redis 7.0 does (``AKE``:
    every event on both channels; the ``n`` class is not shown)."""
    out = "A" if flags & _ALL == _ALL else "".join(c for c in _CLASSES if flags & _BITS[c])
    return out + "".join(c for c in "KEm" if flags & _BITS[c])


def db_of(keyspace: str) -> int | None:
    """The database of walkv keyspace ``keyspace`` (None: no SELECT reaches it)."""
    if keyspace == "":
        return 0
    if keyspace.isdigit() and keyspace[0] != "0" and int(keyspace) < DATABASES:
        return int(keyspace)
    return None


_BY_OP: Final[dict[int, tuple[bytes, ...]]] = {
    OP_PUT: (b"set",), OP_PUT_LEASED: (b"set",), OP_PUT_EXPIRING: (b"set", b"expire"), OP_DELETE: (b"del",),
    OP_EXPIRE: (b"expired",),
}
_PUT_AS: Final[dict[bytes, bytes]] = {
    b"incr": b"incrby", b"decr": b"incrby", b"incrby": b"incrby", b"decrby": b"incrby",
    b"incrbyfloat": b"incrbyfloat", b"append": b"append", b"setrange": b"setrange", b"persist": b"persist",
    b"expire": b"expire", b"pexpire": b"expire", b"expireat": b"expire", b"pexpireat": b"expire",
    b"rename": b"rename_to", b"renamenx": b"rename_to",
}
"""Commands whose puts Redis names otherwise than ``set``."""


Span = tuple[Sequence[bytes] | None, int]
"""One command of an entry: its arguments (None: plain puts of a
connection's batch) and the index after its last op."""


def entry_events(ops: Sequence[Sequence[Any]], spans: Sequence[Span]) -> list[Event]:
    """The events of a RESP entry's ``ops`` (as logged), each made by the
    command of its span, in the order Redis publishes them."""
    db: int | None = 0
    out: list[Event] = []
    span = -1
    end = 0
    name = put_as = None
    keep_ttl = False
    for i, op in enumerate(ops):
        while i >= end and span + 1 < len(spans):
            span += 1
            cmd, end = spans[span]
            name = b"" if cmd is None else cmd[0].lower()
            put_as = _PUT_AS.get(name)
            if cmd is not None and name == b"getex":
                put_as = b"persist" if b"PERSIST" in (a.upper() for a in cmd[2:]) else b"expire"
            keep_ttl = cmd is not None and name == b"set" and b"KEEPTTL" in (a.upper() for a in cmd[3:])
        code = op[0]
        if code == OP_KEYSPACE:
            db = db_of(op[1])
        elif db is None:
            continue
        elif put_as is not None and code in (OP_PUT, OP_PUT_EXPIRING, OP_PUT_LEASED):
            out.append((db, op[1], put_as))
        elif code == OP_DELETE and name in (b"rename", b"renamenx"):
            out.insert(len(out) - 1, (db, op[1], b"rename_from"))  # before its rename_to, as Redis
        elif code == OP_PUT_EXPIRING and keep_ttl:
            out.append((db, op[1], b"set"))
        else:
            out.extend((db, op[1], event) for event in _BY_OP.get(code, ()))
    return out


_BY_CHANGE: Final = {UPSERT: b"set", DELETE: b"del", EXPIRE: b"expired"}


def change_events(changes: Iterable[Any]) -> list[Event]:
    """The events of an entry another face wrote, from its watch changes
    (:class:`kvstore.watch.Change`)."""
    out = []
    for change in changes:
        event = _BY_CHANGE.get(change.op)
        db = db_of(change.keyspace)
        if event is not None and db is not None:
            out.append((db, change.key, event))
    return out
