"""A writer process, a replica process and a watcher process of one store
(tests/trio_child.py), each killed with SIGKILL in turn at seeded moments and
restarted, while the others go on. At the end, against the source's log
(never trimmed here: nothing takes a snapshot):

1. every view the replica showed, in any of its lives, is the log replayed up
   to the view's LSN (a hash of all its pairs), and keeps the writer's
   invariant (``a == b``);
2. the watcher's batches, concatenated across its lives (each resuming at
   the last LSN it printed + 1), are exactly the log's changes in order: no
   LSN missing or repeated, failed conditional writes showing nothing;
3. every batch the writer acknowledged, in any of its lives, is in the log
   at its LSN (a failed one marked failed), and the final state is the
   whole log replayed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

import kvstore
from kvstore.entry import conditions
from kvstore.entry.codec import DELETE, DELETE_RANGE, OP_DELETE, OP_DELETE_RANGE, OP_FAILED, OP_PUT, UPSERT, decode
from tests.test_cli import REPO
from tests.trio_child import digest
from wal import read_log

CHILD = os.path.join(REPO, "tests", "trio_child.py")
SEED = 1313
ROUNDS = 3
ROLES = ("writer", "replica", "watcher")
WAIT_SECONDS = 60.0  # for a child to be ready, or to catch up at the end


class Child:
    """One life of one role: its stdout lines, read by a thread as they come
    (so a fast writer never blocks on a full pipe)."""

    def __init__(self, role: str, args: list[str]) -> None:
        self.role = role
        env = dict(os.environ, PYTHONPATH=REPO)
        self.proc = subprocess.Popen([sys.executable, CHILD, role, *args], stdout=subprocess.PIPE, env=env)
        self.lines: list[list[str]] = []
        self.cond = threading.Condition()
        self.ended = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.endswith(b"\n"):  # one os.write per line: a kill leaves none half written
                with self.cond:
                    self.lines.append(raw.decode().rstrip("\n").split(" ", 2))
                    self.cond.notify_all()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait(self, until: Callable[[list[str]], bool], what: str) -> list[str]:
        deadline = time.monotonic() + WAIT_SECONDS
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if until(line):
                        return line
                seen = len(self.lines)
                assert not self.ended, f"the {self.role} ended (exit {self.proc.poll()}) before {what}"
                left = deadline - time.monotonic()
                assert left > 0, f"the {self.role} did not reach {what} in {WAIT_SECONDS} s"
                self.cond.wait(left)

    def kill(self) -> None:
        assert self.proc.poll() is None, f"the {self.role} died on its own (exit {self.proc.returncode})"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.thread.join()

    def of(self, kind: str) -> list[list[str]]:
        with self.cond:
            return [line for line in self.lines if line[0] == kind]


def watched_up_to(lives: list[Child]) -> int:
    """The last LSN the watcher printed (a batch or a progress marker)."""
    return max((int(line[1]) for life in lives for line in life.of("batch") + life.of("progress")), default=0)


def change_rows(ops) -> list:
    rows = []
    for op in conditions.writes_of(ops):
        if op[0] == OP_PUT:
            rows.append([UPSERT, op[1].hex(), op[2].hex(), None])
        elif op[0] == OP_DELETE:
            rows.append([DELETE, op[1].hex(), None, None])
        else:
            assert op[0] == OP_DELETE_RANGE
            rows.append([DELETE_RANGE, op[1].hex(), None, op[2].hex()])
    return rows


def apply(state: dict[bytes, bytes], ops) -> None:
    for op in conditions.writes_of(ops):
        if op[0] == OP_PUT:
            state[op[1]] = op[2]
        elif op[0] == OP_DELETE:
            state.pop(op[1], None)
        else:
            for key in [k for k in state if op[1] <= k < op[2]]:
                del state[key]


@pytest.mark.crash
def test_writer_replica_and_watcher_processes_under_kill_9_of_each_in_turn(tmp_path):
    rng = random.Random(SEED)
    print(f"kill schedule: seed {SEED}, {ROUNDS} rounds of {', '.join(ROLES)}")
    store, rdir = str(tmp_path / "store"), str(tmp_path / "replica")
    lives: dict[str, list[Child]] = {role: [] for role in ROLES}

    def start(role: str, count: int = 0) -> Child:
        if role == "writer":
            args = [store, str(count)]
        elif role == "replica":
            args = [store, rdir]
        else:
            args = [store, str(watched_up_to(lives["watcher"]) + 1)]
        child = Child(role, args)
        lives[role].append(child)
        child.wait(lambda line: line[0] == "ready", "ready")
        return child

    try:
        for role in ROLES:
            start(role)
        for n in range(ROUNDS):
            for role in ROLES:
                delay = rng.uniform(0.3, 1.5)
                time.sleep(delay)
                print(f"round {n}: kill -9 the {role} after {delay:.2f} s")
                lives[role][-1].kill()
                start(role)
        lives["writer"][-1].kill()
        final = int(start("writer", count=300).wait(lambda line: line[0] == "done", "done")[1])
        lives["replica"][-1].wait(lambda line: line[0] == "view" and int(line[1]) == final, f"LSN {final}")
        lives["watcher"][-1].wait(lambda line: line[0] in ("batch", "progress") and int(line[1]) >= final,
                                  f"LSN {final}")
    finally:
        for child in (c for role in ROLES for c in lives[role]):
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
    for role in ("replica", "watcher"):
        lives[role][-1].thread.join()

    entries = list(read_log(os.path.join(store, "wal"), 1))
    assert [e.lsn for e in entries] == list(range(1, final + 1))
    logged = [decode(e.payload, e.lsn) for e in entries]

    # 3. every acknowledged batch is in the log at its LSN; the state is the log replayed
    acks = [(int(lsn), rest) for life in lives["writer"] for _, lsn, rest in life.of("ack")]
    assert [lsn for lsn, _ in acks] == sorted({lsn for lsn, _ in acks}), "acknowledged LSNs go up"
    assert acks[-1][0] <= final
    for lsn, i in acks:
        ops = logged[lsn - 1]
        if i == "fail":
            assert ops[0][0] == OP_FAILED, lsn
        else:
            assert [OP_PUT, b"a", i.encode()] in [list(op) for op in ops], (lsn, i)
    state: dict[bytes, bytes] = {}
    for ops in logged:
        apply(state, ops)
    with kvstore.open(store, readonly=True) as db:
        assert dict(db.scan()) == state
    assert state[b"a"] == state[b"b"] and b"never" not in state

    # 1. every view of the replica is the log's prefix at its LSN
    views = [(int(lsn), rest.split()) for life in lives["replica"] for _, lsn, rest in life.of("view")]
    assert all(ok == "1" for _, (ok, _) in views), "a view where a != b: half a batch"
    wanted: dict[int, set[str]] = {}
    for lsn, (_, h) in views:
        wanted.setdefault(lsn, set()).add(h)
    model: dict[bytes, bytes] = {}
    for lsn in range(final + 1):
        if lsn:
            apply(model, logged[lsn - 1])
        if lsn in wanted:
            assert wanted[lsn] == {digest(model.items())}, f"the replica's view at LSN {lsn} is not the log's"
    assert max(wanted) == final and len(wanted) > len(lives["replica"])

    # 2. the watcher's changes across its lives are the log's, each once, in order
    batches = [(int(lsn), json.loads(rest)) for life in lives["watcher"] for _, lsn, rest in life.of("batch")]
    expected = [(lsn, rows) for lsn, rows in enumerate((change_rows(ops) for ops in logged), 1) if rows]
    assert [lsn for lsn, _ in batches] == [lsn for lsn, _ in expected]
    assert batches == expected
    assert len(logged) > len(expected), "failed conditional writes were logged and showed nothing"
    print(f"final LSN {final}: {len(acks)} acknowledged batches, {len(wanted)} replica views and "
          f"{len(batches)} watched batches checked")
