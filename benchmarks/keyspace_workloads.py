"""Issue 25 workloads: keyspaces (:mod:`kvstore.store.keyspace`), a named
keyspace (LMDB named database ``ks:<name>``, the contender ``walkv``)
against the default keyspace (``default``) and against the alternative not
taken, a key prefix in the default keyspace (``prefix``), in one run;
16-byte keys, 100-byte values. The runs are :mod:`benchmarks.kv_workloads`'
(the same items, the same loops), on walkv classes of this module's.

* ``kv.keyspace.put``: ``sync="none"`` puts of N pre-built items, one
  thread (the log's fsync would hide the state machine's cost): a named
  keyspace's group is written to LMDB at once, the default keyspace's goes
  through the overlay. Target: >= 0.5x the default keyspace.
* ``kv.keyspace.get``: random gets of existing keys (both through the
  thread's cached read transaction; the default keyspace looks in the
  overlay first). Target: >= 0.7x.
The numbers, and why named databases: :mod:`kvstore.store.keyspace`. The
``prefix`` contender prepends its prefix to each key inside the timed loop,
as an application keeping keyspaces as prefixes would (one concatenation
and one call more per operation than the other two).

* ``kv.keyspace.drop``: removing a keyspace of N keys: ``drop_keyspace``
  (one entry, one ``mdb_drop``) vs ``delete_range`` of the prefix (one
  entry that visits every key). Target: >= 1x.
"""

from __future__ import annotations

from typing import Any, Callable

from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.kv_workloads import WalkvKV, _gets, _open, _puts_counted, load
from benchmarks.timing import counted

KS = ("kvstore:open", "kvstore.store.keyspace:Keyspace")
KEYSPACE = "users"
PREFIX = b"users/"
PREFIX_END = b"users0"  # the first key after every key that starts with PREFIX


class WalkvKeyspace(WalkvKV):
    """walkv's named keyspace ``users`` (LMDB named database ``ks:users``)."""

    name = "walkv-keyspace"

    def __init__(self, path: str, sync: bool) -> None:
        super().__init__(path, sync)
        self.space = self.db.keyspace(KEYSPACE)

    def writer(self) -> Callable[[bytes, bytes], object]:
        return self.space.put

    def reader(self) -> Callable[[bytes], object]:
        return self.space.get

    def write_batch(self, items: Any) -> None:
        self.space.update(items)

    def drop(self) -> None:
        self.db.drop_keyspace(KEYSPACE)

    def count(self) -> int:
        return len(self.space)


class WalkvKeyPrefix(WalkvKV):
    """Keys under :data:`PREFIX` in walkv's default keyspace."""

    name = "walkv-prefix"

    def writer(self) -> Callable[[bytes, bytes], object]:
        put = self.db.put
        return lambda k, v: put(PREFIX + k, v)

    def reader(self) -> Callable[[bytes], object]:
        get = self.db.get
        return lambda k: get(PREFIX + k)

    def write_batch(self, items: Any) -> None:
        super().write_batch((PREFIX + k, v) for k, v in items)

    def drop(self) -> None:
        self.db.delete_range(PREFIX, PREFIX_END)

    def count(self) -> int:
        return len(self.db)


SYSTEMS: dict[str, str | type] = {"walkv": WalkvKeyspace, "default": "walkv", "prefix": WalkvKeyPrefix}
LABELS = {"walkv": "walkv named keyspace", "default": "walkv default keyspace",
          "prefix": "walkv key prefix in the default keyspace"}


def _drop(system: type[WalkvKeyspace] | type[WalkvKeyPrefix], n: int) -> Callable[[Context], Measurement]:
    def run(ctx: Context) -> Measurement:
        db = _open(system, ctx, sync=False)
        try:
            load(db, n)
            m = counted(lambda: db.drop() or n)
            if db.count() != 0:
                raise AssertionError(f"{system.name}: keys left after the drop")
            return m
        finally:
            db.close()

    return run


def workloads(cfg: Config) -> list[Workload]:
    puts_n = cfg.size(full=200_000, quick=10_000)
    keys_n = cfg.size(full=200_000, quick=10_000)
    gets_n = cfg.size(full=500_000, quick=20_000)
    drop_n = cfg.size(full=200_000, quick=20_000)
    get_contenders = []
    for how, system in SYSTEMS.items():
        prep, run, clean = _gets(system, keys_n, gets_n)
        get_contenders.append(Contender(how, run, prepare=prep, cleanup=clean, label=f"{LABELS[how]} get"))
    return [
        Workload(name="kv.keyspace.put", issue=25, unit="puts/s", requires=KS,
                 title=f"sync=none puts of {puts_n:,} items into a named keyspace vs the default one",
                 targets=[Target("default", 0.5)], params={"items": puts_n},
                 contenders=[Contender(how, _puts_counted(system, puts_n), label=f"{LABELS[how]} put")
                             for how, system in SYSTEMS.items()]),
        Workload(name="kv.keyspace.get", issue=25, unit="gets/s", requires=KS,
                 title=f"gets in a named keyspace vs the default one ({keys_n:,} keys, {gets_n:,} gets)",
                 targets=[Target("default", 0.7)], params={"keys": keys_n, "gets": gets_n},
                 contenders=get_contenders),
        Workload(name="kv.keyspace.drop", issue=25, unit="keys/s", requires=KS,
                 title=f"removing a keyspace of {drop_n:,} keys: drop_keyspace vs delete_range of a prefix",
                 targets=[Target("prefix", 1.0)], params={"keys": drop_n},
                 contenders=[Contender(how, _drop(system, drop_n), label=f"{LABELS[how]} drop")
                             for how, system in (("walkv", WalkvKeyspace), ("prefix", WalkvKeyPrefix))]),
    ]


__all__ = ["workloads", "WalkvKeyPrefix", "WalkvKeyspace"]
