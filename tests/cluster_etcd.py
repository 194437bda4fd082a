"""etcd for the cluster tests: one member on free loopback ports
(:func:`benchmarks.server_peers.start_etcd_members`), its data in the test's
temporary directory, stopped at the end (SIGTERM, then SIGKILL).

Its Raft ticks are short (10 ms heartbeat, 100 ms election): a single member
never holds an election after it starts, and etcd grants leases as short as
1.5 election timeouts rounded up to a second, so the tests can use 1 s
leases. Reached over its HTTP JSON gateway (``/v3/...``) for inspection
only (who holds which key): the nodes talk to it themselves.
"""

from __future__ import annotations

import base64
import json
import shutil
import urllib.request
from typing import Any

from benchmarks.server_peers import Server, start_etcd_members

ETCD = "etcd"
INSTALL_HINT = "apt-get install -y etcd-server (.ci/run installs it)"


def etcd_missing() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if shutil.which(ETCD) is None:
        return f"etcd is not installed (/usr/bin/etcd): {INSTALL_HINT}"
    return None


class Etcd:
    """One running etcd member (module docstring); a context manager."""

    def __init__(self, directory: str) -> None:
        self.server: Server = start_etcd_members(directory, 1, heartbeat_ms=10, election_ms=100)[0]
        self.url = self.server.url
        self.port = int(self.url.rsplit(":", 1)[1])

    def coordinator(self, port: int | None = None) -> str:
        """The ``--coordinator`` URL of this member, or of a proxy at ``port`` in front of it."""
        return f"etcd://127.0.0.1:{port or self.port}"

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.loads(resp.read())

    def put(self, key: bytes, value: bytes) -> None:
        self._call("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    def keys(self, prefix: bytes = b"") -> dict[bytes, bytes]:
        """Every key under ``prefix`` (all keys for ``b""``) with its value."""
        end = _prefix_end(prefix) if prefix else b"\0"
        answer = self._call("/v3/kv/range", {"key": _b64(prefix or b"\0"), "range_end": _b64(end)})
        return {base64.b64decode(kv["key"]): base64.b64decode(kv.get("value", ""))
                for kv in answer.get("kvs", [])}

    def alive(self) -> bool:
        return self.server.proc.poll() is None

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> Etcd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for a prefix: the prefix with its last byte incremented."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\0"
