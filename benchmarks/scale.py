"""Issue 15, how cost grows with size: ``python -m benchmarks --scale
1M,10M,50M [--repeats N] [--duration S] [--json FILE] [--plot FILE.png]
[--dir DIR] [--keep]`` (minutes to hours; never part of the default run).

At each size N (16-byte keys, 100-byte values) walkv and LevelDB (plyvel,
with a Bloom filter and every table held open:
:data:`benchmarks.scale_metrics.LEVELDB_OPTIONS`) are loaded with keys
0..N-1 (untimed: write batches of 10,000, not synced, then a clean close;
progress on stderr), then each metric runs as a workload
of the usual harness (:mod:`benchmarks.harness`: walkv and LevelDB
alternating, ``--repeats`` rounds, default 1), every run in a fresh child
process (:mod:`benchmarks.scale_children`) on the loaded stores:

* ``open.clean``: time to open the store after a clean close (walkv goal:
  under 1 s at every size);
* ``get``: random gets of existing keys, 1 thread, ``--duration`` seconds
  (default 5);
* ``put.nosync.1t``: random overwrites, walkv ``sync="none"`` / LevelDB
  ``put()``, 1 thread;
* ``put.durable.8t``: random overwrites, walkv ``sync="always"`` / LevelDB
  ``put(sync=True)``, 8 threads;
* ``open.kill9``: a child overwrites random keys (not synced) and is killed
  with SIGKILL after 50,000 of them, in the middle of writing; then the time
  of the reopen (walkv replays the unapplied log tail: ``replayed`` in the
  JSON; LevelDB replays its log into a memtable);
* ``snapshot``: walkv ``db.snapshot()`` vs LevelDB's nearest equivalent, a
  consistent dump (a plyvel snapshot iterated into a file, fsynced);
* ``restore``: walkv ``kvstore.restore(store, new)`` vs loading that dump
  into a new LevelDB; entries/s.

Before each timed child the parent reads the files that system's reads and
writes use (walkv's LMDB, LevelDB's tables and log; not walkv's log and
snapshots) into the page cache (:func:`warm`): each system is measured warm,
as far as the machine's memory holds its files. Without it the order of the
loads decides: at 50M keys (walkv's LMDB 8 GB, its log 7 GB, LevelDB's
compactions) on a 24 GB machine, the system loaded first had its pages
evicted by what ran after its load, and its gets ran at the disk's random-read rate
(8-12 thousand/s for both), a measurement of the disk and the order, not of
either store. Per size the report states the bytes warmed and the machine's
memory.

Peak RSS is each child's VmHWM (file pages of mapped files included) and,
beside it, its peak anonymous memory (RssAnon); per size the maximum over all
of that system's children. The report (:mod:`benchmarks.scale_report`) gives
walkv/LevelDB per size, each metric's change against the smallest size, and
the goals: rates within 20% (at least 0.8x the smallest size's), clean open
under 1 s, peak RSS flat (at most 1.2x). Each size's data is deleted before
the next unless ``--keep``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from benchmarks import data
from benchmarks.harness import WALKV, Config, Contender, Context, Limit, Measurement, Workload, now_iso, run_workload
from benchmarks.kv_workloads import LOAD_CHUNK, SYSTEMS
from benchmarks.scale_metrics import LABELS, METRICS, SYSTEMS_MEASURED, Metric, open_store, size_label
from benchmarks.timing import in_child, spawn_child
from kvstore.layout import SNAPSHOTS_DIR, WAL_DIR

CHILDREN = "benchmarks.scale_children"
KILL_AFTER = 50_000  # overwrites written before the SIGKILL


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def warm(system: str, path: str) -> int:
    """Read the files of the store at ``path`` that its reads and writes use
    into the page cache (walkv: all but its log and snapshots, which no get
    or put reads); return the bytes read."""
    skip = {WAL_DIR, SNAPSHOTS_DIR} if system == WALKV else set()
    total = 0
    for directory, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            total += _read_data(os.path.join(directory, name))
    return total


def _read_data(path: str) -> int:
    """Read the file's data, not its holes (a sparse map would fill the
    cache with zeros); return the bytes read."""
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        size, offset = os.fstat(fd).st_size, 0
        while offset < size:
            try:
                offset = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, offset, os.SEEK_HOLE)
            while offset < end:
                chunk = os.pread(fd, min(8 << 20, end - offset), offset)
                if not chunk:
                    return total
                offset += len(chunk)
                total += len(chunk)
    finally:
        os.close(fd)
    return total


def load(system: str, path: str, n: int, cfg: Config, label: str) -> dict[str, Any]:
    """Put keys 0..n-1 in write batches of 10,000 (not synced), then close;
    a progress line on stderr every ~10%."""
    t0 = time.perf_counter()
    db = open_store(system, path, False)
    step = max(LOAD_CHUNK, n // 10 // LOAD_CHUNK * LOAD_CHUNK)
    try:
        for start in range(0, n, LOAD_CHUNK):
            end = min(n, start + LOAD_CHUNK)
            db.write_batch((data.key(i), data.value(i)) for i in range(start, end))
            if cfg.verbose and (end % step == 0 or end == n):
                rate = end / (time.perf_counter() - t0)
                print(f"[scale.{label}] loading {LABELS[system]}: {end:,}/{n:,} keys "
                      f"({100 * end // n}%, {rate:,.0f} keys/s)", file=sys.stderr, flush=True)
    finally:
        db.close()
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 2), "keys_per_s": n / seconds, "bytes": _du(path)}


def killed_then_reopened(system: str, path: str, n: int, child_timeout: float = 3600) -> Measurement:
    """SIGKILL a child in the middle of non-durable writes, then time the
    reopen in a fresh child."""
    with tempfile.TemporaryFile() as err:
        proc = spawn_child(f"{CHILDREN}:child_write_until_killed",
                           {"system": system, "path": path, "n": n, "ready_after": KILL_AFTER},
                           stdout=subprocess.PIPE, stderr=err)
        timer = threading.Timer(child_timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline().strip() == b"ready"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            timer.cancel()
            proc.stdout.close()  # type: ignore[union-attr]
        if not ready:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the writer to kill exited {proc.returncode}: {' | '.join(tail)}")
    return in_child(f"{CHILDREN}:child_open", system=system, path=path)


def _run(metric: Metric, system: str, store: str, n: int, secs: float,
         dump: str, warmed: dict[str, int]) -> Callable[[Context], Measurement]:
    def child(name: str, **kwargs: Any) -> Measurement:
        return in_child(f"{CHILDREN}:{name}", system=system, **kwargs)

    def warm_first(run: Callable[[Context], Measurement]) -> Callable[[Context], Measurement]:
        def measure(ctx: Context) -> Measurement:
            warmed[system] = warm(system, store)  # the bytes the report states
            return run(ctx)

        return measure

    def restore(ctx: Context) -> Measurement:
        target = os.path.join(ctx.fresh_dir("restore"), "target")
        try:
            return child("child_restore", source=store if system == WALKV else dump, target=target, n=n)
        finally:
            shutil.rmtree(target, ignore_errors=True)

    runs: dict[str, Callable[[Context], Measurement]] = {
        "open.clean": lambda ctx: child("child_open", path=store),
        "get": lambda ctx: child("child_gets", path=store, n=n, seconds=secs),
        "put.nosync.1t": lambda ctx: child("child_puts", path=store, n=n, threads=1, seconds=secs,
                                           sync=False),
        "put.durable.8t": lambda ctx: child("child_puts", path=store, n=n, threads=8, seconds=secs,
                                            sync=True),
        "open.kill9": lambda ctx: killed_then_reopened(system, store, n),
        "snapshot": lambda ctx: child("child_snapshot", path=store, n=n, dump=dump),
        "restore": restore,
    }
    return warm_first(runs[metric.name])


def size_workloads(n: int, stores: dict[str, str], dump: str, secs: float, warmed: dict[str, int],
                   metrics: tuple[Metric, ...] = METRICS) -> list[Workload]:
    """One harness workload per metric at size ``n``, on the loaded ``stores``;
    each timed child's warm-up records its bytes in ``warmed``."""
    label = size_label(n)
    out = []
    for m in metrics:
        limits = [Limit("seconds", 1.0, unit="s")] if m.name == "open.clean" else []
        out.append(Workload(
            name=f"scale.{label}.{m.name}", issue=15, unit=m.unit, title=f"{m.title}, {n:,} keys",
            limits=limits, params={"keys": n, "metric": m.name, "seconds": secs},
            contenders=[Contender(s, _run(m, s, stores[s], n, secs, dump, warmed), requires=SYSTEMS[s].requires,
                                  label=f"{LABELS[s]} {m.name}") for s in SYSTEMS_MEASURED]))
    return out


