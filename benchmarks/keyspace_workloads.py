"""Issue 25 workloads: keyspaces (:mod:`kvstore.store.keyspace`), a named
keyspace (LMDB named database ``ks:<name>``, the contender ``walkv``)
against the default keyspace (``default``) and against the alternative not
taken, a key prefix in the default keyspace (``prefix``), in one run;
16-byte keys, 100-byte values.

* ``kv.keyspace.put``: ``sync="none"`` puts of N pre-built items, one
  thread (the log's fsync would hide the state machine's cost): a named
  keyspace's group is written to LMDB at once, the default keyspace's goes
  through the overlay. Target: >= 0.5x the default keyspace.
* ``kv.keyspace.get``: random gets of existing keys (both through the
  thread's cached read transaction; the default keyspace looks in the
  overlay first). Target: >= 0.7x.
The numbers, and why named databases: :mod:`kvstore.store.keyspace`.

* ``kv.keyspace.drop``: removing a keyspace of N keys: ``drop_keyspace``
  (one entry, one ``mdb_drop``) vs ``delete_range`` of the prefix (one
  entry that visits every key). Target: >= 1x.
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.timing import counted

KS = ("kvstore:open", "kvstore.store.keyspace:Keyspace")
PREFIX = b"users/"
LOAD_CHUNK = 10_000

Writer = Callable[[bytes, bytes], object]


def _store(path: str, how: str) -> tuple[Any, Any, bytes]:
    """``(store, the keyspace or the store, key prefix)`` for one contender."""
    import kvstore

    db = kvstore.open(path, sync="none")
    if how == "walkv":
        return db, db.keyspace("users"), b""
    return db, db, PREFIX if how == "prefix" else b""


def _puts(how: str, n: int):
    def run(ctx: Context) -> Measurement:
        db, space, prefix = _store(ctx.fresh_dir(how), how)
        items = [(prefix + k, v) for k, v in data.items(n)]
        try:
            put = space.put

            def block() -> int:
                for k, v in items:
                    put(k, v)
                return len(items)
            return counted(block)
        finally:
            db.close()

    return run


def _load(space: Any, prefix: bytes, n: int) -> None:
    for start in range(0, n, LOAD_CHUNK):
        space.update((prefix + data.key(i), data.value(i)) for i in range(start, min(n, start + LOAD_CHUNK)))


def _gets(how: str, n_keys: int, n_gets: int):
    def prepare(ctx: Context) -> Any:
        db, space, prefix = _store(os.path.join(ctx.directory, "db"), how)
        _load(space, prefix, n_keys)
        rnd = random.Random(42)
        return db, space, [prefix + data.key(rnd.randrange(n_keys)) for _ in range(n_gets)]

    def run(ctx: Context) -> Measurement:
        _db, space, order = ctx.state
        get = space.get
        if get(order[0]) is None:
            raise AssertionError(f"{how}: a loaded key is missing")

        def block() -> int:
            for k in order:
                get(k)
            return len(order)
        return counted(block)

    return prepare, run, (lambda state: state[0].close())


def _drop(how: str, n: int):
    def run(ctx: Context) -> Measurement:
        db, space, prefix = _store(ctx.fresh_dir(how), how)
        try:
            _load(space, prefix, n)
            if how == "walkv":
                m = counted(lambda: db.drop_keyspace("users") and n)
            else:
                m = counted(lambda: db.delete_range(PREFIX, b"users0") and n)
            if len(space) != 0:
                raise AssertionError(f"{how}: keys left after the drop")
            return m
        finally:
            db.close()

    return run


LABELS = {"walkv": "walkv named keyspace", "default": "walkv default keyspace",
          "prefix": "walkv key prefix in the default keyspace"}


def workloads(cfg: Config) -> list[Workload]:
    puts_n = cfg.size(full=200_000, quick=10_000)
    keys_n = cfg.size(full=200_000, quick=10_000)
    gets_n = cfg.size(full=500_000, quick=20_000)
    drop_n = cfg.size(full=200_000, quick=20_000)
    hows = ("walkv", "default", "prefix")
    get_contenders = []
    for how in hows:
        prep, run, clean = _gets(how, keys_n, gets_n)
        get_contenders.append(Contender(how, run, prepare=prep, cleanup=clean, label=f"{LABELS[how]} get"))
    return [
        Workload(name="kv.keyspace.put", issue=25, unit="puts/s", requires=KS,
                 title=f"sync=none puts of {puts_n:,} items into a named keyspace vs the default one",
                 targets=[Target("default", 0.5)], params={"items": puts_n},
                 contenders=[Contender(how, _puts(how, puts_n), label=f"{LABELS[how]} put") for how in hows]),
        Workload(name="kv.keyspace.get", issue=25, unit="gets/s", requires=KS,
                 title=f"gets in a named keyspace vs the default one ({keys_n:,} keys, {gets_n:,} gets)",
                 targets=[Target("default", 0.7)], params={"keys": keys_n, "gets": gets_n},
                 contenders=get_contenders),
        Workload(name="kv.keyspace.drop", issue=25, unit="keys/s", requires=KS,
                 title=f"removing a keyspace of {drop_n:,} keys: drop_keyspace vs delete_range of a prefix",
                 targets=[Target("prefix", 1.0)], params={"keys": drop_n},
                 contenders=[Contender(how, _drop(how, drop_n), label=f"{LABELS[how]} drop")
                             for how in ("walkv", "prefix")]),
    ]


__all__ = ["workloads"]
