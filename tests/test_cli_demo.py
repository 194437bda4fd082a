"""``walkv demo --small`` end to end, as CI runs it (without Spark here: the
Spark export is covered by tests/test_cli.py and by ``make demo``)."""

from __future__ import annotations

import json
import os

import pytest

import kvstore
from tests.test_cli import one_line_error, walkv

pytestmark = pytest.mark.crash  # the demo SIGKILLs a writer process


def test_demo_small_end_to_end(tmp_path):
    d = tmp_path / "demo"
    summary = tmp_path / "summary.json"
    proc = walkv("demo", str(d), "--small", "--no-spark", "--json", str(summary), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for step in range(1, 7):
        assert f"[{step}/6]" in out
    assert "ok: all " in out and "acknowledged writes survived" in out
    assert "gap-free prefix" in out
    assert "the rebuilt store equals the store before" in out
    assert "the snapshot verifies and equals the store at its LSN" in out
    assert "whole segments covered by the snapshot were deleted" in out
    assert "the restored store equals the store at LSN" in out
    # The point-in-time restore came from the archive, by time, after the store was deleted.
    assert "ok: the archive verifies" in out
    assert "deleted the local store" in out
    assert "ok: the whole archive restores the store as it was at close: every acknowledged write" in out
    assert "from the archive to a time" in out
    assert "skipped: --no-spark" in out
    for row in ("entries", "durable puts/s", "fsyncs", "average group size", "recovery time",
                "bytes trimmed", "archive", "point-in-time restore", "rows exported"):
        assert f"\n  {row} " in out, row
    data = json.loads(summary.read_text())
    assert data["entries"] > 0 and data["fsyncs"] > 0 and data["bytes_trimmed"] > 0
    assert data["avg_group"] >= 1 and data["rows_exported"] is None and data["archive_bytes"] > 0
    # What it left is a sound store and a restored copy.
    assert walkv("verify", str(d / "store")).returncode == 0
    assert walkv("verify", str(d / "archive")).returncode == 0
    with kvstore.open(str(d / "restored"), readonly=True) as db:
        assert len(db) > 0 and db.get(b"deploy:last") is None
    # A second run wipes the directory it made and starts over.
    again = walkv("demo", str(d), "--small", "--no-spark", timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]


def test_demo_refuses_a_directory_it_did_not_make(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    proc = walkv("demo", str(d), "--small", "--no-spark")
    assert proc.returncode == 1
    assert "was not made by `walkv demo`" in one_line_error(proc)
    assert (d / "precious.txt").read_text() == "keep me"
    assert os.listdir(d) == ["precious.txt"]
