"""What the numbers were measured on: CPU, cores, memory, kernel, Python, the
file system of the benchmark directory, library versions, the walkv commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

from benchmarks.peers import versions


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_mb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def filesystem(path: str) -> dict[str, Any]:
    """The mount that holds ``path``: device, type and options (/proc/mounts)."""
    path = os.path.realpath(path)
    best: dict[str, Any] = {"path": path}
    best_len = -1
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts, *_ = line.split()
                mnt = mnt.replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > best_len:
                    best_len = len(mnt)
                    best.update(device=dev, mountpoint=mnt, type=fstype, options=opts)
    except OSError:
        pass
    try:
        st = os.statvfs(path)
        best["free_gb"] = round(st.f_bavail * st.f_frsize / 2**30, 1)
    except OSError:
        pass
    return best


def _git_commit(repo: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _crc_backend() -> str | None:
    try:
        import wal.crc as crc

        for name in ("BACKEND", "backend", "IMPLEMENTATION", "_BACKEND"):
            if hasattr(crc, name):
                return str(getattr(crc, name))
    except Exception:
        return None
    return None


def python_speed() -> float:
    """Seconds this interpreter takes for ``sum(range(10**7))`` (best of 3):
    how fast this machine runs Python now, printed beside the ratios."""
    import time

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        sum(range(10**7))
        best = min(best, time.perf_counter() - t0)
    return round(best, 3)


def describe(bench_dir: str) -> dict[str, Any]:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "memory_mb": _mem_total_mb(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "bench_dir": bench_dir,
        "filesystem": filesystem(bench_dir),
        "repo_filesystem": filesystem(repo),
        "walkv_commit": _git_commit(repo),
        "crc32c_backend": _crc_backend(),
        "versions": versions(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "sum_range_1e7_seconds": python_speed(),
    }
