"""The mutex of the write path: :class:`Mutex`, and :func:`condition` over it.

A non-durable put takes three mutexes that nobody else holds: the group
commit's twice (take the LSNs, then acknowledge) and the overlay's once.
CPython's ``threading.Lock`` parses ``acquire``'s arguments by keyword on
every call, and compiled code reaches it through a method call: together
about a tenth of such a put. mypyc's runtime library (``librt``, which mypy
itself depends on) ships a lock whose ``acquire`` and ``release`` compiled
code calls as plain C functions; interpreted code calls it as any lock.

It keeps what the write path relies on from ``threading.Lock``: it is not
reentrant; it may be released by a thread other than the one that acquired
it (the group commit's leader releases its waiters' locks); a blocked
``acquire`` lets go of the GIL; on Linux it is a POSIX semaphore, as
CPython's own lock is. It has no ``acquire(timeout=...)``: a timed wait is a
:func:`condition`'s ``wait(timeout)``, which waits on a lock of its own.
"""

from __future__ import annotations

import threading

from librt.threading import Lock as Mutex

__all__ = ["Mutex", "condition"]


def condition(mutex: Mutex) -> threading.Condition:
    """A condition variable over ``mutex``. (``threading.Condition`` works
    with any lock that has ``acquire(blocking)`` and ``release()``; its type
    stub names only the standard library's.)"""
    return threading.Condition(mutex)  # type: ignore[arg-type]
