"""The read commands on a read replica's directory (``walkv replica STORE
DIR`` follows the writer; ``walkv get/scan/stats DIR`` read DIR beside it,
read-only), and ``stats`` showing its lag behind the source its ``REPLICA``
record names."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import kvstore
from kvstore import Archiver
from tests.test_cli import REPO, one_line_error, walkv


def _follow(store: str, replica: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "kvstore.cli", "replica", store, replica, "--poll", "0.01"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stats(path: str) -> dict:
    proc = walkv("stats", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _wait_applied(replica: str, lsn: int) -> dict:
    deadline = time.monotonic() + 60
    while True:
        if os.path.isdir(os.path.join(replica, "lmdb")):
            st = _stats(replica)
            if st.get("applied_lsn") == lsn:
                return st
        assert time.monotonic() < deadline, f"the replica did not reach LSN {lsn}"
        time.sleep(0.1)


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v%d" % i)
        db.put(b"\x00\xff", b"bin")
    return path


def test_get_scan_stats_read_a_replica_beside_its_follower(tmp_path, store):
    replica = str(tmp_path / "replica")
    follower = _follow(store, replica)
    try:
        st = _wait_applied(replica, 11)
        assert st["replica"] == {"source": store, "source_durable_lsn": 11, "lag_lsns": 0,
                                 "follower_pid": follower.pid}
        with kvstore.open(store, readonly=True) as db:
            assert st["store_id"] == db.store_id
        got = walkv("get", replica, "k3")
        assert (got.returncode, got.stdout) == (0, "v3\n"), got.stderr
        assert walkv("get", replica, "00ff", "--hex").stdout == b"bin".hex() + "\n"
        scan = walkv("scan", replica, "--keys-only", "--prefix", "k")
        assert scan.returncode == 0 and scan.stdout.split() == [f"k{i}" for i in range(10)]
        with kvstore.open(store) as db:  # the writer goes on; the follower and the readers see it
            db.put(b"k10", b"v10")
        st = _wait_applied(replica, 12)
        assert walkv("get", replica, "k10").stdout == "v10\n"
        table = walkv("stats", replica)
        assert table.returncode == 0
        assert f"follower            pid {follower.pid}" in table.stdout
        assert "lag                 0 entries behind its source" in table.stdout
    finally:
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err


def test_stats_shows_the_lag_behind_the_source(tmp_path, store):
    replica = str(tmp_path / "replica")
    with kvstore.open_replica(store, replica) as rep:
        rep.wait_for(11)
    with kvstore.open(store) as db:  # written while nobody follows
        for i in range(5):
            db.put(b"late%d" % i, b"x")
    st = _stats(replica)
    assert st["applied_lsn"] == 11 and st["closed_cleanly"] is True
    assert st["replica"] == {"source": store, "source_durable_lsn": 16, "lag_lsns": 5, "follower_pid": None}
    table = walkv("stats", replica).stdout
    assert "applied LSN         11" in table and "source durable LSN  16" in table
    assert "lag                 5 entries behind its source" in table and "not being followed" in table
    prom = walkv("stats", replica, "--prometheus").stdout
    assert f'walkv_replica_lag_lsns{{store="{replica}"}} 5.0' in prom  # prometheus-client's number format
    assert f'walkv_applied_lsn{{store="{replica}"}} 11.0' in prom


def test_stats_of_a_replica_of_an_archive_and_of_a_source_gone(tmp_path, store):
    archive = str(tmp_path / "archive")
    Archiver(store, archive).ship_once()
    replica = str(tmp_path / "replica")
    with kvstore.open_replica(archive, replica, poll_interval=0.05) as rep:
        rep.wait_for(11)
    assert _stats(replica)["replica"]["source_durable_lsn"] == 11
    os.rename(archive, archive + ".moved")
    st = _stats(replica)
    assert st["applied_lsn"] == 11 and st["replica"]["lag_lsns"] is None
    assert "no walkv archive" in st["replica"]["source_error"] or "not a walkv store" in \
        st["replica"]["source_error"]
    assert "lag                 unknown: " in walkv("stats", replica).stdout


def _files(path: str) -> dict[str, tuple[int, int, str]]:
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            if os.path.relpath(p, path) == os.path.join("lmdb", "lock.mdb"):
                continue  # LMDB's reader table: where every reader takes its slot
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = (os.stat(p).st_size, os.stat(p).st_mtime_ns,
                                                 hashlib.sha256(f.read()).hexdigest())
    return out


def test_reading_a_replica_writes_nothing(tmp_path, store):
    replica = str(tmp_path / "replica")
    with kvstore.open_replica(store, replica) as rep:
        rep.wait_for(11)
    before = _files(replica)
    for cmd in (["get", replica, "k1"], ["scan", replica], ["scan", replica, "--json"], ["stats", replica],
                ["stats", replica, "--json"], ["stats", replica, "--prometheus"]):
        proc = walkv(*cmd)
        assert proc.returncode == 0, (cmd, proc.stderr)
    assert _files(replica) == before
    assert sorted(os.listdir(replica)) == ["LOCK", "REPLICA", "lmdb"]


def test_what_a_replica_cannot_do_says_so(tmp_path, store):
    replica = str(tmp_path / "replica")
    with kvstore.open_replica(store, replica) as rep:
        rep.wait_for(11)
    for cmd in (["verify", replica], ["snapshot", replica], ["export", replica, str(tmp_path / "out")]):
        proc = walkv(*cmd)
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert f"{replica} is a read replica, not a store" in line and "get`, `scan` and `stats` read it" in line
    proc = walkv("restore", replica, str(tmp_path / "restored"))
    assert proc.returncode == 1 and "is a read replica, which keeps no log" in one_line_error(proc)
    for cmd in (["put", replica, "a", "b"], ["delete", replica, "k1"]):
        proc = walkv(*cmd)
        assert proc.returncode == 1 and "is a read replica" in one_line_error(proc)
    empty = tmp_path / "empty-replica"
    empty.mkdir()
    (empty / "REPLICA").write_text((tmp_path / "replica" / "REPLICA").read_text())
    proc = walkv("get", str(empty), "k1")
    assert proc.returncode == 1 and "`walkv replica SOURCE DIR` builds it" in one_line_error(proc)
