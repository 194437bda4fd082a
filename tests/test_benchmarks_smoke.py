"""Smoke test of the benchmark harness: it runs, rotates the contenders, and reports
the expected structure. No timing assertions: only that rates are positive
and that the verdicts follow from the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import run
from benchmarks.harness import Config, Contender, Limit, Measurement, Target, Workload, run_workload
from benchmarks.report import rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path) -> Config:
    return Config(quick=True, repeats=3, base_dir=str(tmp_path), verbose=False)


def test_contenders_rotate_and_medians_give_the_verdicts(tmp_path):
    calls: list[str] = []
    rates = {"walkv": [10.0, 30.0, 20.0], "fast": [40.0, 40.0, 40.0], "slow": [5.0, 5.0, 10.0]}

    def contender(name: str) -> Contender:
        def run_once(ctx):
            calls.append(name)
            assert os.path.isdir(ctx.directory) and ctx.state == f"prepared {name}"
            return Measurement(ops=int(rates[name][calls.count(name) - 1] * 10), seconds=10.0,
                               rss_mb=50.0)

        return Contender(name, run_once, prepare=lambda ctx: f"prepared {name}")

    w = Workload(name="t.alt", issue=0, title="t", unit="ops/s",
                 contenders=[contender("walkv"), contender("fast"), contender("slow")],
                 targets=[Target("fast", 1.0), Target("slow", 2.0)], limits=[Limit("rss_mb", 40.0)])
    res = run_workload(w, _config(tmp_path))
    # The order rotates by one at each repeat: no contender always runs first (or after the same one).
    assert calls == ["walkv", "fast", "slow", "fast", "slow", "walkv", "slow", "walkv", "fast"]
    assert res["contenders"]["walkv"]["median"] == pytest.approx(20.0)
    by_peer = {c["peer"]: c for c in res["comparisons"]}
    assert by_peer["fast"]["ratio"] == pytest.approx(0.5) and by_peer["fast"]["verdict"] == "MISS"
    assert by_peer["slow"]["ratio"] == pytest.approx(4.0) and by_peer["slow"]["verdict"] == "PASS"
    assert by_peer["slow"]["paired_ratios"] == pytest.approx([2.0, 6.0, 2.0])
    assert by_peer["slow"]["paired_ratio_median"] == pytest.approx(2.0)
    # The table shows each ratio with the spread of the rounds' own ratios.
    table = {r[2]: r[4] for r in rows({"workloads": [res]}) if r[2] in ("fast", "slow")}
    assert table == {"fast": "0.50x (0.25-0.75)", "slow": "4.00x (2.00-6.00)"}
    assert res["limits"][0]["value"] == 50.0 and res["limits"][0]["verdict"] == "MISS"
    assert not os.listdir(tmp_path), "the workload's data directory must be removed"


def test_missing_walkv_code_skips_and_a_failing_peer_does_not_stop_the_run(tmp_path):
    w = Workload(name="t.skip", issue=0, title="t", unit="ops/s", requires=("no_such_walkv_module",),
                 contenders=[Contender("walkv", lambda ctx: Measurement(1, 1.0))])
    res = run_workload(w, _config(tmp_path))
    assert res["status"] == "skipped" and "not available yet" in res["note"]

    def boom(ctx):
        raise OSError("disk on fire")

    w = Workload(name="t.err", issue=0, title="t", unit="ops/s", targets=[Target("bad", 1.0)],
                 contenders=[Contender("walkv", lambda ctx: Measurement(5, 1.0)),
                             Contender("bad", boom),
                             Contender("absent", boom, requires=("no_such_peer_module",))])
    res = run_workload(w, _config(tmp_path))
    assert res["status"] == "ok"
    assert res["contenders"]["walkv"]["rates"] == [5.0, 5.0, 5.0]
    assert "disk on fire" in res["contenders"]["bad"]["error"]
    assert "not available" in res["contenders"]["absent"]["error"]
    assert {c["peer"]: c["verdict"] for c in res["comparisons"]} == {"bad": "n/a", "absent": "-"}


def test_quick_run_of_log_workloads_writes_the_report(tmp_path, capsys):
    pytest.importorskip("plyvel")
    out = tmp_path / "bench.json"
    report = run(quick=True, only="log.append.durable.1t,log.read", repeats=1, duration=0.2,
                 json_path=str(out), bench_dir=str(tmp_path / "data"), verbose=False, plain=True, pure=True)
    printed = capsys.readouterr().out
    assert "log.append.durable.1t" in printed and "walkv/peer" in printed
    assert f"walkv {report['machine']['walkv_build']}, Python sum(range(10**7)) " in printed.splitlines()[0]
    assert "walkv, pure Python (WALKV_PURE=1)" in printed  # --pure: the interpreted twin, a contender

    saved = json.loads(out.read_text())
    assert saved["workloads"] == json.loads(json.dumps(report["workloads"]))
    m = saved["machine"]
    for key in ("cpu", "cores", "kernel", "python", "filesystem", "versions", "bench_dir", "python_speed_ms",
                "walkv_build", "first_touch_us"):
        assert m[key], key
    assert m["first_touch_us"]["fresh"] > 0 and m["first_touch_us"]["again"] > 0
    assert f"memory first touch {m['first_touch_us']['fresh']} µs/page" in printed.splitlines()[0]
    assert m["filesystem"]["type"] and m["versions"]["plyvel"]
    names = [w["name"] for w in saved["workloads"]]
    assert names == ["log.append.durable.1t", "log.read"]
    for w in saved["workloads"]:
        assert w["status"] == "ok", w
        for name, c in w["contenders"].items():
            assert c["error"] is None, (w["name"], name, c["error"])
            assert len(c["rates"]) == 1 and c["median"] > 0
        for comp in w["comparisons"]:
            assert comp["ratio"] > 0
            if comp["target"] is not None:
                assert comp["verdict"] == ("PASS" if comp["ratio"] >= comp["target"] else "MISS")
    read = saved["workloads"][1]
    assert read["contenders"]["walkv"]["ops"] == [read["params"]["entries"]]
    assert read["contenders"]["leveldb-replay"]["ops"] == [read["params"]["entries"]]
    assert read["contenders"]["walkv"]["rss_mb"][0] > 0
    assert not os.listdir(tmp_path / "data"), "benchmark data must be cleaned up"


def test_plot_and_cli(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.report import plot

    report = {"machine": {"cpu": "x", "cores": 2, "filesystem": {"type": "ext4"}},
              "config": {"repeats": 1},
              "workloads": [{"name": "w", "comparisons": [
                  {"label": "peer", "ratio": 0.5, "target": 1.0, "verdict": "MISS"},
                  {"label": "extra", "ratio": 2.0, "target": None, "verdict": "-"}]}]}
    png = tmp_path / "r.png"
    plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    env = dict(os.environ, PYTHONPATH=REPO)
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "log.append.durable.8t" in listed.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "no.such.workload"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "matches no workload" in bad.stderr


def test_only_selects_exact_names_prefixes_and_slow_workloads_only_by_name():
    from benchmarks import all_workloads
    from benchmarks.harness import select

    every = all_workloads(Config(quick=True))
    names = lambda only: [w.name for w in select(every, only)]  # noqa: E731
    assert names(["log.read"]) == ["log.read"]
    assert set(names(["log"])) >= {"log.append.durable.1t", "log.append.durable.8t", "log.read",
                                   "log.memory"}
    assert all(n.startswith("log.") for n in names(["log"]))
    assert not any(n.startswith("spark") for n in names(None))
    assert names(["spark"]) and all(n.startswith("spark.") for n in names(["spark"]))


@pytest.mark.parametrize("mode", ["serial", "serial+gather", "pipelined", "pipelined+gather"])
def test_the_group_commit_model_runs_every_mode(tmp_path, mode):
    from benchmarks.group_commit_model import run as run_model

    rate, per_group = run_model(mode, threads=4, seconds=0.2, directory=str(tmp_path))
    assert rate > 0
    assert 1 <= per_group <= 4  # a group never holds more appends than there are appenders waiting
    assert not os.listdir(tmp_path), "the model's file must be removed"
