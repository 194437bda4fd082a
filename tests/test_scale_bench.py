"""The scale benchmark (``python -m benchmarks --scale``, issue 15) at a tiny
size, end to end through the command line: every metric is measured for
walkv and LevelDB and lands in the JSON, the goals follow from the numbers,
the data is cleaned up, and ``--plot`` without matplotlib is a one-line error.
No timing assertions."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from benchmarks.scale_metrics import METRICS, parse_sizes, size_label
from benchmarks.scale_report import summarise

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO)


def _cli(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import sys; from benchmarks.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=240)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> dict:
    pytest.importorskip("plyvel")
    tmp = tmp_path_factory.mktemp("scale")
    out = tmp / "scale.json"
    done = _cli("--scale", "2k", "--duration", "0.1", "--json", str(out), "--dir", str(tmp / "data"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loading walkv: 2,000/2,000 keys" in done.stderr  # progress on stderr
    assert "open.clean" in done.stdout and "walkv/LevelDB" in done.stdout
    assert not os.listdir(tmp / "data"), "the size's data must be deleted (no --keep)"
    return json.loads(out.read_text())


def test_every_metric_is_measured_for_both_systems(tiny_report):
    assert tiny_report["kind"] == "scale" and tiny_report["command"].startswith("python -m benchmarks --scale")
    assert tiny_report["machine"]["walkv_commit"]
    (size,) = tiny_report["sizes"]
    assert size["keys"] == 2000 and set(size["load"]) == {"walkv", "leveldb"}
    # each child ran warm: its system's files read first (walkv's LMDB, LevelDB's tables)
    assert set(size["warm_bytes"]) == {"walkv", "leveldb"} and all(b > 0 for b in size["warm_bytes"].values())
    assert [w["params"]["metric"] for w in size["workloads"]] == [m.name for m in METRICS]
    for w in size["workloads"]:
        for system in ("walkv", "leveldb"):
            c = w["contenders"][system]
            assert c["error"] is None, (w["name"], system, c["error"])
            assert c["median"] > 0 and c["rss_mb_max"] > 0
            assert all(x["anon_peak_mb"] > 0 and x["minor_faults"] >= 0 for x in c["extra"])
    kill = next(w for w in size["workloads"] if w["params"]["metric"] == "open.kill9")
    assert all(isinstance(x["replayed"], int) for x in kill["contenders"]["walkv"]["extra"])
    rows = tiny_report["summary"]["rows"]
    assert [r["metric"] for r in rows] == [m.name for m in METRICS] + ["peak RSS", "peak anon"]
    for r in rows:
        assert r["walkv"] > 0 and r["leveldb"] > 0 and r["ratio"] > 0, r
    assert tiny_report["summary"]["errors"] == []


def test_growth_against_the_smallest_size_gives_the_verdicts(tiny_report):
    report = copy.deepcopy(tiny_report)
    bigger = copy.deepcopy(report["sizes"][0])
    bigger["keys"] = 20_000
    for w in bigger["workloads"]:
        walkv = w["contenders"]["walkv"]
        if w["params"]["metric"] == "get":
            walkv["median"] *= 0.5  # gets/s halved: a MISS
        if w["params"]["metric"] == "open.clean":
            walkv["median"] = 0.5  # 2 s to open: a MISS
        walkv["rss_mb_max"] *= 1.1  # within 1.2x: PASS
    report["sizes"].append(bigger)
    rows = {(r["metric"], r["keys"]): r for r in summarise(report)["rows"]}
    assert rows[("get", 2000)]["verdict"] == "(base)"
    assert rows[("get", 20_000)]["walkv_x_smallest"] == pytest.approx(0.5)
    assert rows[("get", 20_000)]["verdict"] == "MISS"
    assert rows[("put.nosync.1t", 20_000)]["verdict"] == "PASS"
    assert rows[("open.clean", 20_000)]["walkv"] == pytest.approx(2.0)
    assert rows[("open.clean", 20_000)]["verdict"] == "MISS"
    assert rows[("open.kill9", 20_000)]["verdict"] == "-"
    assert rows[("peak RSS", 20_000)]["walkv_x_smallest"] == pytest.approx(1.1)
    assert rows[("peak RSS", 20_000)]["verdict"] == "PASS"


def test_plot_from_the_report(tiny_report, tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.scale_report import plot

    png = tmp_path / "scale.png"
    plot(tiny_report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_one_line_error_before_any_work(tmp_path):
    done = _cli("--scale", "2k", "--plot", str(tmp_path / "x.png"), "--dir", str(tmp_path / "data"),
                prelude="import sys; sys.modules['matplotlib'] = None; ")
    assert done.returncode == 2
    assert done.stderr == "error: --plot needs matplotlib: pip install 'walkv[bench]'\n"
    assert not (tmp_path / "data").exists() and not (tmp_path / "x.png").exists()


def test_sizes():
    assert parse_sizes("10M, 1M,2k,1500") == [1500, 2000, 1_000_000, 10_000_000]
    assert [size_label(n) for n in (2000, 1_000_000, 50_000_000, 1500)] == ["2k", "1M", "50M", "1500"]
    for bad in ("", "ten", "10"):
        with pytest.raises(ValueError):
            parse_sizes(bad)
