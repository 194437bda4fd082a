"""The compiled/pure ratio (``python -m benchmarks --pure``): right after a
workload runs, its walkv contender runs again, alone, in a child process with
``WALKV_PURE=1`` (the interpreted twin of the mypyc-compiled modules: see
:mod:`wal.compiled`), with the same sizes, repeats and duration. The child's
median joins the workload as one more contender, ``walkv-pure``, whose ratio
(walkv/walkv-pure) is the gain the compiled build gives on that workload. The
two do not alternate repeat by repeat (a process runs one twin only), so noise
that drifts over the seconds between them falls on one side.

The child is ``python -m benchmarks --walkv-alone --only NAME ...``: it prints
the walkv contender's result as JSON (:func:`walkv_alone`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.harness import WALKV, Config, Workload, run_workload

PURE = "walkv-pure"


def add_pure_twin(result: dict[str, Any], workload: Workload, config: Config) -> None:
    """Run ``workload``'s walkv contender interpreted in a child process and add
    it to ``result`` as the contender ``walkv-pure`` with its comparison."""
    if result["status"] == "skipped" or WALKV not in result["contenders"]:
        return
    command = [sys.executable, "-m", "benchmarks", "--walkv-alone", "--only", workload.name, "--repeats",
               str(workload.repeats or config.repeats), "--dir", config.base_dir]
    if config.quick:
        command.append("--quick")
    if config.duration is not None:
        command += ["--duration", str(config.duration)]
    if config.verbose:
        print(f"[{workload.name}] walkv again, interpreted (WALKV_PURE=1), in a child process",
              file=sys.stderr, flush=True)
    env = dict(os.environ, WALKV_PURE="1")
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `-m benchmarks` is
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, cwd=checkout)
    entry: dict[str, Any]
    if proc.returncode == 0:
        entry = json.loads(proc.stdout)
    else:
        entry = {"rates": [], "median": None, "error": f"the WALKV_PURE=1 child exited {proc.returncode}"}
    entry["label"] = "walkv, pure Python (WALKV_PURE=1)"
    result["contenders"][PURE] = entry
    walkv, pure = result["contenders"][WALKV].get("median"), entry.get("median")
    result["comparisons"].append({
        "peer": PURE, "label": entry["label"], "walkv": walkv, "peer_rate": pure,
        "ratio": walkv / pure if walkv and pure else None, "target": None, "verdict": "-",
        "paired_ratios": [], "paired_ratio_median": None})


def walkv_alone(workload: Workload, config: Config) -> dict[str, Any]:
    """``workload``'s walkv contender alone (no peers, targets or limits): the
    child's side of :func:`add_pure_twin`."""
    alone = dataclasses.replace(workload, contenders=[c for c in workload.contenders if c.name == WALKV],
                                targets=[], limits=[])
    entry: dict[str, Any] = run_workload(alone, config)["contenders"][WALKV]
    return entry
