"""Timed loops: N threads for a fixed time, coroutines for a fixed time, a
counted block, and a child process whose max RSS is measured.

Time-boxed runs give every contender the same wall-clock budget, whatever its
speed; the rate is the operations completed divided by the time until the
last worker finished its last operation (so an operation that straddles the
deadline is counted in full, time included).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Awaitable, Callable, Sequence

from benchmarks.harness import Measurement

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def threaded(threads: int, seconds: float, make_op: Callable[[int], Callable[[int], Any]],
             chunk: int = 1) -> Measurement:
    """Run ``threads`` workers for ``seconds``. ``make_op(thread_index)`` is
    called in the worker before the clock starts and returns ``op(n)``, which
    does the worker's ``n``-th operation. The deadline is checked every
    ``chunk`` operations."""
    barrier = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []
    deadline = [0.0]

    def body(index: int) -> None:
        try:
            op = make_op(index)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        n = 0
        end = deadline[0]
        clock = time.perf_counter
        try:
            while clock() < end:
                for _ in range(chunk):
                    op(n)
                    n += 1
        except BaseException as exc:
            errors.append(exc)
        counts[index] = n

    workers = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Measurement(ops=sum(counts), seconds=elapsed, extra={"threads": threads})


def threaded_puts(put: Callable[[bytes, bytes], Any], threads: int, seconds: float,
                  value: bytes) -> Measurement:
    """:func:`threaded` with each worker calling ``put(key, value)`` on keys
    of its own (``data.key(n, thread)``)."""
    from benchmarks import data

    def make(i: int) -> Callable[[int], Any]:
        key = data.key
        return lambda n: put(key(n, i), value)

    return threaded(threads, seconds, make)


def coroutines(tasks: int, seconds: float,
               open_: Callable[[], Awaitable[Any]],
               op: Callable[[Any, int, int], Awaitable[Any]],
               close: Callable[[Any], Awaitable[Any]]) -> Measurement:
    """Run ``tasks`` coroutines on one event loop for ``seconds``: ``handle =
    await open_()`` (untimed), then each task awaits ``op(handle, task, n)``
    until the deadline, then ``await close(handle)`` (untimed)."""

    async def main() -> Measurement:
        handle = await open_()
        try:
            counts = [0] * tasks
            loop = asyncio.get_running_loop()
            start = loop.time()
            end = start + seconds

            async def worker(index: int) -> None:
                n = 0
                while loop.time() < end:
                    await op(handle, index, n)
                    n += 1
                counts[index] = n

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(tasks)))
            elapsed = time.perf_counter() - t0
        finally:
            await close(handle)
        return Measurement(ops=sum(counts), seconds=elapsed, extra={"coroutines": tasks})

    return asyncio.run(main())


def counted(block: Callable[[], int]) -> Measurement:
    """Time ``block()``, which returns the number of operations it did."""
    start = time.perf_counter()
    ops = block()
    return Measurement(ops=ops, seconds=time.perf_counter() - start)


def counted_puts(put: Callable[[bytes, bytes], Any], items: Sequence[tuple[bytes, bytes]]) -> Measurement:
    """Time ``put(key, value)`` over ``items``, one call each, in this thread."""

    def block() -> int:
        for k, v in items:
            put(k, v)
        return len(items)

    return counted(block)


def spawn_child(function: str, kwargs: dict[str, Any], **popen: Any) -> subprocess.Popen:
    """Start ``python -m benchmarks.child function kwargs`` (this checkout
    first on the path); ``popen`` goes to :class:`subprocess.Popen`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-m", "benchmarks.child", function, json.dumps(kwargs)],
                            env=env, cwd=REPO, **popen)


def in_child(function: str, /, *, child_timeout: float = 3600, **kwargs: Any) -> Measurement:
    """Run ``function`` ("package.module:name") in a fresh Python process.

    The function gets ``kwargs`` and returns a dict with ``ops`` and
    ``seconds`` (timed inside the child) and anything else (kept in
    ``extra``). The child's peak RSS is its own VmHWM (see
    :mod:`benchmarks.child`): the whole child, interpreter and imports
    included. ``wait4``'s ru_maxrss is kept in ``extra`` for comparison only:
    Linux carries ru_maxrss across exec, so it is never below the parent's
    RSS at the time of the spawn.
    """
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = spawn_child(function, kwargs, stdout=out_f, stderr=err_f)
        timer = threading.Timer(child_timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"child {function} exited {proc.returncode}: {' | '.join(tail)}")
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"child {function} printed no result")
    data = json.loads(lines[-1])
    ops = int(data.pop("ops"))
    seconds = float(data.pop("seconds"))
    data["wait4_maxrss_mb"] = usage.ru_maxrss / 1024.0  # Linux: kilobytes
    rss_mb = float(data.pop("peak_rss_mb", data["wait4_maxrss_mb"]))
    return Measurement(ops=ops, seconds=seconds, rss_mb=rss_mb, extra=data)


def in_child_on_copy(ctx: Any, name: str, function: str, **kwargs: Any) -> Measurement:
    """Copy the workload's prepared directory (``ctx.state``) to a fresh
    place and run ``function`` on the copy in a fresh process (``path=`` the
    copy), so that every round reopens the same untouched files."""
    copy = os.path.join(ctx.fresh_dir(name), "data")
    shutil.copytree(ctx.state, copy)
    try:
        return in_child(function, path=copy, **kwargs)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
