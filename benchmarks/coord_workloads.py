"""Issue 13 workloads: programs that coordinate through the store.

* ``kv.watch.8w``: durable puts/s from 8 threads with 8 watchers attached
  (each following every change in its own thread) vs none: >= 0.95x. The
  watched run's ``extra`` holds the watch delivery latency, p50/p99 in
  microseconds, from the entry's commit stamp (taken just before the group's
  write and fsync) to the watcher's thread holding the change: the fsync is
  inside it, so it bounds "durable -> delivered" from above.
* ``kv.cas.8t``: compare-and-set increments/s from 8 threads (each on its own
  counter, so every attempt succeeds and both runs log one entry per call)
  vs plain durable puts from 8 threads (no target; the ratio is reported).
* ``kv.replica.lag``: a writer PROCESS doing 10k durable puts/s (8 threads,
  paced) and a read replica of its store in this one
  (:mod:`kvstore.replica.replica`); ``extra`` holds the replica's lag sampled every
  millisecond through ``rep.lag``, p50/p99 in LSNs and in milliseconds (the
  time since the replica last showed all the source had durable). The rate
  is the puts the writer did per second (no target: the lag is the result).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.timing import threaded, threaded_puts

KV = ("kvstore:open",)


def _puts_with_watchers(watchers: int, threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        db = kvstore.open(ctx.fresh_dir("watch"))
        lat: list[list[int]] = [[] for _ in range(watchers)]
        ws = [db.watch() for _ in range(watchers)]

        def follow(i: int) -> None:
            out = lat[i]
            now = time.time_ns
            for c in ws[i]:
                out.append(now() // 1000 - c.time)

        followers = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(watchers)]
        for t in followers:
            t.start()
        try:
            m = threaded_puts(db.put, threads, seconds, data.value(0))
        finally:
            for w in ws:
                w.close()
            for t in followers:
                t.join(5)
            db.close()
        all_lat = sorted(x for one in lat for x in one)
        if all_lat:
            m.extra["watch_latency_p50_us"] = all_lat[len(all_lat) // 2]
            m.extra["watch_latency_p99_us"] = all_lat[int(len(all_lat) * 0.99)]
            m.extra["changes_delivered"] = len(all_lat)
        return m

    return run


def _cas_or_put(threads: int, seconds: float, cas: bool):
    def run(ctx: Context) -> Measurement:
        import kvstore

        db = kvstore.open(ctx.fresh_dir("cas"))
        try:
            def make(i: int):
                key = b"counter-%d" % i
                if not cas:
                    put = db.put
                    return lambda n: put(key, b"%d" % n)
                c_a_s = db.compare_and_set

                def op(n: int) -> Any:
                    if not c_a_s(key, b"%d" % (n - 1) if n else None, b"%d" % n):
                        raise AssertionError("a compare-and-set on a private counter failed")
                return op

            return threaded(threads, seconds, make)
        finally:
            db.close()

    return run


_PACED_WRITER = """
import sys, threading, time, kvstore
path, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
db = kvstore.open(path)
print("ready", flush=True)
start = time.perf_counter(); counts = [0] * 8
def work(t):
    n, step = 0, 8 / rate
    while True:
        due = start + n * step
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        db.put(b"t%d-%d" % (t, n % 10000), b"x" * 100)
        n += 1
    counts[t] = n
ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(counts), time.perf_counter() - start, flush=True)
db.close()
"""


def _replica_lag(rate: float, seconds: float):
    def run(ctx: Context) -> Measurement:
        import kvstore

        base = ctx.fresh_dir("replica")
        src, rdir = os.path.join(base, "src"), os.path.join(base, "rep")
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=repo)
        child = subprocess.Popen([sys.executable, "-c", _PACED_WRITER, src, str(rate), str(seconds)],
                                 stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            lsns: list[int] = []
            ms: list[float] = []
            with kvstore.open_replica(src, rdir) as rep:
                while child.poll() is None:
                    lag = rep.lag
                    lsns.append(lag.lsns)
                    ms.append(lag.seconds * 1000)
                    time.sleep(0.001)
                puts, took = child.stdout.read().split()
                rep.wait_for(rep.lag.lsns + rep.applied_lsn, timeout=30)
        finally:
            child.kill()
            child.wait()
        m = Measurement(ops=int(puts), seconds=float(took))
        lsns.sort()
        ms.sort()
        if lsns:
            m.extra.update({"lag_lsns_p50": lsns[len(lsns) // 2], "lag_lsns_p99": lsns[int(len(lsns) * 0.99)],
                            "lag_ms_p50": round(ms[len(ms) // 2], 2), "lag_ms_p99": round(ms[int(len(ms) * 0.99)], 2),
                            "samples": len(lsns)})
        return m

    return run


def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    return [
        Workload(
            name="kv.watch.8w", issue=13, unit="puts/s",
            title="durable puts from 8 threads with 8 watchers attached vs none", requires=KV,
            targets=[Target("no-watchers", 0.95)], params={"threads": 8, "watchers": 8, "seconds": secs},
            contenders=[
                Contender("walkv", _puts_with_watchers(8, 8, secs), label="walkv put x8, 8 watchers"),
                Contender("no-watchers", _puts_with_watchers(0, 8, secs), label="walkv put x8, no watcher"),
            ]),
        Workload(
            name="kv.cas.8t", issue=13, unit="ops/s",
            title="compare-and-set from 8 threads vs plain durable puts", requires=KV,
            params={"threads": 8, "seconds": secs},
            contenders=[
                Contender("walkv", _cas_or_put(8, secs, cas=True), label="walkv compare_and_set x8"),
                Contender("put", _cas_or_put(8, secs, cas=False), label="walkv put x8"),
            ]),
        Workload(
            name="kv.replica.lag", issue=13, unit="puts/s",
            title="a read replica's lag behind a writer process doing 10k durable puts/s", requires=KV,
            params={"rate": 10000, "threads": 8, "seconds": max(secs, 1.0)},
            contenders=[Contender("walkv", _replica_lag(10000, max(secs, 1.0)),
                                  label="walkv put x8 (process) + open_replica")]),
    ]


__all__ = ["workloads"]
