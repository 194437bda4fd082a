"""``walkv watch`` follows a store's changes as ``tail -f`` does: beside a
writing process, in log order, each line flushed as it comes; every kind of
change; JSON lines that keep bytes; a prefix, a keyspace or all of them;
from an LSN; and it stops cleanly (exit 0, the store closed, where to go on)
on SIGINT, on SIGTERM, after --count changes and after --idle seconds. Every
run here is bounded (--count/--idle, or a signal and a deadline)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

import kvstore
from tests.test_cli import REPO, walkv

DEADLINE = 60.0


def _spawn(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "kvstore.cli", "watch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=REPO)


def _read_lines(proc: subprocess.Popen, n: int) -> list[str]:
    """``n`` lines of the watcher's stdout, each as it is flushed (within DEADLINE)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    lines: list[str] = []
    end = time.monotonic() + DEADLINE
    buf = b""
    while len(lines) < n:
        left = end - time.monotonic()
        assert left > 0, f"only {lines} after {DEADLINE} s"
        if not sel.select(left):
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, f"the watcher ended early: {proc.wait()}, {proc.stderr.read() if proc.stderr else ''}"
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [d.decode() for d in done]
    return lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_follows_a_writer_and_stops_cleanly_on_a_signal(tmp_path, sig):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        before = db.put(b"before", b"not shown")
        proc = _spawn(path, "--json", "--from-lsn", str(before + 1))  # (a start in time is no test's business)
        try:
            first = db.put(b"k1", b"v1")
            got = _read_lines(proc, 1)
            db.put(b"k2", b"\xff\x00")
            db.delete(b"k1")
            got += _read_lines(proc, 2)
            rows = [json.loads(line) for line in got]
            assert [(r["lsn"], r["op"], r.get("key")) for r in rows] == [
                (first, "upsert", "k1"), (first + 1, "upsert", "k2"), (first + 2, "delete", "k1")]
            assert rows[1]["value_hex"] == "ff00" and rows[2]["value"] is None
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert "Traceback" not in err.decode()
        assert f"to go on: --from-lsn {first + 3}" in err.decode()
        assert out == b""
        db.put(b"after", b"the writer goes on")


def test_every_kind_of_change_from_an_lsn_and_stops_after_count_or_idle(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        db.put(b"user:1", b"ann")
        db.put(b"item:1", b"pen")
        db.delete_range(b"item:", None)
        db.keyspace("orders").put(b"o1", b"x")
        db.delete(b"user:1")
    new_only = walkv("watch", path, "--idle", "0.3")  # no --from-lsn: what comes after now
    assert new_only.returncode == 0 and new_only.stdout == "" and "--from-lsn 6" in new_only.stderr
    text = walkv("watch", path, "--from-lsn", "1", "--idle", "0.5")
    assert text.returncode == 0, text.stderr
    lines = [ln.split("\t") for ln in text.stdout.splitlines()]
    assert [(f[0], f[2], f[3], f[4]) for f in lines] == [
        ("1", "upsert", "user:1", "ann"), ("2", "upsert", "item:1", "pen"), ("3", "delete_range", "item:", ""),
        ("5", "delete", "user:1", "")]
    assert "no change for 0.5 s" in text.stderr and "--from-lsn 6" in text.stderr
    rows = [json.loads(ln) for ln in walkv("watch", path, "--from-lsn", "1", "--json", "--all-keyspaces",
                                           "--count", "4").stdout.splitlines()]
    assert [(r["lsn"], r["keyspace"]) for r in rows] == [(1, ""), (2, ""), (3, ""), (4, "orders")]
    assert rows[2]["end_key"] is None  # to the end of the keys
    only = walkv("watch", path, "--from-lsn", "1", "--prefix", "user:", "--idle", "0.3", "--json")
    # the range to the end of the keys meets the prefix too
    assert [json.loads(ln)["op"] for ln in only.stdout.splitlines()] == ["upsert", "delete_range", "delete"]
    ks = walkv("watch", path, "--from-lsn", "1", "--keyspace", "orders", "--count", "1", "--json")
    assert json.loads(ks.stdout)["key"] == "o1" and "--count 1 reached" in ks.stderr


@pytest.mark.parametrize("args", [["--idle", "0"], ["--from-lsn", "0"], ["--count", "-2"],
                                  ["--keyspace", "a", "--all-keyspaces"]])
def test_bad_arguments_are_usage_errors(tmp_path, args):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        db.put(b"k", b"v")
    proc = walkv("watch", path, *args)
    assert proc.returncode == 2, proc.stderr
    assert args[0] in proc.stderr and "invalid choice" not in proc.stderr  # the option is named
