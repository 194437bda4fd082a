"""Issue 35: walkv's Redis face (``walkv serve STORE --resp``) against
Redis 7 with ``appendonly yes``, ``appendfsync always`` (every acknowledged
write in its fsynced append-only file, as walkv's are in its log), both
started here on loopback and driven by Redis's own load generator,
``redis-benchmark``, in the same run, alternated, medians of the repeats.

``python -m benchmarks --only resp`` (about 3 minutes). Workloads: SET at 50
and 256 clients with ``-P 1`` and ``-P 16``, GET at 50 clients, INCR (one
counter: a read-modify-write decided in log order) and MSET (10 keys), over
100,000 random keys of 3-byte values (redis-benchmark's defaults). A third
contender, ``floor``, is a Python RESP server that only answers
(:mod:`benchmarks.resp_floor`): the most a Python face reaches on this
machine. Each row reports p50 and p99 latency (ms, redis-benchmark's), the
server's CPU per operation and the fdatasync latency measured just before. The issue's targets: SET ``-P 16`` at 50 clients
>= 1x Redis, SET ``-P 1`` at 256 clients >= 0.5x, GET at 50 clients >= 0.5x.

The load generator shares the machine's cores with the server it loads (2
here), so the rates are lower than on a dedicated client; the ratios, taken
in the same run, alternated, are the comparison.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from benchmarks.harness import Config, Contender, Context, Measurement, Target, Workload
from benchmarks.processes import free_port, wait_ready
from benchmarks.server_peers import Server, start_redis
from benchmarks.timing import REPO

KEYSPACE = 100_000
REPORTED = ("p50_ms", "p99_ms", "server_cpu_us_per_op", "fsync_p50_ms")
LABELS = {"walkv": "walkv serve --resp (sync=always)", "redis": "Redis 7 appendfsync always",
          "floor": "Python RESP floor (answers only)"}


def missing_tools() -> str | None:
    for prog in ("redis-server", "redis-benchmark"):
        if shutil.which(prog) is None:
            return f"{prog} not found on PATH (apt-get install -y redis-server redis-tools)"
    return None


def _ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(16).startswith(b"+PONG")


def _python(directory: str, name: str, *argv: str) -> tuple[subprocess.Popen, str]:
    log_path = os.path.join(directory, f"{name}.log")
    env = dict(os.environ, PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return proc, log_path


def start_walkv_resp(directory: str) -> Server:
    port = free_port()
    proc, log_path = _python(directory, "walkv-serve", "-m", "kvstore.cli", "serve",
                             os.path.join(directory, "store"), "--listen", "127.0.0.1:0",
                             "--resp", f"127.0.0.1:{port}")
    server = Server("walkv", f"redis://127.0.0.1:{port}", proc, log_path)
    wait_ready(proc, lambda: _ping(port), "walkv serve --resp", timeout=60, log_tail=server.log_tail)
    return server


def start_floor(directory: str) -> Server:
    port = free_port()
    proc, log_path = _python(directory, "floor", "-m", "benchmarks.resp_floor", str(port))
    server = Server("floor", f"redis://127.0.0.1:{port}", proc, log_path)
    wait_ready(proc, lambda: _ping(port), "the RESP floor", timeout=60, log_tail=server.log_tail)
    return server


STARTERS = {"walkv": start_walkv_resp, "redis": start_redis, "floor": start_floor}


def _prepare(kind: str):
    def prepare(ctx: Context) -> Server:
        gone = missing_tools()
        if gone:
            raise RuntimeError(gone)
        return STARTERS[kind](ctx.directory)

    return prepare


def redis_benchmark(port: int, test: str, clients: int, pipeline: int, requests: int) -> dict[str, float]:
    """One ``redis-benchmark --csv`` run: rps, p50_ms, p99_ms."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", test, "-c", str(clients),
           "-P", str(pipeline), "-n", str(requests), "-r", str(KEYSPACE), "--csv"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = [line.replace('"', "").split(",") for line in done.stdout.splitlines() if line.startswith('"')]
    data = [r for r in rows if r[0] != "test"]
    if done.returncode != 0 or not data:
        raise RuntimeError(f"redis-benchmark failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    header = rows[0] if rows[0][0] == "test" else ["test", "rps", "avg_latency_ms", "min_latency_ms",
                                                   "p50_latency_ms", "p95_latency_ms", "p99_latency_ms"]
    row = dict(zip(header, data[-1]))
    return {"rps": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]), "p99_ms": float(row["p99_latency_ms"])}


def fsync_p50_ms(directory: str, syncs: int = 20) -> float:
    """The median time of a 4 KiB write and fdatasync in ``directory`` (the
    durable writes' floor, measured before each run)."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        times = []
        for _ in range(syncs):
            os.pwrite(fd, b"x" * 4096, 0)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return round(sorted(times)[len(times) // 2] * 1000, 2)


def _run(test: str, clients: int, pipeline: int, requests: int):
    def run(ctx: Context) -> Measurement:
        server: Server = ctx.state
        server.check_alive()
        fsync_ms = fsync_p50_ms(ctx.directory)
        port = int(server.url.rsplit(":", 1)[1])
        cpu = server.cpu_seconds()
        t0 = time.perf_counter()
        got = redis_benchmark(port, test, clients, pipeline, requests)
        seconds = time.perf_counter() - t0
        used = server.cpu_seconds() - cpu
        m = Measurement(ops=requests, seconds=requests / got["rps"])
        m.extra.update(p50_ms=got["p50_ms"], p99_ms=got["p99_ms"], wall_s=round(seconds, 2), fsync_p50_ms=fsync_ms,
                       server_cpu_us_per_op=round(used / requests * 1e6, 1))
        return m

    return run


def workloads(cfg: Config) -> list[Workload]:
    rows = [  # (name, redis-benchmark test, clients, pipeline, requests full/quick, walkv/redis target)
        ("resp.set.50c.p16", "set", 50, 16, 400_000, 40_000, 1.0),
        ("resp.set.50c.p1", "set", 50, 1, 60_000, 6_000, None),
        ("resp.set.256c.p1", "set", 256, 1, 100_000, 10_000, 0.5),
        ("resp.set.256c.p16", "set", 256, 16, 400_000, 40_000, None),
        ("resp.get.50c.p1", "get", 50, 1, 200_000, 20_000, 0.5),
        ("resp.incr.50c.p1", "incr", 50, 1, 60_000, 6_000, None),
        ("resp.mset.50c.p1", "mset", 50, 1, 40_000, 4_000, None),
    ]
    out = []
    for name, test, clients, pipeline, full, quick, target in rows:
        requests = cfg.size(full, quick)
        kinds = ("walkv", "redis", "floor") if test in ("set", "get") else ("walkv", "redis")
        out.append(Workload(
            name=name, issue=35, unit=f"{test.upper()}s/s",
            title=f"{test.upper()}, {clients} clients, -P {pipeline} (redis-benchmark, durable)",
            contenders=[Contender(kind, _run(test, clients, pipeline, requests), prepare=_prepare(kind),
                                  cleanup=lambda s: s.stop(), label=LABELS[kind]) for kind in kinds],
            targets=[Target("redis", target)] if target else [],
            params={"clients": clients, "pipeline": pipeline, "requests": requests, "keyspace": KEYSPACE},
            report=REPORTED, requires=("hiredis", "kvstore.server.resp")))
    return out
