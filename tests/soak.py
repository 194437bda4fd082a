"""Soak runner: kill -9 a multi-threaded writer over and over, and check that
nothing it was told is durable was ever lost.

    python -m tests.soak --seconds 600          # loop for ten minutes
    python -m tests.soak --count 200            # or for 200 crashes
    python -m tests.soak --target wal           # the log alone (default: the store)

Each round starts a child process on the same store (so every round first
recovers from the previous kill), with ``--threads`` writer threads. Each
thread runs its own sequence of operations, one at a time, with
``sync="always"``: put of a fresh key, an atomic batch of three fresh keys,
or delete of one of its earlier keys; a background thread takes snapshots
(which also trims the log). Before an operation the child prints an
*intent* line, after it returns an *ack* line, each with one ``os.write``
to a pipe, so the parent's oracle of what was acknowledged only ever
under-counts. After a random delay the parent sends SIGKILL (sometimes while
the child is still recovering), then opens the store itself and checks:

* lost: an acknowledged put whose key is missing or holds another value, or
  an acknowledged delete whose key is back; must be 0;
* torn: a batch of which some keys are present and some not (atomicity);
* phantom: a key no thread ever intended to write.

Every ``--rebuild-every`` rounds the LMDB directory is deleted before the
check, which makes the store rebuild from snapshot plus log (what a machine
crash does). Prints a summary; exits 1 on any loss, tear or phantom.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS = {"segment_bytes": 64 << 10, "map_size": 8 << 20}


# -- the child: a multi-threaded writer ---------------------------------------------------


def child_main(args: argparse.Namespace) -> None:
    out_lock = threading.Lock()

    def emit(line: str) -> None:
        data = (line + "\n").encode()
        with out_lock:  # one write per line, under PIPE_BUF: never interleaved
            os.write(1, data)

    if args.target == "kv":
        import kvstore

        db = kvstore.open(args.path, sync="always", **OPTIONS)

        def do(op: list) -> None:
            kind = op[0]
            if kind == "put":
                db.put(op[1], op[2])
            elif kind == "batch":
                with db.batch() as b:
                    for k, v in op[1]:
                        b.put(k, v)
            else:
                db.delete(op[1])

        def snapshots() -> None:
            while True:
                time.sleep(args.snapshot_interval)
                try:
                    db.snapshot(keep=2)
                except Exception as e:  # noqa: BLE001
                    emit(f"E snapshot failed: {e!r}")
                    return

        threading.Thread(target=snapshots, daemon=True).start()
    else:
        import wal

        log = wal.open(os.path.join(args.path, "wal"), sync="always", segment_bytes=OPTIONS["segment_bytes"])

        def do(op: list) -> None:
            log.append(json.dumps(_jsonable(op)).encode())

    emit("R")  # ready: recovery is over

    def writer(tid: int) -> None:
        rnd = random.Random(args.seed * 1000 + tid)
        mine: list[bytes] = []  # keys this thread put in this round
        n = 0
        while True:
            n += 1
            tag = f"{args.round}.{tid}.{n}"
            r = rnd.random()
            if r < 0.15 and mine:
                key = mine.pop(rnd.randrange(len(mine)))
                op = ["delete", key]
            elif r < 0.35:
                op = ["batch", [(f"{tag}.{j}".encode(), _value(tag, j, rnd)) for j in range(3)]]
            else:
                key = tag.encode()
                op = ["put", key, _value(tag, 0, rnd)]
                mine.append(key)
            emit("I " + json.dumps(_jsonable(op)))
            try:
                do(op)
            except Exception as e:  # noqa: BLE001 - reported; the parent counts it as not acknowledged
                emit(f"E {tag} {e!r}")
                return
            emit("A " + tag + " " + json.dumps(_jsonable(op)))

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(args.threads)]
    for t in threads:
        t.start()
    time.sleep(3600)  # until killed


def _value(tag: str, j: int, rnd: random.Random) -> bytes:
    return f"{tag}.{j}:".encode() + bytes([rnd.randrange(256)]) * rnd.choice([0, 10, 100, 1000, 5000])


def _jsonable(op: list) -> list:
    def enc(x):
        if isinstance(x, bytes):
            return {"b": x.hex()}
        if isinstance(x, (list, tuple)):
            return [enc(i) for i in x]
        return x
    return enc(op)


def _unjson(x):
    if isinstance(x, dict):
        return bytes.fromhex(x["b"])
    if isinstance(x, list):
        return [_unjson(i) for i in x]
    return x


# -- the parent: oracle, killer, checker -------------------------------------------------------


@dataclass
class Oracle:
    """What each key must (or may) hold."""

    acked_value: dict[bytes, bytes] = field(default_factory=dict)   # acknowledged puts
    acked_deleted: set[bytes] = field(default_factory=set)           # acknowledged deletes
    maybe: dict[bytes, set] = field(default_factory=dict)            # key -> allowed states (value or None)
    batches: list[list[bytes]] = field(default_factory=list)         # keys of every intended batch
    acked_ops: int = 0
    intended_ops: int = 0
    log_entries: list[list] = field(default_factory=list)            # wal target: acknowledged ops

    def intent(self, op: list) -> None:
        self.intended_ops += 1
        if op[0] == "put":
            self.maybe.setdefault(op[1], set()).add(op[2])
        elif op[0] == "batch":
            self.batches.append([k for k, _ in op[1]])
            for k, v in op[1]:
                self.maybe.setdefault(k, set()).add(v)
        else:
            self.maybe.setdefault(op[1], set()).add(None)

    def ack(self, op: list) -> None:
        self.acked_ops += 1
        self.log_entries.append(op)
        if op[0] == "put":
            self.acked_value[op[1]] = op[2]
        elif op[0] == "batch":
            for k, v in op[1]:
                self.acked_value[k] = v
        else:
            self.acked_deleted.add(op[1])
            self.acked_value.pop(op[1], None)


@dataclass
class Totals:
    rounds: int = 0
    crashes: int = 0
    killed_during_recovery: int = 0
    rebuilds: int = 0
    acked: int = 0
    lost: int = 0
    torn: int = 0
    phantom: int = 0
    child_errors: int = 0
    problems: list[str] = field(default_factory=list)


def run_round(path: str, rnd_no: int, args: argparse.Namespace, oracle: Oracle, totals: Totals,
              rng: random.Random) -> None:
    cmd = [sys.executable, "-m", "tests.soak", "--child", "--path", path, "--round", str(rnd_no),
           "--seed", str(rng.randrange(1 << 30)), "--threads", str(args.threads), "--target", args.target,
           "--snapshot-interval", str(args.snapshot_interval)]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[bytes] = []
    ready = threading.Event()

    def reader() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if line.startswith(b"R"):
                ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if rng.random() < 0.1:
        time.sleep(rng.uniform(0.05, 0.4))  # kill while it may still be recovering
        if not ready.is_set():
            totals.killed_during_recovery += 1
    else:
        if not ready.wait(60):
            p.kill()
            raise RuntimeError(f"round {rnd_no}: the writer did not get ready: "
                               f"{p.stderr.read().decode(errors='replace')[-2000:] if p.stderr else ''}")
        time.sleep(rng.uniform(0.05, args.max_run))
    p.send_signal(signal.SIGKILL)
    p.wait()
    t.join(10)
    stderr = p.stderr.read().decode(errors="replace") if p.stderr else ""
    totals.crashes += 1
    for line in lines:
        if not line.endswith(b"\n"):
            continue  # a line cut by the kill (cannot happen with one write per line, but be exact)
        if line.startswith(b"I "):
            oracle.intent(_unjson(json.loads(line[2:])))
        elif line.startswith(b"A "):
            _tag, body = line[2:].split(b" ", 1)
            oracle.ack(_unjson(json.loads(body)))
        elif line.startswith(b"E "):
            totals.child_errors += 1
            totals.problems.append(f"round {rnd_no}: writer error: {line[2:].decode(errors='replace').strip()}")
    if "Traceback" in stderr:
        totals.problems.append(f"round {rnd_no}: writer stderr: {stderr[-1500:]}")


def check(path: str, args: argparse.Namespace, oracle: Oracle, totals: Totals, rnd_no: int) -> None:
    if args.target == "kv":
        import kvstore

        if args.rebuild_every and rnd_no % args.rebuild_every == 0:
            shutil.rmtree(os.path.join(path, "lmdb"), ignore_errors=True)
            totals.rebuilds += 1
        with kvstore.open(path, sync="always", **OPTIONS) as db:
            state = dict(db.scan())
    else:
        import wal

        with wal.open(os.path.join(path, "wal"), segment_bytes=OPTIONS["segment_bytes"]) as log:
            state = {}
            for _lsn, payload in log.read(log.first_lsn):
                op = _unjson(json.loads(payload))
                if op[0] == "put":
                    state[op[1]] = op[2]
                elif op[0] == "batch":
                    for k, v in op[1]:
                        state[k] = v
                else:
                    state.pop(op[1], None)
    # An acknowledged put may be gone only if a delete of it was in flight
    # (intended, not acknowledged) when the writer was killed.
    lost = [k for k, v in oracle.acked_value.items()
            if state.get(k) != v and not (k not in state and None in oracle.maybe.get(k, ()))]
    back = [k for k in oracle.acked_deleted if k in state and k not in oracle.acked_value]
    phantom = [k for k in state if k not in oracle.maybe or state[k] not in oracle.maybe[k]]
    torn = [b for b in oracle.batches if 0 < sum(k in state for k in b) < len(b)
            and not any(k in oracle.acked_deleted for k in b)]
    totals.lost = len(lost) + len(back)
    totals.phantom = len(phantom)
    totals.torn = len(torn)
    totals.acked = oracle.acked_ops
    for what, keys in (("lost", lost), ("deleted key back", back), ("phantom", phantom), ("torn batch", torn)):
        if keys:
            totals.problems.append(f"after round {rnd_no}: {len(keys)} {what}: {keys[:5]!r}")
    # What the store holds now is the truth from here on: every key whose
    # fate was open (an operation in flight at the kill) is settled.
    for k in oracle.maybe:
        if k in state:
            oracle.acked_value[k] = state[k]
            oracle.acked_deleted.discard(k)
        else:
            oracle.acked_value.pop(k, None)
            oracle.acked_deleted.add(k)
    oracle.maybe = {k: {state.get(k)} for k in oracle.maybe}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, help="run for this long")
    ap.add_argument("--count", type=int, help="run this many crashes")
    ap.add_argument("--threads", type=int, default=4, help="writer threads in the child (default 4)")
    ap.add_argument("--target", choices=("kv", "wal"), default=None, help="the store (default) or the log alone")
    ap.add_argument("--path", help="store directory (default: a temporary one, removed on success)")
    ap.add_argument("--max-run", type=float, default=0.8, help="longest a writer runs before its kill (s)")
    ap.add_argument("--rebuild-every", type=int, default=5, help="delete LMDB before every Nth check (0: never)")
    ap.add_argument("--snapshot-interval", type=float, default=0.25, help="seconds between snapshots in the writer")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--verbose", action="store_true", help="show walkv's warnings (torn tails cut, rebuilds)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.target = args.target or "kv"
    if args.child:
        child_main(args)
        return 0
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="  %(name)s: %(message)s")
    if args.seconds is None and args.count is None:
        args.seconds = 60.0
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    own_dir = args.path is None
    base = tempfile.mkdtemp(prefix="walkv-soak-") if own_dir else None
    path = os.path.join(base, "store") if own_dir else args.path
    oracle, totals = Oracle(), Totals()
    t0 = time.monotonic()
    rnd_no = 0
    while True:
        if args.count is not None and totals.crashes >= args.count:
            break
        if args.seconds is not None and time.monotonic() - t0 >= args.seconds:
            break
        rnd_no += 1
        run_round(path, rnd_no, args, oracle, totals, rng)
        check(path, args, oracle, totals, rnd_no)
        totals.rounds = rnd_no
        if totals.lost or totals.torn or totals.phantom:
            break
    elapsed = time.monotonic() - t0
    summary = {
        "target": args.target, "seed": seed, "seconds": round(elapsed, 1), "crashes": totals.crashes,
        "killed_during_recovery": totals.killed_during_recovery, "lmdb_rebuilds": totals.rebuilds,
        "acknowledged_writes": totals.acked, "intended_writes": oracle.intended_ops,
        "lost": totals.lost, "torn_batches": totals.torn, "phantoms": totals.phantom,
        "writer_errors": totals.child_errors,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"soak ({args.target}, seed {seed}): {totals.crashes} kill -9 crashes in {elapsed:.0f} s "
              f"({totals.killed_during_recovery} during recovery, {totals.rebuilds} LMDB rebuilds); "
              f"acknowledged writes: {totals.acked} (of {oracle.intended_ops} attempted); "
              f"lost: {totals.lost}; torn batches: {totals.torn}; phantoms: {totals.phantom}; "
              f"writer errors: {totals.child_errors}")
    for p in totals.problems[:20]:
        print("  " + p)
    failed = bool(totals.lost or totals.torn or totals.phantom or totals.child_errors)
    if own_dir and base is not None:
        if failed:
            print(f"  the store is kept for inspection: {path}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
