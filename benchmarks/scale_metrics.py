"""What the scale benchmark (:mod:`benchmarks.scale`) measures at each store
size, and how sizes are written: shared by the run and its report
(:mod:`benchmarks.scale_report`)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.harness import WALKV

SYSTEMS_MEASURED = (WALKV, "leveldb")
LABELS = {WALKV: "walkv", "leveldb": "LevelDB"}
_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


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
