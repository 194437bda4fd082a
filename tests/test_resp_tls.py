"""``walkv serve --resp`` follows ``walkv serve``'s rules: with
``--tls-cert``/``--tls-key`` the RESP listener speaks TLS (``rediss://``,
redis-py and redis-cli with the CA; a plain client gets nothing), and a
non-loopback ``--resp`` address without tokens is refused before anything
listens (the loopback rule)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.resp_fixture import RESP_LISTENING, served_with_resp
from tests.server_fixture import ROOT, Tls, child_env, serve_command

redis = pytest.importorskip("redis")


def test_resp_over_tls(tmp_path):
    tls = Tls(str(tmp_path))
    served, port = served_with_resp(str(tmp_path / "store"), tls=tls)
    try:
        assert RESP_LISTENING.search(served.output()).group(1) == f"rediss://127.0.0.1:{port}"
        secure = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=tls.ca_file, socket_timeout=10)
        assert secure.set("k", "over tls") is True and secure.get("k") == b"over tls"
        secure.close()
        plain = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            plain.set("k", "in clear")
        plain.close()
        if shutil.which("redis-cli") is not None:
            done = subprocess.run(["redis-cli", "-p", str(port), "--tls", "--cacert", tls.ca_file, "GET", "k"],
                                  capture_output=True, timeout=60)
            assert done.stdout == b"over tls\n", done
    finally:
        served.stop()


def test_a_non_loopback_resp_address_needs_tokens(tmp_path):
    done = subprocess.run(serve_command(str(tmp_path / "store"), "--listen", "127.0.0.1:0", "--resp", "0.0.0.0:0"),
                          capture_output=True, text=True, timeout=60, env=child_env(), cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "RESP listening" not in done.stdout, done
    assert "--tokens" in done.stderr and "0.0.0.0" in done.stderr, done.stderr
