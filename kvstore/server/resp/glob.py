"""Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET), as byte regexes.

``*`` any run of bytes, ``?`` one byte, ``[abc]``, ``[a-z]`` and ``[^a]``
a class, ``\\x`` the byte x itself; a ``[`` that is never closed matches
itself. :func:`literal_prefix` is the part before the first wildcard, where
a scan of the sorted keys can start.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Match = Callable[[bytes], bool]


def compile_glob(pattern: bytes) -> Match:
    """A test of whether a key matches ``pattern``."""
    if pattern == b"*":
        return lambda key: True
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i:i + 1]
        if c == b"*":
            out.append(b".*")
        elif c == b"?":
            out.append(b".")
        elif c == b"\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i:i + 1]))
        elif c == b"[":
            end = _class_end(pattern, i)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append(_class(pattern[i + 1:end]))
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    try:
        regex = re.compile(b"".join(out), re.DOTALL)
    except re.error:  # a class no regex can say: the pattern stands for itself
        return lambda key: key == pattern
    return lambda key: regex.fullmatch(key) is not None


def _class_end(pattern: bytes, start: int) -> int:
    i = start + 1
    if pattern[i:i + 1] == b"^":
        i += 1
    while i < len(pattern):
        if pattern[i:i + 1] == b"\\":
            i += 2
            continue
        if pattern[i:i + 1] == b"]" and i > start + 1:
            return i
        i += 1
    return -1


def _class(body: bytes) -> bytes:
    negate = body.startswith(b"^")
    if negate:
        body = body[1:]
    parts = []
    i = 0
    while i < len(body):
        if body[i:i + 1] == b"\\" and i + 1 < len(body):
            i += 1
        if i + 2 < len(body) and body[i + 1:i + 2] == b"-":
            lo, hi = sorted((body[i], body[i + 2]))
            parts.append(re.escape(bytes((lo,))) + b"-" + re.escape(bytes((hi,))))
            i += 3
            continue
        parts.append(re.escape(body[i:i + 1]))
        i += 1
    return b"[" + (b"^" if negate else b"") + b"".join(parts) + b"]"


def literal_prefix(pattern: bytes) -> bytes:
    """The bytes every matching key starts with (up to the first wildcard)."""
    out = bytearray()
    i = 0
    while i < len(pattern):
        c = pattern[i:i + 1]
        if c in (b"*", b"?", b"["):
            break
        if c == b"\\":
            if i + 1 >= len(pattern):
                break
            i += 1
        out += pattern[i:i + 1]
        i += 1
    return bytes(out)
