"""What the numbers were measured on: CPU, cores, memory, kernel, Python, the
file system of the benchmark directory, library versions, the walkv commit."""

from __future__ import annotations

import mmap
import os
import platform
import subprocess
import sys
import timeit
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


def python_speed_ms() -> float:
    """This interpreter's speed: the best of three ``sum(range(10**7))``, in
    ms (``python -m timeit -n 3 "sum(range(10**7))"``; 100-150 ms is common,
    300 ms a slow machine). walkv's ratios to C peers move with it."""
    return round(min(timeit.repeat("sum(range(10**7))", number=1, repeat=3)) * 1000, 1)


def fsync_latency_ms(directory: str, writes: int = 100) -> float:
    """The median time of a 4 KiB write + ``fdatasync`` in ``directory``, in
    ms: what every durable put waits for at least once (a replica adds its
    own)."""
    path = os.path.join(directory, f".fsync-probe-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        times = []
        for _ in range(writes):
            started = timeit.default_timer()
            os.write(fd, b"x" * 4096)
            os.fdatasync(fd)
            times.append(timeit.default_timer() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    return round(sorted(times)[len(times) // 2] * 1000, 3)


def first_touch_us(mib: int = 64) -> dict[str, float]:
    """What a page of memory costs the first time this process writes it, in
    µs: ``fresh``, a new anonymous map touched a page at a time; ``again``, a
    second map of the same size once the first was unmapped (the kernel hands
    back the pages it just freed). On bare metal both are about 1 µs (the
    kernel zeroes each page). A virtual machine whose host backs guest memory
    only when the guest first touches it (Firecracker; a balloon or DAMON
    reclaim gives memory back) pays several times more for a page the guest
    never touched: seen here, 11.2 µs against 4.5 on a machine just booted, and
    3.3 for both once its memory had been used. There a contender that writes
    into never-touched memory (a big log write into the page cache, LMDB's
    map) pays for it and the next one not, which is why the harness rotates
    the order of the contenders (:func:`benchmarks.harness.run_workload`)."""
    size = mib << 20
    out: dict[str, float] = {}
    for name in ("fresh", "again"):
        m = mmap.mmap(-1, size)
        try:
            started = timeit.default_timer()
            for offset in range(0, size, mmap.PAGESIZE):
                m[offset] = 1
            out[name] = round((timeit.default_timer() - started) * 1e6 / (size // mmap.PAGESIZE), 2)
        finally:
            m.close()
    return out


def describe(bench_dir: str) -> dict[str, Any]:
    from wal.compiled import build_info

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
        "python_speed_ms": python_speed_ms(),
        "fsync_latency_ms": fsync_latency_ms(bench_dir),
        "first_touch_us": first_touch_us(),
        "walkv_build": build_info(),
        "bench_dir": bench_dir,
        "filesystem": filesystem(bench_dir),
        "repo_filesystem": filesystem(repo),
        "walkv_commit": _git_commit(repo),
        "crc32c_backend": _crc_backend(),
        "versions": versions(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
