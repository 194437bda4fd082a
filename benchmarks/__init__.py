"""walkv's benchmark harness (run by hand and by ``walkv bench``; never in CI).

``python -m benchmarks [--quick] [--only NAME,...] [--repeats N] [--json FILE]
[--plot FILE.png]`` runs each workload for walkv and its peers in the same run,
alternating (the order rotated each round), and reports medians and walkv/peer ratios against the issues'
targets. :func:`run` is the same thing as a function (the ``walkv bench``
command calls it).

Modules: :mod:`benchmarks.harness` (model, rotation, medians),
:mod:`benchmarks.timing` (timed loops, child processes with peak RSS),
:mod:`benchmarks.peers` (LevelDB, RocksDB, LMDB, SQLite, plain fdatasync loop),
:mod:`benchmarks.report` (table, JSON, plot), :mod:`benchmarks.machine`, and one
module of workloads per issue: ``log_workloads`` (2), ``kv_workloads`` (3),
``keyspace_workloads`` (25), ``expiry_workloads`` (25), ``snapshot_workloads`` (4), ``archive_workloads``
(12), ``server`` (22: walkv serve against etcd and Redis, which it starts itself:
:mod:`benchmarks.server_peers`, one load generator :mod:`benchmarks.http_load`), ``resp`` (35: the
Redis face against Redis with redis-benchmark; :mod:`benchmarks.resp_floor`), ``cluster`` (34: a three-node
walkv cluster against three-member etcd through ``wrk``, failover times: :mod:`benchmarks.walkv_cluster`,
:mod:`benchmarks.wrk`), ``spark_workloads`` (5,
only with ``--only spark``).

``python -m benchmarks --scale 1M,10M,50M`` runs instead the scale benchmark
of issue 15 (how cost grows with the store's size, vs LevelDB; minutes to
hours): :mod:`benchmarks.scale`, :mod:`benchmarks.scale_children`,
:mod:`benchmarks.scale_report`; ``python -m benchmarks.scale_lmdb 1M,10M,50M``
measures py-lmdb alone at the same sizes (the B-tree's own cost of size).

``python -m benchmarks.group_commit_model`` measures a model of group commit,
serial against pipelined, in bare Python threads: what pipelining would buy on
the machine at hand before it is built (issue 37).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Iterable

from benchmarks.harness import Config, Workload, now_iso, run_workload, select


def all_workloads(cfg: Config) -> list[Workload]:
    from benchmarks import (
        archive_workloads,
        cluster,
        coord_workloads,
        expiry_workloads,
        keyspace_workloads,
        kv_workloads,
        log_workloads,
        resp,
        server,
        snapshot_workloads,
        spark_workloads,
    )

    out: list[Workload] = []
    for module in (log_workloads, kv_workloads, coord_workloads, keyspace_workloads, expiry_workloads,
                   snapshot_workloads, archive_workloads, server, resp, cluster, spark_workloads):
        out.extend(module.workloads(cfg))
    return out


def default_bench_dir() -> str:
    """``$WALKV_BENCH_DIR``, else the system temp dir (on this project's
    machines the same file system as the repository; the JSON records both)."""
    return os.environ.get("WALKV_BENCH_DIR") or tempfile.gettempdir()


def run(quick: bool = False, only: Iterable[str] | str | None = None, repeats: int | None = None,
        json_path: str | None = None, plot_path: str | None = None, bench_dir: str | None = None,
        keep: bool = False, duration: float | None = None, verbose: bool = True,
        table: bool = True, plain: bool = False, pure: bool = False) -> dict[str, Any]:
    """Run the selected workloads and return the report (also printed as a
    table, and written as JSON / a PNG plot when paths are given).

    ``only``: workload names or dotted prefixes (``"log"``, ``"kv.put"``,
    ``"spark"``), a list or a comma-separated string; slow workloads (Spark)
    run only when named. ``repeats``: alternating repeats per contender
    (default 3, 2 with ``quick``). ``duration``: seconds per time-boxed run
    (default 5, 0.5 with ``quick``). ``pure``: one more contender per workload,
    its walkv side interpreted (``WALKV_PURE=1``) in a child process per repeat,
    ``walkv-pure`` (:mod:`benchmarks.pure`).
    """
    from benchmarks import machine, report

    if isinstance(only, str):
        only = [s.strip() for s in only.split(",") if s.strip()]
    only = list(only) if only else None
    bench_dir = os.path.abspath(bench_dir or default_bench_dir())
    os.makedirs(bench_dir, exist_ok=True)
    cfg = Config(quick=quick, repeats=repeats or (2 if quick else 3), base_dir=bench_dir,
                 keep=keep, duration=duration, verbose=verbose)
    chosen = select(all_workloads(cfg), only)
    if only and not chosen:
        names = ", ".join(w.name for w in all_workloads(cfg))
        raise ValueError(f"--only {','.join(only)} matches no workload; known: {names}")
    started = time.perf_counter()
    out: dict[str, Any] = {
        "started": now_iso(),
        "command": None,
        "config": {"quick": quick, "repeats": cfg.repeats, "only": only, "duration": duration,
                   "bench_dir": bench_dir, "pure": pure},
        "machine": machine.describe(bench_dir),
        "workloads": [],
    }
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out["machine"]["bench_dir_same_fs_as_repo"] = os.stat(bench_dir).st_dev == os.stat(repo).st_dev
    if pure:
        from benchmarks.pure import with_pure_twin

        chosen = [with_pure_twin(w, cfg) for w in chosen]
    for w in chosen:
        out["workloads"].append(run_workload(w, cfg))
    out["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    if hasattr(os, "getloadavg"):
        out["machine"]["load_avg_end"] = os.getloadavg()  # others' work on a shared machine
    verdicts = [c["verdict"] for w in out["workloads"] for c in w["comparisons"] + w["limits"]]
    out["summary"] = {"pass": verdicts.count("PASS"), "miss": verdicts.count("MISS"),
                      "skipped": sum(w["status"] == "skipped" for w in out["workloads"]),
                      "errors": sum(w["status"] == "error" for w in out["workloads"])}
    if json_path:
        report.write_json(out, json_path)
    if table:
        report.print_table(out, plain=plain)
    if plot_path:
        report.plot(out, plot_path)
    return out
