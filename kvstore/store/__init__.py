"""The store: :class:`KVStore` has a state machine (:mod:`kvstore.state`), a
watch hub (:mod:`kvstore.watch`) and, unless read-only, a writer (the lock,
the log (:mod:`wal`), the snapshots and, with ``archive=``, an archiver
(:mod:`kvstore.archive`)), and composes them.

* :mod:`kvstore.store.store`: KVStore, open, close, durability and locking;
* :mod:`kvstore.store.writer`: what only the writing process has, opened and
  closed in order; :mod:`kvstore.store.readonly`: what a read-only store has
  in its place;
* :mod:`kvstore.store.fast_path`: the one way a write reaches the log (and
  where it is refused), and the compiled get;
* :mod:`kvstore.store.opening`: what ``open`` refuses before it opens anything;
* :mod:`kvstore.store.write_batch`, :mod:`kvstore.store.txn`: batches and
  conditional writes; :mod:`kvstore.store.aio`: the asyncio front, and
  :mod:`kvstore.store.aio_batch` its batches and transactions;
* :mod:`kvstore.store.keyspace`: named keyspaces, the handle and its writes,
  and the store's bookkeeping of them;
* :mod:`kvstore.store.expiring`, :mod:`kvstore.store.leases`: TTLs, leases, the sweeper;
* :mod:`kvstore.store.recovery`: trusting or rebuilding LMDB at open, replay;
* :mod:`kvstore.store.snapshots`: taking snapshots, retention, the base of a rebuild;
* :mod:`kvstore.store.metrics`: stats in Prometheus' text format.
"""

from kvstore.store.store import KVStore, open
from kvstore.store.txn import Transaction
from kvstore.store.write_batch import WriteBatch

__all__ = ["KVStore", "Transaction", "WriteBatch", "open"]
