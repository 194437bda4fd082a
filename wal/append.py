"""One entry's way into an open log, compiled: :class:`Appender`.

:meth:`wal.Log.append` is a method of an interpreted class (the fork guard
holds a log weakly, and compiled classes take no weak references), so every
call to it makes a bound method and parses its arguments by keyword: 1.2k
of a non-durable put's 26k instructions (``callgrind``). ``Log.append`` runs
an :class:`Appender`, and a caller that appends in a loop (the store) may
hold the appender's ``append`` instead, a compiled method: the same checks,
the same group commit, the same durability, without that toll.
"""

from __future__ import annotations

from typing import final

from wal.commit import GroupCommit
from wal.crc import BytesLike
from wal.segment import ENTRY_HEADER_SIZE, Payload
from wal.segment_writer import check_payload


@final
class Appender:
    """Appends one entry at a time through ``commit`` (the log's group
    commit), each checked against ``max_record_bytes``."""

    def __init__(self, commit: GroupCommit, max_record_bytes: int) -> None:
        self._commit = commit
        self._max_record_bytes = max_record_bytes
        self._max_payload = max_record_bytes - ENTRY_HEADER_SIZE

    def append(self, payload: Payload | BytesLike, context: object = None) -> int:
        """As :meth:`wal.Log.append`."""
        if type(payload) is not bytes or len(payload) > self._max_payload:
            payload = check_payload(payload, self._max_record_bytes)
        return self._commit.submit([payload], [context])
