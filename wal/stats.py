"""A log's counters and fsync latencies, for :meth:`wal.Log.stats`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class LogStats:
    """Counted by the leader that writes each group (one at a time), read
    under the log's mutex."""

    __slots__ = ("_fsync_times", "appends", "bytes", "fsyncs", "groups", "max_group", "rolls")

    def __init__(self) -> None:
        self.appends = self.bytes = self.groups = self.max_group = self.fsyncs = self.rolls = 0
        self._fsync_times: deque[float] = deque(maxlen=4096)

    def group(self, entries: int, nbytes: int) -> None:
        """One group of ``entries`` entries, ``nbytes`` bytes framed, was written."""
        self.bytes += nbytes
        self.groups += 1
        self.appends += entries
        self.max_group = max(self.max_group, entries)

    def timed(self, sync: Callable[[], None]) -> None:
        """Run one fsync, counting it and its latency."""
        t0 = time.perf_counter()
        sync()
        self._fsync_times.append(time.perf_counter() - t0)
        self.fsyncs += 1

    def report(self) -> dict[str, float | int | str]:
        """The counters, the average group and the fsync latency p50/p99 (ms,
        over the last 4096)."""
        times = sorted(self._fsync_times)
        return {
            "appends": self.appends, "bytes": self.bytes, "groups": self.groups, "fsyncs": self.fsyncs,
            "max_group": self.max_group, "rolls": self.rolls,
            "avg_group": self.appends / self.groups if self.groups else 0.0,
            "fsync_p50_ms": times[len(times) // 2] * 1e3 if times else 0.0,
            "fsync_p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3 if times else 0.0,
        }
