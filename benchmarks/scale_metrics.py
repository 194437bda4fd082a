"""What the scale benchmark (:mod:`benchmarks.scale`) measures at each store
size, and how sizes are written: shared by the run and its report
(:mod:`benchmarks.scale_report`)."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import WALKV
from benchmarks.kv_workloads import SYSTEMS

SYSTEMS_MEASURED = (WALKV, "leveldb")
LABELS = {WALKV: "walkv", "leveldb": "LevelDB"}
_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}

LEVELDB_OPTIONS: dict[str, Any] = {
    "max_open_files": max(1000, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2, 50_000)),
    "bloom_filter_bits": 10,
}
"""LevelDB as its documentation advises for a large database, at every
size: a Bloom filter of 10 bits per key, so that a get reads one table and
not one per level, and a table cache that holds every table file open
(LevelDB's default of 1,000 is fewer than the ~2,700 tables of 50M keys: a
get then reopens a table and reads its index; with the defaults, LevelDB's
gets at 50M ran at 16 thousand/s from a warm page cache)."""


def open_store(system: str, path: str, sync: bool) -> Any:
    """``system``'s store at ``path`` as the scale benchmark opens it (LevelDB
    with :data:`LEVELDB_OPTIONS`)."""
    if system == "leveldb":
        return SYSTEMS[system](path, sync, **LEVELDB_OPTIONS)
    return SYSTEMS[system](path, sync)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # of the harness's rate: ops/s
    time: bool = False  # shown as seconds per op (open times), lower is better
    title: str = ""


METRICS = (
    Metric("open.clean", "opens/s", time=True, title="open after a clean close"),
    Metric("get", "gets/s", title="random gets, 1 thread"),
    Metric("put.nosync.1t", "puts/s", title="non-durable random overwrites, 1 thread"),
    Metric("put.durable.8t", "puts/s", title="durable random overwrites, 8 threads"),
    Metric("open.kill9", "opens/s", time=True, title="open after kill -9 while writing"),
    Metric("snapshot", "entries/s", title="snapshot (LevelDB: consistent dump to a file)"),
    Metric("restore", "entries/s", title="restore (LevelDB: load the dump into a new DB)"),
)


def parse_sizes(text: str) -> list[int]:
    """``"1M,10M,50M"`` / ``"2k,2000"`` -> key counts, ascending."""
    sizes = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        factor = _SUFFIX.get(part[-1], 1)
        digits = part[:-1] if factor > 1 else part
        try:
            n = int(float(digits) * factor)
        except ValueError:
            raise ValueError(f"--scale: {part!r} is not a size (e.g. 2000, 2k, 1M)") from None
        if n < 1_000:
            raise ValueError(f"--scale: {part!r} is under 1,000 keys")
        sizes.append(n)
    if not sizes:
        raise ValueError("--scale needs at least one size, e.g. 1M,10M")
    return sorted(set(sizes))


def size_label(n: int) -> str:
    for suffix, factor in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
