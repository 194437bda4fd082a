"""Proof, as Jepsen would try it: three real ``walkv serve`` nodes of one
cluster and a real etcd on loopback, clients writing and reading all along
(tests/cluster_workload.py), and faults, each repeated:

* ``kill-leader``: kill -9 of the leader (restarted afterwards, it rejoins);
* ``pause-leader``: SIGSTOP of the leader past its lease, writes sent
  straight to it meanwhile, then SIGCONT;
* ``partition``: the leader cut off from etcd and from the other nodes
  through the proxies (tests/cluster_proxy.py), its links stalling, then
  dropping (blackhole), then refusing, round after round, while the test's
  clients still reach it on its own port; healed after each;
* ``kill-during-failover``: the leader killed, then the node that takes over
  killed as soon as it says it leads;
* ``kill-replica``: a replica killed, the writes going on, then restarted;
* ``stale-disk-leader``: the replicas' directories copied while they
  follow, the leader killed, the replica that takes over killed once it
  acknowledged writes that only the old leader confirmed, its old
  directory put back and started again while the old leader is paused:
  no leader may be elected until the old leader is back.

With ``--sync-replicas 0`` nothing but the lease fences a deposed leader:
``test_a_leader_with_no_sync_replicas_cut_off_past_its_lease_acknowledges_nothing``
cuts the leader off from etcd and the other nodes, sends writes straight to
it once its lease ran out, and holds that none is acknowledged.

After the faults every node is stopped and the checks of
tests/cluster_checks.py run on their logs and on what the clients saw: 0
acknowledged writes lost, one node acknowledging per epoch, no
``(timeline, LSN)`` with two entries, the registers' history linearizable,
no read served from a forked history. A row per fault goes to the fault
table, printed at the end (``-s``) and written to build/cluster-faults.json.

Sized for CI (:data:`FAULTS` says how many rounds of each, 1 s leases);
``--soak`` runs each fault for ``--soak-seconds``. Skipped when etcd is not
installed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.cluster_checks import read_log, verdict
from tests.cluster_etcd import Etcd, etcd_missing
from tests.cluster_nodes import Cluster
from tests.cluster_proxy import BLACKHOLE, REFUSE, STALL
from tests.cluster_workload import Workload

pytestmark = [pytest.mark.crash, pytest.mark.skipif(etcd_missing() is not None, reason=str(etcd_missing()))]

LEASE_SECONDS = 1.0
SYNC_REPLICAS = 1
TABLE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build",
                          "cluster-faults.json")
TABLE: list[dict] = []

Nemesis = Callable[[Cluster, Workload, int], None]


# -- the faults ---------------------------------------------------------------------------------


def kill_leader(c: Cluster, w: Workload, _round: int) -> None:
    leader, epoch = c.wait_followed()
    w.fault("kill -9 leader", leader, epoch)
    leader.kill()
    c.wait_for_leader(newer_than=epoch, among=c.replicas(leader))
    w.wait_progress(newer_than_epoch=epoch)
    leader.start()


def pause_leader(c: Cluster, w: Workload, _round: int) -> None:
    leader, epoch = c.wait_followed()
    w.fault("SIGSTOP leader past its lease", leader, epoch)
    leader.pause()
    waiting = w.probe(leader)  # answered first thing after SIGCONT, before it learns it was deposed
    c.wait_for_leader(newer_than=epoch, among=c.replicas(leader))
    w.wait_progress(newer_than_epoch=epoch)
    leader.resume()
    waiting()


def partition(c: Cluster, w: Workload, round_: int) -> None:
    mode = (STALL, BLACKHOLE, REFUSE)[round_ % 3]
    leader, epoch = c.wait_followed()
    w.fault(f"partition of the leader ({mode})", leader, epoch)
    c.network.isolate(leader.name, mode)
    waiting = w.probe(leader)  # the test's clients still reach it
    try:
        c.wait_for_leader(newer_than=epoch, among=c.replicas(leader))
        w.wait_progress(newer_than_epoch=epoch)
        waiting()
    finally:
        c.network.heal()


def kill_during_failover(c: Cluster, w: Workload, _round: int) -> None:
    leader, epoch = c.wait_followed()
    w.fault("kill -9 leader, then its successor", leader, epoch)
    leader.kill()
    successor, new_epoch = c.wait_for_leader(newer_than=epoch, among=c.replicas(leader), agreed=False)
    successor.kill()  # as soon as it says it leads: maybe before it acknowledged anything
    leader.start()
    c.wait_for_leader(newer_than=new_epoch)
    w.wait_progress(newer_than_epoch=new_epoch)
    successor.start()


def kill_replica(c: Cluster, w: Workload, round_: int) -> None:
    leader, epoch = c.wait_followed()
    replica = c.replicas(leader)[round_ % 2]
    w.fault("kill -9 replica, restarted", leader, epoch)
    replica.kill()
    w.wait_progress()  # the other replica is enough for --sync-replicas 1
    replica.start()


def stale_disk_leader(c: Cluster, w: Workload, round_: int) -> None:
    """The worst case for the election (kvstore/cluster/election.py: a disk
    that goes back): the successor's writes are confirmed by the old leader
    alone (the third node paused meanwhile), the successor comes back on a
    copy from before it led, and the old leader, the one other holder of
    those writes, is paused while the two others freeze. Counting the
    rolled-back node among the N - K, they would elect one of themselves and
    lose the writes; they must wait for the old leader instead."""
    leader, epoch = c.wait_followed()
    stale = {}
    for replica in c.replicas(leader):  # whichever takes over next, its old disk is kept
        stale[replica.name] = os.path.join(replica.directory, f"stale-{round_}")
        replica.pause()  # a consistent image of a running replica: what a crash would leave
        try:
            shutil.copytree(replica.store, stale[replica.name])
        finally:
            replica.resume()
    w.wait_progress()
    w.fault("kill -9 leader", leader, epoch)
    leader.kill()
    successor, led_epoch = c.wait_for_leader(newer_than=epoch, among=c.replicas(leader))
    leader.start()
    c.wait_followed()
    third = next(n for n in c.replicas(successor) if n is not leader)
    third.pause()
    try:
        w.wait_progress(newer_than_epoch=epoch)  # acknowledged with the old leader alone: its old disk lacks them
        w.fault("leader restarted with a stale disk", successor, led_epoch)
        leader.pause()
        successor.kill()
    finally:
        third.resume()
    held, kept = (read_log(successor.name, os.path.join(d, "wal")).last_lsn
                  for d in (successor.store, stale[successor.name]))
    assert kept < held, f"the copy of {successor.name} is not stale: LSN {kept} of {held}"  # the fault happened
    shutil.rmtree(successor.store)
    shutil.copytree(stale[successor.name], successor.store)
    successor.start()
    try:
        deadline = time.monotonic() + 60
        while any((n.status() or {}).get("leader", "") is not None for n in (third, successor)):
            assert time.monotonic() < deadline, f"the successor's lease outlived it: {c.statuses()}"
            time.sleep(0.05)  # until both see the successor's lease gone: they freeze, and may ask
        time.sleep(3 * LEASE_SECONDS)  # time enough for them to elect one of themselves, were they allowed to
        assert c.leader([third, successor], agreed=False) is None, \
            f"elected without the one node holding epoch {led_epoch}'s writes: {c.statuses()}\n{c.logs()}"
    finally:
        leader.resume()
    c.wait_for_leader(newer_than=led_epoch)
    w.wait_progress(newer_than_epoch=led_epoch)


FAULTS: dict[str, tuple[Nemesis, int]] = {  # name: (the fault, its rounds in the default suite)
    "kill-leader": (kill_leader, 2),
    "pause-leader": (pause_leader, 1),
    "partition": (partition, 2),
    "kill-during-failover": (kill_during_failover, 1),
    "kill-replica": (kill_replica, 2),
    "stale-disk-leader": (stale_disk_leader, 1),
}


# -- running one ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory):
    with Etcd(str(tmp_path_factory.mktemp("etcd"))) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def fault_table():
    yield
    if TABLE:
        print_table(TABLE)


def run(fault: str, etcd: Etcd, directory: str, *, rounds: int | None = None, seconds: float | None = None) -> dict:
    """Start a cluster, run the workload under ``fault`` for ``rounds``
    rounds (or ``seconds``), stop everything, check; the fault table's row."""
    nemesis = FAULTS[fault][0]
    with Cluster(directory, etcd, name=f"t-{fault}-{uuid.uuid4().hex[:8]}", sync_replicas=SYNC_REPLICAS,
                 lease_seconds=LEASE_SECONDS) as cluster:
        cluster.start()
        cluster.wait_followed()
        with Workload(cluster) as workload:
            workload.wait_progress()
            started, n = time.monotonic(), 0
            while (n < rounds) if rounds is not None else (time.monotonic() - started < (seconds or 0)):
                nemesis(cluster, workload, n)
                cluster.wait_followed()
                workload.wait_progress()
                n += 1
        assert not workload.crashes, workload.crashes
        leader, found = workload.final_reads()
        codes = cluster.stop()
        logs = [read_log(node.name, os.path.join(node.store, "wal")) for node in cluster.nodes]
        result = verdict(logs, leader.name, workload.writes, workload.history.ops(), found)
        failovers = [s for s in (workload.failover_seconds(f) for f in workload.faults
                                 if not f.name.startswith("kill -9 replica")) if s is not None]
        row = {"fault": fault, "rounds": n, **result.stats, "failovers": len(failovers),
               "failover_p50_s": _percentile(failovers, 0.5), "failover_p99_s": _percentile(failovers, 0.99),
               "lost": len(result.problems["0 acknowledged writes lost"]), "ok": result.ok,
               "exit_codes": codes, "discarded": _discarded(cluster)}
        TABLE.append(row)
        assert result.ok, f"{fault}: {result.text()}\n{json.dumps(row)}\n{cluster.logs(60)}"
        return row


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)


