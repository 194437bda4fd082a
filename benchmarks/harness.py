"""The benchmark model and runner: workloads, contenders, rotation, medians.

A :class:`Workload` pits walkv (the contender named ``"walkv"``) against its
peers. Every contender is prepared once (untimed: loading data, writing a
log), then the contenders run in turn for N repeats, the order rotated by
one at each (``walkv, peer1, peer2``, then ``peer1, peer2, walkv``, then
``peer2, walkv, peer1``), so that noise from the shared machine falls on all
of them alike, and so does what one run leaves the next: memory touched for
the first time costs several times more on some virtual machines
(:func:`benchmarks.machine.first_touch_us`), and with a fixed order the same
contender would always be the one to touch it. The result is the median rate
of each contender and, for each peer, the ratio walkv/peer against the target
the issue states (PASS/MISS), with the ratios of the rounds themselves.
Peers without a target are extra columns (ratio shown, no verdict). A
:class:`Limit` is an absolute bound (e.g. max RSS) instead of a ratio.

Nothing here asserts anything: a contender that raises is reported as an
error in its row and the run goes on; a workload whose walkv code has not
landed yet is reported as skipped, "not available yet".
"""

from __future__ import annotations

import gc
import importlib
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

WALKV = "walkv"


@dataclass
class Config:
    """What the whole run was asked for."""

    quick: bool = False
    repeats: int = 3
    base_dir: str = ""  # where each workload gets its fresh temp dir
    keep: bool = False  # keep the data directories (for inspection)
    duration: float | None = None  # seconds per time-boxed run (None: per mode)
    verbose: bool = True

    def seconds(self, full: float, quick: float) -> float:
        """Length of one time-boxed run."""
        if self.duration is not None:
            return self.duration
        return quick if self.quick else full

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full


@dataclass
class Measurement:
    """One timed run: ``ops`` done in ``seconds`` (and optionally max RSS)."""

    ops: int
    seconds: float
    rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Context:
    """Handed to a contender's ``prepare`` and ``run``."""

    config: Config
    directory: str  # this contender's own directory (fresh per workload)
    state: Any = None  # what ``prepare`` returned
    _counter: int = 0

    def fresh_dir(self, label: str = "run") -> str:
        """A new empty directory under this contender's directory."""
        self._counter += 1
        return tempfile.mkdtemp(prefix=f"{label}{self._counter}-", dir=self.directory)


@dataclass
class Contender:
    name: str
    run: Callable[[Context], Measurement]
    prepare: Callable[[Context], Any] | None = None
    cleanup: Callable[[Any], None] | None = None
    requires: tuple[str, ...] = ()  # "module" or "module:attribute"
    label: str = ""  # how it is shown, e.g. "LevelDB put(sync=True) x8"


@dataclass(frozen=True)
class Target:
    peer: str
    ratio: float  # walkv rate / peer rate must be at least this


@dataclass(frozen=True)
class Limit:
    metric: str  # a Measurement attribute, e.g. "rss_mb"
    maximum: float
    unit: str = "MB"
    contender: str = WALKV


@dataclass
class Workload:
    name: str
    issue: int
    title: str
    unit: str
    contenders: list[Contender]
    targets: list[Target] = field(default_factory=list)
    limits: list[Limit] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()  # walkv code this needs, e.g. ("wal:open",)
    repeats: int | None = None  # overrides Config.repeats (big, slow runs)
    slow: bool = False  # runs only when named explicitly in --only
    note: str = ""
    report: tuple[str, ...] = ()  # Measurement.extra keys shown in the table for each contender (medians)


def missing(requirements: tuple[str, ...]) -> str | None:
    """The first requirement that cannot be imported, or None."""
    for req in requirements:
        module, _, attr = req.partition(":")
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # ImportError, or a half-landed module
            return f"{module} ({type(exc).__name__}: {exc})"
        if attr and not hasattr(mod, attr):
            return f"{module}.{attr}"
    return None


