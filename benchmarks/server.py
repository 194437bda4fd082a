"""Issue 22 workloads: walkv over HTTP (``walkv serve``) against etcd and Redis.

Every server is started by the benchmark on a free loopback port with its
data in the workload's temp dir, durable on every acknowledged write
(:mod:`benchmarks.server_peers`: walkv ``sync="always"``, etcd's fsynced WAL,
Redis ``appendfsync always``), and stopped at the end. walkv and etcd are
driven by the SAME load generator (:mod:`benchmarks.http_load`: aiohttp, one
keep-alive connection per client, in a child process of its own), Redis
through redis-py's asyncio client in the same loop structure. A peer whose
program is not installed is reported as an error of its row ("not found on
PATH"), and the run goes on.

* ``server.put.{1,16,256}c``: durable puts/s with that many concurrent clients
  (16-byte keys, 100-byte values, each client its own keys); target at 256
  clients: >= 1.5x etcd. ``extra``: latency p50/p99/max in ms (p99 at 16
  clients is the reported one), the server's CPU per operation
  (``/proc/PID/stat`` before and after: a measure the other jobs of a shared
  machine disturb less than the rate) and the load generator's own CPU
  seconds (close to the run's length: the generator, not the server, was
  the limit).
* ``server.get.{1,16,256}c``: gets/s of 10,000 preloaded keys (500 quick); target >= 1.0x
  etcd at every concurrency.
* ``server.watch``: one watcher of a prefix (walkv: ``GET /v1/watch`` as
  Server-Sent Events; etcd: its gateway's ``POST /v3/watch`` stream) while 16
  clients put into it; the rate is changes delivered per second, ``extra``
  the delivery latency (put sent -> change in the watcher's hands, the put's
  fsync included) p50/p99 in ms. No target: reported.
* ``server.replica.lag``: a read replica over HTTP
  (``kvstore.open_replica(url, dir)``, :mod:`kvstore.replica.http_source`) in
  this process while a load generator puts at 10,000/s paced (64 clients);
  the rate is the puts/s the server sustained, ``extra`` the time from a put's
  acknowledgement to the replica showing its LSN (p50/p99 ms) and the lag in
  LSNs behind the newest acknowledged LSN, sampled every 0.5 ms.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.server_peers import Server, missing_peers, start_etcd, start_redis, start_walkv
from benchmarks.timing import in_child, spawn_child

GET_KEYS = 10_000
QUICK_GET_KEYS = 500
CLIENTS = (1, 16, 256)
REPLICA_RATE = 10_000
REPLICA_CLIENTS = 64
SERVE = ("kvstore.server:serve",)
REPORTED = ("p50_ms", "p99_ms", "server_cpu_us_per_op", "client_cpu_s")
STARTERS = {"walkv": start_walkv, "etcd": start_etcd, "redis": start_redis}
LABELS = {"walkv": "walkv serve (HTTP)", "etcd": "etcd 3.4 (HTTP JSON gateway)",
          "redis": "Redis 7 appendfsync always (redis-py)"}


def _start(kind: str, preload: int = 0):
    def prepare(ctx: Context) -> Server:
        gone = missing_peers().get(kind)
        if gone:
            raise RuntimeError(gone)
        server = STARTERS[kind](ctx.directory)
        try:
            if preload:
                in_child("benchmarks.http_load:preload", url=server.url, kind=kind, keys=preload)
        except BaseException:
            server.stop()
            raise
        return server

    return prepare


def _stop(server: Server) -> None:
    server.stop()


def _load(kind: str, op: str, clients: int, seconds: float, keys: int = GET_KEYS):
    def run(ctx: Context) -> Measurement:
        server: Server = ctx.state
        server.check_alive()
        cpu = server.cpu_seconds()
        m = in_child("benchmarks.http_load:load", url=server.url, kind=kind, op=op, clients=clients,
                     seconds=seconds, keys=keys)
        used = server.cpu_seconds() - cpu  # warm-up requests included: a little over the timed ones
        m.extra.update(server_cpu_s=round(used, 2), server_cpu_us_per_op=round(used / max(m.ops, 1) * 1e6, 1))
        return m

    return run


def _watch(kind: str, writers: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        server: Server = ctx.state
        server.check_alive()
        return in_child("benchmarks.http_load:watch", url=server.url, kind=kind, writers=writers, seconds=seconds)

    return run


def visible_after_ack(acks: list[tuple[int, int]], samples: list[tuple[int, int]]) -> list[float]:
    """For each acknowledged ``(lsn, ack_ns)``, the seconds until the first
    ``(time_ns, applied_lsn)`` sample showing it (0 when the replica showed
    it before the acknowledgement reached the client). Samples are in time
    order; a replica's applied LSN only grows."""
    times = [t for t, _ in samples]
    applied = [a for _, a in samples]
    out = []
    for lsn, ack_ns in acks:
        i = bisect.bisect_left(applied, lsn)
        if i < len(samples):
            out.append(max(0, times[i] - ack_ns) / 1e9)
    return out


