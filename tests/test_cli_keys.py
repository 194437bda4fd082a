"""``walkv stats`` counts the live keys of every keyspace (issue 33 item 11:
only the default keyspace's, expired keys not yet swept among them), ``walkv
keyspaces`` lists them, and ``walkv put`` takes ``--ttl``, a value from stdin
(``-``) or from ``--file``."""

from __future__ import annotations

import json
import time

import kvstore
from tests.test_cli import one_line_error, walkv


def _store(path: str) -> str:
    """3 live keys in the default keyspace and 1 expired, 2 in users, 1 in orders and 1 expired there;
    the sweeper never ran (no sweeper thread; the TTLs ran out after the writes)."""
    with kvstore.open(path, sweep_interval=None) as db:
        for k in (b"a", b"b", b"c"):
            db.put(k, b"1")
        db.put(b"gone", b"x", ttl=0.05)
        db.keyspace("users").put(b"u1", b"1")
        db.keyspace("users").put(b"u2", b"1")
        db.keyspace("orders").put(b"o1", b"1")
        db.keyspace("orders").put(b"o2", b"1", ttl=0.05)
        time.sleep(0.1)
        assert db.stats()["lmdb_entries"] == 4  # LMDB still holds the expired one
    return path


def test_stats_counts_every_keyspace_without_expired_keys(tmp_path):
    s = _store(str(tmp_path / "s"))
    st = json.loads(walkv("stats", s, "--json").stdout)
    assert st["keys"] == 6
    assert st["keyspaces"] == {"": 3, "orders": 1, "users": 2}
    text = walkv("stats", s).stdout
    assert "keys              6 (default keyspace 3; 2 keyspaces: orders 1, users 2)" in text


def test_keyspaces_lists_each_with_its_keys(tmp_path):
    s = _store(str(tmp_path / "s"))
    proc = walkv("keyspaces", s)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["  (default)  3 keys", "  orders     1 key", "  users      2 keys"]
    assert json.loads(walkv("keyspaces", s, "--json").stdout) == [
        {"keyspace": "", "keys": 3}, {"keyspace": "orders", "keys": 1}, {"keyspace": "users", "keys": 2}]
    missing = walkv("keyspaces", str(tmp_path / "none"))
    assert missing.returncode == 1 and "no store" in one_line_error(missing)


def test_put_with_a_ttl_from_stdin_and_from_a_file(tmp_path):
    s = str(tmp_path / "s")
    binary = bytes(range(256)) * 10
    assert walkv("put", s, "blob", "-", input=binary).returncode == 0
    src = tmp_path / "value.bin"
    src.write_bytes(binary[::-1])
    assert walkv("put", s, "file", "--file", str(src), "--keyspace", "users").returncode == 0
    assert walkv("put", s, "beef", "-", "--hex", input=b"cafe\n").returncode == 0
    assert walkv("put", s, "short", "lived", "--ttl", "3600").returncode == 0
    with kvstore.open(s) as db:
        assert db.get(b"blob") == binary
        assert db.keyspace("users").get(b"file") == binary[::-1]
        assert db.get(b"\xbe\xef") == b"\xca\xfe"
        ttl = db.ttl(b"short")
        assert ttl is not None and 3500 < ttl <= 3600
        assert db.ttl(b"blob") is None
    for args in (["k"], ["k", "v", "--file", str(src)], ["k", "v", "--ttl", "0"], ["k", "v", "--ttl", "soon"]):
        proc = walkv("put", s, *args)
        assert proc.returncode == 2, (args, proc.stderr)
    proc = walkv("put", s, "k", "--file", str(tmp_path / "nofile"))
    assert proc.returncode == 1 and "cannot read" in one_line_error(proc)
