"""Reading a command's arguments as Redis reads them: integers and floats
in Redis's strict text forms, and the errors Redis answers for bad ones."""

from __future__ import annotations

import math
import re
from typing import Final

from kvstore.server.resp.replies import RespError

I64_MIN: Final = -(1 << 63)
I64_MAX: Final = (1 << 63) - 1
_INT: Final = re.compile(rb"0|-?[1-9][0-9]{0,18}")
_FLOAT: Final = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?inf(?:inity)?", re.I)

NOT_INTEGER: Final = "ERR value is not an integer or out of range"
NOT_FLOAT: Final = "ERR value is not a valid float"
SYNTAX: Final = "ERR syntax error"


def as_int(raw: bytes | None, message: str = NOT_INTEGER) -> int:
    """``raw`` as a signed 64-bit integer in Redis's form (no sign but ``-``,
    no leading zero, no space), else RespError(``message``)."""
    if raw is None or not _INT.fullmatch(raw):
        raise RespError(message)
    n = int(raw)
    if not I64_MIN <= n <= I64_MAX:
        raise RespError(message)
    return n


def as_float(raw: bytes | None, message: str = NOT_FLOAT) -> float:
    """``raw`` as a float (what INCRBYFLOAT reads), else RespError."""
    if raw is None or not _FLOAT.fullmatch(raw):
        raise RespError(message)
    value = float(raw)
    if math.isnan(value):
        raise RespError(message)
    return value


def text(raw: bytes) -> str:
    """An option or subcommand name, upper-cased (unknown bytes become U+FFFD)."""
    return raw.decode("utf-8", "replace").upper()

