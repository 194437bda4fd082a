"""RESP replies: what a command answers, encoded for RESP2 or RESP3.

A command answers a Python value and :func:`encode` writes it in the
connection's protocol (``HELLO 3`` switches to RESP3):

========================  =====================  ======================
value                     RESP2                  RESP3
========================  =====================  ======================
``bytes``                 bulk string ``$``      bulk string ``$``
``int`` (not bool)        integer ``:``          integer ``:``
``None``                  null bulk ``$-1``      null ``_``
:class:`Simple`           simple string ``+``    simple string ``+``
:class:`RespError`        error ``-``            error ``-``
``list``, ``tuple``       array ``*``            array ``*``
``dict``                  flat array             map ``%``
:data:`NULL_ARRAY`        null array ``*-1``     null ``_``
========================  =====================  ======================

A bulk string is binary-safe; a simple string or an error is one line (a
CR or LF in one is replaced by a space, so no answer can forge another).
"""

from __future__ import annotations

from typing import Any, Final


class Simple(str):
    """A status reply (``+OK``)."""

    __slots__ = ()


class RespError(Exception):
    """A command's error reply: ``-CODE message`` (the message's first word
    is the code Redis clients tell errors apart by: ERR, WRONGTYPE,
    NOAUTH, NOPERM, WRONGPASS, EXECABORT, READONLY, NOPROTO)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY: Final = _NullArray()
"""A null array: EXEC aborted by WATCH, in RESP2 ``*-1``."""

OK: Final = b"+OK\r\n"
NULL2: Final = b"$-1\r\n"
NULL3: Final = b"_\r\n"


def bulk_or_null(value: bytes | None, resp3: bool) -> bytes:
    """A bulk string, or the null of the protocol (GET's answer)."""
    if value is None:
        return NULL3 if resp3 else NULL2
    return b"$%d\r\n%b\r\n" % (len(value), value)


def line(text: str) -> str:
    """``text`` as one line of a simple string or an error."""
    return text.replace("\r", " ").replace("\n", " ")


def error(message: str) -> bytes:
    """An error reply, ``-message``."""
    return b"-" + line(message).encode("utf-8", "replace") + b"\r\n"


def encode(value: Any, resp3: bool) -> bytes:
    """``value`` as a reply (module docstring's table)."""
    out: list[bytes] = []
    _encode(value, resp3, out)
    return b"".join(out)


def _encode(value: Any, resp3: bool, out: list[bytes]) -> None:
    t = type(value)
    if t is bytes:
        out.append(b"$%d\r\n%b\r\n" % (len(value), value))
    elif t is int:
        out.append(b":%d\r\n" % value)
    elif value is None:
        out.append(NULL3 if resp3 else NULL2)
    elif t is Simple:
        out.append(b"+" + line(value).encode("utf-8", "replace") + b"\r\n")
    elif t is list or t is tuple:
        out.append(b"*%d\r\n" % len(value))
        for item in value:
            _encode(item, resp3, out)
    elif t is dict:
        out.append((b"%%%d\r\n" if resp3 else b"*%d\r\n") % (len(value) if resp3 else 2 * len(value)))
        for k, v in value.items():
            _encode(k, resp3, out)
            _encode(v, resp3, out)
    elif isinstance(value, RespError):
        out.append(error(value.message))
    elif value is NULL_ARRAY:
        out.append(NULL3 if resp3 else b"*-1\r\n")
    else:
        raise TypeError(f"no RESP encoding for {t.__name__}")
