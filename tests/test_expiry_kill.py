"""Kill -9 during expiry sweeps: a child process (tests/expiry_child.py)
writes keys with TTLs of a few milliseconds, keys under short leases (kept
alive, revoked, or left to run out) and plain keys, while its sweeper logs
expiry deletions every 2 ms; the parent SIGKILLs it at random moments and
checks, against a model of the log computed here (not by kvstore's apply
path), that

* every acknowledged put is in the log, at the LSN it was acknowledged with;
* LMDB as the dead process left it (opened read-only) is exactly the log up
  to its applied LSN, expiry metadata included: with a clock at 1 (nothing
  expired) every key the log has and no other (so no key an expiry entry
  deleted comes back), and at the last commit's time exactly the keys alive
  then;
* after a read-write reopen (replay), after sweeping, and after a rebuild
  from the log (a faked machine crash), reads at that time are the same.
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
from kvstore.entry.conditions import writes_of
from tests.test_kvstore import fake_machine_crash

pytestmark = pytest.mark.crash

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expiry_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LogModel:
    """The state the log's entries make, expiry metadata included."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.meta: dict[bytes, tuple[int, int]] = {}  # key -> (8, at_us) | (9, lease id)
        self.leases: dict[int, int] = {}  # lease id -> at_us
        self.puts: dict[int, list[tuple[bytes, bytes]]] = {}  # LSN -> its puts
        self.expired = 0
        self.last_us = 0

    def apply(self, lsn: int, ops: list) -> None:
        for op in writes_of(ops):
            code = op[0]
            if code in (1, 8, 9):
                self.values[op[1]] = op[2]
                self.puts.setdefault(lsn, []).append((op[1], op[2]))
                if code == 1:
                    self.meta.pop(op[1], None)
                else:
                    self.meta[op[1]] = (code, op[3])
            elif code in (2, 14):
                self.values.pop(op[1], None)
                self.meta.pop(op[1], None)
                self.expired += code == 14
            elif code == 3:
                hi = None if op[2] == END_OF_KEYS else op[2]
                for k in [k for k in self.values if k >= op[1] and (hi is None or k < hi)]:
                    del self.values[k]
                    self.meta.pop(k, None)
            elif code == 11:
                self.leases[op[1]] = op[3]
            elif code == 12 and op[1] in self.leases:
                self.leases[op[1]] = op[2]
            elif code == 13:
                self.leases.pop(op[1], None)

    def alive(self, now_us: int) -> dict[bytes, bytes]:
        out = {}
        for k, v in self.values.items():
            m = self.meta.get(k)
            if m is None or (m[0] == 8 and m[1] > now_us) or (m[0] == 9 and self.leases.get(m[1], 0) > now_us):
                out[k] = v
        return out


def log_model(store: str, upto: int | None = None) -> tuple[LogModel, int]:
    model = LogModel()
    with wal.open(os.path.join(store, "wal"), segment_bytes=256 << 10) as lg:
        last = lg.last_lsn
        for entry in lg.read_entries(1, upto):
            model.apply(entry.lsn, decode(entry.payload, entry.lsn))
            model.last_us = entry.timestamp_us
    return model, last


def acked(stdout: bytes) -> list[tuple[int, bytes, bytes]]:
    out = []
    for line in stdout.split(b"\n"):
        parts = line.split(b" ")
        if len(parts) == 3:
            out.append((int(parts[0]), bytes.fromhex(parts[1].decode()), bytes.fromhex(parts[2].decode())))
    return out


def reads_at(store: str, now_us: int, **options: object) -> tuple[dict[bytes, bytes], int]:
    clock = kvstore.ManualClock(now_us)
    with kvstore.open(store, clock=clock, sweep_interval=None, **options) as db:  # type: ignore[arg-type]
        return dict(db.scan()), len(db)


def one_round(store: str, rnd: random.Random, machine_crash: bool) -> tuple[int, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, CHILD, store], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             cwd=ROOT, env=env)
    line = child.stdout.readline()  # type: ignore[union-attr]
    assert line == b"ready\n" or child.poll() is not None, child.stderr.read()  # type: ignore[union-attr]
    time.sleep(rnd.uniform(0.05, 0.4))
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")
    acks = acked(out)

    model, last = log_model(store)
    for lsn, key, value in acks:  # no acknowledged write lost
        assert (key, value) in model.puts.get(lsn, []), f"acknowledged put of {key!r} at LSN {lsn} is not in the log"

    # LMDB as the dead process left it: the log's prefix, metadata included.
    with kvstore.open(store, readonly=True) as ro:
        applied = ro.applied_lsn
    prefix, _ = log_model(store, applied)
    raw, n = reads_at(store, 1, readonly=True)
    assert raw == prefix.values and n == len(raw), f"LMDB at LSN {applied} is not the log's prefix"
    alive, n = reads_at(store, prefix.last_us, readonly=True)
    assert alive == prefix.alive(prefix.last_us) and n == len(alive)

    if machine_crash:
        fake_machine_crash(store, rnd.choice(["garbage", "truncate", "zero"]), seed=last)
    # Reopened (replay, or a rebuild), then swept: the same keys, at the same time.
    t = model.last_us
    clock = kvstore.ManualClock(t)
    with kvstore.open(store, segment_bytes=256 << 10, map_size=1 << 20, clock=clock, sweep_interval=None) as db:
        assert (db.rebuilt is not None) == machine_crash
        assert db.last_lsn == db.applied_lsn == last
        assert dict(db.scan()) == model.alive(t) and len(db) == len(model.alive(t))
        while db.sweep_expired():
            pass
        assert dict(db.scan()) == model.alive(t) and len(db) == len(model.alive(t))
    return len(acks), model.expired


def test_sigkill_during_sweeps(tmp_path) -> None:
    rnd = random.Random(25)
    store = str(tmp_path / "store")
    rounds = int(os.environ.get("WALKV_EXPIRY_KILLS", "8"))
    writes = expired = 0
    for i in range(rounds):
        w, e = one_round(store, rnd, machine_crash=i % 4 == 3)
        writes += w
        expired = e
    assert writes > 0 and expired > 0  # the kills did land among writes and sweeps
    print(f"{rounds} kills, {writes} acknowledged puts checked, {expired} expiry deletions in the log")
