"""A store's ``put`` and ``get``, compiled: :class:`PutPath` and :class:`GetPath`.

:class:`kvstore.KVStore` is an interpreted class (the fork guard holds a store
weakly, and compiled classes take no weak references), so each call of one of
its methods runs an interpreted frame before it reaches compiled code: about
600 instructions, an eighth of a get and a twentieth of a non-durable put
(``callgrind``). A store binds its ``put`` (when it writes) and ``get`` to
these instead, whose compiled methods call on in C. They do what the
methods of the same name do; those methods stay the reference, and what
runs where these are not bound (a read-only store's put, a subclass that
overrides one). Only a call with the wrong arguments reads differently
(mypyc words it).

A caller may hold ``db.get`` or ``db.put`` for as long as the store is open
(``get = db.get`` before a loop is common). ``get`` looks the state's
current get up at each call. ``put`` holds the log's appender, which refuses
as the store would: a closed log raises :class:`~wal.errors.ClosedError`, a
forked child's :class:`~wal.errors.ForkedError` (naming the log, where the
store's method names the store; ``tests/test_fork.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from kvstore.entry.codec import put_entry
from kvstore.state.machine import State
from wal.append import Appender


@final
class PutPath:
    """``put`` for a store that writes through ``appender``: a put without
    a ``ttl`` or ``lease`` is built here and appended; one with either goes
    to ``put_expiring(key, value, ttl, lease)``."""

    def __init__(self, appender: Appender, max_value_bytes: int,
                 put_expiring: Callable[[object, object, object, object], int]) -> None:
        self._appender = appender
        self._max_value_bytes = max_value_bytes
        self._put_expiring = put_expiring

    def put(self, key: object, value: object, ttl: object = None, lease: object = None) -> int:
        """As :meth:`kvstore.KVStore.put`."""
        if ttl is None and lease is None:
            payload, ops = put_entry(key, value, self._max_value_bytes)
            return self._appender.append(payload, ops)
        return self._put_expiring(key, value, ttl, lease)


@final
class GetPath:
    """``get`` for a store whose reads ``state`` serves. The state's ``get``
    changes as the overlay fills and empties and keys gain expiries
    (:mod:`kvstore.state.machine`): it is read at each call."""

    def __init__(self, state: State) -> None:
        self._state = state

    def get(self, key: object, default: bytes | None = None) -> bytes | None:
        """As :meth:`kvstore.KVStore.get`."""
        return self._state.get(key, default)
