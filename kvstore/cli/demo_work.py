"""The demo's workload and its crash child (see :mod:`kvstore.cli.demo`).

* :func:`worker`: one thread's share of a small shop (users, orders, atomic
  batches, deletes, reads of its own writes), each thread on its own users
  so that it can keep an exact model of its keys.
* :func:`child_main`: a writer process (started by :func:`run_and_kill`
  with ``python -c``) that puts from several threads until it is killed,
  printing ``ack THREAD SEQ LSN`` after each put returned (so each printed
  write is acknowledged, hence durable).
* :func:`run_and_kill`: starts that child, SIGKILLs it mid-stream and returns
  how many writes of each thread were acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kvstore.cli.common import CliError
from kvstore.cli.progress import Reporter

if TYPE_CHECKING:
    from kvstore.store.store import KVStore

_COUNTERS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Size:
    """How much the demo does (:data:`FULL`, or :data:`SMALL` for CI)."""

    threads: int
    ops_per_thread: int
    crash_threads: int
    crash_acks: int
    after_snapshot: int
    segment_bytes: int


FULL = Size(threads=8, ops_per_thread=2500, crash_threads=4, crash_acks=4000, after_snapshot=2000,
            segment_bytes=1 << 20)
SMALL = Size(threads=4, ops_per_thread=300, crash_threads=4, crash_acks=400, after_snapshot=300,
             segment_bytes=128 << 10)


class DemoFailed(CliError):
    """A demo check failed (exit 1)."""


# -- the workload ----------------------------------------------------------------------


def new_user(uid: int, rng: random.Random) -> bytes:
    plan = rng.choice(["free", "pro", "team"])
    return json.dumps({"id": uid, "name": f"user {uid}", "email": f"user{uid}@example.com", "plan": plan,
                       "since": 1700000000 + uid}, separators=(",", ":")).encode()


def _order(uid: int, n: int, rng: random.Random) -> bytes:
    items = [{"sku": f"SKU-{rng.randrange(1000):04d}", "qty": rng.randint(1, 3)} for _ in range(rng.randint(1, 3))]
    return json.dumps({"user": uid, "n": n, "items": items, "total_cents": rng.randrange(500, 50000),
                       "status": "placed"}, separators=(",", ":")).encode()


def worker(db: KVStore, t: int, threads: int, ops: int, seed: int, model: dict[bytes, bytes],
           counters: dict[str, int], errors: list[BaseException], tick: Callable[[int], None]) -> None:
    """One thread's share of the shop: users ``uid % threads == t`` only, so the
    thread's model of its keys is exact."""
    rng = random.Random(seed * 1000 + t)
    uids = list(range(t, threads * 200, threads))
    orders: dict[int, int] = {}
    puts = batches = deletes = reads = 0
    try:
        for i in range(ops):
            uid = rng.choice(uids)
            r = rng.random()
            if r < 0.45:  # new order
                n = orders.get(uid, 0) + 1
                orders[uid] = n
                k, v = f"order:{uid:06d}:{n:04d}".encode(), _order(uid, n, rng)
                db.put(k, v)
                model[k] = v
                puts += 1
            elif r < 0.65:  # profile update
                k, v = f"user:{uid:06d}".encode(), new_user(uid, rng)
                db.put(k, v)
                model[k] = v
                puts += 1
            elif r < 0.8:  # order shipped: order status and the user's counter, atomically
                n = orders.get(uid, 0) + 1
                orders[uid] = n
                k1, v1 = f"order:{uid:06d}:{n:04d}".encode(), _order(uid, n, rng).replace(b'"placed"', b'"shipped"')
                k2 = f"stats:{uid:06d}".encode()
                shipped = int(model.get(k2, b"0")) + 1
                with db.batch() as b:
                    b.put(k1, v1)
                    b.put(k2, str(shipped).encode())
                model[k1] = v1
                model[k2] = str(shipped).encode()
                batches += 1
            elif r < 0.9:  # cancel an order
                n = orders.get(uid, 0)
                if n:
                    k = f"order:{uid:06d}:{rng.randint(1, n):04d}".encode()
                    db.delete(k)
                    model.pop(k, None)
                    deletes += 1
            else:  # read your writes
                k = f"user:{uid:06d}".encode()
                got = db.get(k)
                if got != model.get(k):
                    raise AssertionError(f"thread {t}: read {k!r} = {got!r}, expected {model.get(k)!r}")
                reads += 1
            if i % 32 == 31:
                tick(32)
        tick(ops % 32)
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        errors.append(e)
    with _COUNTERS_LOCK:
        counters["puts"] += puts
        counters["batches"] += batches
        counters["deletes"] += deletes
        counters["reads"] += reads