def _discarded(cluster: Cluster) -> list[str]:
    """What the nodes said about entries discarded past a fork (their stderr lines)."""
    return [f"{n.name}: {line.strip()}" for n in cluster.nodes for line in n.stderr().splitlines()
            if "discard" in line.lower()]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault(fault: str, etcd: Etcd, tmp_path) -> None:
    run(fault, etcd, str(tmp_path), rounds=FAULTS[fault][1])


@pytest.mark.soak
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_soak(fault: str, etcd: Etcd, tmp_path, soak_seconds: float) -> None:
    run(fault, etcd, str(tmp_path), seconds=soak_seconds)


def test_a_leader_with_no_sync_replicas_cut_off_past_its_lease_acknowledges_nothing(etcd: Etcd, tmp_path) -> None:
    """K = 0: no replica refuses a deposed leader's writes, so its lease (by
    its own monotonic clock, less a margin) is the fence. The leader is cut
    off from etcd and the other nodes, its links stalling: it cannot renew,
    and hears nothing that would make it step down until its request to etcd
    times out. Writes sent straight to it once its lease ran out (by then a
    new leader may be elected) are refused or fail, never 2xx, and no node
    serves them afterwards. (The lease clock itself, without etcd's answers:
    tests/test_cluster_election.py.)"""
    with Cluster(str(tmp_path), etcd, name=f"t-k0-{uuid.uuid4().hex[:8]}", sync_replicas=0,
                 lease_seconds=LEASE_SECONDS) as cluster:
        cluster.start()
        leader, epoch = cluster.wait_followed()
        with httpx.Client(timeout=30) as http:
            assert http.put(leader.direct + "/v1/kv/k0-before", content=b"b").status_code == 200
            cluster.network.isolate(leader.name, STALL)
            try:
                time.sleep(LEASE_SECONDS * 1.2)  # past the lease it last renewed, which was before the cut
                answers = []
                for i in range(4):
                    try:
                        resp = http.put(leader.direct + f"/v1/kv/k0-probe-{i}", content=b"p")
                        answers.append(f"{resp.status_code} {resp.text[:200]}")
                    except httpx.HTTPError as exc:
                        answers.append(f"no answer: {type(exc).__name__}")
                cluster.wait_for_leader(newer_than=epoch, among=cluster.replicas(leader))
            finally:
                cluster.network.heal()
            assert not any(a.startswith("2") for a in answers), answers
            cluster.wait_followed()
            for node in cluster.nodes:
                for i in range(4):  # never acknowledged, never served (a node opening its store again answers 503)
                    assert _answer(http, node.direct + f"/v1/kv/k0-probe-{i}") == 404, (node.name, i)


