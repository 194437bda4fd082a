"""walkv speaks the Redis protocol (RESP2 and RESP3): ``walkv serve STORE
--resp HOST:PORT`` answers redis-cli, redis-py and every other Redis client
beside the HTTP face, on the same store, in the same process and event loop.

Durability: every write command is durable (per the store's sync mode:
fsynced with ``sync="always"``) and applied before its answer; writes from
RESP, HTTP and the embedded API go through the one asyncio front, so they
share group commit and are one log that watchers, Spark, the archive and
replicas read. Commands that read before they write (INCR, APPEND, SETNX,
SET NX/XX/GET, GETSET, RENAME, DEL's count, EXPIRE, MULTI/EXEC) are decided
in log order by the writer (:class:`kvstore.entry.conditions.Decided`), as
compare-and-set is.

Modules: :mod:`~kvstore.server.resp.server` (the listener, stopping),
:mod:`~kvstore.server.resp.connection` (parsing with hiredis, ordering,
pipelining, slow clients), :mod:`~kvstore.server.resp.table` (every command,
its role, arity and how it runs), the command groups
(:mod:`~kvstore.server.resp.strings`, :mod:`~kvstore.server.resp.keys`,
:mod:`~kvstore.server.resp.expiry`, :mod:`~kvstore.server.resp.transactions`,
:mod:`~kvstore.server.resp.session_commands`,
:mod:`~kvstore.server.resp.server_commands`), :mod:`~kvstore.server.resp.keyview`
(where a command reads and writes), :mod:`~kvstore.server.resp.info` (INFO),
:mod:`~kvstore.server.resp.replication` (WAIT), pub/sub
(:mod:`~kvstore.server.resp.pubsub`, :mod:`~kvstore.server.resp.pubsub_commands`)
and keyspace notifications fed by the watch
(:mod:`~kvstore.server.resp.keyspace_feed`, :mod:`~kvstore.server.resp.notify`),
:mod:`~kvstore.server.resp.limits`, :mod:`~kvstore.server.resp.replies`
(RESP2/RESP3 encoding), :mod:`~kvstore.server.resp.args`,
:mod:`~kvstore.server.resp.glob`, :mod:`~kvstore.server.resp.served` and
:mod:`~kvstore.server.resp.session` (what connections and commands share).
"""

from kvstore.server.resp.limits import RespLimits
from kvstore.server.resp.server import RespServer

__all__ = ["RespLimits", "RespServer"]
