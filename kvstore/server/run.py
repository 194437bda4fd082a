"""Running the server: :func:`serve` (what ``walkv serve`` calls).

Security by default: it listens on loopback (127.0.0.1) unless told
otherwise, refuses a non-loopback address without a tokens file unless
``insecure=True`` says it means it, and warns (stderr) when it serves
tokens without TLS (they would cross the network in the clear). TLS comes
from :mod:`ssl`: a certificate and key, and optionally a CA file whose
client certificates it requires (``tls_client_ca``).

Shutdown: SIGTERM or SIGINT stops accepting connections, ends the open
watch streams, and gives the requests in flight up to
:attr:`~kvstore.server.context.Limits.shutdown_timeout` seconds to finish
(:func:`~kvstore.server.app.drain`) on their connections, still open, so
a body still arriving is read and answered (with ``Connection: close``).
Only then does aiohttp's cleanup close the connections (an idle one is owed
no answer), give a request still running :data:`CANCEL_GRACE` more seconds,
cancel it (a cancelled write is still written), and close the store (every
acknowledged write is durable already, per its sync mode; close flushes
LMDB and records a clean close).

With ``resp=(host, port)`` a RESP listener (:mod:`kvstore.server.resp`)
serves the same store beside HTTP, through the same asyncio front, started
after the HTTP site and stopped in the same sequence: it stops accepting
with HTTP, its commands in flight are answered within the same timeout, its
connections close, then the store does.

Why the drain comes first: aiohttp's ``AppRunner.cleanup()`` closes every
connection before it waits for the handlers, and a closed connection reads
nothing more, so a request that had its ``100 Continue`` but not yet its
body would wait for the body until cancelled.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from kvstore.server.app import ROUTES, drain, make_app
from kvstore.server.auth import Tokens
from kvstore.server.connections import guarded_server
from kvstore.server.context import Limits
from kvstore.server.resp import RespLimits, RespServer
from kvstore.server.routes import Route
from kvstore.store.aio import AsyncKVStore, open_async
from kvstore.store.store import KVStore
from wal.errors import WalkvError

DEFAULT_PORT = 7379
CANCEL_GRACE = 1.0
"""Seconds aiohttp's cleanup gives a request still running after the drain
before it cancels it, and a cancelled one to unwind."""


class ServeError(WalkvError):
    """The server refuses to start as asked (the message says why and what to do)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or newer); with ``client_ca``, clients
    must present a certificate that CA signed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def check_listen(host: str, tokens: Tokens | None, tls: bool, insecure: bool,
                 warn: Callable[[str], None]) -> None:
    """Refuse a non-loopback address without tokens (unless ``insecure``);
    warn about tokens or a network address without TLS."""
    if not is_loopback(host):
        if tokens is None and not insecure:
            raise ServeError(f"refusing to listen on {host} without --tokens: anyone who can reach it could read "
                             f"and write the store. Give a tokens file, or --insecure if you mean it")
        if tokens is None:
            warn(f"walkv serve: WARNING: listening on {host} with no tokens (--insecure): anyone who can reach "
                 f"it can read and write the store")
    if not tls and (tokens is not None or not is_loopback(host)):
        warn("walkv serve: WARNING: no TLS (--tls-cert/--tls-key): tokens and data cross the network in the clear")


