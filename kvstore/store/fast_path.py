"""A store's one write path and its get, compiled: :class:`WritePath` and :class:`GetPath`.

Every write of a store (its puts, deletes, batches, transactions, keyspaces'
writes, grants, revokes, sweeps) is one log entry appended through
:meth:`WritePath.append`, and that is where a write is refused too: a store
opened with ``readonly=True`` has no log to append to, and a store that was
closed or that a forked child inherited lets go of its log's appender
(:meth:`WritePath.close`), so that from then on every write, through any
handle a caller still holds, raises the error the store words
(:class:`~wal.errors.ClosedError`, :class:`~wal.errors.ForkedError`,
:class:`~wal.errors.ReadOnlyError`; ``tests/test_fork.py``).

Why compiled, and why a store binds ``put`` and ``get`` to these per
instance: :class:`kvstore.KVStore` is an interpreted class (the fork guard
holds a store weakly, and compiled classes take no weak references), so each
call of one of its methods runs an interpreted frame before it reaches
compiled code: about 600 instructions, an eighth of a get and a twentieth of
a non-durable put (``callgrind``). So a store's ``put`` and ``get`` are these
methods, bound at open (``docs/architecture.md``, "The path of a put"); the
methods of the same name on :class:`~kvstore.KVStore` call the same ones,
and run where nothing is bound (a subclass that overrides one). Only a call
with the wrong arguments reads differently (mypyc words it).

A caller may hold ``db.get`` or ``db.put`` for as long as it likes (``get =
db.get`` before a loop is common). ``get`` looks the state's current get up
at each call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from kvstore.entry.codec import put_entry
from kvstore.state.machine import State
from wal.append import Appender
from wal.segment import Payload


@final
class WritePath:
    """The one way a store's writes reach its log (module docstring): the
    log's ``appender`` while the store writes; None when it never does
    (read-only) or no longer may (:meth:`close`), and then each write raises
    ``refusal()``, the store's error. A put without a ``ttl`` or ``lease`` is
    built here; one with either goes to ``put_expiring(key, value, ttl,
    lease)`` (:class:`kvstore.store.expiring.Expiring`), which appends here."""

    def __init__(self, appender: Appender | None, max_value_bytes: int,
                 put_expiring: Callable[[object, object, object, object], int],
                 refusal: Callable[[], Exception]) -> None:
        self._appender = appender
        self._max_value_bytes = max_value_bytes
        self._put_expiring = put_expiring
        self._refusal = refusal

    @property
    def writes(self) -> bool:
        """Whether a write may be appended now."""
        return self._appender is not None

    def append(self, payload: Payload, ops: object) -> int:
        """Log one entry (``ops``: its operations, or the context a
        conditional write is decided by); its LSN, once it is durable per the
        sync mode and applied (:meth:`wal.Log.append`)."""
        appender = self._appender
        if appender is None:
            raise self._refusal()
        return appender.append(payload, ops)

    def check(self) -> None:
        """Raise now what :meth:`append` would raise (before a batch or a
        transaction is handed out)."""
        if self._appender is None:
            raise self._refusal()

    def put(self, key: object, value: object, ttl: object = None, lease: object = None) -> int:
        """As :meth:`kvstore.KVStore.put`."""
        if ttl is None and lease is None:
            payload, ops = put_entry(key, value, self._max_value_bytes)
            return self.append(payload, ops)
        return self._put_expiring(key, value, ttl, lease)

    def close(self) -> None:
        """From now on every write raises ``refusal()`` (the store closed, or
        this process is a forked child of the one that opened it)."""
        self._appender = None


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
