"""INFO's text: the sections Redis prints, filled from walkv.

``server`` (the Redis version walkv speaks, walkv's own version, uptime),
``cluster`` (``cluster_enabled:0``),
``clients``, ``persistence`` (walkv's log: the last, durable and applied
LSNs, the sync mode; ``aof_enabled:1`` since every acknowledged write is in
the log), ``stats``, ``replication`` (``role:master`` with a ``slaveN`` line
per synchronous replica of this epoch, its durable LSN as the offset, or
``slave`` on a read-only store or replica) and ``keyspace`` as Redis prints it
(``db0:keys=N,expires=M,avg_ttl=0``, a line per database that holds keys).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit

from kvstore.server.resp.keyview import DATABASES, keyspace_of
from kvstore.server.resp.served import Served

SECTIONS: Final = ("server", "clients", "persistence", "stats", "replication", "cluster", "keyspace")


def _server(served: Served, version: str) -> list[str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        walkv_version = dist_version("walkv")
    except PackageNotFoundError:
        walkv_version = "0"
    up = int(time.time() - served.started)
    return [f"redis_version:{version}", f"walkv_version:{walkv_version}", "redis_mode:standalone",
            f"os:{os.uname().sysname}", "arch_bits:64", f"process_id:{os.getpid()}", f"uptime_in_seconds:{up}",
            f"uptime_in_days:{up // 86400}", f"walkv_store:{served.store.path}"]


def _clients(served: Served) -> list[str]:
    return [f"connected_clients:{len(served.clients)}", f"maxclients:{served.limits.max_connections}"]


def _persistence(served: Served) -> list[str]:
    store = served.store
    sync = getattr(getattr(store, "_log", None), "sync_mode", None) or ("none" if store.readonly else "always")
    snaps = store.list_snapshots()
    last_save = int(os.path.getmtime(snaps[-1].path)) if snaps else int(served.started)
    return ["loading:0", "aof_enabled:1", f"aof_fsync:{sync}", "rdb_changes_since_last_save:0",
            f"rdb_last_save_time:{last_save}", f"walkv_last_lsn:{store.last_lsn}",
            f"walkv_durable_lsn:{store.durable_lsn}", f"walkv_applied_lsn:{store.applied_lsn}",
            f"walkv_snapshots:{len(snaps)}"]


def _stats(served: Served) -> list[str]:
    return [f"total_connections_received:{served.connections_received}",
            f"total_commands_processed:{served.commands}",
            f"rejected_connections:{served.connections_rejected}",
            f"pubsub_channels:{len(served.pubsub.channels)}", f"pubsub_patterns:{len(served.pubsub.patterns)}",
            f"client_output_buffer_limit_disconnections:{served.output_limit_disconnections}"]


def _replication(served: Served) -> list[str]:
    store = served.store
    if store.readonly:
        return ["role:slave", "master_link_status:up", "slave_read_only:1", "connected_slaves:0"]
    replicas = store.replicas
    positions = [] if replicas is None else [
        p for p in replicas.positions(store.last_lsn) if p["epoch"] == replicas.epoch]
    lines = ["role:master", f"connected_slaves:{len(positions)}"]
    for n, p in enumerate(positions):
        where = urlsplit(str(p["name"]))
        lines.append(f"slave{n}:ip={where.hostname},port={where.port},state=online,offset={p['durable_lsn']},"
                     f"lag={int(float(str(p['seen_seconds_ago'])))}")
    return [*lines, f"master_repl_offset:{store.last_lsn}"]


def _keyspace(served: Served) -> list[str]:
    store = served.store
    named = set(store.keyspaces())
    lines = []
    for db in range(DATABASES):
        ks = keyspace_of(db)
        if ks and ks not in named:
            continue
        keys = len(served.view(db).reads)
        if keys:
            lines.append(f"db{db}:keys={keys},expires={_expiring(served, ks)},avg_ttl=0")
    return lines


def _expiring(served: Served, keyspace: str) -> int:
    """Keys of ``keyspace`` with a TTL or lease (counted from the expiry index)."""
    from kvstore.state.expiry import unnamed

    state = served.store._state

    def count(txn: object, expiry: object) -> int:
        db = getattr(expiry, "dbs", {}).get("ttl:keys")
        if db is None:
            return 0
        n = 0
        for value in txn.cursor(db=db).iternext(keys=False):  # type: ignore[attr-defined]
            if unnamed(bytes(value)[9:])[0] == keyspace:
                n += 1
        return n

    return int(state.expiring_reads.read_expiry(count))


_BUILDERS: Final[dict[str, Callable[[Served], list[str]]]] = {
    "clients": _clients, "persistence": _persistence, "stats": _stats, "replication": _replication,
    "cluster": lambda served: ["cluster_enabled:0"], "keyspace": _keyspace,
}


def info_text(served: Served, wanted: list[str], version: str) -> bytes:
    """INFO's answer for the sections ``wanted`` (lower case; empty,
    ``all``, ``default`` or ``everything``: every section)."""
    names = [n for n in SECTIONS if not wanted or n in wanted or {"all", "default", "everything"} & set(wanted)]
    out = []
    for name in names:
        lines = _server(served, version) if name == "server" else _BUILDERS[name](served)
        out.append(f"# {name.capitalize()}\r\n" + "".join(line + "\r\n" for line in lines))
    return "\r\n".join(out).encode()