async def serve_async(db: KVStore | AsyncKVStore | str | os.PathLike[str], host: str = "127.0.0.1",
                      port: int = DEFAULT_PORT, *, tokens: Tokens | None = None, tls: ssl.SSLContext | None = None,
                      insecure: bool = False, limits: Limits = Limits(), store_options: dict[str, Any] | None = None,
                      on_listening: Callable[[str], None] | None = None,
                      stop: asyncio.Event | None = None, warn: Callable[[str], None] | None = None,
                      resp: tuple[str, int] | None = None, resp_limits: RespLimits = RespLimits(),
                      on_resp_listening: Callable[[str], None] | None = None,
                      resp_read_check: Callable[[], None] | None = None,
                      routes: list[Route] = ROUTES, setup: Callable[[web.Application], None] | None = None) -> None:
    """Serve ``db`` (a store, its asyncio front, or a path to open) until
    ``stop`` is set or SIGTERM/SIGINT arrives; ``on_listening(url)`` once it
    accepts requests (the URL has the real port when ``port`` is 0).
    ``resp=(host, port)``: the Redis protocol too, on that address
    (``on_resp_listening(url)`` once it accepts, ``redis://HOST:PORT``).
    ``routes``, ``setup(app)`` and ``resp_read_check`` (called before each
    RESP read, raising to refuse it): a cluster node's additions
    (:mod:`kvstore.server.cluster`)."""
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    check_listen(host, tokens, tls is not None, insecure, warn)
    if resp is not None:
        check_listen(resp[0], tokens, tls is not None, insecure, warn)
    owns = isinstance(db, (str, os.PathLike))
    opened = await open_async(db, **(store_options or {})) if isinstance(db, (str, os.PathLike)) else db
    loop = asyncio.get_running_loop()
    if resp is not None and isinstance(opened, KVStore):  # one front: both faces' writes share group commit
        opened = AsyncKVStore(opened, loop)
    app = make_app(opened, tokens=tokens, limits=limits, close_store=owns, routes=routes)
    if setup is not None:
        setup(app)
    stop = stop or asyncio.Event()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    # handler_cancellation: a client that disconnects cancels its handler, so an idle watch
    # stream gives back its slot at once (a cancelled write is still written: kvstore.store.aio)
    runner = web.AppRunner(app, handle_signals=False, keepalive_timeout=limits.idle_timeout,
                           shutdown_timeout=CANCEL_GRACE, access_log=None, handler_cancellation=True)
    await runner.setup()
    resp_server: RespServer | None = None
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    backlog=1024, reuse_port=False)
        server = await loop.create_server(guarded_server(runner.server, limits), sock=sock,  # type: ignore[arg-type]
                                          ssl=tls)
        real_port = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        url = f"{'https' if tls else 'http'}://{shown}:{real_port}"
        if on_listening is not None:
            on_listening(url)
        if resp is not None:
            assert isinstance(opened, AsyncKVStore)
            resp_server = RespServer(opened, tokens=tokens, limits=resp_limits, read_check=resp_read_check)
            resp_url = await resp_server.start(*resp, tls=tls)
            if on_resp_listening is not None:
                on_resp_listening(resp_url)
        await stop.wait()
        server.close()  # stop accepting
        if resp_server is not None:
            resp_server.stop_accepting()
        await drain(app, limits.shutdown_timeout)  # streams end, requests in flight finish
        if resp_server is not None:  # RESP's commands in flight are answered, its connections close
            await resp_server.stop(limits.shutdown_timeout)
    finally:
        if resp_server is not None:
            resp_server.close()  # (already, unless something failed: none may outlive the store)
        try:  # a second SIGTERM/SIGINT meanwhile sets the event again: a no-op (the drain is bounded)
            await runner.cleanup()  # connections close, what still runs is cancelled, the store closes
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (the ``server`` extra: measured up to 1.6x the
    puts/s of asyncio's loop), or asyncio's own (None) where uvloop is not
    installed or not available (Windows)."""
    if sys.platform == "win32":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on the event loop ``walkv serve`` runs on (:func:`loop_factory`)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main)


def serve(db: KVStore | AsyncKVStore | str | os.PathLike[str], host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          **options: Any) -> None:
    """Serve ``db`` over HTTP until SIGTERM/SIGINT (options as :func:`serve_async`),
    on uvloop's event loop when it is installed (:func:`loop_factory`),
    e.g. ``serve("/data/store", "127.0.0.1", 7379, tokens=Tokens.from_file("tokens"))``."""
    run_loop(serve_async(db, host, port, **options))
