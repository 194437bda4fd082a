"""walkv over HTTP: the server (docs/http-api.md is the wire contract).

::

    kvstore.server.serve(db_or_path, "127.0.0.1", 7379, tokens=Tokens.from_file(path))  # until SIGTERM
    app = kvstore.server.make_app(db)        # an aiohttp Application to mount in your own server
    await kvstore.server.drain(app, 10.0)    # ... and at its stop, before runner.cleanup()

Why aiohttp rather than Starlette on uvicorn: measured with the same load
generator on the same store (``python -m benchmarks.frameworks``: both
frameworks serving the same put and get handlers over the asyncio front,
``sync="always"``, uvicorn with httptools), aiohttp served 1.3x (puts, 16
clients) to 2.0x (puts, 256 clients) the requests per second, and 1.7-1.8x
the gets, with half the p99 latency at 256 clients (the table is in
:mod:`benchmarks.frameworks`). It is also one dependency where the other is
two, and its streaming responses and protocol factory give the watch
streams and the connection cap directly. :func:`serve` runs it on uvloop's
event loop (a dependency of the ``server`` extra; asyncio's own without it),
which measured 1.1-1.6x the puts per second of asyncio's own loop at 128
clients.

Modules: :mod:`~kvstore.server.app` (the application, its route table, its
one middleware: routing, roles, the error shape), :mod:`~kvstore.server.routes`
(the one parse of a request's target, matching it to a route),
:mod:`~kvstore.server.kv` (keys, keyspaces), :mod:`~kvstore.server.batches`
(delete_range, batches, transactions), :mod:`~kvstore.server.leases`,
:mod:`~kvstore.server.streams` (watch, subscriptions),
:mod:`~kvstore.server.log` (log and snapshots for followers),
:mod:`~kvstore.server.admin` (snapshot, stats, metrics, health),
:mod:`~kvstore.server.auth` (tokens), :mod:`~kvstore.server.context`
(limits, the served store, the query), :mod:`~kvstore.server.bodies`
(request bodies: bounds, parsing), :mod:`~kvstore.server.connections` (the
connection cap), :mod:`~kvstore.server.run` (serve, TLS, shutdown).
"""

from kvstore.server.app import drain, make_app
from kvstore.server.auth import Tokens
from kvstore.server.context import Limits
from kvstore.server.run import DEFAULT_PORT, ServeError, serve, serve_async, tls_context

__all__ = ["DEFAULT_PORT", "Limits", "ServeError", "Tokens", "drain", "make_app", "serve", "serve_async", "tls_context"]
