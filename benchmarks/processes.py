"""A server program run as a child process, for the benchmarks and the tests
(``tests/`` may import ``benchmarks``; nothing under ``benchmarks`` or
``kvstore`` imports ``tests``, so this is the one place both can share):
a free port to give it (:func:`free_port`), waiting until it serves
(:func:`wait_ready`, :func:`port_open`) and stopping it (:func:`stop`).

Readiness is polled every :data:`POLL` seconds: another program's port has
no event this process could await.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

POLL = 0.05
STOP_GRACE = 10.0
"""Seconds :func:`stop` waits after SIGTERM before it sends SIGKILL."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; another program
    may take it before the caller binds it, so a server that can listen on
    port 0 and say its port should)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_ready(proc: subprocess.Popen, ready: Callable[[], bool], name: str, *, timeout: float,
               log_tail: Callable[[], str] = lambda: "") -> None:
    """Return once ``ready()`` is true (an ``OSError`` from it counts as not
    yet). :class:`RuntimeError` naming ``name`` and the end of its log when
    the process exits first, or when ``timeout`` seconds pass (the process
    is stopped then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before it was ready: {log_tail()}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(POLL)
    stop(proc)
    raise RuntimeError(f"{name} was not ready within {timeout:.0f} s (stopped): {log_tail()}")


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
