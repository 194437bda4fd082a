"""``walkv serve STORE --resp HOST:PORT`` with Redis's own client,
redis-cli (Debian's redis-tools): commands, databases, ``--pipe`` mass
insertion, ``--scan``, tokens, PSUBSCRIBE to keyspace notifications; the
HTTP face sees the same store; SIGTERM answers what is in flight and closes
the store cleanly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading

import pytest

import kvstore
from tests.resp_fixture import served_with_resp
from tests.server_fixture import ROOT, new_token

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None,
                                reason="redis-cli is not installed (apt-get install -y redis-tools)")


def cli(port: int, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), *args], input=stdin, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_redis_cli_against_walkv_serve(tmp_path):
    store = str(tmp_path / "store")
    served, port = served_with_resp(store)
    try:
        assert cli(port, "PING") == "PONG\n"
        assert cli(port, "SET", "user:1", "Ada") == "OK\n"
        assert cli(port, "GET", "user:1") == "Ada\n"
        assert cli(port, "INCRBY", "visits", "5") == "5\n"
        assert cli(port, "-n", "2", "SET", "k", "in db 2") == "OK\n"
        assert cli(port, "-n", "2", "DBSIZE") == "1\n"
        assert cli(port, "SET", "t", "x", "EX", "100") == "OK\n"
        assert 0 < int(cli(port, "TTL", "t")) <= 100
        assert cli(port, "NOSUCH").startswith("ERR unknown command 'NOSUCH'")
        lines = b"".join(b"SET bulk:%04d %d\r\n" % (i, i) for i in range(500))
        mass = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=_protocol(lines),
                              capture_output=True, timeout=60)
        assert b"errors: 0, replies: 500" in mass.stdout, mass.stdout
        assert sorted(cli(port, "--scan", "--pattern", "bulk:00*").split()) == [f"bulk:{i:04d}" for i in range(100)]
        assert "db0:keys=503" in cli(port, "INFO", "keyspace")
        http = served.session()  # the HTTP face: the same store
        assert http.get("/v1/kv/user%3A1").content == b"Ada"
        assert served.stop() == 0  # SIGTERM
    finally:
        if served.alive():
            served.kill()
    with kvstore.open(store) as db:
        assert db.get(b"bulk:0499") == b"499" and db.keyspace("2").get(b"k") == b"in db 2"
        assert db.rebuilt is None and db.replayed == 0  # closed cleanly


def _protocol(lines: bytes) -> bytes:
    """Inline lines as RESP arrays (what a --pipe user generates)."""
    out = []
    for line in lines.split(b"\r\n"):
        if line:
            parts = line.split(b" ")
            out.append(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts))
    return b"".join(out)


def test_redis_cli_with_tokens(tmp_path):
    read, write = new_token("read"), new_token("write")
    served, port = served_with_resp(str(tmp_path / "store"), tokens={"read": read, "write": write})
    try:
        assert cli(port, "GET", "k").startswith("NOAUTH")
        assert cli(port, "--no-auth-warning", "-a", write, "SET", "k", "v") == "OK\n"
        assert cli(port, "--no-auth-warning", "-a", read, "GET", "k") == "v\n"
        assert cli(port, "--no-auth-warning", "-a", read, "SET", "k", "w").startswith("NOPERM")
        assert read not in served.output() and write not in served.output()
    finally:
        served.stop()


def test_the_readme_redis_cli_examples_print_what_they_say(tmp_path):
    """Each ``redis-cli`` line of the README's "Redis clients" section, run
    against a server, prints what its comment says."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Redis clients", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"^(redis-cli [^#\n]*?)\s+# (.*)$", section, re.MULTILINE)
    assert len(examples) >= 5
    served, port = served_with_resp(str(tmp_path / "store"))
    try:
        for line, expected in examples:
            args = line.split()[1:]
            if args[:2] == ["-p", "6379"]:
                args = args[2:]
            got = cli(port, *args).strip().replace("\n", " ")
            assert got == expected.strip(), (line, got)
    finally:
        served.stop()


def test_redis_cli_subscribes_to_keyspace_notifications(tmp_path):
    """``redis-cli PSUBSCRIBE`` prints the notifications of writes made by
    another redis-cli and by the HTTP face, as Redis's would."""
    served, port = served_with_resp(str(tmp_path / "store"))
    sub = subprocess.Popen(["redis-cli", "-p", str(port), "PSUBSCRIBE", "__keyspace@0__:user:*"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    bound = threading.Timer(60, sub.kill)  # readline below waits at most this long (then reads EOF)
    bound.start()
    try:
        assert [sub.stdout.readline() for _ in range(3)] == ["psubscribe\n", "__keyspace@0__:user:*\n", "1\n"]
        assert cli(port, "SET", "user:1", "Ada") == "OK\n"
        assert cli(port, "INCR", "user:2") == "1\n"
        assert served.session().put("/v1/kv/user%3A3", content=b"by http").status_code in (200, 201, 204)
        assert cli(port, "DEL", "user:1") == "1\n"
        got = [sub.stdout.readline().strip() for _ in range(16)]  # 4 lines a message
        assert got == ["pmessage", "__keyspace@0__:user:*", "__keyspace@0__:user:1", "set",
                       "pmessage", "__keyspace@0__:user:*", "__keyspace@0__:user:2", "incrby",
                       "pmessage", "__keyspace@0__:user:*", "__keyspace@0__:user:3", "set",
                       "pmessage", "__keyspace@0__:user:*", "__keyspace@0__:user:1", "del"]
    finally:
        bound.cancel()
        sub.kill()
        sub.wait()
        served.stop()
