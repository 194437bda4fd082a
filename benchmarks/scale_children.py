"""What the scale benchmark (:mod:`benchmarks.scale`) runs in its child
processes, for ``system`` "walkv" or "leveldb", on a store already holding
keys ``0..n-1`` (:func:`benchmarks.data.key`, 100-byte values).

Every function runs in a fresh process (:func:`benchmarks.timing.in_child`),
times only its own operation and returns ``ops``, ``seconds`` and
``anon_peak_mb``: the peak of the process's anonymous memory (RssAnon,
sampled every 50 ms) over the whole child, open and close included, and
``minor_faults``: the page faults it took meanwhile (each first touch of a
page of a mapped file, LMDB's or LevelDB's, costs one). The
child's VmHWM (peak RSS, file pages of mapped files included: LMDB's map,
LevelDB's table files) is added by :mod:`benchmarks.child`.

Writes are overwrites of random existing keys with 100-byte values, so the
store keeps its ``n`` keys and its size through every measurement.
"""

from __future__ import annotations

import functools
import importlib
import os
import random
import resource
import struct
import sys
import time
from typing import Any, Callable

from benchmarks import data
from benchmarks.child import AnonPeak
from benchmarks.kv_workloads import LOAD_CHUNK, SYSTEMS
from benchmarks.scale_metrics import LEVELDB_OPTIONS, open_store
from benchmarks.snapshot_workloads import child_restore_walkv, child_snapshot_walkv
from benchmarks.timing import threaded

_HEAD = struct.Struct(">HI")  # LevelDB dump record: key length, value length


def _with_anon_peak(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> dict[str, Any]:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with AnonPeak(interval=0.05) as mem:
            out = fn(**kwargs)
        out["anon_peak_mb"] = mem.peak_mb
        out["minor_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return out

    return wrapper


def _random_overwrite(db: Any, n: int, seed: int) -> Callable[[int], None]:
    put, key, value = db.writer(), data.key, data.value
    pick = random.Random(seed).randrange

    def op(_: int) -> None:
        i = pick(n)
        put(key(i), value(i))

    return op


@_with_anon_peak
def child_puts(system: str, path: str, n: int, threads: int, seconds: float, sync: bool) -> dict[str, Any]:
    """Puts/s from ``threads`` threads for ``seconds`` (durable when ``sync``:
    walkv ``sync="always"``, LevelDB ``put(sync=True)``; else walkv
    ``sync="none"``, LevelDB ``put()``). The close is not timed."""
    db = open_store(system, path, sync)
    try:
        m = threaded(threads, seconds, lambda i: _random_overwrite(db, n, seed=i))
    finally:
        db.close()
    return {"ops": m.ops, "seconds": m.seconds, "threads": threads}


@_with_anon_peak
def child_gets(system: str, path: str, n: int, seconds: float) -> dict[str, Any]:
    """Gets/s of random existing keys, one thread, for ``seconds``."""
    db = open_store(system, path, False)
    try:
        get, key = db.reader(), data.key
        found = get(key(n - 1))  # values differ by process (data's pool is random), not their size
        if found is None or len(found) != data.VALUE_BYTES:
            raise AssertionError(f"{system}: get of a loaded key returned {found!r}")
        pick = random.Random(7).randrange
        m = threaded(1, seconds, lambda _i: lambda _n: get(key(pick(n))))
    finally:
        db.close()
    return {"ops": m.ops, "seconds": m.seconds}


@_with_anon_peak
def child_open(system: str, path: str) -> dict[str, Any]:
    """Time of opening the store (``ops`` = 1, so the rate is opens/s), its
    library imported before the clock starts; for walkv also the log entries
    it replayed (``replayed``)."""
    for requirement in SYSTEMS[system].requires:
        importlib.import_module(requirement.partition(":")[0])
    t0 = time.perf_counter()
    db = open_store(system, path, True)
    seconds = time.perf_counter() - t0
    replayed = getattr(getattr(db, "db", None), "replayed", None)
    db.close()
    return {"ops": 1, "seconds": seconds, "replayed": replayed}


def child_write_until_killed(system: str, path: str, n: int, ready_after: int) -> dict[str, Any]:
    """Non-durable random overwrites, one thread, forever: after
    ``ready_after`` of them print ``ready`` on stdout, for the parent to
    SIGKILL this process in the middle of writing."""
    db = open_store(system, path, False)
    op = _random_overwrite(db, n, seed=99)
    for i in range(ready_after):
        op(i)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    i = 0
    while True:
        op(i)
        i += 1


@_with_anon_peak
def child_snapshot(system: str, path: str, n: int, dump: str) -> dict[str, Any]:
    """walkv: ``db.snapshot()`` (see :func:`benchmarks.snapshot_workloads.child_snapshot_walkv`).
    LevelDB has no snapshot file of its own; its nearest equivalent is a
    consistent dump: iterate a plyvel ``snapshot()`` and write every key and
    value to ``dump`` (length-prefixed records), fsynced. Entries/s."""
    if system == "walkv":
        return child_snapshot_walkv(path=path, n=n)
    import plyvel

    db = plyvel.DB(path, **LEVELDB_OPTIONS)
    try:
        t0 = time.perf_counter()
        count = 0
        with db.snapshot() as snap, open(dump, "wb", buffering=1 << 20) as f:
            write, head = f.write, _HEAD.pack
            for k, v in snap.iterator():
                write(head(len(k), len(v)))
                write(k)
                write(v)
                count += 1
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
    finally:
        db.close()
    return {"ops": count, "seconds": seconds}


@_with_anon_peak
def child_restore(system: str, source: str, target: str, n: int) -> dict[str, Any]:
    """walkv: ``kvstore.restore(store, target)`` (newest snapshot + log tail).
    LevelDB: load the dump :func:`child_snapshot` wrote (``source``) into a
    new LevelDB at ``target`` in write batches of 10,000, the last one
    ``sync=True``, then close. Entries/s."""
    if system == "walkv":
        return child_restore_walkv(source=source, target=target, n=n)
    import plyvel

    t0 = time.perf_counter()
    db = plyvel.DB(target, create_if_missing=True, error_if_exists=True, **LEVELDB_OPTIONS)
    count = 0

    def write(items: list[tuple[bytes, bytes]], sync: bool) -> None:
        with db.write_batch(sync=sync) as wb:
            for k, v in items:
                wb.put(k, v)

    chunk: list[tuple[bytes, bytes]] = []
    with open(source, "rb", buffering=1 << 20) as f:
        read, unpack, size = f.read, _HEAD.unpack, _HEAD.size
        while head := read(size):
            kl, vl = unpack(head)
            body = read(kl + vl)
            chunk.append((body[:kl], body[kl:]))
            if len(chunk) == LOAD_CHUNK:
                write(chunk, sync=False)
                count += len(chunk)
                chunk = []
    write(chunk, sync=True)  # the last batch synced: LevelDB's log is on disk
    count += len(chunk)
    db.close()
    return {"ops": count, "seconds": time.perf_counter() - t0}
