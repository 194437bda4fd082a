"""The state machine: the LMDB environment the log's entries are applied to,
and every read of it.

* :mod:`kvstore.state.machine`: :class:`State` (apply, flush, stats),
  which has the parts below and delegates to them;
* :mod:`kvstore.state.commits`: the write transactions that carry applied
  writes into LMDB with their applied LSN, their kept failure and counters;
  :mod:`kvstore.state.staged`: a bulk group applied while the log writes and syncs it;
* :mod:`kvstore.state.meta`: walkv's bookkeeping keys in LMDB (format, store
  id, applied LSN); :mod:`kvstore.state.base_load`: a snapshot loaded into it;
* :mod:`kvstore.state.expiring_reads`: the reads that know expiry and
  keyspaces (gets, scans, counts, views);
* :mod:`kvstore.state.environment`: the LMDB environment shared by reading
  threads and one writer (the read gate, cached readers and views, write
  transactions that grow the map);
* :mod:`kvstore.state.keyspace_dbs`: the keyspaces' named databases;
* :mod:`kvstore.state.reads`: reading keys (cached read transactions, or a
  fresh one per get when opened read-only);
* :mod:`kvstore.state.overlay`: applied writes held in memory until they reach
  LMDB in bulk;
* :mod:`kvstore.state.readers`, :mod:`kvstore.state.view`: how readers and the
  writer share LMDB without a lock on the read path; consistent views;
* :mod:`kvstore.state.lookups`: the dict face (``x[key]``, ``key in x``) the
  store, its views and replicas share;
* :mod:`kvstore.state.lmdb_env`, :mod:`kvstore.state.lmdb_ops`: opening the
  environment, growing its map, the LMDB operations an entry becomes.

It knows the entry format (:mod:`kvstore.entry`) and nothing of the log's files.
"""

from kvstore.state.machine import DEFAULT_MAP_SIZE, Ops, State, StateOptions
from kvstore.state.view import View

__all__ = ["DEFAULT_MAP_SIZE", "Ops", "State", "StateOptions", "View"]
