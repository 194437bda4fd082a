"""Real crashes: a child process writes from several threads (or, one round
in three, from one: the group commit's direct path) with sync="always" and reports every acknowledged write; the parent SIGKILLs it at
random moments (during writes, during open and replay, during LMDB map
growth), then checks that

* LMDB as the dead process left it (opened read-only, nothing replayed) is
  exactly the log replayed up to LMDB's applied LSN: a prefix of the log,
  never half a group;
* after a read-write reopen the store is exactly the whole log replayed;
* every write the child acknowledged is in it.

Some iterations also fake a machine crash on top (LMDB damaged, boot id
changed): the reopen must rebuild the same state from the log.
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
from kvstore.entry.codec import END_OF_KEYS, decode
from tests.test_kvstore import fake_machine_crash

pytestmark = pytest.mark.crash

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = 4


def log_model(store: str, upto: int | None = None) -> tuple[dict[bytes, bytes], int]:
    """The state the log's entries (up to LSN ``upto``) make, computed here
    independently of kvstore's apply path; and the log's last LSN."""
    model: dict[bytes, bytes] = {}
    with wal.open(os.path.join(store, "wal"), segment_bytes=256 << 10) as lg:
        last = lg.last_lsn
        for lsn, payload in lg.read(1, upto):
            for op in decode(payload, lsn):
                if op[0] == 1:
                    model[op[1]] = op[2]
                elif op[0] == 2:
                    model.pop(op[1], None)
                else:
                    hi = op[2] if op[2] != END_OF_KEYS else None
                    for k in [k for k in model if k >= op[1] and (hi is None or k < hi)]:
                        del model[k]
    return model, last


def acked(stdout: bytes) -> dict[int, tuple[int, int]]:
    """thread -> (run, i) of its last acknowledged write."""
    out: dict[int, tuple[int, int]] = {}
    for line in stdout.split(b"\n"):
        parts = line.split()
        if len(parts) != 3:
            continue  # "ready", or a line cut by the kill
        run, t, i = map(int, parts)
        out[t] = max(out.get(t, (0, 0)), (run, i))
    return out


def one_round(store: str, run: int, rnd: random.Random, machine_crash: bool) -> int:
    # One round in three has one writing thread: every write takes the group
    # commit's direct path (no queue), killed between its write and its fsync too.
    threads = 1 if run % 3 == 0 else THREADS
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))  # this checkout's walkv
    child = subprocess.Popen([sys.executable, CHILD, store, str(run), str(threads)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    # Kill at a random moment: often while writing, sometimes while opening.
    if rnd.random() < 0.2:
        time.sleep(rnd.uniform(0.0, 0.3))
    else:
        line = child.stdout.readline()
        assert line == b"ready\n" or child.poll() is not None, child.stderr.read()
        time.sleep(rnd.uniform(0.0, 0.4))
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")
    acks = acked(out)

    if not os.path.exists(os.path.join(store, "lmdb", "SESSION")):
        return 0  # killed before the store was first created

    # 1. LMDB as the dead process left it: a prefix of the log (no replay).
    try:
        ro = kvstore.open(store, readonly=True)
    except kvstore.WalkvError:
        ro = None  # killed before LMDB existed (first open, or mid-rebuild)
    if ro is not None:
        with ro:
            applied = ro.applied_lsn
            left = dict(ro.scan())
        prefix, _ = log_model(store, applied)
        assert left == prefix, f"LMDB at LSN {applied} is not the log's prefix"

    if machine_crash:
        fake_machine_crash(store, rnd.choice(["garbage", "truncate", "zero"]), seed=run)

    # 2. Reopen: the whole log, and every acknowledged write.
    model, last = log_model(store)
    with kvstore.open(store, segment_bytes=256 << 10, map_size=1 << 20) as db:
        assert db.last_lsn == db.applied_lsn == last
        if machine_crash:
            assert db.rebuilt is not None
        assert dict(db.scan()) == model
        for t, (arun, ai) in acks.items():
            got = db.get(b"t%d/last" % t)
            assert got is not None, f"thread {t}: acknowledged {arun}:{ai} but nothing stored"
            grun, _, gi = map(int, got.split(b":"))
            assert (grun, gi) >= (arun, ai), f"thread {t}: acknowledged {arun}:{ai}, found {got!r}"
    return sum(i for _, i in acks.values())


def run_rounds(store: str, rounds: int | None, seconds: float | None, seed: int) -> tuple[int, int]:
    rnd = random.Random(seed)
    end = time.monotonic() + seconds if seconds else None
    run = writes = 0
    while (rounds is None or run < rounds) and (end is None or time.monotonic() < end):
        run += 1
        writes += one_round(store, run, rnd, machine_crash=rnd.random() < 0.2)
    return run, writes


def test_sigkill_loses_no_acknowledged_write(tmp_path) -> None:
    rounds, writes = run_rounds(str(tmp_path / "store"), rounds=int(os.environ.get("WALKV_CRASH_ROUNDS", "24")),
                                seconds=45.0, seed=1234)
    assert rounds >= 10
    assert writes > 0


@pytest.mark.soak
def test_sigkill_soak(tmp_path, soak_seconds: float) -> None:
    rounds, writes = run_rounds(str(tmp_path / "store"), rounds=None, seconds=soak_seconds,
                                seed=int(time.time()))
    print(f"{rounds} kills, {writes} acknowledged writes checked")
