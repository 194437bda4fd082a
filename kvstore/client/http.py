"""The HTTP transport of walkv's clients: :class:`Http` (sync) and
:class:`AsyncHttp` (asyncio), on httpx.

Both keep one connection pool per client (HTTP/1.1 keep-alive: a request
reuses an idle connection), send ``Authorization: Bearer TOKEN`` when given a
token, and turn every non-2xx answer into the walkv exception it names
(:func:`kvstore.client.wire.raise_for_error`). Timeouts: ``timeout`` seconds
to connect, and between two reads or writes of a request (a watch stream's
reads have none: the server sends progress while idle).

Retries: only GETs (reads, which change nothing), only on a transport
error (the connection was refused or broke before an answer), at most
:data:`RETRIES` more times, after 50 ms then 200 ms. A write that meets a
transport error is never retried: it raises :class:`ServerUnavailable`,
whose message says the write may or may not have been applied.

Query parameters that are bytes are percent-encoded as keys are
(:func:`kvstore.client.wire.quote`); the query string is built here, so
httpx never re-encodes a ``%``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from kvstore.client.wire import ServerUnavailable, WriteOutcomeUnknown, quote, raise_for_error

RETRIES = 2
_BACKOFF = (0.05, 0.2)
Params = Mapping[str, "bytes | str | int | float | bool | None"]


def query(params: Params | None) -> str:
    """``?a=1&b=%00`` for ``params`` (None values left out; bytes percent-encoded)."""
    if not params:
        return ""
    parts = []
    for name, value in params.items():
        if value is None:
            continue
        if isinstance(value, bytes):
            text = quote(value)
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = urllib.parse.quote(str(value), safe="")
        parts.append(f"{name}={text}")
    return "?" + "&".join(parts) if parts else ""


Verify = bool | str | ssl.SSLContext
Cert = str | tuple[str, str] | None


def tls_verify(verify: Verify, cert: Cert = None) -> bool | ssl.SSLContext:
    """What httpx takes for ``verify``: a CA bundle's path becomes a context
    trusting it; ``cert`` (a PEM file with the key, or ``(certfile, keyfile)``)
    is the client certificate a server with ``--tls-client-ca`` asks for."""
    if cert is None:
        return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    if isinstance(verify, ssl.SSLContext):
        ctx = verify
    else:
        ctx = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
    certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def _pool(url: str, token: str | None, timeout: float, verify: Verify, cert: Cert,
          max_connections: int) -> dict[str, Any]:
    """The options of the httpx client (sync or asyncio) of a connection to ``url``."""
    return dict(base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {},
                timeout=httpx.Timeout(timeout), verify=tls_verify(verify, cert),
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))


def _attempts(method: str) -> int:
    return RETRIES + 1 if method == "GET" else 1


def _unreachable(url: str, method: str, path: str, exc: Exception) -> ServerUnavailable:
    """What a failed connection raises: a write that may have left,
    :class:`WriteOutcomeUnknown` (an :class:`~wal.errors.OutcomeUnknownError`)."""
    text = f"{method} {path} to the walkv server at {url} failed: {type(exc).__name__}: {exc}"
    if method in ("GET", "HEAD") or isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ServerUnavailable(text)
    return WriteOutcomeUnknown(f"{text}; the request may or may not have been applied")


def _answered(resp: httpx.Response) -> httpx.Response:
    if resp.status_code >= 300:
        raise_for_error(resp.status_code, resp.content)
    return resp


class Http:
    """A pooled HTTP/1.1 connection to a walkv server at ``url``."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0,
                 verify: Verify = True, cert: Cert = None, max_connections: int = 100) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(**_pool(self.url, token, timeout, verify, cert, max_connections))

    def request(self, method: str, path: str, *, params: Params | None = None, json: Any = None,
                content: bytes | None = None, headers: Mapping[str, str] | None = None) -> httpx.Response:
        """Send one request; the answer when 2xx, else the walkv exception it names."""
        target = path + query(params)
        attempts = _attempts(method)
        for attempt in range(attempts):
            try:
                resp = self._client.request(method, target, json=json, content=content, headers=headers)
                break
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise _unreachable(self.url, method, path, exc) from exc
                time.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
        return _answered(resp)

    @contextlib.contextmanager
    def stream(self, method: str, path: str, *, params: Params | None = None,
               headers: Mapping[str, str] | None = None, read_timeout: float | None = None
               ) -> Iterator[httpx.Response]:
        """A response whose body is read incrementally (no read timeout
        unless ``read_timeout``: the longest wait for the headers or for the
        next bytes); raises the walkv exception of an error answer."""
        timeout = httpx.Timeout(self._client.timeout.connect, read=read_timeout)
        try:
            with self._client.stream(method, path + query(params), headers=headers, timeout=timeout) as resp:
                if resp.status_code >= 300:
                    raise_for_error(resp.status_code, resp.read())
                yield resp
        except httpx.TransportError as exc:
            raise _unreachable(self.url, method, path, exc) from exc

    @property
    def closed(self) -> bool:
        return self._client.is_closed

    def close(self) -> None:
        self._client.close()


class AsyncHttp:
    """:class:`Http` for asyncio (httpx.AsyncClient)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0,
                 verify: Verify = True, cert: Cert = None, max_connections: int = 100) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(**_pool(self.url, token, timeout, verify, cert, max_connections))

    async def request(self, method: str, path: str, *, params: Params | None = None, json: Any = None,
                      content: bytes | None = None, headers: Mapping[str, str] | None = None) -> httpx.Response:
        target = path + query(params)
        attempts = _attempts(method)
        for attempt in range(attempts):
            try:
                resp = await self._client.request(method, target, json=json, content=content, headers=headers)
                break
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise _unreachable(self.url, method, path, exc) from exc
                await asyncio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
        return _answered(resp)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, params: Params | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[httpx.Response]:
        timeout = httpx.Timeout(self._client.timeout.connect, read=None)
        try:
            async with self._client.stream(method, path + query(params), headers=headers,
                                           timeout=timeout) as resp:
                if resp.status_code >= 300:
                    raise_for_error(resp.status_code, await resp.aread())
                yield resp
        except httpx.TransportError as exc:
            raise _unreachable(self.url, method, path, exc) from exc

    @property
    def closed(self) -> bool:
        return self._client.is_closed

    async def aclose(self) -> None:
        await self._client.aclose()
