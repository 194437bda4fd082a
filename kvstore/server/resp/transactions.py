"""MULTI, EXEC, DISCARD, WATCH, UNWATCH: a Redis transaction as ONE walkv
log entry.

MULTI queues commands (each checked when queued: a bad one discards the
transaction, EXECABORT). EXEC hands the queue to the writer as one decided
write (:class:`kvstore.entry.conditions.Decided`): on the group's leader, in
log order, the watched keys are checked, then every queued command runs
against the state at the entry's place in the log, each seeing the ones
before it; their writes are one entry (one LSN, atomic, durable before the
answer), their answers EXEC's array. A command that fails (INCR of a word)
answers its error in the array and writes nothing; the others still run, as
in Redis. A block of reads is logged too (as an empty batch): that is what
gives it one place in the log.

WATCH: Redis aborts EXEC after any write to a watched key. walkv decides it by
value: EXEC is aborted (answers null, logs nothing) when a watched key's value
at EXEC's place in the log differs from its value when WATCHed, or when a read
on this connection since the WATCH found a value other than that one. So a
transaction runs only when every value of a watched key it could have seen is
the value at its commit: the serial outcome optimistic locking needs (why a
value condition is enough, with no new condition in the log's format: a write
that puts a key back to the value it had cannot change what the transaction
computed). What differs from Redis: a write of the same value, or a TTL
change, does not abort.

Not allowed in MULTI on walkv (they read the whole state, which the writer
does not): KEYS, SCAN, DBSIZE, and the server and connection commands other
than PING, ECHO and SELECT; queuing one discards the transaction.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from kvstore.entry.conditions import GroupSoFar
from kvstore.server.resp.keyview import DATABASES, EntryView, holdable, keyspace_of
from kvstore.server.resp.notify import Span
from kvstore.server.resp.replies import NULL_ARRAY, OK, RespError, Simple
from kvstore.server.resp.session import Session, ViewFn

OKAY: Final = Simple("OK")
EXECABORT: Final = "EXECABORT Transaction discarded because of previous errors."


class Queued(NamedTuple):
    name: str
    view: ViewFn
    cmd: list[bytes]


class Multi:
    """A connection's open MULTI: the commands queued, whether one was
    refused, the bytes they hold, the database EXEC leaves selected."""

    __slots__ = ("queued", "failed", "size", "db")

    def __init__(self, db: int) -> None:
        self.queued: list[Queued] = []
        self.failed = False
        self.size = 0
        self.db = db


class Watching:
    """A connection's watched keys: ``(db, key) -> value when watched``,
    and whether a read since found another value (``dirty``)."""

    __slots__ = ("values", "dirty")

    def __init__(self) -> None:
        self.values: dict[tuple[int, bytes], bytes | None] = {}
        self.dirty = False

    def saw(self, db: int, key: bytes, value: bytes | None) -> None:
        """A read on the connection found ``value`` for ``key``."""
        expected = self.values.get((db, key), value)
        if expected != value:
            self.dirty = True


def queue(s: Session, name: str, view: ViewFn | None, cmd: list[bytes]) -> None:
    """Queue a command in the open MULTI (or refuse it, failing the MULTI)."""
    multi: Multi = s.multi
    limits = s.served.limits
    if view is None:
        multi.failed = True
        raise RespError(f"ERR {name.upper()} is not allowed in MULTI on walkv")
    if len(multi.queued) >= limits.max_multi_commands:
        multi.failed = True
        raise RespError(f"ERR this MULTI already holds {limits.max_multi_commands} commands, its limit")
    multi.size += sum(len(a) for a in cmd)
    if multi.size > s.served.max_payload:
        multi.failed = True
        raise RespError(f"ERR this MULTI holds more than {s.served.max_payload} bytes, the store's record limit")
    if name == "select":
        multi.db = select_index(cmd[1])
    multi.queued.append(Queued(name, view, cmd))
    s.reply(b"+QUEUED\r\n")


def select_index(raw: bytes) -> int:
    try:
        db = int(raw)
    except ValueError:
        raise RespError("ERR value is not an integer or out of range") from None
    if not 0 <= db < DATABASES:
        raise RespError("ERR DB index is out of range")
    return db


def select(v: Any, cmd: list[bytes]) -> Any:
    """SELECT inside MULTI (the connection's own SELECT: :mod:`kvstore.server.resp.session_commands`)."""
    v.select(select_index(cmd[1]))
    return OKAY


def multi(s: Session, cmd: list[bytes]) -> None:
    if s.multi is not None:
        raise RespError("ERR MULTI calls can not be nested")
    s.multi = Multi(s.db)
    s.reply(OK)


def discard(s: Session, cmd: list[bytes]) -> None:
    if s.multi is None:
        raise RespError("ERR DISCARD without MULTI")
    s.multi = None
    s.unwatch()
    s.reply(OK)


def watch(s: Session, cmd: list[bytes]) -> None:
    if s.multi is not None:
        raise RespError("ERR WATCH inside MULTI is not allowed")
    if s.must_wait():
        return
    watching = s.watch()
    for key in cmd[1:]:
        if (s.db, key) not in watching.values:
            watching.values[(s.db, key)] = s.view.get(key)
    s.reply(OK)


def unwatch(s: Session, cmd: list[bytes]) -> None:
    s.unwatch()
    s.reply(OK)


def exec_(s: Session, cmd: list[bytes]) -> None:
    block: Multi | None = s.multi
    if block is None:
        raise RespError("ERR EXEC without MULTI")
    watching = s.watching
    s.multi = None
    s.unwatch()
    if block.failed:
        raise RespError(EXECABORT)
    if watching is not None and watching.dirty:
        s.answer(NULL_ARRAY)
        return
    watched = dict(watching.values) if watching is not None else {}
    if not block.queued and not watched:
        s.answer([])
        return
    db, queued, served = s.db, block.queued, s.served
    spans: list[Span] = []  # the ops each command made, for keyspace notifications

    def compute(so_far: GroupSoFar) -> tuple[list, Any]:
        for (wdb, key), value in watched.items():
            if holdable(key) and so_far.get(keyspace_of(wdb), key) != value:
                return [], NULL_ARRAY
        view = EntryView(so_far, db, served.now_us, served.max_value)
        answers: list[Any] = []
        for q in queued:
            try:
                answers.append(q.view(view, q.cmd))
            except RespError as exc:
                answers.append(exc)
            except (ValueError, TypeError) as exc:
                answers.append(RespError(f"ERR {exc}"))
            spans.append((q.cmd, len(view.ops)))
        return view.ops, answers

    s.select(block.db)
    s.decide_entry(compute, spans)
