"""The pub/sub commands: SUBSCRIBE, PSUBSCRIBE, UNSUBSCRIBE, PUNSUBSCRIBE,
PUBLISH, PUBSUB (CHANNELS, NUMSUB, NUMPAT), as Redis answers them
(:mod:`kvstore.server.resp.pubsub` holds the subscriptions).

A RESP2 connection with a subscription is in Redis's subscribed mode: it
may only (un)subscribe, PING (answered ``["pong", message]``), QUIT or
RESET (the connection checks it). A RESP3 connection runs any command, the
messages arriving as push frames between its answers. PUBLISH's messages
are not stored, nor sent to other walkv servers: they reach who is
subscribed here and now, as in Redis.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.server.resp.args import text
from kvstore.server.resp.glob import compile_glob
from kvstore.server.resp.pubsub import confirmation
from kvstore.server.resp.replies import RespError
from kvstore.server.resp.session import Session


def _count(s: Session) -> int:
    return len(s.channels) + len(s.patterns)


def subscribe(s: Session, cmd: list[bytes]) -> None:
    _add(s, cmd, b"subscribe", s.served.pubsub.subscribe)


def psubscribe(s: Session, cmd: list[bytes]) -> None:
    _add(s, cmd, b"psubscribe", s.served.pubsub.psubscribe)


def unsubscribe(s: Session, cmd: list[bytes]) -> None:
    """UNSUBSCRIBE [channel...] (none: every channel of the connection)."""
    _remove(s, cmd, b"unsubscribe", s.served.pubsub.unsubscribe, s.channels)


def punsubscribe(s: Session, cmd: list[bytes]) -> None:
    """PUNSUBSCRIBE [pattern...] (none: every pattern of the connection)."""
    _remove(s, cmd, b"punsubscribe", s.served.pubsub.punsubscribe, s.patterns)


def _add(s: Session, cmd: list[bytes], kind: bytes, add: Callable[[Session, bytes], None]) -> None:
    out = []
    for name in cmd[1:]:
        add(s, name)
        out.append(confirmation(kind, name, _count(s), s.resp3))
    s.recheck()
    s.reply(b"".join(out))


def _remove(s: Session, cmd: list[bytes], kind: bytes, remove: Callable[[Session, bytes], bool],
            current: dict[bytes, None]) -> None:
    out = []
    for name in cmd[1:] or list(current):
        remove(s, name)
        out.append(confirmation(kind, name, _count(s), s.resp3))
    if not out:
        out.append(confirmation(kind, None, _count(s), s.resp3))
    s.recheck()
    s.reply(b"".join(out))


def publish(s: Session, cmd: list[bytes]) -> None:
    s.answer(s.served.pubsub.publish(cmd[1], cmd[2]))


def pubsub(s: Session, cmd: list[bytes]) -> None:
    """PUBSUB CHANNELS [pattern] | NUMSUB [channel...] | NUMPAT."""
    sub, n = text(cmd[1]), len(cmd)
    hub = s.served.pubsub
    if sub == "CHANNELS" and n <= 3:
        match = compile_glob(cmd[2]) if n == 3 else None
        s.answer([c for c in hub.channels if match is None or match(c)])
    elif sub == "NUMSUB":
        s.answer([x for c in cmd[2:] for x in (c, len(hub.channels.get(c, ())))])
    elif sub == "NUMPAT" and n == 2:
        s.answer(len(hub.patterns))
    elif sub in ("CHANNELS", "NUMPAT"):
        raise RespError(f"ERR wrong number of arguments for 'pubsub|{sub.lower()}' command")
    else:
        raise RespError(f"ERR unknown subcommand '{cmd[1].decode('utf-8', 'replace')}'. Try PUBSUB HELP.")