def lag_in_lsns(acks: list[tuple[int, int]], samples: list[tuple[int, int]]) -> list[int]:
    """At each sample, the newest LSN acknowledged by then minus the applied LSN."""
    by_time = sorted((ack_ns, lsn) for lsn, ack_ns in acks)
    newest, j, out = 0, 0, []
    for t, applied in samples:
        while j < len(by_time) and by_time[j][0] <= t:
            newest = max(newest, by_time[j][1])
            j += 1
        out.append(max(0, newest - applied))
    return out


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _replica_lag(rate: float, clients: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        server: Server = ctx.state
        server.check_alive()
        work = ctx.fresh_dir("replica")
        acks_path = os.path.join(work, "acks")
        samples: list[tuple[int, int]] = []
        with kvstore.open_replica(server.url, os.path.join(work, "rep")) as rep:
            with tempfile.TemporaryFile() as out:
                child = spawn_child("benchmarks.http_load:paced",
                                    {"url": server.url, "kind": "walkv", "rate": rate, "clients": clients,
                                     "seconds": seconds, "acks_path": acks_path}, stdout=out)
                stop = threading.Event()

                def sample() -> None:
                    clock = time.time_ns
                    while not stop.is_set():
                        samples.append((clock(), rep.applied_lsn))
                        time.sleep(0.0005)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                try:
                    child.wait(seconds + 120)
                    with open(acks_path) as f:
                        acks = [(int(lsn), int(ns)) for lsn, ns in map(str.split, f)]
                    rep.wait_for(max((lsn for lsn, _ in acks), default=0), timeout=60)
                    samples.append((time.time_ns(), rep.applied_lsn))
                finally:
                    stop.set()
                    sampler.join()
                    if child.poll() is None:
                        child.kill()
                        child.wait()
                out.seek(0)
                result = json.loads(out.read().decode().strip().splitlines()[-1])
            rebuilds = rep.rebuilds
        delays = visible_after_ack(acks, samples)
        lags = lag_in_lsns(acks, samples)
        m = Measurement(ops=int(result["ops"]), seconds=float(result["seconds"]))
        m.extra.update({"target_rate": rate, "put_p99_ms": result.get("p99_ms"), "rebuilds": rebuilds,
                        "samples": len(samples)})
        if delays:
            m.extra.update({"visible_after_ack_ms_p50": round(_pct(delays, 0.5) * 1000, 2),
                            "visible_after_ack_ms_p99": round(_pct(delays, 0.99) * 1000, 2),
                            "visible_after_ack_ms_max": round(max(delays) * 1000, 2)})
        if lags:
            m.extra.update({"lag_lsns_p50": _pct(lags, 0.5), "lag_lsns_p99": _pct(lags, 0.99)})
        return m

    return run


def _contenders(make_run: Any, kinds: tuple[str, ...], preload: int = 0, walkv_requires=SERVE) -> list[Contender]:
    out = []
    for kind in kinds:
        out.append(Contender(kind, make_run(kind), prepare=_start(kind, preload), cleanup=_stop,
                             requires=walkv_requires if kind == "walkv" else ("aiohttp",) if kind == "etcd"
                             else ("redis",), label=LABELS[kind]))
    return out


def _clients(n: int) -> str:
    return "1 client" if n == 1 else f"{n} concurrent clients"


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    keys = cfg.size(GET_KEYS, QUICK_GET_KEYS)
    peers = ("walkv", "etcd", "redis")
    out = []
    for clients in CLIENTS:
        out.append(Workload(
            name=f"server.put.{clients}c", issue=22, unit="puts/s",
            title=f"durable puts over the network, {_clients(clients)}",
            targets=[Target("etcd", 1.5)] if clients == 256 else [],
            params={"clients": clients, "seconds": secs}, report=REPORTED,
            contenders=_contenders(lambda kind, c=clients: _load(kind, "put", c, secs), peers)))
    for clients in CLIENTS:
        out.append(Workload(
            name=f"server.get.{clients}c", issue=22, unit="gets/s",
            title=f"gets over the network of {keys:,} keys, {_clients(clients)}",
            targets=[Target("etcd", 1.0)], params={"clients": clients, "seconds": secs, "keys": keys},
            report=REPORTED,
            contenders=_contenders(lambda kind, c=clients: _load(kind, "get", c, secs, keys), peers, preload=keys)))
    out.append(Workload(
        name="server.watch", issue=22, unit="changes/s",
        title="watch delivery over HTTP: one watcher, 16 clients putting", params={"writers": 16, "seconds": secs},
        report=("p50_ms", "p99_ms"),
        contenders=_contenders(lambda kind: _watch(kind, 16, secs), ("walkv", "etcd"))))
    rep_secs = max(secs, 1.0)
    out.append(Workload(
        name="server.replica.lag", issue=22, unit="puts/s",
        title=f"a replica over HTTP under {REPLICA_RATE:,} puts/s paced ({REPLICA_CLIENTS} clients)",
        params={"rate": REPLICA_RATE, "clients": REPLICA_CLIENTS, "seconds": rep_secs},
        report=("visible_after_ack_ms_p50", "visible_after_ack_ms_p99", "lag_lsns_p50", "lag_lsns_p99"),
        contenders=_contenders(lambda kind: _replica_lag(REPLICA_RATE, REPLICA_CLIENTS, rep_secs), ("walkv",),
                               walkv_requires=(*SERVE, "kvstore.replica.http_source:HttpSource"))))
    return out


__all__ = ["workloads"]
