"""A walkv server on an ephemeral port in a thread of the test process, and
``open_store(kind, path)``: the one open call the API tests change to run the
same body against the embedded store and against a client of a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvloop

import kvstore
from kvstore.server import serve_async

KINDS = ["embedded", "http"]


class ServerThread:
    """``kvstore.server.serve_async`` of the store at ``path`` (or of an open
    store, which the test may read meanwhile) on 127.0.0.1 (``port`` 0: any
    free one), in a thread with its own event loop (uvloop's, as ``walkv
    serve``); :attr:`url` once it accepts."""

    def __init__(self, path: Any, port: int = 0, **options: Any) -> None:
        self.url = ""
        self._port = port
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        served = path if isinstance(path, kvstore.KVStore) else str(path)
        self._thread = threading.Thread(target=self._run, args=(served, options), daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        assert self.url, "the server did not start within 30 s"

    def _run(self, path: Any, options: dict[str, Any]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server_options = {k: options.pop(k) for k in ("tokens", "limits", "tls") if k in options}
            await serve_async(path, "127.0.0.1", self._port, stop=self._stop, store_options=options,
                              on_listening=self._listening, **server_options)
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the loop walkv serve runs on
                runner.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._error = exc
        finally:
            self._ready.set()

    def _listening(self, url: str) -> None:
        self.url = url
        self._ready.set()

    def stop(self) -> None:
        """SIGTERM's path: stop accepting, finish requests, close the store."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the server did not stop within 60 s"
        if self._error is not None:
            raise self._error

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def open_store(kind: str, path: Any, **options: Any) -> Iterator[Any]:
    """``kvstore.open(path, **options)``, or a client of a server of it."""
    if kind == "embedded":
        with kvstore.open(path, **options) as db:
            yield db
        return
    with ServerThread(path, **options) as server, kvstore.connect(server.url) as db:
        yield db


@contextlib.asynccontextmanager
async def open_store_async(kind: str, path: Any, **options: Any) -> AsyncIterator[Any]:
    """``kvstore.open_async(path)``, or ``kvstore.connect_async`` to a server of it."""
    if kind == "embedded":
        async with kvstore.open_async(path, **options) as adb:
            yield adb
        return
    server = ServerThread(path, **options)
    try:
        async with kvstore.connect_async(server.url) as adb:
            yield adb
    finally:
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
