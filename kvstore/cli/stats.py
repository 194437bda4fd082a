"""``walkv stats``: LSNs, segments, snapshots, LMDB size and readers of a
store, or of a read replica's directory (its applied LSN, its source's
durable LSN and the lag between them).

It reads the files only and never takes the store's lock (the writer's pid
comes from ``/proc/locks``), so it is safe beside a running writer and never
makes a writer's open fail; the same holds for a replica and the process
following it. A replica's source is the one its ``REPLICA`` record names
(:func:`kvstore.replica.directory.read_record`): a store directory, whose
``DURABLE`` marker is read, or an archive, whose log is listed (with bounded
timeouts); when the source cannot be read the lag is unknown and the reason
is shown.

``walkv stats URL`` asks a running server instead (``GET /v1/stats``, an
admin token from ``$WALKV_TOKEN``): what its open store counts in memory,
such as a cluster leader's synchronous replicas, each one's durable LSN and
lag (:mod:`kvstore.store.replication`), which no file holds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from kvstore.archive.marker import read_archived
from kvstore.cli.common import (
    EXIT_OK,
    AddCommand,
    CliError,
    allocated_bytes,
    dir_bytes,
    human_bytes,
    is_replica,
    open_store,
    print_table,
    require_store,
)
from kvstore.cli.progress import Reporter
from kvstore.layout import SESSION_NAME, StoreLayout
from kvstore.store.metrics import prometheus_text
from kvstore.store.store import KVStore
from wal.compiled import build_info
from wal.errors import CorruptionError, WalkvError


def add_commands(add: AddCommand) -> None:
    p = add("stats", "LSNs, segments, snapshots and LMDB size of a store (or a replica's lag)", cmd_stats)
    p.add_argument("store", metavar="STORE",
                   help="a store, a read replica's directory, or a server's URL (its synchronous replicas)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--prometheus", action="store_true",
                   help="LSNs (and the archived LSN a sidecar publishes) in Prometheus' text format")

    p = add("keyspaces", "list the keyspaces of a store and the keys each holds", cmd_keyspaces,
            description="List the default keyspace and every named keyspace that holds a key, with its "
                        "live keys (keys whose TTL or lease ran out are not counted, swept or not). "
                        "Reads only: safe beside a writer; also reads a replica's directory.")
    p.add_argument("store", metavar="STORE", help="a store, or a read replica's directory")
    p.add_argument("--json", action="store_true", help='a JSON array of {"keyspace": NAME, "keys": N} ("": default)')


def gather_stats(path: str) -> dict[str, Any]:
    """What the files say about a store, without taking its lock (a writer
    may be running): LSNs, segments, snapshots, LMDB."""
    import snapshot
    import wal

    layout = require_store(path, replica_ok=True)
    if is_replica(layout):
        return _replica_stats(layout)
    out: dict[str, Any] = {"path": layout.root}
    segs = wal.list_segments(layout.wal_dir)
    out["segments"] = len(segs)
    out["segment_bytes"] = sum(s.size for s in segs)
    out["segment_files"] = [{"file": os.path.basename(s.path), "first_lsn": s.first_lsn, "bytes": s.size}
                            for s in segs]
    out["first_lsn"] = segs[0].first_lsn if segs else None
    out["durable_lsn"] = wal.read_durable_lsn(layout.wal_dir)
    archived = read_archived(layout.root)
    if archived is not None:  # published by a sidecar archiver (`walkv archive STORE URI`)
        out["archive"] = {"archived_lsn": archived,
                          "lag_lsns": max(0, (out["durable_lsn"] or 0) - archived)}
    try:
        out["store_id"] = wal.read_store_id(layout.wal_dir)
    except CorruptionError:  # stats reports what it can read; verify judges
        out["store_id"] = None
    out["writer_pid"] = _lock_holder(layout.lock_path)
    out["snapshots"] = [{"lsn": s.lsn, "pairs": s.count, "bytes": s.bytes, "chunks": s.chunks,
                         "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_us / 1e6)),
                         "path": s.path} for s in snapshot.list_snapshots(layout.snapshots_dir)]
    out["segment_disk_bytes"] = sum(allocated_bytes(s.path) for s in segs)
    out.update(_lmdb_files(layout))
    return out


def _lmdb_files(layout: StoreLayout) -> dict[str, Any]:
    """LMDB's file sizes and whether its last user closed it cleanly (SESSION)."""
    out: dict[str, Any] = {"lmdb_file_bytes": dir_bytes(layout.lmdb_dir),
                           "lmdb_disk_bytes": dir_bytes(layout.lmdb_dir, allocated=True)}
    try:
        with open(os.path.join(layout.lmdb_dir, SESSION_NAME), encoding="utf-8") as fh:
            session = json.load(fh)
        out["closed_cleanly"] = bool(session.get("clean"))
    except (OSError, ValueError):
        out["closed_cleanly"] = None
    return out


