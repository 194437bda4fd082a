"""The command table: every command the RESP face answers, with the role it
needs, its arity, how it runs alone and (``view``) inside MULTI/EXEC.

Deny by default: a command that is not in :data:`COMMANDS` is ``ERR unknown
command``; one whose role the connection's token does not have is refused
before it runs (``NOAUTH`` before AUTH, ``NOPERM`` after), so the role
comes from the same look-up that finds the command. Roles are
:mod:`kvstore.server.auth`'s: OPEN (AUTH, HELLO, QUIT, RESET), READ, WRITE,
ADMIN (SAVE, BGSAVE, CONFIG).

How a command runs alone (``run``): a read on the event loop against the
state now, once the connection's earlier writes are answered (:func:`read`);
a write that reads first as a decided write (:func:`decided`, on the group's
leader, in log order); the hot and plain ones (GET, SET, MSET, SETEX,
FLUSHDB) by functions of their own. Arity is Redis's: ``n`` exactly n
arguments with the name, ``-n`` at least n.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kvstore.server.auth import ADMIN, OPEN, READ, WRITE
from kvstore.server.resp import (
    expiry,
    keys,
    pubsub_commands,
    server_commands,
    session_commands,
    strings,
    transactions,
)
from kvstore.server.resp.args import text
from kvstore.server.resp.replies import RespError, Simple
from kvstore.server.resp.session import Session, ViewFn

Run = Callable[[Session, list[bytes]], None]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    run: Run
    role: int
    arity: int
    view: ViewFn | None = None
    """The command against a key view: how it runs inside MULTI/EXEC (None: not allowed there)."""
    flags: tuple[str, ...] = ()
    """COMMAND's flags (write, readonly, fast, ...)."""
    keys: tuple[int, int, int] = (0, 0, 0)
    """COMMAND's first key, last key and step."""

    def arity_ok(self, n: int) -> bool:
        return n == self.arity if self.arity >= 0 else n >= -self.arity


def read(fn: ViewFn) -> Run:
    """Run view function ``fn`` on the loop, against the state now."""

    def run(s: Session, cmd: list[bytes]) -> None:
        if not s.must_wait():
            s.answer(fn(s.view, cmd))

    return run


def decided(fn: ViewFn) -> Run:
    """Run view function ``fn`` as a write the writer decides in log order."""

    def run(s: Session, cmd: list[bytes]) -> None:
        s.decide(fn, cmd)

    return run


def now(fn: ViewFn) -> Run:
    """Answer view function ``fn`` at once (it reads no key: PING, ECHO)."""

    def run(s: Session, cmd: list[bytes]) -> None:
        s.answer(fn(s.view, cmd))

    return run


K1: Final = (1, 1, 1)
KALL: Final = (1, -1, 1)
KPAIRS: Final = (1, -1, 2)
W: Final = ("write",)
WD: Final = ("write", "denyoom")
R: Final = ("readonly",)
RF: Final = ("readonly", "fast")

