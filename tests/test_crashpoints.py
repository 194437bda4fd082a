"""Crash-point exploration of the log: a power loss at every durability boundary.

A deterministic workload (appends of every size, batches, segment rolls,
reopen, truncate_before, truncate_after) runs once through the fault-injecting
file system to count its boundaries (every sync, fsync_dir, rename, unlink,
rmdir). Then, for each boundary k, it runs again and the machine loses power
at the k-th: unsynced writes and undirsynced name changes are undone (in the
"torn" and "reordered" variants, part of them survive the way real disks let
them). The log is reopened with the real file system and checked against an
oracle:

* every acknowledged append is there, with its payload, at its LSN;
* the log is a prefix of what was attempted (no entry from nowhere, no stale
  entry from before a truncate_after, no gap);
* no segment was deleted that truncate_before did not ask for;
* an interrupted truncate_after is either not done or done, never half;
* the reopened log accepts appends, verifies clean, and reopens again.

CI runs a few hundred crash points; ``--soak`` runs every variant at every
boundary of several workloads, and crashes again during recovery.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import time
from dataclasses import dataclass, field

import pytest

import wal
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
CI_POINTS = 360          # crash points in the CI run of the main workload
MIN_CI_POINTS = 250


@pytest.fixture
def scratch(tmp_path):
    with scratch_dir(tmp_path) as d:
        yield d


@dataclass
class LogOracle:
    model: dict[int, bytes] = field(default_factory=dict)  # LSN -> payload attempted (current timeline)
    acked: int = 0                    # highest LSN whose append returned
    truncate_before: int = 1          # highest LSN passed to truncate_before (attempted)
    truncate_after: int | None = None  # the LSN of a truncate_after in flight


def make_plan(seed: int, steps: int = 70) -> list[tuple]:
    """A workload: mostly small appends (many per segment), a few large ones
    (fragmented records, preallocation growth), batches, and now and then a
    reopen, a sync, a truncate_before or a truncate_after."""
    rnd = random.Random(seed)
    plan: list[tuple] = []
    for i in range(steps):
        r = rnd.random()
        if r < 0.55:
            plan.append(("append", _payload(rnd, i, 0)))
        elif r < 0.65:
            plan.append(("append", _payload(rnd, i, 0, big=True)))
        elif r < 0.80:
            plan.append(("batch", [_payload(rnd, i, j) for j in range(rnd.randint(2, 6))]))
        elif r < 0.86:
            plan.append(("truncate_before", rnd.randint(0, 6)))
        elif r < 0.91:
            plan.append(("truncate_after", rnd.randint(1, 4)))
        elif r < 0.96:
            plan.append(("reopen",))
        else:
            plan.append(("sync",))
    return plan


def _payload(rnd: random.Random, step: int, j: int, big: bool = False) -> bytes:
    size = rnd.choice([40000, 70000, 33000]) if big else rnd.randint(0, 400)
    head = f"<{step}.{j}>".encode()
    body = bytes(rnd.getrandbits(8) for _ in range(min(size, 64)))
    return (head + body * (size // max(1, len(body)) + 1))[: max(size, len(head))]


def run_log_workload(fs: FaultFS, directory: str, plan: list[tuple], oracle: LogOracle,
                     sync: str = "always") -> None:
    """Run ``plan``. With ``sync="always"`` (and ``"none"``, whose promise is
    weaker: the explorer must catch it) an append is acknowledged when it
    returns; with ``sync="batch"`` only what ``sync()`` or a clean ``close()``
    covered is (the flusher is held off so the run is deterministic)."""
    # wal.open creates the directory (durably: a crash point too).
    options = {"segment_bytes": SEGMENT_BYTES, "sync": sync}
    if sync == "batch":
        options.update(sync_interval=1e9, sync_bytes=1 << 60)
    acks_on_return = sync != "batch"
    log = wal.open(directory, fs=fs, **options)
    try:
        for step in plan:
            kind = step[0]
            if kind == "append":
                lsn = log.last_lsn + 1
                oracle.model[lsn] = step[1]
                assert log.append(step[1]) == lsn
                if acks_on_return:
                    oracle.acked = lsn
            elif kind == "batch":
                first = log.last_lsn + 1
                for i, p in enumerate(step[1]):
                    oracle.model[first + i] = p
                got = log.append_batch(step[1])
                assert got == (first, first + len(step[1]) - 1)
                if acks_on_return:
                    oracle.acked = got[1]
            elif kind == "truncate_before":
                target = max(1, oracle.acked - step[1])
                oracle.truncate_before = max(oracle.truncate_before, target)
                log.truncate_before(target)
            elif kind == "truncate_after":
                t = max(log.first_lsn - 1, oracle.acked - step[1])
                oracle.truncate_after = t
                log.truncate_after(t)
                oracle.truncate_after = None
                for lsn in [lsn for lsn in oracle.model if lsn > t]:
                    del oracle.model[lsn]
                oracle.acked = min(oracle.acked, t)
            elif kind == "reopen":
                last = log.last_lsn
                log.close()
                oracle.acked = max(oracle.acked, last)  # a clean close syncs everything
                log = wal.open(directory, fs=fs, **options)
            elif kind == "sync":
                oracle.acked = max(oracle.acked, log.sync())
        last = log.last_lsn
        log.close()
        oracle.acked = max(oracle.acked, last)
    finally:
        if not log.closed:
            close_quietly(log)  # the machine is off; release the lock


def check_log(directory: str, oracle: LogOracle, where: str) -> int:
    """Reopen with the real file system and check the oracle; returns the last LSN."""
    log = wal.open(directory, segment_bytes=SEGMENT_BYTES)
    try:
        first, last = log.first_lsn, log.last_lsn
        entries = list(log.read(first)) if last >= first else []
        lsns = [lsn for lsn, _ in entries]
        assert lsns == list(range(first, last + 1)), f"{where}: LSNs not consecutive from {first}: {lsns[:5]}..."
        for lsn, payload in entries:
            assert oracle.model.get(lsn) == payload, f"{where}: LSN {lsn} holds a payload never appended there"
        t = oracle.truncate_after
        if not (t is not None and last == t):
            assert last >= oracle.acked, f"{where}: acknowledged LSNs {last + 1}..{oracle.acked} lost"
        assert last <= max(oracle.model, default=0), f"{where}: LSN {last} was never appended"
        assert first <= max(1, oracle.truncate_before), (
            f"{where}: the log starts at {first}, but truncate_before asked for no more than {oracle.truncate_before}")
        assert log.durable_lsn == last
        lsn = log.append(b"after the crash")
        assert lsn == last + 1, f"{where}: next LSN {lsn} after {last}"
        assert list(log.read(lsn)) == [(lsn, b"after the crash")]
    finally:
        log.close()
    assert wal.verify(directory) == [], f"{where}: {wal.verify(directory)}"
    with wal.open(directory, segment_bytes=SEGMENT_BYTES) as again:
        assert again.last_lsn == last + 1 and again.first_lsn == first
    return last


def _known_bug(d: str, error: BaseException) -> str | None:
    """The known, reported, strict-xfail-tested bug that ``error`` (met
    checking the crashed directory ``d``) is an instance of, if any. Remove an
    entry when its xfail test starts passing."""
    return None


def explore_log(base: str, seed: int, budget: int | None, *, recovery_crashes: bool = False,
                sync: str = "always", deadline: float | None = None) -> dict:
    """Explore the crash points of one workload. Failures are collected (so
    that one bug does not hide the next) and returned in ``stats["failures"]``;
    instances of known bugs are counted in ``stats["known"]``."""
    plan = make_plan(seed)
    n = count_boundaries(lambda fs: run_log_workload(fs, os.path.join(base, "dry"), plan, LogOracle(), sync))
    shutil.rmtree(os.path.join(base, "dry"))
    points = plan_points(n, budget=budget, seed=seed)
    stats: dict = {"boundaries": n, "points": 0, "recovery_points": 0, "failures": [], "known": {}}
    rng = random.Random(seed)
    for k, variant in points:
        if deadline is not None and time.monotonic() > deadline:
            break
        d = os.path.join(base, f"k{k}-{variant}")
        oracle = LogOracle()
        fs = FaultFS()
        run_to_crash(lambda fs: run_log_workload(fs, d, plan, oracle, sync), fs, k if k <= n else None, variant, rng)
        where = f"seed {seed}, crash point {k}/{n + 1} ({variant})"
        stats["points"] += 1
        try:
            if recovery_crashes:
                stats["recovery_points"] += crash_recovery(d, oracle, where, rng)
            check_log(d, oracle, where)
        except (AssertionError, WalkvError) as e:
            known = _known_bug(d, e)
            if known:
                stats["known"][known] = stats["known"].get(known, 0) + 1
            else:
                stats["failures"].append(f"{where}: {type(e).__name__}: {e}")
        shutil.rmtree(d, ignore_errors=True)
        for extra in glob.glob(d + ".*"):
            shutil.rmtree(extra, ignore_errors=True)
    return stats


def _no_failures(stats: dict) -> None:
    assert not stats["failures"], f"{len(stats['failures'])} crash points failed:\n" + "\n".join(stats["failures"][:10])


def crash_recovery(d: str, oracle: LogOracle, where: str, rng: random.Random) -> int:
    """Lose power again at each boundary of the recovery itself (open then
    close), then check. Works on copies of the crashed directory."""
    def reopen(fs: FaultFS, path: str) -> None:
        log = wal.open(path, fs=fs, segment_bytes=SEGMENT_BYTES)
        try:
            log.close()
        finally:
            if not log.closed:
                log.close()

    if not os.path.isdir(d):
        return 0  # the power loss took the directory itself (its creation was not yet durable)
    probe = d + ".probe"
    shutil.copytree(d, probe)
    m = count_boundaries(lambda fs: reopen(fs, probe))
    shutil.rmtree(probe)
    for j in range(1, m + 1):
        copy = f"{d}.r{j}"
        shutil.copytree(d, copy)
        run_to_crash(lambda fs: reopen(fs, copy), FaultFS(), j, PLAIN, rng)
        check_log(copy, oracle, f"{where}, then again at recovery boundary {j}/{m}")
        shutil.rmtree(copy)
    return m


def test_log_crash_points(scratch, capsys):
    stats = explore_log(scratch, seed=7, budget=CI_POINTS)
    _no_failures(stats)
    with capsys.disabled():
        print(f"\nlog crash points explored: {stats['points']} (of {stats['boundaries']} boundaries, seed 7)")
    assert stats["boundaries"] >= 150, stats
    assert stats["points"] >= MIN_CI_POINTS, stats


def test_log_crash_points_during_recovery(scratch, capsys):
    """A second power loss while recovering from the first (a sample in CI)."""
    plan_seed = 11
    plan = make_plan(plan_seed, steps=25)
    n = count_boundaries(lambda fs: run_log_workload(fs, os.path.join(scratch, "dry"), plan, LogOracle()))
    rng = random.Random(plan_seed)
    total = 0
    for k in sorted(rng.sample(range(1, n + 1), min(n, 12))):
        d = os.path.join(scratch, f"k{k}")
        oracle = LogOracle()
        run_to_crash(lambda fs: run_log_workload(fs, d, plan, oracle), FaultFS(), k, "torn", rng)
        total += crash_recovery(d, oracle, f"seed {plan_seed}, crash point {k}", rng)
    with capsys.disabled():
        print(f"\nlog crash points during recovery explored: {total}")
    assert total >= 12


def test_log_crash_points_batch_mode(scratch, capsys):
    """sync="batch": what sync() returned as durable, and everything before
    a clean close, survives a power loss at every boundary."""
    stats = explore_log(scratch, seed=23, budget=120, sync="batch")
    _no_failures(stats)
    with capsys.disabled():
        print(f"\nlog crash points explored (sync='batch'): {stats['points']} (of {stats['boundaries']} boundaries)")
    assert stats["points"] >= 60


def test_explorer_catches_acknowledged_but_unsynced_writes(scratch):
    """The explorer can fail: a log that acknowledges before fsyncing
    (sync="none", the documented trade-off) loses acknowledged appends at
    some crash point, and the explorer says which."""
    stats = explore_log(scratch, seed=7, budget=40, sync="none")
    assert any("acknowledged LSNs" in f and "lost" in f for f in stats["failures"]), stats["failures"][:3]


def test_new_log_directory_survives_power_loss(tmp_path):
    """wal.open creates its directory; an fsynced append in it must survive a
    power loss, so the directory's own name must be made durable (an fsync of
    its parent) before anything in it is acknowledged."""
    fs = FaultFS()
    d = str(tmp_path / "newstore" / "wal")
    log = wal.open(d, fs=fs, segment_bytes=SEGMENT_BYTES)
    lsn = log.append(b"acknowledged")
    fs.crash()
    close_quietly(log)
    fs.power_loss()
    assert os.path.isdir(d), "the log directory itself was lost: its creation was never made durable"
    with wal.open(d) as log:
        assert list(log.read()) == [(lsn, b"acknowledged")]


@pytest.mark.soak
@pytest.mark.timeout(0)  # bounded by --soak-seconds instead
def test_log_crash_points_soak(scratch, capsys, soak_seconds):
    """Every boundary, every variant, a crash during each recovery, over as
    many workload seeds as fit in ``--soak-seconds``."""
    deadline = time.monotonic() + soak_seconds
    totals: dict = {"points": 0, "recovery_points": 0, "seeds": 0, "known": {}}
    failures: list[str] = []
    seed = 100
    while time.monotonic() < deadline:
        stats = explore_log(os.path.join(scratch, f"s{seed}"), seed, None, recovery_crashes=True,
                            deadline=deadline)
        totals["points"] += stats["points"]
        totals["recovery_points"] += stats["recovery_points"]
        totals["seeds"] += 1
        for bug, count in stats["known"].items():
            totals["known"][bug] = totals["known"].get(bug, 0) + count
        failures += stats["failures"]
        seed += 1
    with capsys.disabled():
        print(f"\nlog crash points explored (soak): {totals}, failures: {len(failures)}")
    _no_failures({"failures": failures})
    assert totals["points"] >= 100


def test_interrupted_truncate_after_with_partly_zeroed_tail(tmp_path):
    """The disk state a power loss leaves during truncate_after(4): the
    TRUNCATE marker is durable, and of the zeros written over the entries
    after LSN 4 one sector inside entry 5 reached the disk (not its header).
    Open must finish the truncation, not refuse."""
    from wal.record_reader import RecordReader
    from wal.truncation import TRUNCATE_MARKER

    d = str(tmp_path / "log")
    with wal.open(d, segment_bytes=1 << 20) as log:
        for i in range(10):
            log.append(bytes([65 + i]) * 1500)
    seg = wal.segment.list_segments(d)[0].path
    with open(seg, "rb") as fh:
        offsets = [off for off, _ in RecordReader(fh, path=seg, zeros_end=True).records()]
    start5, start6 = offsets[5], offsets[6]  # record 0 is the header
    sector = (start5 + 7 + 511) // 512 * 512
    assert sector + 512 <= start6
    with open(seg, "r+b") as fh:
        fh.seek(sector)
        fh.write(bytes(512))
    with open(os.path.join(d, TRUNCATE_MARKER), "wb") as fh:
        fh.write(b"4")
    with wal.open(d, segment_bytes=1 << 20) as log:
        assert [lsn for lsn, _ in log.read()] == [1, 2, 3, 4]
        assert log.append(b"next") == 5
