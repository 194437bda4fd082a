"""What a batch's keys, range bounds, values and keyspace names may be, and the
checks every write path runs on its arguments before anything is logged (a bad
argument is a ``TypeError``, a ``ValueError`` or a
:class:`~wal.errors.RecordTooLargeError`, and nothing is written). Where they
stand in an entry: :mod:`kvstore.entry.codec`, whose decoder holds a logged
batch to the same limits.

The limits, and the reason for each:

* A key is 1..511 bytes: LMDB cannot store an empty key, and 511 bytes is its
  default maximum key size (``mdb_env_get_maxkeysize``).
* A range bound is 0..512 bytes: a bound is never stored, and
  ``b"\\xff" * 512`` (:data:`END_OF_KEYS`) sorts after every possible key, which
  is how "to the end" is written.
* A value is bounded by the store's value limit, itself bounded by the log's
  maximum record size.
* A keyspace name is text, chosen by the program, never data: 1..64
  characters of ``[A-Za-z0-9_.-]``, not starting with ``__`` (reserved), or
  ``""`` for the default keyspace.
* Keys, values and bounds are bytes-like, never ``str``: text must be encoded
  by the caller, so no codec is ever guessed on replay.
"""

from __future__ import annotations

from typing import Final

from wal.errors import RecordTooLargeError

MAX_KEY_BYTES: Final = 511
"""LMDB's default maximum key size (``mdb_env_get_maxkeysize``)."""
MAX_BOUND_BYTES: Final = MAX_KEY_BYTES + 1
"""Range bounds may be one byte longer than a key, see :data:`END_OF_KEYS`."""
END_OF_KEYS: Final = b"\xff" * MAX_BOUND_BYTES
"""A range end that sorts after every key (keys are at most 511 bytes)."""

DEFAULT_KEYSPACE: Final = ""
MAX_KEYSPACE_NAME: Final = 64
_KEYSPACE_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _type_error(what: str, obj: object) -> TypeError:
    hint = " (encode text first, e.g. s.encode())" if isinstance(obj, str) else ""
    return TypeError(f"{what} must be bytes, not {type(obj).__name__}{hint}")

def as_bytes(obj: object, what: str) -> bytes:
    """``obj`` as ``bytes``: bytes as is, bytearray and memoryview copied,
    anything else a TypeError that says so."""
    if type(obj) is bytes:
        return obj
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if isinstance(obj, memoryview):
        return obj.tobytes()
    raise _type_error(what, obj)


def check_key(key: object) -> bytes:
    """Validate a key: bytes-like, 1..511 bytes. Returns it as ``bytes``."""
    if type(key) is not bytes:
        key = as_bytes(key, "key")
    n = len(key)
    if 0 < n <= MAX_KEY_BYTES:
        return key
    if n == 0:
        raise ValueError("key must not be empty (LMDB cannot store an empty key)")
    raise RecordTooLargeError(
        f"key is {n} bytes; the limit is {MAX_KEY_BYTES} bytes "
        f"(LMDB's default maximum key size). Nothing was written."
    )


def keyspace_problem(name: object) -> str | None:
    """Why ``name`` cannot name a keyspace, or None (``""``, the default
    keyspace, is fine: callers that refuse it say so)."""
    if type(name) is not str:
        return f"a keyspace name is a str, not {type(name).__name__}"
    if name == DEFAULT_KEYSPACE:
        return None
    if len(name) > MAX_KEYSPACE_NAME:
        return f"a keyspace name has at most {MAX_KEYSPACE_NAME} characters, not {len(name)}"
    if not _KEYSPACE_CHARS.issuperset(name):
        return f"a keyspace name holds only A-Z a-z 0-9 _ . - (got {name!r:.80})"
    if name.startswith("__"):
        return f"keyspace names starting with '__' are reserved (got {name!r})"
    return None


def check_keyspace(name: object, *, default_ok: bool = True) -> str:
    """Validate a keyspace name (module docstring); returns it. A name that
    is not a str is a TypeError, a bad one a ValueError."""
    why = keyspace_problem(name)
    if why is None and (default_ok or name != DEFAULT_KEYSPACE):
        return name  # type: ignore[return-value]  # a str: keyspace_problem checked it
    if type(name) is not str:
        raise TypeError(why)
    raise ValueError(why or "the default keyspace cannot be dropped (drop a named keyspace, "
                            "or delete_range(None, None) to empty the default one)")


def check_value(value: object, limit: int) -> bytes:
    """Validate a value: bytes-like, at most ``limit`` bytes."""
    if type(value) is not bytes:
        value = as_bytes(value, "value")
    if len(value) > limit:
        raise RecordTooLargeError(
            f"value is {len(value)} bytes; the limit is {limit} bytes "
            f"(option max_value_bytes, bounded by the log's max_record_bytes). "
            f"Nothing was written."
        )
    return value


def check_bound(bound: object, what: str) -> bytes:
    """Validate a range bound: bytes-like, 0..512 bytes."""
    if type(bound) is not bytes:
        bound = as_bytes(bound, what)
    if len(bound) > MAX_BOUND_BYTES:
        raise ValueError(
            f"{what} is {len(bound)} bytes; range bounds are at most "
            f"{MAX_BOUND_BYTES} bytes (keys are at most {MAX_KEY_BYTES})"
        )
    return bound


def check_range(start: object, end: object) -> tuple[bytes, bytes]:
    """Validate the bounds of a delete_range (``None``: unbounded); an
    inverted range (start >= end) is empty, and deletes nothing."""
    start = b"" if start is None else check_bound(start, "start")
    end = END_OF_KEYS if end is None else check_bound(end, "end")
    return start, end
