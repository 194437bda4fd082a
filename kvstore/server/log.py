"""The log and snapshots, as a follower reads them (docs/http-api.md):
``/v1/log/bounds``, ``/v1/log/entries``, ``/v1/log/segment``,
``/v1/snapshots`` and a snapshot's files.

Only durable entries are served: an entry after the durable LSN may still be
mid-write, and a crash could take it back. ``/v1/log/segment`` sends the
bytes of a segment file as they are, from the start of the 32 KiB block that
holds the record of ``from_lsn`` (or one before it: the nearest indexed
record) to the end of the last durable record in that segment
(``Walkv-Durable-Lsn`` is the durable LSN when the request was served; the
body may end before it when the segment does). So the body holds whole
records only, never the active segment's preallocated zeros, and a follower
can read it all and reuse the connection. A follower's next request costs
the new bytes only (:mod:`kvstore.server.cursors`). Both log endpoints take
``wait=S`` (at most 30): wait up to S seconds for ``from_lsn`` to become
durable (a long poll) before answering, possibly with nothing; a stopping
server answers at once. ``/v1/log/entries`` answers at most
:attr:`~kvstore.server.context.Limits.max_answer_bytes` of payloads once
one entry is in (``next_lsn`` goes on). File reads run in the default
executor.

A cluster's follower (:mod:`kvstore.cluster.follower`) adds ``replica=URL``
and ``epoch=E`` to its segment requests: the request is its report that it
holds every entry before ``from_lsn`` durably, which the store's synchronous
replicas count (:mod:`kvstore.store.replication`). Since a report counts
toward what a write's acknowledgement promises, a server with tokens takes
it only with an admin token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import BinaryIO, TypeVar

from aiohttp import web

from kvstore.client.wire import NotFound, b64encode
from kvstore.server.auth import ADMIN
from kvstore.server.context import MAX_LSN, Query, json_response, served
from kvstore.server.cursors import LogCursors
from kvstore.server.routes import RouteMatch
from kvstore.store.snapshots import snapshots_dir
from kvstore.store.store import KVStore
from kvstore.watch.log_tail import LogTail
from snapshot import list_snapshots
from wal.index import read_index
from wal.record import BLOCK_SIZE
from wal.segment import SegmentScan, find_segment, list_segments
from wal.timeline import history_to_json

MAX_ENTRIES = 10_000
CURSORS: web.AppKey[LogCursors] = web.AppKey("walkv_log_cursors", LogCursors)
SEGMENT_CHUNK = 256 * 1024
T = TypeVar("T")


async def _in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _wal_dir(request: web.Request) -> str:
    return served(request).store._wal_dir


async def bounds(request: web.Request, match: RouteMatch) -> web.Response:
    store = served(request).store
    durable = store.durable_lsn
    segments = await _in_thread(lambda: list_segments(store._wal_dir))
    return json_response({"first_lsn": segments[0].first_lsn if segments else durable + 1,
                          "durable_lsn": durable, "last_lsn": store.last_lsn, "applied_lsn": store.applied_lsn,
                          "store_id": store.store_id, "history": history_to_json(store.history)})


class DurableSignal:
    """Wakes the long polls of ``/v1/log/*`` as soon as a group is durable:
    the store's synchronous replicas (:mod:`kvstore.store.replication`) poke
    it from the log's thread before they wait for the followers, so a
    follower's round trip starts at once. Without them (no follower waits
    on this store) the polls look again every few milliseconds."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def attach(self, loop: asyncio.AbstractEventLoop, store: KVStore) -> None:
        self._loop = loop
        if store.replicas is not None:
            store.replicas.on_durable = self.poke

    def poke(self, lsn: int) -> None:
        """From any thread: a group up to ``lsn`` is durable."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()


DURABLE: web.AppKey[DurableSignal] = web.AppKey("walkv_durable", DurableSignal)


async def _wait_durable(request: web.Request, q: Query, first: int) -> None:
    """``wait=S``: until ``first`` is durable, at most S seconds, and not
    past the start of the server's stop (the answer then says what is
    durable, maybe nothing, and closes the connection). A durable group
    wakes it at once (:class:`DurableSignal`)."""
    s = served(request)
    signal = request.app[DURABLE]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + q.number("wait", 0.0, 0.0, 30.0)
    pause = 0.001
    while s.store.durable_lsn < first and (left := deadline - loop.time()) > 0:
        if s.shutting_down:
            return
        await signal.wait(min(pause, left))
        pause = min(pause * 2, 0.05)


async def entries(request: web.Request, match: RouteMatch) -> web.Response:
    """Durable entries from ``from_lsn``, at most ``limit`` and about
    :attr:`~kvstore.server.context.Limits.max_answer_bytes` of payloads (one
    always fits; ``next_lsn`` goes on); with ``wait=S`` (at most 30), wait up
    to S seconds for the first one."""
    s = served(request)
    q = match.query
    first = q.integer("from_lsn", None, 1, MAX_LSN)
    if first is None:
        raise ValueError("from_lsn is required: GET /v1/log/entries?from_lsn=N")
    limit = q.integer("limit", 1000, 1, MAX_ENTRIES)
    assert limit is not None
    await _wait_durable(request, q, first)
    durable = min(s.store.durable_lsn, first + limit - 1)

    cursors = request.app[CURSORS]

    budget = s.limits.max_answer_bytes

    def read() -> list[dict]:
        if durable < first:
            return []
        tail = cursors.take_tail(first) or LogTail(s.store._wal_dir, first)
        out: list[dict] = []
        size = 0
        try:
            for e in tail.read(durable):  # stopped at the budget: the tail goes on after the last one read
                out.append({"lsn": e.lsn, "time": e.timestamp_us, "payload": b64encode(e.payload)})
                size += len(e.payload)
                if size >= budget:
                    break
        except BaseException:
            tail.close()
            raise
        cursors.give_tail(tail)
        return out

    out = await _in_thread(read)
    return json_response({"entries": out, "next_lsn": out[-1]["lsn"] + 1 if out else first})


async def segment(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    s = served(request)
    q = match.query
    first = q.integer("from_lsn", None, 1, MAX_LSN)
    if first is None:
        raise ValueError("from_lsn is required: GET /v1/log/segment?from_lsn=N")
    replica = q.text("replica")
    if replica and s.store.replicas is not None:  # a follower's report: it holds up to first - 1 durably
        if s.tokens is not None:  # a report counts toward durability: an admin token's, not any reader's
            s.tokens.check(request.headers.get("Authorization"), ADMIN)
        s.store.replicas.report(replica, first - 1, q.integer("epoch", 0, 0, MAX_LSN) or 0)
    await _wait_durable(request, q, first)
    durable = s.store.durable_lsn
    wal_dir = s.store._wal_dir
    cursors = request.app[CURSORS]

    def locate() -> tuple[BinaryIO, str, int, int]:
        """The segment holding ``first`` (open: a handle stays readable if
        retention deletes the file meanwhile), the block start and the durable end."""
        segments = list_segments(wal_dir)
        i = find_segment(segments, first)
        if i < 0:
            LogTail(wal_dir, first).close()  # raises the LogGapError naming the first LSN available
        seg = segments[i]
        known = cursors.end(first)
        expected: int | None = first
        if known is not None and known[0] == seg.path:
            start = known[1]  # where the last answer ended: the record of `first` starts there
        else:
            index = read_index(seg.path)
            start = index.offset_for(first) if index is not None and index.first_lsn == seg.first_lsn else 0
            expected = seg.first_lsn if start == 0 else None
        try:
            fh = open(seg.path, "rb")
        except FileNotFoundError:
            LogTail(wal_dir, first).close()  # retention deleted it just now: the gap
            raise
        try:
            scan = SegmentScan(fh, seg.path, start, expected)
            for _ in scan.batches(first, durable):
                pass
        except BaseException:
            fh.close()
            raise
        if scan.next_lsn is not None and durable >= first:
            cursors.remember_end(scan.next_lsn, seg.path, scan.data_end)
        block = start - start % BLOCK_SIZE
        end = scan.data_end if durable >= first else block  # nothing durable from `first` yet: no bytes
        return fh, seg.path, block, end

    fh, path, offset, end = await _in_thread(locate)
    # Read after the segment was opened: a fork begins in a segment created after it (wal.timeline), so
    # the bytes sent are on this history (a cut zeroes the bytes past the fork in place first).
    history = json.dumps(history_to_json(s.store.history), separators=(",", ":"))
    response = web.StreamResponse(headers={
        "Content-Type": "application/octet-stream", "Content-Length": str(end - offset),
        "Walkv-Segment": os.path.basename(path), "Walkv-Offset": str(offset), "Walkv-Durable-Lsn": str(durable),
        "Walkv-History": history, "Walkv-Epoch": str(s.store.history[-1].timeline)})
    with fh:
        fh.seek(offset)
        await response.prepare(request)
        left = end - offset
        while left > 0:
            chunk = await asyncio.get_running_loop().run_in_executor(None, fh.read, min(SEGMENT_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            await response.write(chunk)
    return response


def _snapshot_files(path: str) -> list[dict]:
    return [{"name": name, "size": os.path.getsize(os.path.join(path, name))}
            for name in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, name))]


async def snapshots(request: web.Request, match: RouteMatch) -> web.Response:
    store = served(request).store

    def read() -> list[dict]:
        return [{"lsn": info.lsn, "count": info.count, "created_us": info.created_us, "store_id": info.store_id,
                 "files": _snapshot_files(info.path)} for info in list_snapshots(snapshots_dir(store.path))]

    return json_response({"snapshots": await _in_thread(read)})


async def snapshot_file(request: web.Request, match: RouteMatch) -> web.StreamResponse:
    """A file of a verified snapshot, by name (only names the listing has)."""
    store = served(request).store
    text = match.param("lsn").decode("utf-8", "replace")
    if not text.isascii() or not text.isdigit():
        raise NotFound(f"no snapshot {text[:40]!r}")
    lsn = int(text)
    name = match.param("name").decode("utf-8", "surrogateescape")  # not UTF-8: no file has that name

    def find() -> str:
        for info in list_snapshots(snapshots_dir(store.path)):
            if info.lsn == lsn:
                if any(f["name"] == name for f in _snapshot_files(info.path)):
                    return os.path.join(info.path, name)
                raise NotFound(f"snapshot {lsn} has no file {name[:80]!r}")
        raise NotFound(f"no snapshot at LSN {lsn}")

    return web.FileResponse(await _in_thread(find), headers={"Content-Type": "application/octet-stream"})
