"""Real crashes of the asyncio front (kvstore/store/aio.py, aio_writes.py): a
child process puts from many coroutines on one event loop with
sync="always" and prints every acknowledged put with its LSN; the parent
SIGKILLs it at random moments, then checks that, after a reopen,

* every acknowledged put is in the log at the LSN it was acknowledged with
  (no future resolved before its own entry was durable, none with another's LSN);
* the reopened store is exactly the log replayed.

The same run under ``WALKV_PURE=1`` (``make test-pure``) checks the interpreted twin.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import kvstore
import wal
from kvstore.entry.codec import decode
from tests.test_crash_kill import log_model

pytestmark = pytest.mark.crash

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aio_crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def acknowledged(stdout: bytes, run: int) -> list[tuple[bytes, bytes, int]]:
    """(key, value, lsn) of each put the child printed as acknowledged in ``run``."""
    out = []
    for line in stdout.split(b"\n"):
        parts = line.split()
        if len(parts) != 4:
            continue  # "ready", or a line cut by the kill
        r, c, i, lsn = map(int, parts)
        assert r == run
        out.append((b"c%d/%02d" % (c, i % 32), b"%d:%d:%d" % (r, c, i) + b"." * (i % 7 * 300), lsn))
    return out


def one_round(store: str, run: int, rnd: random.Random) -> int:
    coroutines = rnd.choice([1, 16, 128])
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))  # this checkout's walkv
    child = subprocess.Popen([sys.executable, CHILD, store, str(run), str(coroutines)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    line = child.stdout.readline()
    assert line == b"ready\n", child.communicate(timeout=60)[1].decode(errors="replace")
    time.sleep(rnd.uniform(0.0, 0.3))
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")
    acks = acknowledged(line + out, run)

    model, last = log_model(store)
    logged: dict[int, tuple[bytes, bytes]] = {}
    with wal.open(os.path.join(store, "wal"), segment_bytes=256 << 10) as lg:
        for lsn, payload in lg.read(1, None):
            (op,) = decode(payload, lsn)
            logged[lsn] = (op[1], op[2])
    for key, value, lsn in acks:
        assert logged.get(lsn) == (key, value), f"acknowledged {key!r} at LSN {lsn}, the log has {logged.get(lsn)}"
    with kvstore.open(store, segment_bytes=256 << 10, map_size=1 << 20) as db:
        assert db.last_lsn == db.applied_lsn == last
        assert dict(db.scan()) == model
    return len(acks)


def test_sigkill_loses_no_acknowledged_async_put(tmp_path) -> None:
    rnd = random.Random(2121)
    store = str(tmp_path / "store")
    acks = [one_round(store, run, rnd) for run in range(1, 7)]
    assert sum(acks) > 0
