"""Showing a run: the table (rich when installed, plain text otherwise), the
JSON file and the ratio plot (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

HEADERS = ("workload", "walkv", "peer", "peer rate", "walkv/peer", "target", "result")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:,.2f}"


def rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per comparison and per limit; one row per skipped workload."""
    out: list[tuple[str, ...]] = []
    for w in report["workloads"]:
        name = w["name"]
        walkv = w["contenders"].get("walkv", {})
        if w["status"] == "skipped":
            out.append((name, "-", "-", "-", "-", "-", "SKIP: " + w["note"]))
            continue
        walkv_text = _num(walkv.get("median")) + " " + w["unit"] if walkv.get("median") else (
            "ERROR" if walkv.get("error") else "-")
        for c in w["comparisons"]:
            peer_entry = w["contenders"][c["peer"]]
            if peer_entry.get("error") and c["peer_rate"] is None:
                result = "peer error: " + peer_entry["error"][:60]
            else:
                result = c["verdict"]
            target = f">= {c['target']:g}x" if c["target"] is not None else "(extra)"
            ratio = f"{c['ratio']:.2f}x" if c["ratio"] is not None else "-"
            rounds = c.get("paired_ratios") or []
            if len(rounds) > 1:  # the spread of the rounds' own ratios: how far one run's ratio can be trusted
                ratio += f" ({min(rounds):.2f}-{max(rounds):.2f})"
            out.append((name, walkv_text, c["label"], _num(c["peer_rate"]), ratio, target, result))
        for lim in w["limits"]:
            value = f"{lim['value']:.0f} {lim['unit']}" if lim["value"] is not None else "-"
            out.append((name, value, f"max {lim['metric']}", "-", "-",
                        f"< {lim['maximum']:g} {lim['unit']}", lim["verdict"]))
        for metric in w.get("report", []):  # extras reported without a target: walkv's beside each peer's
            own = walkv.get("reported", {}).get(metric)
            peers = [(e["label"], e.get("reported", {}).get(metric))
                     for c, e in w["contenders"].items() if c != "walkv"]
            for label, value in [(lbl, v) for lbl, v in peers if v is not None] or [("-", None)]:
                if own is not None or value is not None:
                    out.append((f"{name} {metric}", _num(own), label, _num(value), "-", "-", "reported"))
        if not w["comparisons"] and not w["limits"]:
            out.append((name, walkv_text, "-", "-", "-", "-", w["status"]))
        if walkv.get("error"):
            out.append((name, "ERROR", "-", "-", "-", "-", walkv["error"][:100]))
    return out


def plain_table(headers: tuple[str, ...], table: list[tuple[str, ...]], stream: TextIO) -> None:
    """Columns padded to their widest cell (at most 60 characters), a rule under the headers."""
    data = [headers, *table]
    widths = [min(max(len(r[i]) for r in data), 60) for i in range(len(headers))]
    for n, r in enumerate(data):
        stream.write("  ".join(cell[:60].ljust(widths[i]) for i, cell in enumerate(r)).rstrip() + "\n")
        if n == 0:
            stream.write("  ".join("-" * w for w in widths) + "\n")


def _first_touch(machine: dict[str, Any]) -> str:
    """The memory's first-touch cost (:func:`benchmarks.machine.first_touch_us`), as the title shows it."""
    touch = machine.get("first_touch_us")
    if not touch:
        return "memory first touch ?"
    return f"memory first touch {touch['fresh']} µs/page (again {touch['again']})"


def print_table(report: dict[str, Any], stream: TextIO | None = None, plain: bool = False) -> None:
    stream = stream or sys.stdout
    table = rows(report)
    m = report["machine"]
    title = (f"walkv benchmarks ({'quick' if report['config']['quick'] else 'full'}, "
             f"{report['config']['repeats']} repeats, medians) on {m['cpu']}, {m['cores']} cores, "
             f"{m['filesystem'].get('type', '?')} at {m['bench_dir']}; walkv {m.get('walkv_build', '?')}, "
             f"Python sum(range(10**7)) {m.get('python_speed_ms', '?')} ms, "
             f"fsync (4 KiB fdatasync, median) {m.get('fsync_latency_ms', '?')} ms, "
             f"{_first_touch(m)}")
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if plain:
        stream.write(title + "\n")
        plain_table(HEADERS, table, stream)
        return
    t = Table(title=title, title_justify="left")
    for h in HEADERS:
        t.add_column(h, justify="right" if h in ("walkv", "peer rate", "walkv/peer") else "left")
    style = {"PASS": "green", "MISS": "bold red"}
    for r in table:
        t.add_row(*r[:-1], f"[{style[r[-1]]}]{r[-1]}[/]" if r[-1] in style else r[-1])
    Console(file=stream, width=max(160, Console(file=stream).width)).print(t)


def write_json(report: dict[str, Any], path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def matplotlib_missing() -> str | None:
    """The one-line error for ``--plot`` when matplotlib cannot be imported, else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "error: --plot needs matplotlib: pip install 'walkv[bench]'"
    return None


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str) -> None:
    """Lay out, write as PNG and free the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot(report: dict[str, Any], path: str) -> None:
    """Horizontal bars of walkv/peer for every comparison, log scale, with each
    bar's target marked and the 1x line."""
    plt = pyplot()

    bars = []
    for w in report["workloads"]:
        for c in w["comparisons"]:
            if c["ratio"] is not None:
                bars.append((f"{w['name']} vs {c['label']}", c["ratio"], c["target"], c["verdict"]))
    if not bars:
        bars.append(("(no comparisons ran)", 1.0, None, "-"))
    colours = {"PASS": "#2e7d32", "MISS": "#c62828"}
    fig, ax = plt.subplots(figsize=(11, 0.38 * len(bars) + 1.6))
    ys = list(range(len(bars)))[::-1]
    # bars grow from 1x: right when walkv is faster, left when slower
    ax.barh(ys, [b[1] - 1.0 for b in bars], left=1.0,
            color=[colours.get(b[3], "#9e9e9e") for b in bars], height=0.6)
    for y, (_, ratio, target, _) in zip(ys, bars):
        if target is not None:
            ax.plot([target, target], [y - 0.42, y + 0.42], color="black", linewidth=2)
        ax.text(ratio, y, f" {ratio:.2f}x " , va="center", ha="left" if ratio >= 1 else "right",
                fontsize=8)
    ax.axvline(1.0, color="#555555", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    lo = min(min(b[1] for b in bars), min((b[2] for b in bars if b[2]), default=1.0), 1.0)
    hi = max(max(b[1] for b in bars), max((b[2] for b in bars if b[2]), default=1.0), 1.0)
    ax.set_xlim(lo / 1.6, hi * 1.6)
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set_yticks(ys)
    ax.set_yticklabels([b[0] for b in bars], fontsize=8)
    ax.set_xlabel("walkv / peer (higher is better; black tick = target; green PASS, red MISS, grey extra)")
    m = report["machine"]
    ax.set_title(f"walkv vs peers, medians of {report['config']['repeats']} alternating repeats "
                 f"({m['cpu']}, {m['cores']} cores, {m['filesystem'].get('type', '?')})", fontsize=9)
    save(fig, path)