def _replica_stats(layout: StoreLayout) -> dict[str, Any]:
    """What a replica's directory says (module docstring); its applied LSN
    and the lag come from its LMDB, in :func:`cmd_stats`."""
    from kvstore.cli.replica import server_options
    from kvstore.replica.directory import read_record
    from kvstore.replica.source import open_source

    rec = read_record(layout.root) or {}
    source = str(rec.get("source"))
    replica: dict[str, Any] = {"source": source, "source_durable_lsn": None, "lag_lsns": None,
                               "follower_pid": _lock_holder(layout.lock_path)}
    out: dict[str, Any] = {"path": layout.root, "store_id": rec.get("store_id"), "replica": replica}
    try:
        src = open_source(source, **server_options(source))
        try:
            if src.store_id != rec.get("store_id"):
                raise WalkvError(f"{source} now holds store {src.store_id}, not {rec.get('store_id')}")
            replica["source_durable_lsn"] = src.durable_lsn()
        finally:
            src.close()
    except (WalkvError, OSError, ValueError) as e:  # the replica's own stats still stand
        replica["source_error"] = str(e)
    out.update(_lmdb_files(layout))
    return out


def _lock_holder(path: str) -> int | None:
    """The pid holding a walkv lock file (from /proc/locks, so that looking
    never takes the lock and never makes a writer's open fail), or None."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:567 0 EOF" (blocked waiters have "->")
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if int(ino) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                return int(parts[4])
        except ValueError:
            continue
    return None


def cmd_stats(args: argparse.Namespace, rep: Reporter) -> int:
    if args.store.lower().startswith(("http://", "https://")):
        return _served_stats(args)
    st = gather_stats(args.store)
    db_stats: dict[str, Any] = {}
    if os.path.isdir(require_store(args.store, replica_ok=True).lmdb_dir):
        try:
            with open_store(args.store, readonly=True) as db:
                db_stats = db.stats()
                st["keyspaces"] = key_counts(db)
                st["keys"] = sum(st["keyspaces"].values())
        except (WalkvError, OSError, CliError) as e:  # the file-level stats still stand
            st["state_error"] = str(e)
    for k in ("applied_lsn", "lmdb_entries", "lmdb_used_bytes", "lmdb_map_bytes", "lmdb_depth", "lmdb_readers",
              "lmdb_reader_slots", "lmdb_readers_reading", "lmdb_oldest_reader_lag"):
        if k in db_stats:
            st[k] = db_stats[k]
    replica = st.get("replica")
    if replica is not None and replica["source_durable_lsn"] is not None and "applied_lsn" in st:
        replica["lag_lsns"] = max(0, replica["source_durable_lsn"] - st["applied_lsn"])
    st["fsync_note"] = ("fsync counts and latencies are per process: see `walkv demo`, "
                        "`walkv bench`, or db.stats()['log'] in the writing process")
    if args.prometheus:
        print(prometheus_text(st), end="")
        return EXIT_OK
    st["build"] = build_info()  # which twin runs in this process: compiled (mypyc) or pure Python
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"walkv: {st['build']}")
    print_table(_replica_rows(st) if replica is not None else _rows(st))
    return EXIT_OK


def _served_stats(args: argparse.Namespace) -> int:
    """``walkv stats URL`` (module docstring)."""
    from kvstore.cli.replica import server_options
    from kvstore.client.remote import connect

    with connect(args.store, **server_options(args.store)) as db:
        st = db.stats()
    if args.prometheus:
        print(prometheus_text(st), end="")
    elif args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
    else:
        print_table(_served_rows(args.store, st))
    return EXIT_OK


def _served_rows(url: str, st: dict[str, Any]) -> list[tuple[str, str]]:
    """The table ``walkv stats URL`` prints: the store's LSNs and each synchronous replica."""
    rows = [("server", url), ("store", str(st.get("path", "-"))), ("timeline", str(st.get("timeline", "-"))),
            ("durable LSN", str(st.get("durable_lsn", "-"))), ("applied LSN", str(st.get("applied_lsn", "-")))]
    sync = st.get("sync_replicas")
    if not isinstance(sync, dict):
        return [*rows, ("sync replicas", "none (sync_replicas=0)")]
    rows.append(("sync replicas", f"{sync['required']} required, epoch {sync['epoch']}, timeout {sync['timeout']:g} s"))
    for r in sync.get("replicas") or ():
        rows.append((f"  {r['name']}", f"durable LSN {r['durable_lsn']}, {r['lag_lsns']} entries behind, "
                                       f"epoch {r['epoch']}, last report {r['seen_seconds_ago']:g} s ago"))
    return rows


def key_counts(db: KVStore) -> dict[str, int]:
    """The live keys of each keyspace (``""``: the default one, always
    there), keys whose TTL or lease ran out left out though not swept yet."""
    return {"": len(db), **{name: len(db.keyspace(name)) for name in db.keyspaces()}}


