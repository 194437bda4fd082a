"""The connection's own commands: PING (in RESP2's subscribed mode too), ECHO, HELLO, AUTH, SELECT, QUIT,
RESET, CLIENT (ID, SETNAME, GETNAME, INFO, LIST, SETINFO).

Authentication: with a tokens file (:class:`kvstore.server.auth.Tokens`, the
HTTP face's), a connection has no role until ``AUTH TOKEN``, ``AUTH default
TOKEN`` or ``HELLO 3 AUTH default TOKEN`` names a known token; then the
token's role (read, write, admin) is what the command table checks. The
token is compared in constant time with every known one.
"""

from __future__ import annotations

import re
from typing import Any, Final

from kvstore.server.auth import OPEN
from kvstore.server.resp.args import text
from kvstore.server.resp.keyview import KeyView
from kvstore.server.resp.replies import OK, RespError, Simple
from kvstore.server.resp.session import Session
from kvstore.server.resp.transactions import select_index

REDIS_VERSION: Final = "7.0.0"
"""The Redis version walkv answers as (HELLO, INFO): the protocol and
commands it speaks are Redis 7.0's."""
WRONGPASS: Final = "WRONGPASS invalid username-password pair or user is disabled."
_NAME: Final = re.compile(rb"[!-~]*")  # printable ASCII, no space


def ping(v: KeyView, cmd: list[bytes]) -> Any:
    if len(cmd) > 2:
        raise RespError("ERR wrong number of arguments for 'ping' command")
    return Simple("PONG") if len(cmd) == 1 else cmd[1]


def run_ping(s: Session, cmd: list[bytes]) -> None:
    """PING [message]; in RESP2's subscribed mode ``["pong", message]``, as Redis answers."""
    if (s.channels or s.patterns) and not s.resp3:
        if len(cmd) > 2:
            raise RespError("ERR wrong number of arguments for 'ping' command")
        s.answer([b"pong", cmd[1] if len(cmd) == 2 else b""])
    else:
        s.answer(ping(s.view, cmd))


def echo(v: KeyView, cmd: list[bytes]) -> Any:
    return cmd[1]


def _login(s: Session, username: bytes, token: bytes) -> None:
    tokens = s.served.tokens
    if tokens is None:
        raise RespError("ERR AUTH <password> called without any password configured for the default user. "
                        "Are you sure your configuration is correct?")
    role = tokens.role_of_token(token.decode("utf-8", "surrogateescape"))
    if username != b"default" or role is None:
        raise RespError(WRONGPASS)
    s.role = role
    s.recheck()


def auth(s: Session, cmd: list[bytes]) -> None:
    if len(cmd) > 3:
        raise RespError("ERR syntax error")
    _login(s, b"default" if len(cmd) == 2 else cmd[1], cmd[-1])
    s.reply(OK)


def hello(s: Session, cmd: list[bytes]) -> None:
    """HELLO [protover [AUTH username password] [SETNAME name]]."""
    proto = 3 if s.resp3 else 2
    i = 1
    if len(cmd) > 1:
        try:
            proto = int(cmd[1])
        except ValueError:
            raise RespError("ERR Protocol version is not an integer or out of range") from None
        if proto not in (2, 3):
            raise RespError("NOPROTO unsupported protocol version")
        i = 2
    name = None
    authed = False
    while i < len(cmd):
        opt = text(cmd[i])
        if opt == "AUTH" and i + 2 < len(cmd):
            _login(s, cmd[i + 1], cmd[i + 2])
            authed = True
            i += 3
        elif opt == "SETNAME" and i + 1 < len(cmd):
            name = _client_name(cmd[i + 1])
            i += 2
        else:
            raise RespError(f"ERR Syntax error in HELLO option '{cmd[i].decode('utf-8', 'replace')}'")
    if s.role == OPEN and not authed:
        raise RespError("NOAUTH HELLO must be called with the client already authenticated, otherwise the "
                        "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
                        "select the RESP protocol version at the same time")
    if name is not None:
        s.name = name or None
    s.resp3 = proto == 3
    s.recheck()
    s.answer({b"server": b"redis", b"version": REDIS_VERSION.encode(), b"proto": proto, b"id": s.id,
              b"mode": b"standalone", b"role": b"replica" if s.served.store.readonly else b"master",
              b"modules": []})


def select(s: Session, cmd: list[bytes]) -> None:
    s.select(select_index(cmd[1]))
    s.reply(OK)


def quit_(s: Session, cmd: list[bytes]) -> None:
    s.reply(OK)
    s.quit()


def reset(s: Session, cmd: list[bytes]) -> None:
    s.multi = None
    s.unwatch()
    s.select(0)
    s.served.pubsub.drop(s)
    s.resp3 = False
    s.name = None
    s.role = s.served.open_role
    s.recheck()
    s.reply(b"+RESET\r\n")


def _client_name(raw: bytes) -> bytes:
    if not _NAME.fullmatch(raw):
        raise RespError("ERR Client names cannot contain spaces, newlines or special characters.")
    return raw


def client(s: Session, cmd: list[bytes]) -> None:
    sub = text(cmd[1])
    n = len(cmd)
    if sub == "ID" and n == 2:
        s.answer(s.id)
    elif sub == "SETNAME" and n == 3:
        s.name = _client_name(cmd[2]) or None
        s.reply(OK)
    elif sub == "GETNAME" and n == 2:
        s.answer(s.name)
    elif sub == "INFO" and n == 2:
        s.answer(s.describe().encode() + b"\n")
    elif sub == "LIST" and n == 2:
        s.answer(b"".join(c.describe().encode() + b"\n" for c in s.served.clients.values()))
    elif sub == "SETINFO" and n == 4 and text(cmd[2]) in ("LIB-NAME", "LIB-VER"):
        if not _NAME.fullmatch(cmd[3]):
            raise RespError(f"ERR {text(cmd[2])} cannot contain spaces, newlines or special characters.")
        s.lib[text(cmd[2]).lower()] = cmd[3]
        s.reply(OK)
    elif sub in ("ID", "SETNAME", "GETNAME", "INFO", "LIST", "SETINFO"):
        raise RespError(f"ERR wrong number of arguments for 'client|{sub.lower()}' command")
    else:
        raise RespError(f"ERR unknown subcommand '{cmd[1].decode('utf-8', 'replace')}'. Try CLIENT HELP.")

