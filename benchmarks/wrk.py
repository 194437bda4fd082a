"""Durable puts over HTTP driven by ``wrk`` (Debian's, 4.1): a compiled load
generator, because on 2 cores a Python one measures itself. One Lua script
per dialect, the same keys and values for both: key ``k<thread>-<n>`` (each
request a new key), a 100-byte value.

* walkv: ``PUT /v1/kv/{key}`` with the raw value (docs/http-api.md);
* etcd: ``POST /v3/kv/put`` ``{"key", "value"}`` in base64, its HTTP JSON
  gateway (the same requests :mod:`benchmarks.http_load` sends).

wrk runs ``threads`` threads (2: the machine's cores) holding
``connections`` keep-alive connections, each one request at a time, for
``seconds``. The script's ``done`` prints one JSON line: requests, duration,
errors by kind, latency p50/p99/max; only 2xx answers count as puts (a
non-2xx is an error of the run, never a put).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

from benchmarks.harness import Measurement

INSTALL_HINT = "apt-get install -y wrk"

_COMMON = r"""
local counter = 0
local prefix = "k"
local value = string.rep("v", 100)
local started = 0
function setup(thread)
  started = started + 1
  thread:set("id", started)
end
function init(args)
  prefix = "k" .. tostring(id) .. "-"
  prepare()
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, ' ..
    '"timeout": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""

WALKV = _COMMON + r"""
function prepare() end
request = function()
  counter = counter + 1
  return wrk.format("PUT", "/v1/kv/" .. prefix .. counter, nil, value)
end
"""

ETCD = _COMMON + r"""
local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function sextet(n) return ALPHABET:sub(n + 1, n + 1) end
local function b64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    out[#out + 1] = sextet(math.floor(n / 262144) % 64) .. sextet(math.floor(n / 4096) % 64)
      .. (b and sextet(math.floor(n / 64) % 64) or "=") .. (c and sextet(n % 64) or "=")
  end
  return table.concat(out)
end
local value64 = ""
local headers = {["Content-Type"] = "application/json"}
function prepare() value64 = b64(value) end
request = function()
  counter = counter + 1
  local body = '{"key":"' .. b64(prefix .. counter) .. '","value":"' .. value64 .. '"}'
  return wrk.format("POST", "/v3/kv/put", headers, body)
end
"""

SCRIPTS = {"walkv": WALKV, "etcd": ETCD}


def wrk_missing() -> str | None:
    return None if shutil.which("wrk") else f"wrk not found on PATH ({INSTALL_HINT})"


def put_load(url: str, kind: str, connections: int, seconds: float, threads: int = 2) -> Measurement:
    """wrk's durable puts against ``url``: ``ops`` the 2xx answers; ``extra``
    the latency p50/p99/max in ms and the errors by kind."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(SCRIPTS[kind])
    try:
        out = subprocess.run(["wrk", "-t", str(min(threads, connections)), "-c", str(connections),
                              "-d", f"{max(seconds, 1):g}s", "--timeout", "10s", "-s", script.name, url],
                             capture_output=True, text=True, timeout=seconds + 120)
    finally:
        os.unlink(script.name)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRK ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip()[-300:]} {out.stdout.strip()[-300:]}")
    r = json.loads(line[4:])
    errors = {k: r[k] for k in ("connect", "read", "write", "status", "timeout") if r[k]}
    m = Measurement(ops=r["requests"] - r["status"], seconds=r["duration_us"] / 1e6)
    m.extra.update(p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, max_ms=r["max_us"] / 1000,
                   errors=errors, connections=connections)
    return m
