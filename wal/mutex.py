"""The mutex of the write path: :class:`Mutex`, and :func:`condition` over it.

A non-durable put takes three mutexes that nobody else holds: the group
commit's twice (take the LSNs, then acknowledge) and the overlay's once.
CPython's ``threading.Lock`` parses ``acquire``'s arguments by keyword on
every call, and compiled code reaches it through a method call: together
about a tenth of such a put (``callgrind``). mypyc's runtime library
(``librt``, which mypy itself depends on) ships a lock whose ``acquire`` and
``release`` compiled code calls as plain C functions, ``with`` included;
interpreted code calls it as any lock.

It keeps what the write path relies on from ``threading.Lock``
(``tests/test_mutex.py``): it is not reentrant; it may be released by a
thread other than the one that acquired it (the group commit's leader
releases its waiters' locks, and no two threads ever release one lock
at once, which librt leaves undefined); a blocked ``acquire`` lets go of
the GIL. It has no ``acquire(timeout=...)``: a timed wait is a :func:`condition`'s
``wait(timeout)``, which waits on a lock of its own.

Without librt (PyPy, where mypy does not use it either, and nothing is
compiled) the interpreted modules take ``threading.Lock``: the same
behaviour. A compiled build depends on librt.
"""

from __future__ import annotations

import threading

try:
    from librt.threading import Lock as Mutex
except ImportError:  # no librt: nothing runs compiled either (see above)
    from threading import Lock as Mutex  # type: ignore[assignment]

__all__ = ["Mutex", "condition"]


def condition(mutex: Mutex) -> threading.Condition:
    """A condition variable over ``mutex``. ``threading.Condition`` takes any
    lock with ``acquire(blocking)`` and ``release()``: lacking the private
    ``_release_save`` and ``_is_owned``, it uses those two, exactly as it does
    for ``threading.Lock``, which lacks them too. librt's authors do not
    promise this pairing (python/mypy#21690: "just a lock"), so
    ``tests/test_mutex.py`` holds it: waits, time-outs, wake-ups, and a
    notify without the mutex refused. (The type stub names only the standard
    library's locks.)"""
    return threading.Condition(mutex)  # type: ignore[arg-type]
