"""A store's live watchers (:class:`WatchHub`): the set its commit hook
wakes once per group, and the LSNs they still need, which log retention
keeps (:mod:`kvstore.watch.consumers`). How a watcher waits on it:
:mod:`kvstore.watch.watcher`."""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class Watching(Protocol):
    """What the hub knows of a watcher: the next LSN it needs."""

    next_lsn: int


class WatchHub:
    """A store's live watchers: :meth:`committed` wakes them, the one call per
    group from the store's commit hook (a look at an empty set when nobody
    watches); :meth:`positions` says which LSNs they still need, so that log
    retention keeps them (:mod:`kvstore.watch.consumers`). A watcher leaves
    the set when it is closed, or dropped (the set holds it weakly: one never
    iterated, or abandoned, costs the writers nothing)."""

    def __init__(self) -> None:
        # Reentrant: a watcher collected by the GC in a thread holding it closes itself here.
        self.cond = threading.Condition(threading.RLock())
        # Weak references to the live watchers (a dropped one leaves through its
        # reference's callback). A plain set, not a WeakSet, so that the store's
        # commit hook looks at it once per group in C (a WeakSet's len is Python code);
        # the hook holds this very set, so it is only ever changed in place.
        self.watchers: set[weakref.ref[Watching]] = set()
        self.closed = False

    def add(self, watcher: Watching) -> None:
        """Track ``watcher`` (under :attr:`cond`) until it is discarded or dropped."""
        self.watchers.add(weakref.ref(watcher, self.watchers.discard))

    def discard(self, watcher: Watching) -> None:
        """Stop tracking ``watcher`` (under :attr:`cond`)."""
        self.watchers.discard(weakref.ref(watcher))

    def committed(self) -> None:
        """A group was applied: wake the watchers (the commit hook calls this
        only while :attr:`watchers` is not empty)."""
        if self.watchers:
            with self.cond:
                self.cond.notify_all()

    def positions(self) -> list[int]:
        """The next LSN each live watcher needs."""
        with self.cond:
            live = [ref() for ref in list(self.watchers)]
        return [w.next_lsn for w in live if w is not None]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
