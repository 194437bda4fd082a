"""Crash-point exploration of the store: a power loss at every durability
boundary of a kvstore workload (puts, deletes, delete_ranges, batches,
segment rolls, reopens; snapshots and retention once the store offers them).

LMDB's own files do not go through ``wal.fs`` (LMDB is a cache of snapshot
plus log), so a power loss is simulated as: the fault layer undoes what was
not durable in the log, snapshot and SESSION files, and the machine
"reboots" (the kernel boot id the store recorded changes), which makes the
store rebuild LMDB from snapshot plus log. One in a few crash points also
deletes the LMDB directory outright.

Checked after each: the store opens; its last LSN covers every acknowledged
write; its contents equal the model state after exactly that many writes (a
prefix of the attempted ones); it accepts a write and reopens cleanly; every
committed snapshot verifies and holds the model state at its LSN (no half
snapshot is ever visible); the log still holds every entry after the newest
snapshot (no segment was deleted that a snapshot did not cover).
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import time
from dataclasses import dataclass, field

import pytest

import kvstore
import kvstore.store.recovery
from tests.faultfs import (
    PLAIN,
    FaultFS,
    close_quietly,
    count_boundaries,
    plan_points,
    run_to_crash,
    scratch_dir,
)
from wal.errors import WalkvError

SEGMENT_BYTES = 2048
CI_POINTS = 250
MIN_CI_POINTS = 120
KEYS = [f"k{i:02d}".encode() for i in range(24)]
OPTIONS = {"segment_bytes": SEGMENT_BYTES, "map_size": 1 << 20}
SNAPSHOT_CHUNK_BYTES = 4096  # several chunks per snapshot


@pytest.fixture
def scratch(tmp_path):
    with scratch_dir(tmp_path) as d:
        yield d


@dataclass
class KVOracle:
    ops: dict[int, list[tuple]] = field(default_factory=dict)  # LSN -> ops attempted
    acked: int = 0

    def state(self, lsn: int) -> dict[bytes, bytes]:
        st: dict[bytes, bytes] = {}
        for i in range(1, lsn + 1):
            for op in self.ops[i]:
                if op[0] == "put":
                    st[op[1]] = op[2]
                elif op[0] == "delete":
                    st.pop(op[1], None)
                else:
                    for k in [k for k in st if op[1] <= k < op[2]]:
                        del st[k]
        return st


def make_plan(seed: int, steps: int = 50) -> list[tuple]:
    rnd = random.Random(seed)

    def value() -> bytes:
        n = rnd.choice([0, 5, 50, 200, 700, 3000]) if rnd.random() < 0.9 else 40000
        return (f"v{rnd.getrandbits(32):08x}".encode() * (n // 9 + 1))[:n]

    def op() -> tuple:
        r = rnd.random()
        if r < 0.7:
            return ("put", rnd.choice(KEYS), value())
        if r < 0.9:
            return ("delete", rnd.choice(KEYS))
        a, b = sorted(rnd.sample(KEYS, 2))
        return ("delete_range", a, b)

    plan: list[tuple] = []
    for _ in range(steps):
        r = rnd.random()
        if r < 0.68:
            plan.append(("write", [op()]))
        elif r < 0.84:
            plan.append(("write", [op() for _ in range(rnd.randint(2, 6))]))
        elif r < 0.90:
            plan.append(("reopen",))
        else:
            plan.append(("snapshot",))
    return plan


def run_kv_workload(fs: FaultFS, path: str, plan: list[tuple], oracle: KVOracle) -> None:
    # kvstore.open creates the store's directories (durably: crash points too).
    db = kvstore.open(path, fs=fs, **OPTIONS)
    try:
        for step in plan:
            if step[0] == "write":
                ops = step[1]
                lsn = db.last_lsn + 1
                oracle.ops[lsn] = ops
                if len(ops) == 1:
                    got = _single(db, ops[0])
                else:
                    with db.batch() as b:
                        for o in ops:
                            getattr(b, o[0])(*o[1:])
                    got = b.lsn
                assert got == lsn, (got, lsn)
                oracle.acked = lsn
            elif step[0] == "reopen":
                db.close()
                db = kvstore.open(path, fs=fs, **OPTIONS)
            elif step[0] == "snapshot":
                db.snapshot(chunk_bytes=SNAPSHOT_CHUNK_BYTES, keep=2)
        db.close()
    finally:
        if not db.closed:
            close_quietly(db)


def _single(db, op: tuple) -> int:
    if op[0] == "put":
        return db.put(op[1], op[2])
    if op[0] == "delete":
        return db.delete(op[1])
    return db.delete_range(op[1], op[2])


def check_store(path: str, oracle: KVOracle, where: str) -> None:
    with kvstore.open(path, **OPTIONS) as db:
        last = db.last_lsn
        assert last >= oracle.acked, f"{where}: acknowledged LSNs {last + 1}..{oracle.acked} lost"
        assert last <= max(oracle.ops, default=0), f"{where}: LSN {last} was never written"
        assert db.applied_lsn == last, f"{where}: applied {db.applied_lsn}, log at {last}"
        expected = oracle.state(last)
        got = dict(db.scan())
        assert got == expected, f"{where}: the state is not the model's after LSN {last}: {_diff(got, expected)}"
        assert len(db) == len(expected)
        lsn = db.put(b"after", b"crash")
        assert lsn == last + 1
    check_snapshots(path, oracle, where)
    with kvstore.open(path, **OPTIONS) as db:
        assert db.last_lsn == last + 1 and db.get(b"after") == b"crash"
        assert db.rebuilt is None, f"{where}: rebuilt after a clean close: {db.rebuilt}"


def check_snapshots(path: str, oracle: KVOracle, where: str) -> None:
    snaps_dir = os.path.join(path, "snapshots")
    if not os.path.isdir(snaps_dir):
        return
    import snapshot
    import wal

    infos = snapshot.list_snapshots(snaps_dir)
    for info in infos:
        snap = snapshot.open(info.path)
        snap.verify()
        assert dict(snap) == oracle.state(snap.lsn), f"{where}: snapshot at LSN {snap.lsn} is not the model's state"
    newest = max((i.lsn for i in infos), default=0)
    first = wal.segment.list_segments(os.path.join(path, "wal"))[0].first_lsn
    assert first <= newest + 1, (
        f"{where}: the log starts at LSN {first}, but the newest snapshot only covers LSN {newest}")


def _diff(got: dict, expected: dict) -> str:
    keys = sorted(set(got) | set(expected))
    bad = [k for k in keys if got.get(k) != expected.get(k)]
    return ", ".join(f"{k!r}: {(got.get(k) or b'-')[:12]!r} vs {(expected.get(k) or b'-')[:12]!r}" for k in bad[:5])




def _known_bug(error: BaseException) -> str | None:
    """The known, reported, strict-xfail-tested bug that ``error`` is an
    instance of, if any. Remove an entry when its xfail test starts passing."""
    return None


def crash_kv_recovery(d: str, oracle: KVOracle, where: str, rng: random.Random, reboot) -> int:
    """After a power loss, lose power again at each boundary of the store's
    recovery (open after a reboot: LMDB rebuilt from snapshot plus log; then
    close), reboot, and check. Works on copies of the crashed store."""
    def reopen(fs: FaultFS, path: str) -> None:
        db = kvstore.open(path, fs=fs, **OPTIONS)
        try:
            db.close()
        finally:
            if not db.closed:
                close_quietly(db)

    if not os.path.isdir(d):
        return 0  # the power loss took the directory itself (its creation was not yet durable)
    probe = d + ".probe"
    shutil.copytree(d, probe)
    reboot()
    m = count_boundaries(lambda fs: reopen(fs, probe))
    shutil.rmtree(probe)
    for j in range(1, m + 1):
        copy = f"{d}.r{j}"
        shutil.copytree(d, copy)
        reboot()
        run_to_crash(lambda fs: reopen(fs, copy), FaultFS(), j, PLAIN, rng)
        reboot()
        check_store(copy, oracle, f"{where}, then again at recovery boundary {j}/{m}")
        shutil.rmtree(copy)
    return m


def explore_kv(base: str, seed: int, budget: int | None, reboot, deadline: float | None = None,
               *, recovery_crashes: bool = False) -> dict[str, int]:
    plan = make_plan(seed)
    n = count_boundaries(lambda fs: run_kv_workload(fs, os.path.join(base, "dry"), plan, KVOracle()))
    shutil.rmtree(os.path.join(base, "dry"))
    points = plan_points(n, budget=budget, seed=seed)
    rng = random.Random(seed)
    stats: dict = {"boundaries": n, "points": 0, "lmdb_deleted": 0, "recovery_points": 0, "failures": [],
                   "known": {}}
    for k, variant in points:
        if deadline is not None and time.monotonic() > deadline:
            break
        d = os.path.join(base, f"k{k}-{variant}")
        oracle = KVOracle()
        run_to_crash(lambda fs: run_kv_workload(fs, d, plan, oracle), FaultFS(), k if k <= n else None,
                     variant, rng)
        reboot()
        where = f"seed {seed}, crash point {k}/{n + 1} ({variant})"
        stats["points"] += 1
        try:
            if recovery_crashes:
                stats["recovery_points"] += crash_kv_recovery(d, oracle, where, rng, reboot)
            if variant == PLAIN and k % 5 == 0:
                shutil.rmtree(os.path.join(d, "lmdb"), ignore_errors=True)
                stats["lmdb_deleted"] += 1
            check_store(d, oracle, where)
        except (AssertionError, WalkvError) as e:  # collected, so that one bug does not hide the next
            known = _known_bug(e)
            if known:
                stats["known"][known] = stats["known"].get(known, 0) + 1
            else:
                stats["failures"].append(f"{where}: {type(e).__name__}: {e}")
        shutil.rmtree(d, ignore_errors=True)
        for extra in glob.glob(d + ".*"):
            shutil.rmtree(extra, ignore_errors=True)
    return stats


def test_store_crash_points(scratch, reboot, capsys):
    stats = explore_kv(scratch, seed=6, budget=CI_POINTS, reboot=reboot)
    assert not stats["failures"], "\n".join(stats["failures"][:10])
    with capsys.disabled():
        print(f"\nstore crash points explored: {stats['points']} (of {stats['boundaries']} boundaries, "
              f"seed 6, snapshots on)")
    assert stats["points"] >= MIN_CI_POINTS, stats


def test_store_crash_points_during_recovery(scratch, reboot, capsys):
    """A second power loss while the store rebuilds after the first (a sample
    of first crash points in CI; every one with --soak)."""
    plan = make_plan(6)
    n = count_boundaries(lambda fs: run_kv_workload(fs, os.path.join(scratch, "dry"), plan, KVOracle()))
    rng = random.Random(6)
    total = 0
    for k in sorted(rng.sample(range(1, n + 1), 4)) + [n + 1]:
        d = os.path.join(scratch, f"k{k}")
        oracle = KVOracle()
        run_to_crash(lambda fs: run_kv_workload(fs, d, plan, oracle), FaultFS(), k if k <= n else None,
                     "torn", rng)
        total += crash_kv_recovery(d, oracle, f"seed 6, crash point {k}", rng, reboot)
    with capsys.disabled():
        print(f"\nstore crash points during recovery explored: {total}")
    assert total >= 20


def test_store_survives_power_loss_without_reboot_detection_of_lmdb_loss(tmp_path, reboot):
    """Power loss after acknowledged writes, LMDB directory gone entirely:
    the store rebuilds it from the log."""
    oracle = KVOracle()
    plan = make_plan(5, steps=20)
    fs = FaultFS()
    run_kv_workload(fs, str(tmp_path / "s"), plan, oracle)
    fs.crash()
    fs.power_loss()
    reboot()
    shutil.rmtree(tmp_path / "s" / "lmdb", ignore_errors=True)
    check_store(str(tmp_path / "s"), oracle, "lmdb deleted")


@pytest.mark.soak
@pytest.mark.timeout(0)  # bounded by --soak-seconds instead
def test_store_crash_points_soak(scratch, reboot, capsys, soak_seconds):
    """Every boundary and every variant of as many workload seeds as fit in
    ``--soak-seconds``."""
    deadline = time.monotonic() + soak_seconds
    totals: dict = {"points": 0, "seeds": 0}
    failures: list[str] = []
    seed = 200
    while time.monotonic() < deadline:
        stats = explore_kv(os.path.join(scratch, f"s{seed}"), seed, None, reboot, deadline,
                           recovery_crashes=(seed % 2 == 1))
        totals["points"] += stats["points"]
        totals["recovery_points"] = totals.get("recovery_points", 0) + stats["recovery_points"]
        failures += stats["failures"]
        for bug, count in stats["known"].items():
            totals.setdefault("known", {})[bug] = totals.get("known", {}).get(bug, 0) + count
        totals["seeds"] += 1
        seed += 1
    with capsys.disabled():
        print(f"\nstore crash points explored (soak): {totals}, failures: {len(failures)}")
    assert not failures, f"{len(failures)} crash points failed:\n" + "\n".join(failures[:10])
    assert totals["points"] >= 100
