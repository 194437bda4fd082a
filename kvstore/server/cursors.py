"""Where recent log answers ended, so that a follower's next request costs
the new bytes only (:mod:`kvstore.server.log`).

A follower asks for exactly the LSN after the last one it got. Finding an
LSN in a segment without a sparse index (the active segment has none until
it is sealed) means a CRC-checked scan from the segment's start: O(segment)
per poll. So the server keeps, for the few most recent answers:

* ``/v1/log/entries``: the open :class:`~kvstore.watch.log_tail.LogTail`
  positioned at the answer's ``next_lsn`` (taken out while a request reads
  it: a tail has one reader at a time);
* ``/v1/log/segment``: the segment and the offset just after the answer's
  last record, where the record of its next LSN starts.

Both are bounded (:data:`KEPT` each, least recently used dropped, a dropped
tail closed) and only ever a shortcut: a miss scans as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kvstore.watch.log_tail import LogTail

KEPT = 32


class LogCursors:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tails: OrderedDict[int, LogTail] = OrderedDict()
        self._ends: OrderedDict[int, tuple[str, int]] = OrderedDict()

    def take_tail(self, lsn: int) -> LogTail | None:
        """A tail positioned at ``lsn``, now the caller's (or None)."""
        with self._lock:
            return self._tails.pop(lsn, None)

    def give_tail(self, tail: LogTail) -> None:
        """Keep ``tail`` for a request at its ``next_lsn``."""
        with self._lock:
            old = self._tails.pop(tail.next_lsn, None)
            self._tails[tail.next_lsn] = tail
            dropped = [self._tails.popitem(last=False)[1] for _ in range(len(self._tails) - KEPT)]
        for t in [old, *dropped]:
            if t is not None and t is not tail:
                t.close()

    def end(self, lsn: int) -> tuple[str, int] | None:
        """(segment path, offset) where the record of ``lsn`` starts, if known."""
        with self._lock:
            return self._ends.get(lsn)

    def remember_end(self, lsn: int, path: str, offset: int) -> None:
        with self._lock:
            self._ends[lsn] = (path, offset)
            self._ends.move_to_end(lsn)
            while len(self._ends) > KEPT:
                self._ends.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            tails = list(self._tails.values())
            self._tails.clear()
            self._ends.clear()
        for t in tails:
            t.close()
