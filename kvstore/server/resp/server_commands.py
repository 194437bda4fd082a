"""The server's commands: INFO, CONFIG GET (what redis-benchmark and
redis-cli ask), CONFIG SET notify-keyspace-events (the one setting of the
face itself; the store's are ``walkv serve`` options), CONFIG RESETSTAT, LASTSAVE, SAVE, BGSAVE (a walkv snapshot),
TIME, WAIT.

WAIT answers after the connection's writes before it are durable, with the
number of replicas holding its last write (:mod:`kvstore.server.resp.replication`).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Final

from kvstore.server.resp.args import as_int, text
from kvstore.server.resp.glob import compile_glob
from kvstore.server.resp.info import info_text
from kvstore.server.resp.keyview import DATABASES
from kvstore.server.resp.notify import format_flags, parse_flags
from kvstore.server.resp.replication import replicas_holding, wait_for_replicas
from kvstore.server.resp.replies import OK, RespError
from kvstore.server.resp.session import Session
from kvstore.server.resp.session_commands import REDIS_VERSION

_APPENDFSYNC: Final = {"always": "always", "batch": "everysec", "none": "no"}


def info(s: Session, cmd: list[bytes]) -> None:
    if s.must_wait():
        return
    s.answer(info_text(s.served, [text(a).lower() for a in cmd[1:]], REDIS_VERSION))


def _config(s: Session) -> dict[str, str]:
    served = s.served
    store = served.store
    sync = getattr(getattr(store, "_log", None), "sync_mode", None) or "none"
    return {"save": "", "appendonly": "yes", "appendfsync": _APPENDFSYNC.get(sync, sync),
            "databases": str(DATABASES), "maxclients": str(served.limits.max_connections), "maxmemory": "0",
            "proto-max-bulk-len": str(served.max_value), "timeout": "0", "dir": store.path,
            "replica-read-only": "yes", "slave-read-only": "yes", "cluster-enabled": "no",
            "notify-keyspace-events": format_flags(served.pubsub.flags),
            "client-output-buffer-limit": f"normal 0 0 0 slave 0 0 0 pubsub {served.limits.max_pubsub_output_bytes} "
                                          f"{served.limits.max_pubsub_output_bytes} 0"}


def config(s: Session, cmd: list[bytes]) -> None:
    sub = text(cmd[1])
    if sub == "GET" and len(cmd) >= 3:
        settings = _config(s)
        tests = [compile_glob(p.lower()) for p in cmd[2:]]
        s.answer({k.encode(): v.encode() for k, v in settings.items() if any(t(k.encode()) for t in tests)})
    elif sub == "RESETSTAT" and len(cmd) == 2:
        s.served.commands = s.served.connections_received = s.served.connections_rejected = 0
        s.reply(OK)
    elif sub == "SET" and len(cmd) == 4 and cmd[2].lower() == b"notify-keyspace-events":
        s.served.pubsub.flags = parse_flags(cmd[3].decode("utf-8", "replace"))
        s.reply(OK)
    elif sub == "SET":
        raise RespError("ERR CONFIG SET is not supported by walkv but for notify-keyspace-events: the store's "
                        "settings are `walkv serve` options")
    elif sub in ("GET", "RESETSTAT"):
        raise RespError(f"ERR wrong number of arguments for 'config|{sub.lower()}' command")
    else:
        raise RespError(f"ERR unknown subcommand '{cmd[1].decode('utf-8', 'replace')}'. Try CONFIG HELP.")


def lastsave(s: Session, cmd: list[bytes]) -> None:
    snaps = s.served.store.list_snapshots()
    s.answer(int(os.path.getmtime(snaps[-1].path)) if snaps else int(s.served.started))


def save(s: Session, cmd: list[bytes]) -> None:
    """SAVE: a snapshot of the store (durable before the answer); BGSAVE:
    the same, answered at once."""
    loop = asyncio.get_running_loop()
    done = loop.run_in_executor(None, lambda: s.served.store.snapshot().lsn)
    if text(cmd[0]) == "BGSAVE":
        s.reply(b"+Background saving started\r\n")
    else:
        s.later(done, OK, 0)


def time_(s: Session, cmd: list[bytes]) -> None:
    now = time.time_ns() // 1000
    s.answer([b"%d" % (now // 1_000_000), b"%d" % (now % 1_000_000)])


def wait(s: Session, cmd: list[bytes]) -> None:
    wanted = as_int(cmd[1])
    timeout_ms = as_int(cmd[2], "ERR timeout is not an integer or out of range")
    if timeout_ms < 0:
        raise RespError("ERR timeout is negative")
    if s.must_wait():
        return
    store = s.served.store
    if replicas_holding(store, s.last_lsn) >= wanted or store.replicas is None:
        s.answer(replicas_holding(store, s.last_lsn))
        return
    held = asyncio.ensure_future(wait_for_replicas(store, s.last_lsn, wanted, timeout_ms / 1000 or None))
    s.later(held, lambda done: b":%d\r\n" % done.result(), 0)  # (its result is a count, not an LSN)
