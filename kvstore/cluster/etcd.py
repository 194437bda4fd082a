"""etcd, the coordinator a cluster elects and fences its writer through: a
small client of etcd's own JSON gateway (``/v3/...``, grpc-gateway, served
by every etcd 3.4+ on its client port).

Why this client and not a Python etcd library: the maintained-looking ones
either pin old gRPC stubs (python-etcd3: no release since 2022, protobuf 3
only), wrap the v2 API (python-etcd), or are asyncio forks of the first
(aetcd); etcd's JSON gateway is part of etcd itself, stable across 3.4-3.6,
and the five calls a leader lease needs (lease grant, keep-alive, revoke,
range, txn) are a POST each with httpx, which walkv's server extra already
has. etcd's documentation of the gateway: "gRPC gateway" (dev-guide/api_grpc_gateway).

Every key and value is base64 in the JSON; 64-bit numbers come back as
strings; a field at its zero value is left out (a failed txn has no
``succeeded``, an expired lease's keep-alive no ``TTL``). Every failure to
reach etcd or an answer that is not what etcd answers is
:class:`CoordinatorError` naming the URL; the caller decides what a lost
coordinator means (a leader steps down when it cannot renew its lease).
"""

from __future__ import annotations

import base64
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx

from wal.errors import CoordinatorError


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def parse_url(url: str) -> str:
    """``etcd://host:port`` (or ``http://``) as the gateway's base URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("etcd", "http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"--coordinator must be etcd://HOST:PORT (etcd's client URL), not {url!r}")
    scheme = "https" if parts.scheme == "https" else "http"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}:{parts.port}"


class Etcd:
    """An etcd cluster's client port, through its JSON gateway (module docstring).
    ``timeout`` bounds each request (seconds)."""

    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        self.url = parse_url(url)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise CoordinatorError(f"etcd at {self.url} cannot be reached ({type(exc).__name__}: {exc}); "
                                   "is it running, and is --coordinator its client URL?") from None
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise CoordinatorError(f"etcd at {self.url} answered {path} with HTTP {resp.status_code} and no JSON "
                                   "object: is it etcd 3.4 or newer?")
        if resp.status_code != 200 or "error" in doc:
            raise CoordinatorError(f"etcd at {self.url} refused {path}: {doc.get('message') or doc.get('error')}",
                                   code=doc.get("code"))
        return doc

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds: its id, and the seconds etcd
        granted (at least its minimum TTL)."""
        doc = await self._post("/v3/lease/grant", {"TTL": int(ttl)})
        return int(doc["ID"]), int(doc.get("TTL", ttl))

    async def keep_alive(self, lease: int) -> int:
        """Renew ``lease``; the seconds it has left (0: it had expired, and is gone)."""
        doc = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(doc.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now (its keys are deleted); an unknown lease is no error."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except CoordinatorError as exc:
            if exc.code != 5:  # NotFound: it expired already
                raise

    async def get(self, key: bytes) -> KeyValue | None:
        found = await self.range(key)
        return found[0] if found else None

    async def range(self, key: bytes, end: bytes | None = None) -> list[KeyValue]:
        """The keys ``key`` (or ``key <= k < end``), in key order."""
        body: dict[str, Any] = {"key": _b64(key)}
        if end is not None:
            body["range_end"] = _b64(end)
        doc = await self._post("/v3/kv/range", body)
        return [_kv(item) for item in doc.get("kvs", [])]

    async def put(self, key: bytes, value: bytes, lease: int | None = None) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        doc = await self._post("/v3/kv/put", body)
        return int(doc.get("header", {}).get("revision", 0))

    async def create(self, puts: list[tuple[bytes, bytes, int | None]], *, absent: bytes,
                     mod_revision: tuple[bytes, int] | None = None) -> tuple[bool, int]:
        """One transaction: when ``absent`` does not exist (and ``mod_revision``'s
        key was last changed at that revision, 0: never), make every
        ``(key, value, lease)`` of ``puts``. Whether it did, and the revision."""
        compare = [{"key": _b64(absent), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}]
        if mod_revision is not None:
            compare.append({"key": _b64(mod_revision[0]), "result": "EQUAL", "target": "MOD",
                            "mod_revision": str(mod_revision[1])})
        success = [{"request_put": {"key": _b64(k), "value": _b64(v), **({"lease": str(le)} if le else {})}}
                   for k, v, le in puts]
        doc = await self._post("/v3/kv/txn", {"compare": compare, "success": success})
        return bool(doc.get("succeeded", False)), int(doc.get("header", {}).get("revision", 0))

    async def delete_if_lease(self, key: bytes, lease: int) -> bool:
        """Delete ``key`` when it is held by ``lease`` (a leader letting go)."""
        compare = [{"key": _b64(key), "result": "EQUAL", "target": "LEASE", "lease": str(lease)}]
        doc = await self._post("/v3/kv/txn", {"compare": compare,
                                              "success": [{"request_delete_range": {"key": _b64(key)}}]})
        return bool(doc.get("succeeded", False))

    async def close(self) -> None:
        await self._http.aclose()


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(item["key"]), base64.b64decode(item.get("value", "")),
                    int(item.get("create_revision", 0)), int(item.get("mod_revision", 0)),
                    int(item.get("lease", 0)))
