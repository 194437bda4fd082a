"""What a hostile client costs ``walkv serve`` (issue 33, items 2, 3 and 7):
the server's memory growth and how long ``/healthz`` stalls meanwhile.

``python -m benchmarks.server_abuse [--checkout DIR] [--only NAME,...]``
starts ``walkv serve`` of ``DIR`` (default: this checkout) on a fresh store
on a free loopback port, with a read token, and runs each scenario alone:

* ``get_many_amplified``: one ``POST /v1/get_many`` of ~15 KiB naming one
  256 KiB key 2,000 times (a 666 MiB answer before the answer budget);
* ``json_bomb``: 63 MB of ``[],[],...`` as the ``keys`` of a ``get_many``,
  then ``json_bomb_x4``: four of them at once;
* ``scan_fairness``: 40 clients each paging through a 100,000-key range
  (10,000-item pages) while another client does point GETs.

For each: the server's peak RSS growth over its RSS before the scenario
(``/proc/PID/status``, ``VmHWM`` reset through ``clear_refs`` before it),
the longest and the median ``/healthz`` (or point GET) latency of a client
polling every 10 ms meanwhile, and what the abusive request got back.
Numbers depend on the machine: compare checkouts in one run, on one machine.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.processes import free_port, port_open, stop, wait_ready

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "abuse-read-token"
BIG_VALUE = 256 * 1024


def _rss_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


class Poller(threading.Thread):
    """GETs ``path`` every 10 ms until stopped; keeps each latency."""

    def __init__(self, url: str, path: str) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"})
        self.path = path
        self.latencies: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.perf_counter()
            self.client.get(self.path)
            self.latencies.append(time.perf_counter() - t)
            self.halt.wait(0.01)
        self.client.close()


def scenario(url: str, pid: int, poll_path: str, work: Callable[[], Any]) -> dict[str, Any]:
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    before = _rss_kib(pid, "VmRSS")
    poller = Poller(url, poll_path)
    poller.start()
    time.sleep(0.2)
    t = time.perf_counter()
    got = work()
    took = time.perf_counter() - t
    time.sleep(0.2)
    poller.halt.set()
    poller.join()
    lat = poller.latencies
    return {"peak_rss_growth_mib": round((_rss_kib(pid, "VmHWM") - before) / 1024, 1),
            "poll_max_ms": round(max(lat) * 1000, 1), "poll_median_ms": round(statistics.median(lat) * 1000, 1),
            "poll_p90_ms": round(statistics.quantiles(lat, n=10)[-1] * 1000, 1),
            "seconds": round(took, 2), "answer": got}


def _post(url: str, path: str, body: bytes) -> str:
    with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        try:
            with c.stream("POST", path, content=body, headers={"Content-Type": "application/json"}) as r:
                size = sum(len(chunk) for chunk in r.iter_bytes())
                return f"{r.status_code}, {size} bytes"
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}"


def get_many_amplified(url: str) -> str:
    body = json.dumps({"keys": [base64.b64encode(b"big").decode()] * 2000}).encode()
    return _post(url, "/v1/get_many", body)


BOMB = b'{"keys": [' + b"[]," * 21_000_000 + b"[]]}"


def json_bomb(url: str) -> str:
    return _post(url, "/v1/get_many", BOMB)


def json_bomb_x4(url: str) -> list[str]:
    out: list[str] = [""] * 4

    def one(i: int) -> None:
        out[i] = _post(url, "/v1/get_many", BOMB)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def scan_fairness(url: str) -> str:
    def pages() -> None:
        with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            after = None
            while True:
                params = {"prefix": "s", "limit": "10000", **({"after": after} if after else {})}
                doc = c.get("/v1/scan", params=params).json()
                after = doc["after"]
                if after is None:
                    return

    threads = [threading.Thread(target=pages) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return "40 scans of 100,000 keys"


SCENARIOS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "get_many_amplified": ("/healthz", get_many_amplified),
    "json_bomb": ("/healthz", json_bomb),
    "json_bomb_x4": ("/healthz", json_bomb_x4),
    "scan_fairness": ("/v1/kv/s0000001", scan_fairness),
}


def seed(path: str, checkout: str) -> None:
    code = ("import kvstore\n"
            f"with kvstore.open({path!r}, sync='none') as db:\n"
            f"    db.put(b'big', b'x' * {BIG_VALUE})\n"
            "    db.update((b's%07d' % i, b'v' * 100) for i in range(100_000))\n")
    # (cwd: not this checkout, whose packages `-c` would import before PYTHONPATH's)
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=checkout),
                   cwd=os.path.dirname(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_abuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", default=REPO, help="the walkv checkout whose server runs (default: this one)")
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        seed(store, args.checkout)
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as fh:
            fh.write(f"read {TOKEN}\n")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "serve", store, "--listen", f"127.0.0.1:{port}",
                                 "--tokens", tokens], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONPATH=args.checkout), cwd=tmp)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(proc, lambda: port_open(port), "walkv serve", timeout=60)
            print(f"checkout {args.checkout}, sum(range(10**7)) {_sum_seconds():.3f} s, load {os.getloadavg()[0]:.1f}")
            for name in names:
                poll, work = SCENARIOS[name]
                print(name, json.dumps(scenario(url, proc.pid, poll, lambda: work(url))), flush=True)
        finally:
            stop(proc)
    return 0


def _sum_seconds() -> float:
    t = time.perf_counter()
    sum(range(10**7))
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