def digest(db: KVStore) -> tuple[int, str]:
    """(pairs, sha256) of a store's whole contents, in key order."""
    h = hashlib.sha256()
    n = 0
    for k, v in db.scan():
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
        n += 1
    return n, h.hexdigest()


# -- the crash child ---------------------------------------------------------------------


# The child's command line: ``python -c _CHILD STORE THREADS SEED SEGMENT_BYTES``.
_CHILD = "import sys; from kvstore.cli.demo_work import child_main; child_main(sys.argv[1:])"


def child_main(argv: list[str]) -> NoReturn:
    """``STORE THREADS SEED SEGMENT_BYTES``: write until killed, printing
    ``ack THREAD SEQ LSN`` after each put returned."""
    import kvstore

    store, threads, seed = argv[0], int(argv[1]), int(argv[2])
    db = kvstore.open(store, sync="always", segment_bytes=int(argv[3]))
    out = sys.stdout
    lock = threading.Lock()
    print("ready", flush=True)

    def write(t: int) -> None:
        rng = random.Random(seed + t)
        i = 0
        while True:
            key = f"crash:{t:02d}:{i:08d}".encode()
            value = crash_value(t, i, rng)
            lsn = db.put(key, value)
            with lock:
                out.write(f"ack {t} {i} {lsn}\n")
                out.flush()
            i += 1

    for t in range(threads):
        threading.Thread(target=write, args=(t,), daemon=True).start()
    while True:
        time.sleep(60)


def crash_value(t: int, i: int, rng: random.Random) -> bytes:
    """Thread ``t``'s ``i``-th value (``rng`` seeded per thread, drawn in order)."""
    return f"thread {t} write {i} ".encode() + rng.randbytes(rng.randint(20, 300))


def crash_values(threads: int, seed: int, upto: dict[int, int]) -> dict[bytes, bytes]:
    """The first ``upto[t]`` writes of each crash thread ``t``, as the child made them."""
    out = {}
    for t in range(threads):
        rng = random.Random(seed + t)
        for i in range(upto.get(t, 0)):
            out[f"crash:{t:02d}:{i:08d}".encode()] = crash_value(t, i, rng)
    return out


def run_and_kill(store: str, size: Size, seed: int, rep: Reporter) -> dict[int, int]:
    """Start the writer child, SIGKILL it after ``size.crash_acks`` acks; return
    per thread the number of acknowledged writes (a prefix: 0..n-1)."""
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parents[2])  # the directory holding kvstore/
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, store, str(size.crash_threads), str(seed), str(size.segment_bytes)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, bufsize=1)
    acked: dict[int, int] = {}
    n = 0
    deadline = time.monotonic() + 60
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first.strip() != "ready":
            err = proc.stderr.read() if proc.stderr else ""
            raise DemoFailed(f"the writer process did not start: {first.strip()} {err.strip()[-500:]}")
        with rep.task("writer process", size.crash_acks, "acks") as progress:
            for line in proc.stdout:
                parts = line.split()
                if len(parts) == 4 and parts[0] == "ack":
                    t, i = int(parts[1]), int(parts[2])
                    acked[t] = max(acked.get(t, 0), i + 1)
                    n += 1
                    progress(n, size.crash_acks)
                if n >= size.crash_acks or time.monotonic() > deadline:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            # Acks already in the pipe were acknowledged before the kill.
            for line in proc.stdout:
                parts = line.split()
                if len(parts) == 4 and parts[0] == "ack":
                    t, i = int(parts[1]), int(parts[2])
                    acked[t] = max(acked.get(t, 0), i + 1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
        if proc.stdout:
            proc.stdout.close()
    if proc.returncode != -signal.SIGKILL:
        raise DemoFailed(f"the writer process exited with {proc.returncode} before it was killed")
    return acked

