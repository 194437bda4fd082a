"""Refusing use across ``fork()``: what a forked child does with its parent's
open logs, stores and LMDB environments.

A child made by ``os.fork()`` (or ``multiprocessing`` with the fork start
method, Linux's default) inherits every open object of its parent: the log's
file descriptors and LSN counter, LMDB's map and reader slots, the lock files'
descriptors. Were the child to append, it would hand out the same LSNs as the
parent and overwrite the same bytes of the active segment: both would
acknowledge writes, and one of them would be lost. So every open
:class:`wal.Log`, :class:`wal.lock.DirectoryLock` and store object registers
itself here (a weak reference, at open; a compiled part, which takes no weak
reference, through the object that owns it), and one ``os.register_at_fork``
hook, run in the child right after the fork, tells each of them
(``_after_fork_in_child()``):

* a log or store refuses every later use with :class:`ForkedError` (which
  says to open the store again in the child, ``readonly=True`` beside the
  parent's writer), and its ``close()`` becomes a no-op that touches no file;
* an LMDB environment refuses reads and writes alike (LMDB forbids using an
  environment across fork), and is kept alive for the rest of the child's
  life (:func:`keep_forever`): py-lmdb closes an environment whenever its
  object is freed, even in a forked child, and that close would end the
  parent's read transactions in the reader table the two processes share.
  py-lmdb also refuses to open an environment again in a process that has
  it open, which a forked child does: the child opens the store only if it
  did not inherit it open (:func:`inherited_from`);
* a lock closes the child's inherited copy of its descriptor, so the child
  neither holds the parent's lock after the parent lets go of it nor can
  release it (with ``flock`` an unlock through an inherited descriptor would
  release the parent's lock).

Nothing is checked on the hot path: no ``getpid()`` per put or get. Threads
do not survive a fork, so nothing here takes a lock another thread may have
held at the moment of the fork.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import NoReturn, Protocol

from wal.errors import ForkedError

__all__ = ["ForkedError", "Refusing", "forked_error", "inherited_from", "keep_forever", "track"]


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


_open: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_parts: weakref.WeakKeyDictionary[object, list[ForkAware]] = weakref.WeakKeyDictionary()
_inherited: dict[str, int] = {}  # in a forked child: path -> pid of the process that had it open


def track(obj: ForkAware, owner: object = None) -> None:
    """Call ``obj._after_fork_in_child()`` in every child forked while
    ``obj`` is alive; or, given its ``owner``, while the owner is alive
    (for a compiled object, which takes no weak reference: its owner holds
    it, and is held weakly here instead)."""
    if owner is None:
        _open.add(obj)
    else:
        _parts.setdefault(owner, []).append(obj)


def keep_forever(obj: object, path: str, owner_pid: int) -> None:
    """In a forked child: never free ``obj`` (the parent's object for the
    files at ``path``), and remember that this process inherited ``path``
    open from ``owner_pid``. A deliberate leak of one reference."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    _inherited[path] = owner_pid


def inherited_from(path: str) -> int | None:
    """The pid of the process this one was forked from while it had the
    files at ``path`` open (which therefore cannot be opened again here),
    or None."""
    return _inherited.get(path)


def forked_error(what: str, owner_pid: int) -> ForkedError:
    """The error a forked child gets for using ``what`` (opened by process
    ``owner_pid``)."""
    return ForkedError(
        f"{what} was opened by process {owner_pid}, and this process ({os.getpid()}) is a fork "
        f"of it (os.fork or multiprocessing's fork start method): a child must not use its "
        f"parent's open store, log or LMDB environment. Open the store in the child instead, "
        f"with readonly=True to read beside the parent's writer, in a child that did not "
        f"inherit it open (multiprocessing's 'spawn' or 'forkserver' start method, or fork "
        f"before opening the store).")


class Refusing:
    """Stands in a forked child for a part of an object the child must not
    use (a log's group commit, an LMDB read gate): any attribute raises
    :class:`ForkedError`, so every path through it refuses without a check
    of its own."""

    __slots__ = ("_what", "_owner_pid")

    def __init__(self, what: str, owner_pid: int) -> None:
        self._what = what
        self._owner_pid = owner_pid

    def __getattr__(self, name: str) -> NoReturn:
        raise forked_error(self._what, self._owner_pid)


def _after_fork_in_child() -> None:
    for obj in [*_open, *(part for parts in list(_parts.values()) for part in parts)]:
        try:
            obj._after_fork_in_child()
        except Exception:  # noqa: BLE001  a hook must not break the fork
            pass
    _open.clear()
    _parts.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
