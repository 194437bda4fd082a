"""Watch: a store's changes from an LSN, read from the log files
(:mod:`kvstore.watch.watcher`: :class:`Watcher`, :class:`Change`; the files
through :mod:`kvstore.watch.log_tail`). Below the store, which wakes watchers
through a :class:`WatchHub`; above the entry format."""

from kvstore.watch.watcher import AsyncWatcher, Change, Watcher, WatchHub

__all__ = ["AsyncWatcher", "Change", "WatchHub", "Watcher"]
