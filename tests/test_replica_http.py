"""Read replicas of a served store (``kvstore.open_replica("http://...", dir)``,
:mod:`kvstore.replica.http_source`), against a real server on an ephemeral
port (``kvstore.server.serve_async`` in a thread: tests/served.py) with
bearer tokens: bootstrap from the newest snapshot the server lists, follow
writes, rebuild when the server's retention trimmed past the replica,
promote refused while the server answers, and no token, no replica."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

pytest.importorskip("httpx")
pytest.importorskip("aiohttp")

import kvstore  # noqa: E402
from kvstore.client.wire import ServerUnavailable, Unauthorized  # noqa: E402
from kvstore.replica.directory import read_record  # noqa: E402
from kvstore.replica.http_source import HttpSource  # noqa: E402
from kvstore.server import Tokens, tls_context  # noqa: E402
from tests.served import ServerThread  # noqa: E402
from tests.test_cli import REPO, walkv  # noqa: E402
from wal.errors import LockedError, LogGapError  # noqa: E402

READ, WRITE, ADMIN = "read-token-1", "write-token-2", "admin-token-3"
TOKENS = Tokens([("read", READ), ("write", WRITE), ("admin", ADMIN)])
SMALL = {"segment_bytes": 64 << 10, "tokens": TOKENS}  # small segments: retention trims after a snapshot


def _fill(db, start: int, n: int, size: int = 200) -> int:
    """``n`` puts, one entry each (so segments roll); the last LSN."""
    lsn = 0
    for i in range(start, start + n):
        lsn = db.put(b"key:%06d" % i, b"%06d" % i + b"v" * size)
    return lsn


def _state(db) -> list[tuple[bytes, bytes]]:
    return list(db.scan())


def _snapshot(url: str) -> int:
    with kvstore.connect(url, token=ADMIN) as admin:
        return admin.snapshot()["lsn"]


def _bounds(url: str) -> dict:
    with kvstore.connect(url, token=READ) as reader:
        return reader.bounds()


def test_bootstraps_from_the_newest_snapshot_then_follows_writes(tmp_path):
    rdir = tmp_path / "rep"
    with ServerThread(tmp_path / "store", **SMALL) as server, kvstore.connect(server.url, token=WRITE) as db:
        _fill(db, 0, 400)
        snap_lsn = _snapshot(server.url)
        _fill(db, 400, 50)
        assert _bounds(server.url)["first_lsn"] > 1  # the log alone could not build the replica
        with kvstore.open_replica(server.url, rdir, token=READ) as rep:
            assert os.listdir(rdir / "snapshots") == [f"snap-{snap_lsn:020d}"]  # downloaded, then verified
            assert rep.applied_lsn == db.last_lsn and rep.store_id == _bounds(server.url)["store_id"]
            assert _state(rep) == _state(db)
            lsn = db.put(b"key:000001", b"changed")
            with db.batch() as b:
                b.delete_range(b"key:000100", b"key:000200")
                b.put(b"new", b"one")
            assert db.compare_and_set(b"new", b"one", b"two")
            assert rep.wait_for(db.last_lsn, timeout=30) >= db.last_lsn > lsn
            assert rep.get(b"key:000001") == b"changed" and rep.get(b"new") == b"two"
            assert rep.get(b"key:000150") is None
            assert _state(rep) == _state(db)
            assert rep.lag.lsns == 0
        assert read_record(str(rdir))["source"] == server.url  # walkv stats DIR asks it
    with kvstore.open(rdir, readonly=True) as ro:  # read beside (after) the follower, as any replica
        assert ro.get(b"new") == b"two"


def test_the_server_trimmed_past_the_replica_it_rebuilds_from_a_snapshot(tmp_path):
    rdir = tmp_path / "rep"
    with ServerThread(tmp_path / "store", **SMALL) as server, kvstore.connect(server.url, token=WRITE) as db:
        _fill(db, 0, 100)
        with kvstore.open_replica(server.url, rdir, token=READ) as rep:
            assert rep.wait_for(db.last_lsn, timeout=30) == db.last_lsn
            behind = rep.applied_lsn
        _fill(db, 100, 600)  # the replica is closed: the server's retention does not wait for it
        _snapshot(server.url)
        _fill(db, 700, 10)
        newest = _snapshot(server.url)
        assert _bounds(server.url)["first_lsn"] > behind + 1
        source = HttpSource(server.url, token=READ)
        try:
            with pytest.raises(LogGapError) as gap:
                list(source.entries(behind + 1, db.last_lsn))
            assert gap.value.first_available == _bounds(server.url)["first_lsn"]
        finally:
            source.close()
        with kvstore.open_replica(server.url, rdir, token=READ) as rep:  # its LMDB no longer meets the log
            assert os.listdir(rdir / "snapshots") == [f"snap-{newest:020d}"]  # rebuilt from the newest
            assert rep.applied_lsn == db.last_lsn
            assert _state(rep) == _state(db)


def test_promote_is_refused_while_the_server_answers_and_works_once_it_is_gone(tmp_path):
    rdir = tmp_path / "rep"
    server = ServerThread(tmp_path / "store", **SMALL)
    try:
        with kvstore.connect(server.url, token=WRITE) as db:
            _fill(db, 0, 20)
            rep = kvstore.open_replica(server.url, rdir, token=READ)
            try:
                rep.wait_for(db.last_lsn, timeout=30)
                with pytest.raises(LockedError, match="still answers"):
                    rep.promote()
                assert not rep.closed  # refused: it goes on following
                lsn = db.put(b"after", b"refusal")
                assert rep.wait_for(lsn, timeout=30) == lsn and rep.get(b"after") == b"refusal"
                expected = _state(db)
            except BaseException:
                rep.close()
                raise
        server.stop()
        promoted = rep.promote()
        try:
            assert _state(promoted) == expected
            assert promoted.put(b"next", b"write") == lsn + 1  # LSNs continue
            assert promoted.store_id == rep.store_id and promoted.history[-1].timeline == 2
        finally:
            promoted.close()
    finally:
        server.stop()


def test_no_valid_token_no_replica(tmp_path):
    rdir = tmp_path / "rep"
    with ServerThread(tmp_path / "store", **SMALL) as server:
        with kvstore.connect(server.url, token=WRITE) as db:
            db.put(b"k", b"v")
        for token in (None, "not-a-token"):
            with pytest.raises(Unauthorized):
                kvstore.open_replica(server.url, rdir, token=token)
            assert not rdir.exists()  # refused before anything was made
        with kvstore.open_replica(server.url, rdir, token=READ) as rep:
            assert rep.wait_for(1, timeout=30) == 1 and rep.get(b"k") == b"v"
    with pytest.raises(ValueError, match="token= and verify= are for a served store"):
        kvstore.open_replica(str(tmp_path / "store"), tmp_path / "rep2", token=READ)


def test_walkv_replica_follows_a_url_with_the_token_from_the_environment(tmp_path):
    replica = str(tmp_path / "rep")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), WALKV_TOKEN=READ)
    with ServerThread(tmp_path / "store", **SMALL) as server, kvstore.connect(server.url, token=WRITE) as db:
        lsn = _fill(db, 0, 5)
        follower = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "replica", server.url, replica],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert follower.stderr is not None
            seen = []
            for line in follower.stderr:  # lag lines as it follows (never a timing: it ends when it shows lsn)
                seen.append(line)
                if f"applied LSN {lsn} " in line:
                    break
            else:
                pytest.fail("walkv replica ended before LSN %d: %s" % (lsn, "".join(seen)))
            stats = walkv("stats", replica, "--json", env=env)
            assert stats.returncode == 0, stats.stderr
            st = json.loads(stats.stdout)
            assert st["applied_lsn"] == lsn
            assert st["replica"]["source"] == server.url and st["replica"]["source_durable_lsn"] == lsn
        finally:
            follower.send_signal(signal.SIGTERM)
            follower.communicate(timeout=60)
        assert follower.returncode == 0
        bad = walkv("replica", server.url, str(tmp_path / "rep2"), env=dict(env, WALKV_TOKEN="wrong"))
        assert bad.returncode == 1 and "Bearer TOKEN" in bad.stderr and "wrong" not in bad.stderr


def _self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (openssl), PEM files."""
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return cert, key


def test_over_tls_the_replica_checks_the_servers_certificate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = _self_signed(tmp_path)
    with ServerThread(tmp_path / "store", tls=tls_context(cert, key), **SMALL) as server:
        assert server.url.startswith("https://")
        with kvstore.connect(server.url, token=WRITE, verify=cert) as db:
            lsn = db.put(b"secret", b"over tls")
        with pytest.raises(ServerUnavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            kvstore.open_replica(server.url, tmp_path / "rep", token=READ)  # not a CA the system trusts
        with kvstore.open_replica(server.url, tmp_path / "rep", token=READ, verify=cert) as rep:
            assert rep.wait_for(lsn, timeout=30) == lsn and rep.get(b"secret") == b"over tls"