def _log(config: Config, text: str) -> None:
    if config.verbose:
        print(text, file=sys.stderr, flush=True)


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_workload(workload: Workload, config: Config) -> dict[str, Any]:
    """Run one workload (alternating contenders) and return its result dict."""
    result: dict[str, Any] = {
        "name": workload.name,
        "issue": workload.issue,
        "title": workload.title,
        "unit": workload.unit,
        "params": dict(workload.params),
        "note": workload.note,
        "report": list(workload.report),
        "status": "ok",
        "contenders": {},
        "comparisons": [],
        "limits": [],
    }
    gone = missing(workload.requires)
    if gone:
        result["status"] = "skipped"
        result["note"] = f"not available yet ({gone} missing)"
        _log(config, f"[{workload.name}] skipped: {result['note']}")
        return result

    root = tempfile.mkdtemp(prefix=f"walkv-bench-{workload.name}-", dir=config.base_dir)
    result["directory"] = root
    active: list[tuple[Contender, Context]] = []
    for c in workload.contenders:
        entry: dict[str, Any] = {"label": c.label or c.name, "rates": [], "seconds": [],
                                 "ops": [], "rss_mb": [], "extra": [], "error": None}
        result["contenders"][c.name] = entry
        gone = missing(c.requires)
        if gone:
            entry["error"] = f"not available: cannot import {gone}"
            continue
        ctx = Context(config=config, directory=tempfile.mkdtemp(prefix=f"{c.name}-", dir=root))
        if c.prepare is not None:
            _log(config, f"[{workload.name}] preparing {c.name}")
            try:
                ctx.state = c.prepare(ctx)
            except Exception as exc:
                entry["error"] = "prepare: " + _error_text(exc)
                _log(config, f"[{workload.name}] {c.name} prepare failed: {entry['error']}")
                continue
        active.append((c, ctx))

    repeats = workload.repeats or config.repeats
    try:
        for r in range(repeats):
            turn = r % len(active) if active else 0
            for c, ctx in active[turn:] + active[:turn]:
                entry = result["contenders"][c.name]
                if entry["error"]:
                    continue
                gc.collect()
                try:
                    m = c.run(ctx)
                except Exception as exc:
                    entry["error"] = _error_text(exc)
                    _log(config, f"[{workload.name}] {c.name} failed: {entry['error']}")
                    continue
                entry["rates"].append(m.rate)
                entry["seconds"].append(m.seconds)
                entry["ops"].append(m.ops)
                entry["rss_mb"].append(m.rss_mb)
                entry["extra"].append(m.extra)
                rss = f", {m.rss_mb:.0f} MB RSS" if m.rss_mb is not None else ""
                _log(config, f"[{workload.name}] {r + 1}/{repeats} {c.name}: "
                             f"{m.rate:,.0f} {workload.unit} ({m.ops:,} in {m.seconds:.2f}s{rss})")
    finally:
        for c, ctx in active:
            if c.cleanup is not None and ctx.state is not None:
                try:
                    c.cleanup(ctx.state)
                except Exception as exc:  # report, never mask the run's result
                    _log(config, f"[{workload.name}] {c.name} cleanup failed: {_error_text(exc)}")
        if not config.keep:
            shutil.rmtree(root, ignore_errors=True)

    _summarise(workload, result)
    return result


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _summarise(workload: Workload, result: dict[str, Any]) -> None:
    entries = result["contenders"]
    for entry in entries.values():
        entry["median"] = _median(entry["rates"])
        entry["rss_mb_median"] = _median(entry["rss_mb"])
        entry["rss_mb_max"] = max((v for v in entry["rss_mb"] if v is not None), default=None)
        entry["reported"] = {k: _median([x.get(k) for x in entry["extra"]]) for k in result.get("report", [])}
    walkv = entries.get(WALKV, {}).get("median")
    targets = {t.peer: t.ratio for t in workload.targets}
    for name, entry in entries.items():
        if name == WALKV:
            continue
        peer = entry["median"]
        ratio = walkv / peer if walkv is not None and peer else None
        target = targets.get(name)
        if target is None:
            verdict = "-"
        elif ratio is None:
            verdict = "n/a"
        else:
            verdict = "PASS" if ratio >= target else "MISS"
        # Ratio within each repeat round (walkv and the peer ran back to back):
        # a second view, less sensitive to noise that drifts across rounds.
        own = entries.get(WALKV, {}).get("rates", [])
        paired = [w / p for w, p in zip(own, entry["rates"]) if p]
        result["comparisons"].append({"peer": name, "label": entry["label"], "walkv": walkv,
                                      "peer_rate": peer, "ratio": ratio, "target": target,
                                      "verdict": verdict, "paired_ratios": paired,
                                      "paired_ratio_median": _median(paired)})
    for limit in workload.limits:
        entry = entries.get(limit.contender, {})
        values = [v for v in entry.get(limit.metric, []) if v is not None]
        if not values:  # metrics may also live in the extra dicts
            values = [x[limit.metric] for x in entry.get("extra", []) if limit.metric in x]
        value = max(values) if values else None
        verdict = "n/a" if value is None else ("PASS" if value <= limit.maximum else "MISS")
        result["limits"].append({"metric": limit.metric, "contender": limit.contender,
                                 "value": value, "maximum": limit.maximum, "unit": limit.unit,
                                 "verdict": verdict})
    if all(e["error"] for e in entries.values()):
        result["status"] = "error"
    elif entries.get(WALKV, {}).get("error"):
        result["status"] = "error"
        result["note"] = (result["note"] + " " if result["note"] else "") + "walkv: " + entries[WALKV]["error"]


def select(workloads: list[Workload], only: list[str] | None) -> list[Workload]:
    """Workloads named by ``only``: a pattern that is a workload's exact name
    selects that one; any other selects every workload under it as a dotted
    prefix (``log``, ``kv.put``, ``spark``). Without ``only``: every workload
    that is not slow."""
    if not only:
        return [w for w in workloads if not w.slow]
    names = {w.name for w in workloads}
    chosen = []
    for w in workloads:
        for pattern in only:
            if pattern in names:
                hit = w.name == pattern
            else:
                hit = w.name.startswith(pattern.rstrip(".") + ".")
            if hit:
                chosen.append(w)
                break
    return chosen


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
