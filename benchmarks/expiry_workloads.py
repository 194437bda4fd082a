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

from typing import Callable

from benchmarks.harness import Config, Contender, Workload
from benchmarks.kv_workloads import LABELS, SYSTEMS, WalkvKV, _gets, _puts_counted, _puts_timed

TTL = ("kvstore.store.expiring:Expiring",)
TTL_SECONDS = 3600.0


class WalkvTTLInUse(WalkvKV):
    """walkv with one key that has a TTL: every read and write takes the
    path that checks expiry."""

    name = "walkv-ttl-in-use"

    def __init__(self, path: str, sync: bool) -> None:
        super().__init__(path, sync)
        self.db.put(b"\xff-one-key-with-a-ttl", b"x", ttl=TTL_SECONDS)


class WalkvPutTTL(WalkvTTLInUse):
    """walkv where every put carries ``ttl=3600``."""

    name = "walkv-put-ttl"

    def writer(self) -> Callable[[bytes, bytes], object]:
        put = self.db.put
        return lambda k, v: put(k, v, ttl=TTL_SECONDS)


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    puts_n = cfg.size(full=300_000, quick=10_000)
    keys_n = cfg.size(full=200_000, quick=10_000)
    gets_n = cfg.size(full=500_000, quick=20_000)
    get_contenders = []
    for name, system, label in (("walkv", "walkv", "walkv get, no TTL anywhere"),
                                (WalkvTTLInUse.name, WalkvTTLInUse, "walkv get, TTLs in use"),
                                ("lmdb", "lmdb", "LMDB get, one read txn")):
        prep, run, clean = _gets(system, keys_n, gets_n)
        get_contenders.append(Contender(name, run, prepare=prep, cleanup=clean, label=label,
                                        requires=SYSTEMS["lmdb"].requires if system == "lmdb" else ()))
    return [
        Workload(
            name="ttl.put.nosync.1t", issue=25, unit="puts/s",
            title="puts (sync=none), 1 thread: no TTL anywhere vs TTLs in use", requires=TTL,
            params={"items": puts_n, "ttl_seconds": TTL_SECONDS},
            contenders=[
                Contender("walkv", _puts_counted("walkv", puts_n), label="walkv put, no TTL anywhere"),
                Contender(WalkvTTLInUse.name, _puts_counted(WalkvTTLInUse, puts_n), label="walkv put, TTLs in use"),
                Contender(WalkvPutTTL.name, _puts_counted(WalkvPutTTL, puts_n), label="walkv put(ttl=3600)"),
                Contender("lmdb", _puts_counted("lmdb", puts_n), requires=SYSTEMS["lmdb"].requires,
                          label=f"{LABELS['lmdb']} put (txn per put, sync=False)"),
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
                Contender("walkv", _puts_timed("walkv", 1, secs), label="walkv sync put"),
                Contender(WalkvPutTTL.name, _puts_timed(WalkvPutTTL, 1, secs), label="walkv sync put(ttl=3600)"),
            ]),
    ]


__all__ = ["workloads", "WalkvTTLInUse", "WalkvPutTTL"]
