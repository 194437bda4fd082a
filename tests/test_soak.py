"""The kill -9 soak runner (tests/soak.py): a short smoke run in CI, the real
run behind ``--soak`` (``--soak-seconds`` sets its length), and a check that
its checker does find a lost write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import kvstore
from tests import soak

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str, timeout: float) -> dict:
    p = subprocess.run([sys.executable, "-m", "tests.soak", "--json", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    assert lines, f"no summary (exit {p.returncode}): {p.stderr[-2000:]}"
    summary = json.loads(lines[0])
    assert p.returncode == 0, f"soak failed: {p.stdout}\n{p.stderr[-2000:]}"
    return summary


@pytest.mark.crash
def test_soak_smoke(capsys):
    """Three kill -9 rounds of the store: the harness works and loses nothing."""
    s = _run("--count", "3", "--max-run", "0.4", "--rebuild-every", "2", timeout=120)
    with capsys.disabled():
        print(f"\nsoak smoke: {s}")
    assert s["crashes"] == 3 and s["lost"] == 0 and s["torn_batches"] == 0 and s["phantoms"] == 0
    assert s["acknowledged_writes"] > 0


@pytest.mark.soak
@pytest.mark.timeout(0)  # bounded by --soak-seconds instead
@pytest.mark.parametrize("target", ["kv", "wal"])
def test_soak(target, soak_seconds, capsys):
    s = _run("--seconds", str(soak_seconds), "--target", target, timeout=soak_seconds * 2 + 120)
    with capsys.disabled():
        print(f"\nsoak ({target}): {s}")
    assert s["lost"] == 0 and s["torn_batches"] == 0 and s["phantoms"] == 0 and s["writer_errors"] == 0
    assert s["crashes"] >= 1 and s["acknowledged_writes"] > 0


def test_checker_finds_lost_deleted_back_torn_and_phantom(tmp_path):
    """The checker is not vacuous: each kind of damage is counted."""
    path = str(tmp_path / "store")
    args = soak.argparse.Namespace(target="kv", rebuild_every=0)
    oracle = soak.Oracle()
    ops = [["put", b"a", b"1"], ["put", b"b", b"2"], ["batch", [(b"c", b"3"), (b"d", b"4")]], ["delete", b"b"],
           ["put", b"e", b"5"]]
    for op in ops:
        oracle.intent(op)
        oracle.ack(op)
    oracle.intent(["delete", b"e"])  # in flight at the kill: e may be gone
    with kvstore.open(path, segment_bytes=4096) as db:
        db.put(b"b", b"2")            # an acknowledged delete undone
        db.put(b"c", b"3")            # half of a batch, and a lost put (a), (d)
        db.put(b"zz", b"never")       # a phantom
    totals = soak.Totals()
    soak.check(path, args, oracle, totals, 1)
    assert totals.lost == 3  # a and d missing, b back
    assert totals.torn == 1 and totals.phantom == 1
    assert totals.problems
