"""The clock a store reads for expiry: the seam a test (or an application
testing its own expiry logic) injects a clock through,
``kvstore.open(path, clock=ManualClock())``.

A clock is any object with ``now_us() -> int``: microseconds since the epoch,
UTC. :class:`SystemClock` is the default; :class:`ManualClock` moves only when
told. The store never reads a clock directly, but through its
:class:`ExpiryClock`, which never runs backwards (see
:mod:`kvstore.store.expiring` for what a clock stepped back does).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Where a store gets the time for expiry."""

    def now_us(self) -> int:
        """Microseconds since the epoch, UTC."""
        ...


class SystemClock:
    """The machine's wall clock (``time.time_ns()``)."""

    def now_us(self) -> int:
        return time.time_ns() // 1000


class ManualClock:
    """A clock that moves only when :meth:`advance` or :meth:`set` says so
    (thread-safe). Starts at ``start_us`` (default: the wall clock now)."""

    def __init__(self, start_us: int | None = None) -> None:
        self._now = time.time_ns() // 1000 if start_us is None else int(start_us)
        self._lock = threading.Lock()

    def now_us(self) -> int:
        return self._now

    def advance(self, seconds: float) -> int:
        """Move forward (or back, with a negative number) by ``seconds``;
        return the new time."""
        with self._lock:
            self._now += round(seconds * 1_000_000)
            return self._now

    def set(self, now_us: int) -> None:
        with self._lock:
            self._now = int(now_us)


class ExpiryClock:
    """``clock`` as a store reads it: the largest reading so far, so that
    time for expiry never goes backwards in a process (a key once expired
    stays absent)."""

    __slots__ = ("clock", "_high")

    def __init__(self, clock: Clock, floor_us: int = 0) -> None:
        self.clock = clock
        self._high = floor_us

    def now_us(self) -> int:
        t = self.clock.now_us()
        if t > self._high:
            self._high = t
            return t
        return self._high


def seconds_to_us(seconds: object, what: str) -> int:
    """A positive, finite number of seconds as whole microseconds (at least 1):
    TypeError for what is not a number (``"5"``), ValueError for a number
    that is not positive and finite."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds (int or float), not {type(seconds).__name__} "
                        f"{seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {seconds!r}")
    return max(1, round(seconds * 1_000_000))
