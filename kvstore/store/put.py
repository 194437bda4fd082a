"""A writable store's ``put``, compiled: :class:`PutPath`.

:meth:`kvstore.KVStore.put` is a method of an interpreted class (the fork
guard holds a store weakly, and compiled classes take no weak references):
each call runs an interpreted frame, then calls the entry builder and the
log's appender through Python's call protocol. A writable store binds
``put`` to a :class:`PutPath` instead, whose compiled ``put`` calls both in
C: the same checks, the same entry, the same log and durability.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from kvstore.entry.codec import put_entry
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