def _keys_text(st: dict[str, Any]) -> str:
    """The ``keys`` row: every keyspace's live keys, and how they split."""
    if "keys" not in st:
        return "-"
    named = {k: v for k, v in st["keyspaces"].items() if k}
    if not named:
        return str(st["keys"])
    split = ", ".join(f"{name} {n}" for name, n in named.items())
    return (f"{st['keys']} (default keyspace {st['keyspaces']['']}; {len(named)} keyspace"
            f"{'s' if len(named) > 1 else ''}: {split})")


def cmd_keyspaces(args: argparse.Namespace, rep: Reporter) -> int:
    with open_store(args.store, readonly=True) as db:
        counts = key_counts(db)
    if args.json:
        print(json.dumps([{"keyspace": name, "keys": n} for name, n in counts.items()]))
        return EXIT_OK
    print_table([("(default)" if not name else name, f"{n} key{'s' if n != 1 else ''}") for name, n in counts.items()])
    return EXIT_OK


def _readers(st: dict[str, Any]) -> str:
    """Reader slots in use (every process's, this command's own included)
    and how far the oldest reading one lags: the write transactions
    committed since its snapshot, whose freed pages LMDB cannot reuse while
    it reads. Slots of dead readers are cleared when this command opens the
    store."""
    if "lmdb_reader_slots" not in st:
        return "-"
    lag = st["lmdb_oldest_reader_lag"]
    oldest = "none reading" if lag is None else f"oldest {lag} transactions behind"
    return f"{st['lmdb_reader_slots']} slots in use, {st['lmdb_readers_reading']} reading, {oldest}"


def _lmdb_text(st: dict[str, Any]) -> str:
    lmdb = (f"{human_bytes(st.get('lmdb_used_bytes', st['lmdb_file_bytes']))} used, "
            f"{human_bytes(st['lmdb_disk_bytes'])} on disk")
    if "lmdb_map_bytes" in st:
        lmdb += f", map {human_bytes(st['lmdb_map_bytes'])}"
    return lmdb


def _replica_rows(st: dict[str, Any]) -> list[tuple[str, str]]:
    """The table ``walkv stats`` prints for a replica."""
    rep = st["replica"]
    closed = {True: "yes", False: "no (being followed, or its follower crashed)", None: "-"}[st["closed_cleanly"]]
    if rep["lag_lsns"] is not None:
        lag = f"{rep['lag_lsns']} entries behind its source"
    else:
        lag = f"unknown: {rep['source_error']}" if "source_error" in rep else "-"
    rows = [
        ("replica", st["path"]),
        ("source", rep["source"]),
        ("store id", st["store_id"] or "-"),
        ("follower", f"pid {rep['follower_pid']}" if rep["follower_pid"] else
         "none (not being followed: `walkv replica SOURCE DIR`)"),
        ("closed cleanly", closed),
        ("applied LSN", str(st.get("applied_lsn", "-"))),
        ("source durable LSN", "-" if rep["source_durable_lsn"] is None else str(rep["source_durable_lsn"])),
        ("lag", lag),
        ("keys", _keys_text(st)),
        ("LMDB", _lmdb_text(st)),
        ("LMDB readers", _readers(st)),
    ]
    if "state_error" in st:
        rows.append(("state", f"unreadable: {st['state_error']}"))
    return rows


def _rows(st: dict[str, Any]) -> list[tuple[str, str]]:
    """The table ``walkv stats`` prints for a store."""
    lmdb = _lmdb_text(st)
    segments = (f"{st['segments']} ({human_bytes(st['segment_bytes'])} in files, "
                f"{human_bytes(st['segment_disk_bytes'])} on disk)")
    closed = {True: "yes", False: "no (crashed or still open)", None: "-"}[st["closed_cleanly"]]
    rows = [
        ("store", st["path"]),
        ("store id", st["store_id"] or "-"),
        ("writer", f"pid {st['writer_pid']}" if st["writer_pid"] else "none (not open for writing)"),
        ("closed cleanly", closed),
        ("first LSN in log", str(st["first_lsn"])),
        ("durable LSN", str(st["durable_lsn"])),
        ("applied LSN", str(st.get("applied_lsn", "-"))),
        ("keys", _keys_text(st)),
        ("log segments", segments),
        ("LMDB", lmdb),
        ("LMDB readers", _readers(st)),
        ("fsyncs", "counted per process: db.stats()['log'] in the writer, or `walkv demo`"),
        ("snapshots", str(len(st["snapshots"]))),
    ]
    if "archive" in st:
        rows.insert(-1, ("archived LSN", f"{st['archive']['archived_lsn']} (sidecar archiver; "
                                         f"{st['archive']['lag_lsns']} durable entries behind)"))
    for s in st["snapshots"]:
        text = f"{s['pairs']} pairs, {human_bytes(s['bytes'])}, {s['chunks']} chunks, {s['created']}"
        rows.append((f"  LSN {s['lsn']}", text))
    if "state_error" in st:
        rows.append(("state", f"unreadable: {st['state_error']}"))
    return rows
