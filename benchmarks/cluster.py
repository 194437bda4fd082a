"""Issue 34 workloads: a three-node walkv cluster (:mod:`benchmarks.walkv_cluster`:
one etcd member as its coordinator, ``--sync-replicas 1``: every
acknowledged put is fsynced on the leader and on a replica), against a
three-member etcd cluster on the same machine (every put in a quorum's
fsynced WAL), both driven by the same compiled load generator
(:mod:`benchmarks.wrk`). Everything runs on loopback and is stopped at the
end; the machine's CPU, ``sum(range(10**7))`` and fsync latency are in the
table's title (:mod:`benchmarks.machine`).

* ``cluster.put.{16,256}c``: durable puts/s to the leader with that many
  connections (each request a new key, 100-byte values); target at 256:
  three-node walkv >= 1x three-member etcd (to its leader, so no member
  forwards). Extra columns: the same cluster with ``--sync-replicas 0``
  (``walkv-k0``): the ratio walkv/walkv-k0 is the price of the synchronous
  replica, measured in the same run.
* ``cluster.failover`` (slow: only with ``--only cluster.failover``): 20
  kills (5 quick) of the leader with ``kill -9`` while a writer puts all
  along; each failover's time runs from the kill to the first put
  acknowledged by the new leader (in a newer epoch); the killed node is
  started again and caught up before the next kill. The limit: p99 <= the
  lease + 2 s.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from benchmarks.harness import Config, Contender, Context, Limit, Measurement, Target, Workload
from benchmarks.server_peers import Server, start_etcd_members
from benchmarks.walkv_cluster import WalkvCluster, start_cluster
from benchmarks.wrk import put_load, wrk_missing

CONNECTIONS = (16, 256)
LEASE_SECONDS = 2.0
KILLS, QUICK_KILLS = 20, 5
REQUIRES = ("kvstore.cluster",)  # the engine: skipped ("not available yet") until it is there
REPORTED = ("p50_ms", "p99_ms")


# -- durable puts -----------------------------------------------------------------------------------


def _check_tools() -> None:
    gone = wrk_missing()
    if gone:
        raise RuntimeError(gone)


def _start_walkv(sync_replicas: int):
    def prepare(ctx: Context) -> WalkvCluster:
        _check_tools()
        return start_cluster(ctx.directory, sync_replicas=sync_replicas, lease_seconds=LEASE_SECONDS)

    return prepare


def _walkv_puts(connections: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        cluster: WalkvCluster = ctx.state
        leader, epoch = cluster.wait_followed()
        cpu = cluster.cpu_seconds()
        m = put_load(cluster.urls()[leader], "walkv", connections, seconds)
        m.extra.update(epoch=epoch, nodes_cpu_us_per_op=round((cluster.cpu_seconds() - cpu) / max(m.ops, 1) * 1e6, 1))
        return m

    return run


def _start_etcd(ctx: Context) -> list[Server]:
    _check_tools()
    return start_etcd_members(ctx.directory, 3)


def etcd_leader(members: list[Server]) -> Server:
    """The member that leads (``/v3/maintenance/status``: its own id is the leader's)."""
    for member in members:
        request = urllib.request.Request(member.url + "/v3/maintenance/status", data=b"{}")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                status = json.loads(resp.read())
        except (OSError, urllib.error.URLError, ValueError):
            continue
        if status.get("leader") == status.get("header", {}).get("member_id"):
            return member
    raise RuntimeError("no etcd member says it leads")


def _etcd_puts(connections: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        members: list[Server] = ctx.state
        return put_load(etcd_leader(members).url, "etcd", connections, seconds)

    return run


def _stop(state: Any) -> None:
    if isinstance(state, WalkvCluster):
        state.stop()
    else:
        for member in state:
            member.stop()


# -- failover --------------------------------------------------------------------------------------


class Acks:
    """A writer putting to whichever node leads (following 421 answers),
    keeping each acknowledgement's (time, epoch)."""

    def __init__(self, cluster: WalkvCluster) -> None:
        self.cluster = cluster
        self.acks: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        urls, target, n = self.cluster.urls(), 0, 0
        while not self._stop.is_set():
            n += 1
            request = urllib.request.Request(f"{urls[target]}/v1/kv/failover-{n}", data=b"x" * 100, method="PUT")
            try:
                with urllib.request.urlopen(request, timeout=1.0) as resp:
                    self.acks.append((time.monotonic(), int(resp.headers.get("Walkv-Epoch", 0))))
                    continue
            except urllib.error.HTTPError as exc:
                leader = (json.loads(exc.read() or b"{}").get("error") or {}).get("leader") if exc.code == 421 else None
                target = urls.index(leader) if leader in urls else (target + 1) % len(urls)
            except OSError:
                target = (target + 1) % len(urls)
            time.sleep(0.01)

    def first_after(self, since: float, newer_than: int, timeout: float) -> float:
        """The time of the first put acknowledged after ``since`` in an epoch above ``newer_than``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [t for t, epoch in list(self.acks) if t > since and epoch > newer_than]
            if hits:
                return min(hits)
            time.sleep(0.01)
        raise RuntimeError(f"no put acknowledged in an epoch above {newer_than} within {timeout:.0f} s of the kill")

    def __enter__(self) -> Acks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _failover(kills: int):
    def run(ctx: Context) -> Measurement:
        cluster: WalkvCluster = ctx.state
        times: list[float] = []
        started = time.perf_counter()
        with Acks(cluster) as acks:
            for _ in range(kills):
                leader, epoch = cluster.wait_followed()
                acks.first_after(time.monotonic(), epoch - 1, 30)  # the writer is on the leader
                killed_at = time.monotonic()
                cluster.kill(leader)
                times.append(acks.first_after(killed_at, epoch, 60) - killed_at)
                cluster.start(leader)
        ordered = sorted(times)
        m = Measurement(ops=len(times), seconds=time.perf_counter() - started)
        m.extra.update(failover_p50_s=round(ordered[len(ordered) // 2], 3),
                       failover_p99_s=round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
                       failover_max_s=round(ordered[-1], 3), lease_seconds=LEASE_SECONDS)
        return m

    return run


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=1.0)
    out = []
    for connections in CONNECTIONS:
        out.append(Workload(
            name=f"cluster.put.{connections}c", issue=34, unit="puts/s", requires=REQUIRES,
            title=f"durable puts, 3-node walkv (--sync-replicas 1) vs 3-member etcd, wrk {connections} connections",
            targets=[Target("etcd", 1.0)] if connections == 256 else [],
            params={"connections": connections, "seconds": secs, "lease_seconds": LEASE_SECONDS}, report=REPORTED,
            contenders=[
                Contender("walkv", _walkv_puts(connections, secs), prepare=_start_walkv(1), cleanup=_stop,
                          label="walkv 3 nodes, --sync-replicas 1"),
                Contender("walkv-k0", _walkv_puts(connections, secs), prepare=_start_walkv(0), cleanup=_stop,
                          label="walkv 3 nodes, --sync-replicas 0"),
                Contender("etcd", _etcd_puts(connections, secs), prepare=_start_etcd, cleanup=_stop,
                          label="etcd 3.4, 3 members (HTTP JSON gateway)"),
            ]))
    kills = cfg.size(KILLS, QUICK_KILLS)
    out.append(Workload(
        name="cluster.failover", issue=34, unit="failovers/s", requires=REQUIRES, slow=True, repeats=1,
        title=f"failover of a 3-node walkv cluster: {kills} kill -9 of the leader, lease {LEASE_SECONDS:g} s",
        params={"kills": kills, "lease_seconds": LEASE_SECONDS},
        limits=[Limit("failover_p99_s", LEASE_SECONDS + 2.0, unit="s")],
        report=("failover_p50_s", "failover_p99_s", "failover_max_s"),
        contenders=[Contender("walkv", _failover(kills), prepare=_start_walkv(1), cleanup=_stop,
                              label="walkv 3 nodes, --sync-replicas 1")]))
    return out


__all__ = ["workloads"]
