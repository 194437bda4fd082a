"""Issue 25 workloads: what expiry (TTLs and leases) costs the put and get paths.

* ``ttl.put.nosync.1t``: ``sync="none"`` puts of N pre-built items (16-byte
  keys, 100-byte values) into a store where no key has a TTL (``walkv``),
  the same plain puts into a store where TTLs are in use (one key with a
  TTL: every group is then written through to LMDB, each write drops the
  metadata its key had), puts that each carry ``ttl=3600``, and py-lmdb
  (one write transaction per put) for scale. No target: the ratios are the
  result. ``kv.put.nosync.1t`` (issue 15) is the no-TTL path's target.
* ``ttl.get``: gets of existing keys in a shuffled order when no key has a
  TTL (the plain path: nothing checked) and when TTLs are in use (each get
  reads the key's expiry in the same read transaction), and py-lmdb ``get``
  on one read transaction.
* ``ttl.put.durable.1t``: durable puts from one thread, no TTL anywhere vs
  each put with ``ttl=3600`` (the fsync dominates either).
"""

from __future__ import annotations

import os
import random
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Measurement, Workload
from benchmarks.kv_workloads import SYSTEMS, load
from benchmarks.peers import LMDB
from benchmarks.timing import counted, threaded_puts

TTL = ("kvstore.store.expiring:Expiring",)
TTL_SECONDS = 3600.0


def _walkv(path: str, sync: str, ttl_in_use: bool) -> Any:
    import kvstore

    db = kvstore.open(path, sync=sync)
    if ttl_in_use:
        db.put(b"\xff-one-key-with-a-ttl", b"x", ttl=TTL_SECONDS)
    return db


def _puts(n: int, ttl_in_use: bool, each_ttl: bool):
    def run(ctx: Context) -> Measurement:
        items = data.items(n)
        db = _walkv(ctx.fresh_dir("walkv"), "none", ttl_in_use)
        try:
            put = db.put
            if each_ttl:
                def block() -> int:
                    for k, v in items:
                        put(k, v, ttl=TTL_SECONDS)
                    return len(items)
            else:
                def block() -> int:
                    for k, v in items:
                        put(k, v)
                    return len(items)
            return counted(block)
        finally:
            db.close()

    return run


def _lmdb_puts(n: int):
    def run(ctx: Context) -> Measurement:
        items = data.items(n)
        db = SYSTEMS["lmdb"](ctx.fresh_dir("lmdb"), False)
        try:
            put = db.writer()

            def block() -> int:
                for k, v in items:
                    put(k, v)
                return len(items)
            return counted(block)
        finally:
            db.close()

    return run


def _gets(n_keys: int, n_gets: int, ttl_in_use: bool | None):
    """Gets of walkv with or without TTLs in use (None: py-lmdb)."""
    def prepare(ctx: Context) -> Any:
        path = os.path.join(ctx.directory, "db")
        if ttl_in_use is None:
            db = SYSTEMS["lmdb"](path, False)
            load(db, n_keys)
            get = db.reader()
        else:
            db = _walkv(path, "none", ttl_in_use)
            for start in range(0, n_keys, 10_000):
                db.update((data.key(i), data.value(i)) for i in range(start, min(n_keys, start + 10_000)))
            get = db.get
        rnd = random.Random(42)
        return db, get, [data.key(rnd.randrange(n_keys)) for _ in range(n_gets)]

    def run(ctx: Context) -> Measurement:
        _db, get, order = ctx.state
        found = get(order[0])
        if found is None or bytes(found) != data.value(int.from_bytes(order[0][8:], "big")):
            raise AssertionError(f"get returned {found!r} for a loaded key")

        def block() -> int:
            for k in order:
                get(k)
            return len(order)
        return counted(block)

    return prepare, run, (lambda state: state[0].close())


def _durable(seconds: float, each_ttl: bool):
    def run(ctx: Context) -> Measurement:
        db = _walkv(ctx.fresh_dir("walkv"), "always", False)
        try:
            put = db.put
            writer = (lambda k, v: put(k, v, ttl=TTL_SECONDS)) if each_ttl else put
            return threaded_puts(writer, 1, seconds, data.value(0))
        finally:
            db.close()

    return run


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    puts_n = cfg.size(full=300_000, quick=10_000)
    keys_n = cfg.size(full=200_000, quick=10_000)
    gets_n = cfg.size(full=500_000, quick=20_000)
    get_contenders = []
    for name, in_use, label in (("walkv", False, "walkv get, no TTL anywhere"),
                                ("walkv-ttl-in-use", True, "walkv get, TTLs in use"),
                                ("lmdb", None, "LMDB get, one read txn")):
        prep, run, clean = _gets(keys_n, gets_n, in_use)
        get_contenders.append(Contender(name, run, prepare=prep, cleanup=clean, label=label,
                                        requires=LMDB.requires if in_use is None else ()))
    return [
        Workload(
            name="ttl.put.nosync.1t", issue=25, unit="puts/s",
            title="puts (sync=none), 1 thread: no TTL anywhere vs TTLs in use", requires=TTL,
            params={"items": puts_n, "ttl_seconds": TTL_SECONDS},
            contenders=[
                Contender("walkv", _puts(puts_n, False, False), label="walkv put, no TTL anywhere"),
                Contender("walkv-ttl-in-use", _puts(puts_n, True, False), label="walkv put, TTLs in use"),
                Contender("walkv-put-ttl", _puts(puts_n, True, True), label="walkv put(ttl=3600)"),
                Contender("lmdb", _lmdb_puts(puts_n), requires=LMDB.requires,
                          label="LMDB put (txn per put, sync=False)"),
            ]),
        Workload(
            name="ttl.get", issue=25, unit="gets/s",
            title=f"gets of existing keys ({keys_n:,} keys, {gets_n:,} random gets): no TTL vs TTLs in use",
            requires=TTL, params={"keys": keys_n, "gets": gets_n}, contenders=get_contenders),
        Workload(
            name="ttl.put.durable.1t", issue=25, unit="puts/s",
            title="durable puts, 1 thread: no TTL vs each put with a TTL", requires=TTL,
            params={"seconds": secs, "ttl_seconds": TTL_SECONDS},
            contenders=[
                Contender("walkv", _durable(secs, False), label="walkv sync put"),
                Contender("walkv-put-ttl", _durable(secs, True), label="walkv sync put(ttl=3600)"),
            ]),
    ]


__all__ = ["workloads"]
