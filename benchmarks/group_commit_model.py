"""What pipelining group commit would buy, measured on a model before it is built (issue 37, item 1).

``python -m benchmarks.group_commit_model [--threads 8] [--seconds 3] [--rounds 3]``

T Python threads each make a small payload (a msgpack of a put, plus a loop: a few µs of
Python, as a walkv put spends) and append it to one preallocated file through a group
commit that wakes its waiters as :mod:`wal.commit` did when it was measured (a lock each, all
released by the leader; wal.commit now wakes them along a chain), in one of four ways:

- ``serial``: one leader at a time takes the queue, writes it, ``fdatasync``-s it and
  acknowledges it; then the oldest waiter not yet written leads (LevelDB's writer queue);
- ``serial+gather``: the same, the leader first waiting (at most 0.2 ms) until a whole
  cohort of T is queued (:data:`wal.commit.GATHER_SECONDS`): walkv's group commit;
- ``pipelined`` and ``pipelined+gather``: the leader hands the file to the next leader as
  soon as its write returned and ``fdatasync``-s while the next group is written. A group
  is acknowledged once an ``fdatasync`` that began after its write returned: every earlier
  group's write had returned by then too, so what is acknowledged is the highest group
  such an ``fdatasync`` covered.

On a 2-core AMD EPYC (Firecracker, ext4, a 4 KiB ``fdatasync`` 0.21-0.29 ms), 8 threads,
3 rounds of 3 s, medians (and ranges): serial 14.4k appends/s (4.5 per group),
serial+gather 16.1k (8.0), pipelined 14.2k (2.4), pipelined+gather 16.7k (7.9; 16.5-20.1k),
within the rounds' noise of serial+gather; gathering only half a cohort made both worse.
Pipelining bought next to nothing there: with every thread waiting for its own append, the
next group can only form from the threads the last one released, so either the groups
shrink or the gather waits for the last group to end; and two ``fdatasync`` calls in
flight on one file each took 1.5 times as long as one alone (a bare write+fdatasync loop
from 1 to 4 threads: 9.0k, 12.1k, 12.4k, 12.4k syncs/s). Run it on a machine whose fsync is
slower (1-3 ms) before deciding there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading

import msgpack

from benchmarks.machine import fsync_latency_ms, python_speed_ms
from benchmarks.timing import threaded

MODES = ("serial", "serial+gather", "pipelined", "pipelined+gather")
GATHER_SECONDS = 0.0002
FILE_BYTES = 64 << 20


class _Waiter:
    """An appender waiting: its lock is released when its append is durable,
    or when it is to lead (``lead``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.seq = 0
        self.lead = False


class Model:
    """One group commit of ``mode`` over the file ``fd``, for ``threads``
    appenders, each woken by a lock of its own that the leader releases
    (no thundering herd; :mod:`wal.commit` woke them so when this model was
    measured)."""

    def __init__(self, fd: int, mode: str, threads: int) -> None:
        self.fd = fd
        self.pipelined = mode.startswith("pipelined")
        self.cohort = threads if mode.endswith("+gather") else 0
        self.mutex = threading.Lock()
        self.arrived = threading.Condition(self.mutex)  # a gathering leader waits on it
        self.gathering = False
        self.queue: list[bytes] = []
        self.queued = 0  # appends queued so far (their sequence numbers: 1, 2, ...)
        self.taken = 0  # every append up to this one is in a group written or being written
        self.acknowledged = 0  # every append up to this one is durable
        self.waiters: list[_Waiter] = []  # in sequence order
        self.leading = False  # a leader holds the file (until its write, pipelined; its fdatasync, serial)
        self.offset = 0
        self.groups = 0
        self.local = threading.local()

    def append(self, payload: bytes) -> None:
        """Return once ``payload`` is durable."""
        with self.mutex:
            self.queued += 1
            self.queue.append(payload)
            lead = not self.leading
            if lead:
                self.leading = True
            else:
                w = getattr(self.local, "waiter", None) or _Waiter()
                self.local.waiter = w
                w.seq, w.lead = self.queued, False
                self.waiters.append(w)
                if self.gathering and len(self.queue) >= self.cohort:
                    self.arrived.notify()
        if not lead:
            w.lock.acquire()
            if not w.lead:
                return
        with self.mutex:
            if len(self.queue) < self.cohort:
                self.gathering = True
                self.arrived.wait(GATHER_SECONDS)
                self.gathering = False
            data, last, offset = b"".join(self.queue), self.queued, self.offset
            self.queue.clear()
            self.taken = last
            self.offset = (offset + len(data)) % (FILE_BYTES - (1 << 20))
            self.groups += 1
        os.pwrite(self.fd, data, offset)
        if self.pipelined:
            with self.mutex:
                self._hand_on()
        os.fdatasync(self.fd)
        with self.mutex:
            self.acknowledged = max(self.acknowledged, last)
            while self.waiters and self.waiters[0].seq <= self.acknowledged:
                self.waiters.pop(0).lock.release()
            if not self.pipelined:
                self._hand_on()

    def _hand_on(self) -> None:
        """Mutex held, the file free: the oldest waiter whose append no group
        has taken leads next; none: nobody leads until the next append."""
        for i, w in enumerate(self.waiters):
            if w.seq > self.taken:
                del self.waiters[i]
                w.lead = True
                w.lock.release()
                return
        self.leading = False


def payload(i: int, loops: int = 150) -> bytes:
    """A put's payload, and a few µs of Python on the way (walkv's own per-put work)."""
    x = 0
    for j in range(loops):
        x += j
    return msgpack.packb([1, b"key-%d" % i, b"v" * 100])


def run(mode: str, threads: int, seconds: float, directory: str) -> tuple[float, float]:
    """Appends per second and appends per group, ``threads`` appending for ``seconds``."""
    path = os.path.join(directory, f"model-{mode}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, b"\0" * FILE_BYTES, 0)
        os.fsync(fd)
        model = Model(fd, mode, threads)
        measured = threaded(threads, seconds, lambda _thread: lambda n: model.append(payload(n)))
        return measured.rate, measured.ops / max(model.groups, 1)
    finally:
        os.close(fd)
        os.unlink(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the file goes (default: the temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print(f"sum(range(10**7)) {python_speed_ms()} ms, fsync (4 KiB fdatasync, median) "
              f"{fsync_latency_ms(directory)} ms, {args.threads} threads, {args.rounds} rounds of {args.seconds} s")
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:  # (rotated, as the harness does)
                results[mode].append(run(mode, args.threads, args.seconds, directory))
        for mode in MODES:
            rates = [rate for rate, _ in results[mode]]
            groups = [size for _, size in results[mode]]
            print(f"{mode:17s} {statistics.median(rates):>9,.0f} appends/s  "
                  f"({min(rates):,.0f}-{max(rates):,.0f}), {statistics.median(groups):.1f} per group")


if __name__ == "__main__":
    main()