_TABLE: list[Command] = [
    # strings
    Command("get", strings.run_get, READ, 2, strings.get, RF, K1),
    Command("set", strings.run_set, WRITE, -3, strings.set_, WD, K1),
    Command("setnx", decided(strings.setnx), WRITE, 3, strings.setnx, WD, K1),
    Command("setex", strings.run_setex, WRITE, 4, strings.setex, WD, K1),
    Command("psetex", strings.run_setex, WRITE, 4, strings.setex, WD, K1),
    Command("getset", decided(strings.getset), WRITE, 3, strings.getset, WD, K1),
    Command("getdel", decided(strings.getdel), WRITE, 2, strings.getdel, W, K1),
    Command("getex", strings.run_getex, WRITE, -2, strings.getex, W, K1),
    Command("mget", read(strings.mget), READ, -2, strings.mget, RF, KALL),
    Command("mset", strings.run_mset, WRITE, -3, strings.mset, WD, KPAIRS),
    Command("msetnx", decided(strings.msetnx), WRITE, -3, strings.msetnx, WD, KPAIRS),
    Command("append", decided(strings.append), WRITE, 3, strings.append, WD, K1),
    Command("strlen", read(strings.strlen), READ, 2, strings.strlen, RF, K1),
    Command("getrange", read(strings.getrange), READ, 4, strings.getrange, R, K1),
    Command("substr", read(strings.getrange), READ, 4, strings.getrange, R, K1),
    Command("setrange", decided(strings.setrange), WRITE, 4, strings.setrange, WD, K1),
    Command("incr", decided(strings.incr), WRITE, 2, strings.incr, WD, K1),
    Command("decr", decided(strings.decr), WRITE, 2, strings.decr, WD, K1),
    Command("incrby", decided(strings.incrby), WRITE, 3, strings.incrby, WD, K1),
    Command("decrby", decided(strings.decrby), WRITE, 3, strings.decrby, WD, K1),
    Command("incrbyfloat", decided(strings.incrbyfloat), WRITE, 3, strings.incrbyfloat, WD, K1),
    # keys
    Command("del", decided(keys.delete), WRITE, -2, keys.delete, W, KALL),
    Command("unlink", decided(keys.delete), WRITE, -2, keys.delete, W, KALL),
    Command("exists", read(keys.exists), READ, -2, keys.exists, RF, KALL),
    Command("type", read(keys.type_), READ, 2, keys.type_, RF, K1),
    Command("rename", decided(keys.rename), WRITE, 3, keys.rename, W, (1, 2, 1)),
    Command("renamenx", decided(keys.rename), WRITE, 3, keys.rename, W, (1, 2, 1)),
    Command("keys", keys.keys, READ, 2, None, R),
    Command("scan", keys.scan, READ, -2, None, R),
    Command("dbsize", keys.dbsize, READ, 1, None, RF),
    Command("flushdb", keys.run_flushdb, WRITE, -1, keys.flushdb, W),
    Command("flushall", keys.run_flushdb, WRITE, -1, keys.flushall, W),
    # expiry
    Command("expire", decided(expiry.expire), WRITE, -3, expiry.expire, W, K1),
    Command("pexpire", decided(expiry.expire), WRITE, -3, expiry.expire, W, K1),
    Command("expireat", decided(expiry.expire), WRITE, -3, expiry.expire, W, K1),
    Command("pexpireat", decided(expiry.expire), WRITE, -3, expiry.expire, W, K1),
    Command("persist", decided(expiry.persist), WRITE, 2, expiry.persist, W, K1),
    Command("ttl", read(expiry.ttl), READ, 2, expiry.ttl, RF, K1),
    Command("pttl", read(expiry.ttl), READ, 2, expiry.ttl, RF, K1),
    Command("expiretime", read(expiry.expiretime), READ, 2, expiry.expiretime, RF, K1),
    Command("pexpiretime", read(expiry.expiretime), READ, 2, expiry.expiretime, RF, K1),
    # transactions
    Command("multi", transactions.multi, READ, 1, None, ("fast",)),
    Command("exec", transactions.exec_, READ, 1, None),
    Command("discard", transactions.discard, READ, 1, None, ("fast",)),
    Command("watch", transactions.watch, READ, -2, None, ("fast",), KALL),
    Command("unwatch", transactions.unwatch, READ, 1, None, ("fast",)),
    # the connection
    Command("ping", session_commands.run_ping, READ, -1, session_commands.ping, ("fast",)),
    Command("echo", now(session_commands.echo), READ, 2, session_commands.echo, ("fast",)),
    Command("auth", session_commands.auth, OPEN, -2, None, ("noscript", "loading", "stale", "fast")),
    Command("hello", session_commands.hello, OPEN, -1, None, ("noscript", "loading", "stale", "fast")),
    Command("select", session_commands.select, READ, 2, transactions.select, ("loading", "fast")),
    Command("quit", session_commands.quit_, OPEN, -1, None, ("fast",)),
    Command("reset", session_commands.reset, OPEN, 1, None, ("fast",)),
    Command("client", session_commands.client, READ, -2, None),
    # the server
    Command("info", server_commands.info, READ, -1, None),
    Command("config", server_commands.config, ADMIN, -2, None),
    Command("lastsave", server_commands.lastsave, READ, 1, None, ("fast",)),
    Command("save", server_commands.save, ADMIN, 1, None),
    Command("bgsave", server_commands.save, ADMIN, -1, None),
    Command("time", server_commands.time_, READ, 1, None, ("fast",)),
    Command("wait", server_commands.wait, READ, 3, None),
    # pub/sub
    Command("subscribe", pubsub_commands.subscribe, READ, -2, None, ("pubsub", "noscript", "loading", "stale")),
    Command("psubscribe", pubsub_commands.psubscribe, READ, -2, None, ("pubsub", "noscript", "loading", "stale")),
    Command("unsubscribe", pubsub_commands.unsubscribe, READ, -1, None, ("pubsub", "noscript", "loading", "stale")),
    Command("punsubscribe", pubsub_commands.punsubscribe, READ, -1, None,
            ("pubsub", "noscript", "loading", "stale")),
    Command("publish", pubsub_commands.publish, WRITE, 3, None, ("pubsub", "loading", "stale", "fast")),
    Command("pubsub", pubsub_commands.pubsub, READ, -2, None, ("pubsub", "loading", "stale")),
]


def _command(s: Session, cmd: list[bytes]) -> None:
    """COMMAND [COUNT | INFO name... | DOCS [name...] | LIST]."""
    sub = text(cmd[1]) if len(cmd) > 1 else ""
    if sub == "":
        s.answer([_describe(c) for c in COMMANDS.values()])
    elif sub == "COUNT" and len(cmd) == 2:
        s.answer(len(COMMANDS))
    elif sub == "INFO":
        names = [a.lower() for a in cmd[2:]] or list(COMMANDS)
        s.answer([None if (c := COMMANDS.get(n)) is None else _describe(c) for n in names])
    elif sub == "DOCS":
        names = [a.lower() for a in cmd[2:]] or list(COMMANDS)
        s.answer({n: {b"summary": b"", b"since": b"1.0.0", b"group": b"generic"} for n in names if n in COMMANDS})
    elif sub == "LIST":
        s.answer(list(COMMANDS))
    else:
        raise RespError(f"ERR unknown subcommand '{cmd[1].decode('utf-8', 'replace')}'. Try COMMAND HELP.")


def _describe(c: Command) -> list:
    return [c.name.encode(), c.arity, [Simple(f) for f in c.flags], *c.keys, [], [], [], []]


_TABLE.append(Command("command", _command, READ, -1, None, ("loading", "stale")))
COMMANDS: Final[dict[bytes, Command]] = {c.name.encode(): c for c in _TABLE}
"""Every command, by its lower-case name."""
LOOKUP: Final[dict[bytes, Command]] = {**COMMANDS, **{c.name.upper().encode(): c for c in _TABLE}}
"""Every command by its lower- and upper-case names (most clients send one of
them: one dict look-up on the hot path); any other spelling is lower-cased first."""