def choose(only: list[str] | None) -> tuple[Metric, ...]:
    """The metrics ``only`` names (exact names or dotted prefixes: ``put``)."""
    if not only:
        return METRICS
    chosen = tuple(m for m in METRICS if any(m.name == o or m.name.startswith(o.rstrip(".") + ".")
                                             for o in only))
    if not chosen:
        raise ValueError(f"--only {','.join(only)} matches no scale metric; known: "
                         + ", ".join(m.name for m in METRICS))
    return chosen


def run_scale(sizes: list[int], repeats: int | None = None, duration: float | None = None,
              only: list[str] | None = None, json_path: str | None = None, plot_path: str | None = None,
              bench_dir: str | None = None, keep: bool = False, verbose: bool = True,
              command: str | None = None) -> dict[str, Any]:
    """Run the scale benchmark at each size; print the table; write JSON and
    the curves when asked; return the report."""
    from benchmarks import default_bench_dir, machine, scale_report

    metrics = choose(only)
    bench_dir = os.path.abspath(bench_dir or default_bench_dir())
    os.makedirs(bench_dir, exist_ok=True)
    cfg = Config(repeats=repeats or 1, base_dir=bench_dir, keep=keep, duration=duration, verbose=verbose)
    secs = cfg.seconds(full=5.0, quick=5.0)
    out: dict[str, Any] = {
        "kind": "scale", "started": now_iso(), "command": command,
        "config": {"sizes": sizes, "repeats": cfg.repeats, "seconds": secs, "bench_dir": bench_dir,
                   "metrics": [m.name for m in metrics], "kill_after": KILL_AFTER},
        "machine": machine.describe(bench_dir), "sizes": [],
    }
    started = time.perf_counter()
    for n in sizes:
        label = size_label(n)
        root = tempfile.mkdtemp(prefix=f"walkv-scale-{label}-", dir=bench_dir)
        entry: dict[str, Any] = {"keys": n, "label": label, "directory": root,
                                 "free_gb_before": machine.filesystem(root).get("free_gb"),
                                 "load": {}, "workloads": []}
        out["sizes"].append(entry)
        try:
            stores = {s: os.path.join(root, s) for s in SYSTEMS_MEASURED}
            for s in SYSTEMS_MEASURED:
                entry["load"][s] = load(s, stores[s], n, cfg, label)
            entry["warm_bytes"] = warmed = {}  # per system, what its last timed child had warmed
            for w in size_workloads(n, stores, os.path.join(root, "leveldb.dump"), secs, warmed, metrics):
                entry["workloads"].append(run_workload(w, cfg))
            entry["bytes_after"] = {s: _du(stores[s]) for s in SYSTEMS_MEASURED}
        finally:
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
        if json_path:  # after every size: a long run leaves what it measured so far
            scale_report.finish(out, time.perf_counter() - started, json_path)
    if hasattr(os, "getloadavg"):
        out["machine"]["load_avg_end"] = os.getloadavg()  # others' work on a shared machine
    scale_report.finish(out, time.perf_counter() - started, json_path)
    scale_report.print_table(out)
    if plot_path:
        scale_report.plot(out, plot_path)
    return out
