"""The server benchmarks (benchmarks/server.py) run and report: walkv serve
started and stopped by the benchmark, a peer that is not installed named as
such, and the replica-lag arithmetic. No timing assertions."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

pytest.importorskip("aiohttp")

from benchmarks.harness import Config  # noqa: E402
from benchmarks.server import lag_in_lsns, visible_after_ack, workloads  # noqa: E402
from benchmarks.server_peers import PROGRAMS  # noqa: E402


def test_visibility_after_the_ack_and_the_lag_in_lsns():
    acks = [(1, 100), (2, 150), (3, 400)]  # (LSN, acknowledged at ns)
    samples = [(90, 0), (120, 1), (200, 2), (300, 2), (390, 3), (500, 3)]  # (ns, applied LSN)
    # LSN 1 shown at 120 (20 after its ack), LSN 2 at 200 (50 after), LSN 3 before its ack (0)
    assert visible_after_ack(acks, samples) == [20e-9, 50e-9, 0.0]
    assert lag_in_lsns(acks, samples) == [0, 0, 0, 0, 0, 0]
    assert lag_in_lsns([(5, 10)], [(9, 1), (10, 1), (11, 5)]) == [0, 4, 0]


def test_a_quick_run_starts_and_stops_the_servers_and_names_missing_peers(tmp_path):
    from benchmarks.harness import run_workload

    cfg = Config(quick=True, repeats=1, duration=0.2, base_dir=str(tmp_path), verbose=False)
    workload = next(w for w in workloads(cfg) if w.name == "server.get.1c")
    result = run_workload(workload, cfg)
    walkv = result["contenders"]["walkv"]
    assert walkv["error"] is None and walkv["median"] > 0
    assert walkv["reported"]["server_cpu_us_per_op"] > 0
    for peer, program in PROGRAMS.items():
        entry = result["contenders"][peer]
        if peer == "redis" and importlib.util.find_spec("redis") is None:
            assert "cannot import redis" in entry["error"]
        elif shutil.which(program) is None:
            assert f"{program} not found on PATH" in entry["error"]
        else:
            assert entry["error"] is None and entry["median"] > 0, entry["error"]
    assert not os.listdir(tmp_path), "the servers' data must be removed"