def _answer(http: httpx.Client, url: str, timeout: float = 30.0) -> int:
    """The status of a GET of ``url`` once the node answers it (not 503)."""
    deadline = time.monotonic() + timeout
    while True:
        status = http.get(url).status_code
        if status != 503 or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


# -- the table ------------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    """The fault table on stdout (seen with ``-s``) and as JSON in build/."""
    os.makedirs(os.path.dirname(TABLE_PATH), exist_ok=True)
    with open(TABLE_PATH, "w") as f:
        json.dump({"lease_seconds": LEASE_SECONDS, "sync_replicas": SYNC_REPLICAS, "rows": rows}, f, indent=1)
    head = ("fault", "rounds", "acknowledged", "lost", "unknown", "failover p50 s", "failover p99 s", "reads",
            "registers", "history ops", "of them unknown", "max ops/register", "configurations", "checker ms", "ok")
    body = [(r["fault"], r["rounds"], r["acknowledged"], r["lost"], r["unknown"], r["failover_p50_s"],
             r["failover_p99_s"], r["reads_checked"], r["registers"], r["history_ops"], r["history_unknown"],
             r["register_max_ops"], r["configurations"], r["checker_ms"], r["ok"]) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    print(f"\ncluster faults (3 nodes, --sync-replicas {SYNC_REPLICAS}, --lease-seconds {LEASE_SECONDS:g}; "
          f"{TABLE_PATH}):")
    for line in (head, *body):
        print("  ".join(str(x).ljust(wd) for x, wd in zip(line, widths)))
    all_failovers = [r["failover_p50_s"] for r in rows if r["failover_p50_s"] is not None]
    if all_failovers:
        print(f"median of the faults' failover p50: {statistics.median(all_failovers):.2f} s")
