"""Which asyncio HTTP framework ``walkv serve`` is built on: aiohttp or
Starlette on uvicorn, measured with the same load generator
(:func:`benchmarks.http_load.load`) on the same store, same machine.

``python -m benchmarks.frameworks [--seconds 3]`` starts each server in a
child process over a fresh store (``sync="always"``): ``walkv serve`` (aiohttp,
the whole server) and a Starlette app with the same two handlers
(``PUT``/``GET /v1/kv/{key}``, routed by the raw path, writes through
:class:`kvstore.store.aio.AsyncKVStore`) on uvicorn with httptools, both on
uvloop (as ``walkv serve`` runs). It preloads 10,000 keys, then drives puts and gets
with 16 and 256 concurrent clients and prints requests per second, the
ratio aiohttp/Starlette and the machine's ``sum(range(10**7))`` time.

Measured 2026-11-25 on the 2-core build machine, quiet (``--seconds 3``; the
load generator shares the 2 cores with the server; ``sum(range(10**7))``
0.206 s), both servers on asyncio's own loop then, requests per second:

============  =======  =========  =================
run           aiohttp  Starlette  aiohttp/Starlette
============  =======  =========  =================
put,  16      3,626    2,841      1.28x
put, 256      5,506    2,805      1.96x
get,  16      5,644    3,099      1.82x
get, 256      4,404    2,547      1.73x
============  =======  =========  =================

p99 at 256 clients: aiohttp 97 ms (puts) / 104 ms (gets), Starlette 217 / 229 ms.
Two later runs, both on uvloop but with the machine at load 8-9 from other
work (``sum(range(10**7))`` 0.65 s and 0.34 s), gave ratios from 0.62x to
2.15x: on a loaded machine the order of the runs decides, so compare on a
quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from benchmarks import processes


def baseline_seconds() -> float:
    """The machine's ``sum(range(10**7))`` time (printed beside the ratios)."""
    t0 = time.perf_counter()
    sum(range(10**7))
    return time.perf_counter() - t0


def starlette_child(path: str, port: int) -> None:
    """Serve ``path``'s put and get with Starlette on uvicorn (the comparison's other side)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    import kvstore

    state: dict = {}

    async def kv(request: Request) -> Response:
        adb = state["adb"]
        raw = request.scope["raw_path"].decode("ascii")
        key = urllib.parse.unquote_to_bytes(raw[len("/v1/kv/"):])
        if request.method == "PUT":
            return JSONResponse({"lsn": await adb.put(key, await request.body())})
        lsn = adb.store.applied_lsn
        value = adb.store.get(key)
        if value is None:
            return JSONResponse({"error": {"type": "NotFound", "message": "no such key"}}, 404)
        return Response(value, media_type="application/octet-stream", headers={"Walkv-Lsn": str(lsn)})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with kvstore.open_async(path) as adb:
            state["adb"] = adb
            yield

    app = Starlette(routes=[], lifespan=lifespan)

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        # /v1/kv/ by the raw path, as walkv serve routes it (a key may hold any byte, newlines too)
        if scope["type"] == "http" and scope["raw_path"].startswith(b"/v1/kv/"):
            response = await kv(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await app(scope, receive, send)

    uvicorn.run(asgi, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools",
                loop="uvloop")


def start(framework: str, path: str) -> tuple[subprocess.Popen, str]:
    port = processes.free_port()
    if framework == "aiohttp":
        cmd = [sys.executable, "-m", "kvstore.cli", "serve", path, "--listen", f"127.0.0.1:{port}"]
    else:
        cmd = [sys.executable, "-c", f"from benchmarks.frameworks import starlette_child; "
                                     f"starlette_child({path!r}, {port})"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    processes.wait_ready(proc, lambda: processes.port_open(port), f"the {framework} server", timeout=30)
    return proc, f"http://127.0.0.1:{port}"


def run(seconds: float, clients: tuple[int, ...] = (16, 256)) -> dict[tuple[str, str, int], float]:
    from benchmarks.http_load import load, preload

    out: dict[tuple[str, str, int], float] = {}
    for framework in ("aiohttp", "starlette"):
        tmp = tempfile.mkdtemp(prefix=f"walkv-{framework}-")
        proc, url = start(framework, os.path.join(tmp, "store"))
        try:
            preload(url, "walkv", 10_000)
            for op in ("put", "get"):
                for n in clients:
                    r = load(url, "walkv", op, n, seconds)
                    out[(framework, op, n)] = r["ops"] / r["seconds"]
                    print(f"{framework:<10} {op} {n:>4} clients: {out[(framework, op, n)]:>9.0f} req/s  "
                          f"p99 {r.get('p99_ms', float('nan')):.2f} ms", flush=True)
        finally:
            processes.stop(proc, grace=30)
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    out = run(args.seconds)
    print(f"\nsum(range(10**7)): {baseline_seconds():.3f} s")
    for op in ("put", "get"):
        for n in (16, 256):
            a, s = out[("aiohttp", op, n)], out[("starlette", op, n)]
            print(f"{op} {n:>4} clients: aiohttp {a:>8.0f}/s  starlette {s:>8.0f}/s  ratio {a / s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
