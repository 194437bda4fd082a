"""Watch: a store's changes from an LSN, read from the log files, and the
consumers log retention waits for.

* :mod:`kvstore.watch.watcher`: :class:`Watcher` and :class:`Change` (the
  files are read by :mod:`kvstore.watch.log_tail`);
* :mod:`kvstore.watch.hub`: the :class:`WatchHub` a store wakes its watchers
  through;
* :mod:`kvstore.watch.aio`: :class:`AsyncWatcher`, a watcher for asyncio;
* :mod:`kvstore.watch.subscription`: named, durable subscriptions
  (:class:`Subscription`, acknowledged by LSN);
* :mod:`kvstore.watch.consumers`: their records, live holds, and the floor
  log retention keeps for them.

Below the store, above the entry format.
"""

from kvstore.watch.aio import AsyncWatcher
from kvstore.watch.consumers import SubscriptionInfo
from kvstore.watch.hub import WatchHub
from kvstore.watch.subscription import Subscription
from kvstore.watch.watcher import Change, Watcher

__all__ = ["AsyncWatcher", "Change", "Subscription", "SubscriptionInfo", "WatchHub", "Watcher"]
