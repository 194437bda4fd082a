"""The compiled/pure ratio (``python -m benchmarks --pure``): each workload gets
one more contender, ``walkv-pure``: its walkv contender run in a child process
with ``WALKV_PURE=1`` (the interpreted twin of the mypyc-compiled modules: see
:mod:`wal.compiled`), with the same sizes and duration, one repeat per child.
It alternates with the others like any peer, so its ratio (walkv/walkv-pure,
no target) is the gain the compiled build gives on that workload, measured
round by round beside the same noise.

The child is ``python -m benchmarks --walkv-alone --only NAME --repeats 1 ...``:
it prints the walkv contender's result as JSON (:func:`walkv_alone`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.harness import WALKV, Config, Contender, Context, Measurement, Workload, run_workload

PURE = "walkv-pure"


def with_pure_twin(workload: Workload, config: Config) -> Workload:
    """``workload`` with the contender ``walkv-pure`` added (when it has a walkv one)."""
    if not any(c.name == WALKV for c in workload.contenders):
        return workload
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `-m benchmarks` is

    def run(ctx: Context) -> Measurement:
        command = [sys.executable, "-m", "benchmarks", "--walkv-alone", "--only", workload.name,
                   "--repeats", "1", "--dir", ctx.directory]
        if config.quick:
            command.append("--quick")
        if config.duration is not None:
            command += ["--duration", str(config.duration)]
        proc = subprocess.run(command, env=dict(os.environ, WALKV_PURE="1"), stdout=subprocess.PIPE,
                              text=True, cwd=checkout)
        if proc.returncode != 0:
            raise RuntimeError(f"the WALKV_PURE=1 child exited {proc.returncode}")
        entry = json.loads(proc.stdout)
        if entry["error"]:
            raise RuntimeError(entry["error"])
        return Measurement(ops=entry["ops"][0], seconds=entry["seconds"][0], rss_mb=entry["rss_mb"][0],
                           extra=entry["extra"][0])

    twin = Contender(PURE, run, label="walkv, pure Python (WALKV_PURE=1)")
    return dataclasses.replace(workload, contenders=[*workload.contenders, twin])


def walkv_alone(workload: Workload, config: Config) -> dict[str, Any]:
    """``workload``'s walkv contender alone (no peers, targets or limits): the
    child's side of :func:`with_pure_twin`."""
    alone = dataclasses.replace(workload, contenders=[c for c in workload.contenders if c.name == WALKV],
                                targets=[], limits=[])
    entry: dict[str, Any] = run_workload(alone, config)["contenders"][WALKV]
    return entry
