"""The scale benchmark's report (:mod:`benchmarks.scale`): per metric and
size, walkv and LevelDB, walkv/LevelDB, the change against the smallest size,
and the issue's goals; a plain-text table, the JSON file and the curves.

Values: a rate metric is the median rate of the rounds (ops/s); an open
metric is shown as seconds (1 / the median of opens/s); peak RSS is the
largest VmHWM of all of a system's children at that size, and "peak anon" the
largest RssAnon (memory the process allocated, without the file pages of
LMDB's map or LevelDB's table files). "x smallest" is the value divided by
the same system's value at the smallest size measured.

Goals (walkv, issue 15): every rate at least 0.8x its value at the smallest
size ("within 20%"), open after a clean close under 1 s at every size, peak
RSS at most 1.2x its value at the smallest size ("flat"). Open after kill -9
has no goal: it is shown with how many log entries walkv replayed.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from benchmarks.report import plain_table, pyplot, save, write_json
from benchmarks.scale_metrics import LABELS, METRICS, SYSTEMS_MEASURED, size_label

HEADERS = ("metric", "keys", "walkv", "LevelDB", "walkv/LevelDB", "walkv x smallest",
           "LevelDB x smallest", "goal", "result")
RATE_GOAL = 0.8
RSS_GOAL = 1.2
OPEN_GOAL_S = 1.0
RSS_ROWS = (("peak RSS", "rss_mb_max", None), ("peak anon", None, "anon_peak_mb"))


def _max(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _values(size: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """metric -> system -> value at one size (see the module docstring)."""
    times = {m.name for m in METRICS if m.time}
    out: dict[str, dict[str, float | None]] = {}
    for w in size["workloads"]:
        metric = w["params"]["metric"]
        out[metric] = {}
        for s in SYSTEMS_MEASURED:
            rate = w["contenders"].get(s, {}).get("median")
            out[metric][s] = (1.0 / rate if rate else None) if metric in times else rate
    for row, key, extra in RSS_ROWS:
        out[row] = {}
        for s in SYSTEMS_MEASURED:
            entries = [w["contenders"].get(s, {}) for w in size["workloads"]]
            if key:
                out[row][s] = _max([e.get(key) for e in entries])
            else:
                out[row][s] = _max([x.get(extra) for e in entries for x in e.get("extra", [])])
    return out


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _goal(metric: str, first: bool, value: float | None, growth: float | None) -> tuple[str, str]:
    if metric == "open.clean":
        return f"< {OPEN_GOAL_S:g} s", "n/a" if value is None else ("PASS" if value < OPEN_GOAL_S else "MISS")
    if metric == "open.kill9":
        return "-", "-"
    if metric in ("peak RSS", "peak anon"):
        goal, ok = f"<= {RSS_GOAL:g}x smallest", growth is not None and growth <= RSS_GOAL
    else:
        goal, ok = f">= {RATE_GOAL:g}x smallest", growth is not None and growth >= RATE_GOAL
    if first:
        return goal, "(base)"
    return goal, "n/a" if growth is None else ("PASS" if ok else "MISS")


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """Per metric and size: values, ratios, changes and verdicts."""
    per_size = [(s["keys"], _values(s)) for s in report["sizes"] if s["workloads"]]
    rows = []
    names = [m.name for m in METRICS] + [r[0] for r in RSS_ROWS]
    for metric in names:
        base: dict[str, float | None] = {}
        for i, (keys, values) in enumerate(per_size):
            if metric not in values:
                continue
            v = values[metric]
            if not base:
                base = dict(v)
            growth = {s: _div(v[s], base.get(s)) for s in SYSTEMS_MEASURED}
            walkv, peer = v["walkv"], v["leveldb"]
            goal, verdict = _goal(metric, i == 0, walkv, growth["walkv"])
            rows.append({"metric": metric, "keys": keys, "walkv": walkv, "leveldb": peer,
                         "ratio": _div(walkv, peer),
                         "walkv_x_smallest": growth["walkv"], "leveldb_x_smallest": growth["leveldb"],
                         "goal": goal, "verdict": verdict})
    verdicts = [r["verdict"] for r in rows]
    return {"rows": rows, "pass": verdicts.count("PASS"), "miss": verdicts.count("MISS"),
            "errors": [f"{w['name']} {s}: {c['error']}" for size in report["sizes"] for w in size["workloads"]
                       for s, c in w["contenders"].items() if c.get("error")]}


def finish(report: dict[str, Any], elapsed: float, json_path: str | None) -> None:
    report["elapsed_seconds"] = round(elapsed, 1)
    report["summary"] = summarise(report)
    if json_path:
        write_json(report, json_path)


def _show(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.startswith("open."):
        return f"{value:.3f} s"
    if metric.startswith("peak"):
        return f"{value:,.0f} MB"
    return f"{value:,.0f}/s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(report: dict[str, Any], stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    m, cfg = report["machine"], report["config"]
    stream.write(f"walkv scale benchmark vs LevelDB ({cfg['repeats']} round(s), {cfg['seconds']:g} s per "
                 f"timed run) on {m['cpu']}, {m['cores']} cores, {m['filesystem'].get('type', '?')} at "
                 f"{cfg['bench_dir']}, walkv {m.get('walkv_commit')}, load average {m.get('load_avg')}\n")
    table: list[tuple[str, ...]] = [(r["metric"], f"{r['keys']:,}", _show(r["metric"], r["walkv"]), _show(r["metric"], r["leveldb"]),
              _x(r["ratio"]), _x(r["walkv_x_smallest"]), _x(r["leveldb_x_smallest"]), r["goal"], r["verdict"])
             for r in report["summary"]["rows"]]
    plain_table(HEADERS, table, stream)
    for err in report["summary"]["errors"]:
        stream.write(f"error: {err}\n")
    for size in report["sizes"]:
        killed = next((w for w in size["workloads"] if w["params"]["metric"] == "open.kill9"), None)
        replayed = [x.get("replayed") for x in killed["contenders"]["walkv"]["extra"]] if killed else []
        load = ", ".join(f"{LABELS[s]} {v['seconds']:g} s, {v['bytes'] / 2**30:.2f} GiB"
                         for s, v in size["load"].items())
        warmed = ", ".join(f"{LABELS[s]} {b / 2**30:.2f} GiB" for s, b in size.get("warm_bytes", {}).items())
        stream.write(f"{size['label']}: load {load}; walkv replayed after kill -9: {replayed}; "
                     f"warmed before each timed run: {warmed or '-'} (memory {m.get('memory_mb', '?')} MB)\n")


def plot(report: dict[str, Any], path: str) -> None:
    """One panel per metric (and for peak RSS): value vs keys, log-log, walkv
    and LevelDB; the goals drawn as dashed lines."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = pyplot()
    rows = report["summary"]["rows"]
    names = list(dict.fromkeys(r["metric"] for r in rows))
    cols = 3
    fig, axes = plt.subplots((len(names) + cols - 1) // cols or 1, cols, figsize=(13, 3.3 * ((len(names) + 2) // 3)),
                             squeeze=False)
    style = {"walkv": ("#1565c0", "o"), "leveldb": ("#ef6c00", "s")}
    for ax, name in zip(axes.flat, names):
        mine = [r for r in rows if r["metric"] == name]
        for s in SYSTEMS_MEASURED:
            pts = [(r["keys"], r[s]) for r in mine if r[s]]
            if pts:
                colour, marker = style[s]
                ax.plot(*zip(*pts), marker=marker, color=colour, label=LABELS[s])
        base = mine[0]["walkv"] if mine else None
        if name == "open.clean":
            ax.axhline(OPEN_GOAL_S, color="#c62828", linestyle="--", linewidth=1, label="goal")
        elif base and name != "open.kill9":
            bound = base * (RSS_GOAL if name.startswith("peak") else RATE_GOAL)
            ax.axhline(bound, color="#1565c0", linestyle="--", linewidth=1, label="walkv goal")
        ax.set_xscale("log")
        ax.set_yscale("log")
        sizes = sorted({r["keys"] for r in mine})
        ax.set_xticks(sizes, [size_label(k) for k in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
        lo, hi = ax.get_ylim()
        ax.yaxis.set_major_formatter(plain)  # labels on 2..9 too when the span is under a decade
        ax.yaxis.set_minor_formatter(plain if hi < 10 * lo else NullFormatter())
        unit = "s" if name.startswith("open.") else ("MB" if name.startswith("peak") else "per s")
        ax.set_title(f"{name} ({unit})", fontsize=9)
        ax.set_xlabel("keys", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_lines():
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    m = report["machine"]
    fig.suptitle(f"walkv vs LevelDB by store size ({m['cpu']}, {m['cores']} cores, walkv "
                 f"{m.get('walkv_commit')})", fontsize=10)
    save(fig, path)
