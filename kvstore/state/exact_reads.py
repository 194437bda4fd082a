"""Reads that say exactly which LSN they read at (:func:`read_at_lsn`).

A server answers a read with an LSN (``Walkv-Lsn``): a client uses it as a
read token, and a history checker compares the value with the log's at that
LSN. Reading ``applied_lsn`` and then the value is not enough: a group
applied between the two (the applying thread runs whenever the reader lets
go of the GIL) gives a value newer than the LSN sent with it, which reads as
a value from another history (a cluster fault test under load found
exactly that: a replica's read "from a forked history" that was only a
newer one).

So the state keeps two LSNs, as a seqlock keeps its counter:

* ``applying_lsn``: raised by the applying thread to a group's last LSN
  just before any of its writes can be seen (before they go into the
  overlay's dictionary; in the write transaction, before the commit that
  makes them visible in LMDB);
* ``applied_lsn``: raised to the same LSN once all of them can be.

Between groups the two are equal; a failed apply sets ``applying_lsn`` back
(a failed commit made nothing visible). A read that took ``applied_lsn``
before it ran, and finds ``applying_lsn`` equal to it after, saw the state
exactly as of that LSN: a write of a later group that it could have seen
would have raised ``applying_lsn`` first. Otherwise it runs again, after
letting go of the GIL (the applying thread is between those two lines, in
a dictionary assignment or an LMDB commit, and needs the GIL to finish).

A read-only open has no applying thread in this process: the writer's
applied LSN in LMDB, read before and after, takes both parts (LMDB commits
values and that LSN in one transaction).

The flush of the overlay to LMDB changes no value a read sees, so it
raises neither. A key's expiry is decided by the clock, not by an LSN: a
read at LSN N of a key that expired meanwhile answers it absent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

from wal.errors import WalkvError

T = TypeVar("T")

SPINS: Final = 1000
"""Tries that only let go of the GIL (``sleep(0)``) before they sleep."""
PAUSE: Final = 0.001
"""How long a try after :data:`SPINS` sleeps."""
MAX_SECONDS: Final = 10.0
"""How long a read goes on trying before it gives up: far longer than a
commit takes; reached only if the applying thread is stuck between the two
LSNs."""


def read_at_lsn(read: Callable[[], T], applied: Callable[[], int], applying: Callable[[], int],
                path: str) -> tuple[T, int]:
    """``(read(), lsn)``: the result of ``read`` (a read of one state: a
    get, a ttl) and the applied LSN it read at, exactly (module docstring).
    ``applied()`` and ``applying()`` read the state's two LSNs. A read that
    finds the state changing for :data:`MAX_SECONDS` raises
    :class:`~wal.errors.WalkvError` (a bug: the applying thread is stuck)."""
    deadline = 0.0
    tries = 0
    while True:
        lsn = applied()
        result = read()
        if applying() == lsn:
            return result, lsn
        tries += 1
        if tries <= SPINS:
            time.sleep(0)
            continue
        now = time.monotonic()
        if not deadline:
            deadline = now + MAX_SECONDS
        elif now > deadline:
            raise WalkvError(f"a read of the state at {path} found writes past LSN {lsn} being applied for "
                             f"{MAX_SECONDS:.0f} s: the applying thread is stuck; this is a bug, please report it")
        time.sleep(PAUSE)
