"""A replica's source over the network: a store served by ``walkv serve``
(:mod:`kvstore.server`), followed through its log and snapshot endpoints
(docs/http-api.md) with :class:`kvstore.client.http.Http`.

::

    rep = kvstore.open_replica("https://db1:7379", "replica-dir", token="...", verify="ca.pem")

:class:`HttpSource` gives a replica (:mod:`kvstore.replica.replica`) what a
store directory or an archive gives (:class:`kvstore.replica.source.ReplicaSource`),
with the same guarantees: whole durable entries in LSN order, each checked.

* Store id, first and durable LSN: ``GET /v1/log/bounds``, at least once a
  second (the store id is checked each time: a server that now serves
  another store is :class:`~wal.errors.ReplicaError`). In between, a replica
  that had everything at its last look asks for the next entry with a long
  poll (``/v1/log/segment?from_lsn=NEXT&wait=0.5``): the server answers as
  soon as that LSN is durable, so a new write reaches the replica in one
  round trip, and an idle replica costs the server two requests a second,
  not a poll every few milliseconds. The answer's ``Walkv-Durable-Lsn`` is
  the durable LSN the replica's lag is measured against.
* Entries: ``GET /v1/log/segment`` read with :mod:`wal`'s record reader
  (:mod:`kvstore.replica.http_log`): the segment's own bytes, CRC-checked,
  read as they arrive; the answer stays open between the replica's groups
  and is read on from where the last group stopped. Why not
  ``/v1/log/entries`` (JSON, payloads in base64): a replica catching up
  300,000 entries of 100-byte puts took 1.25-1.5 s through segments and
  6.5-7.6 s through entries, the same CPU in the replica either way (the
  server's encoding is the difference, and the server's CPU is what its
  writers need), measured alternately against one ``walkv serve`` on 2 cores.
  An LSN the server's retention deleted is its 410 answer,
  :class:`~wal.errors.LogGapError`: the replica rebuilds from a snapshot as
  it does for a store directory.
* Bootstrap and rebuilds: the newest snapshot listed by ``GET /v1/snapshots``
  at or below the target from which the server's log reaches on is
  downloaded, file by file, into ``REPLICA_DIR/snapshots/snap-<lsn>/`` (one
  at a time: an older download is deleted first; a file whose size is not
  the listed one is refused; names must be plain file names,
  :func:`snapshot.layout.check_chunk_name`), then opened and verified by
  :mod:`snapshot` (every chunk's checksum, the store id) through
  :func:`kvstore.store.snapshots.choose_base`; an unusable one falls back to
  the next older one. The download is not fsynced: it is only read to build
  the replica's LMDB, whose own rules (:mod:`kvstore.store.recovery`) make
  the result durable. It is kept until the next rebuild or close.
* The network failing (refused, reset, timed out) is
  :class:`~wal.errors.ReplicaError` naming the URL: the replica logs it once,
  retries with backoff and serves what it applied meanwhile.
* No retention hold: the server's retention does not know its network
  replicas (``hold`` is None); one that falls behind it rebuilds.

The fence (for :meth:`kvstore.replica.replica.Replica.promote`): promote
refuses with :class:`~wal.errors.LockedError` while ANY process answers HTTP
at the URL (``GET /healthz`` gets an answer, even an error status: a server
holds the store there, and a store directory's lock could not be taken
then either). When the connection is refused or nothing answers within the
timeout, the source counts as gone: nothing more can be read from it, so
the promoted store holds what the replica had applied
(:class:`~wal.errors.SourceGoneError` ends its catch-up there), and
the server's last durable LSN is logged beside it: the LSNs between were
acknowledged by the old server and exist only on its disk. Unlike a lock,
this proves only that nothing answered at that moment: a partition looks
the same as a dead server, and nothing stops the old server from starting
again afterwards. Make sure it is stopped for good (as for any promotion:
two writers would write two histories after ``applied_lsn``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx

import snapshot
from kvstore.client.http import Http
from kvstore.client.wire import ServerUnavailable
from kvstore.replica.http_log import SegmentStream
from kvstore.store.snapshots import choose_base
from snapshot.layout import MANIFEST_NAME, check_chunk_name, snapshot_dir_name
from wal.errors import LockedError, ReplicaError, SnapshotError, SourceGoneError, WalkvError
from wal.segment import Entry
from wal.timeline import ROOT, History, history_from_json, history_to_json

log = logging.getLogger("walkv.replica")

HTTP_POLL_SECONDS = 0.01
LONG_POLL_SECONDS = 0.5
BOUNDS_EVERY_SECONDS = 1.0
DOWNLOAD_CHUNK_BYTES = 1 << 20


def display_url(url: str) -> str:
    """``url`` as messages and the ``REPLICA`` record show it: without a
    user or password, a query or a trailing slash."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class HttpLog:
    """The server's log as :func:`kvstore.store.recovery.replay` reads it
    (:class:`kvstore.store.recovery.LogSource`), bounded at ``last_lsn``."""

    def __init__(self, source: HttpSource, first_lsn: int, last_lsn: int) -> None:
        self.source = source
        self.directory = source.name
        self.first_lsn = first_lsn
        self.last_lsn = last_lsn

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *,
                     durable_only: bool = True) -> Iterator[Entry]:
        last = self.last_lsn if to_lsn is None else min(to_lsn, self.last_lsn)
        return self.source.entries(from_lsn, last)


class HttpSource:
    """A served store (module docstring). ``download_dir``: where snapshots
    are downloaded (default: a temporary directory removed at close)."""

    poll_seconds = HTTP_POLL_SECONDS
    wal_dir: str | None = None
    snapshots_dir: str | None = None

    def __init__(self, url: str, *, token: str | None = None, verify: bool | str = True, timeout: float = 10.0,
                 download_dir: str | None = None) -> None:
        self.name = display_url(url)
        self.http = Http(url, token=token, timeout=timeout, verify=verify)
        self._stream: SegmentStream | None = None
        self._download_dir = download_dir
        self._temp_dir: str | None = None
        self._gone = False
        self._durable = 0  # the server's durable LSN, as last seen
        self._history: History = ROOT  # the server's log's timeline history, as last seen
        self._bounds_at = 0.0  # time.monotonic() of the last bounds request
        self._next: int | None = None  # the LSN after the last entry delivered (None: unknown)
        try:
            bounds = self._get_json("/v1/log/bounds")
            sid = bounds.get("store_id") if isinstance(bounds, dict) else None
            if not isinstance(sid, str) or not sid:
                raise ReplicaError(f"{self.name} answered /v1/log/bounds without a store id: is it a walkv server?")
            self.store_id = sid
            self._note(bounds)
        except BaseException:
            self.http.close()
            raise

    # -- requests ------------------------------------------------------------------

    def _unreachable(self, exc: httpx.HTTPError) -> ServerUnavailable:
        return ServerUnavailable(f"reading from the walkv server {self.name} failed: {type(exc).__name__}: {exc}")

    def _get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        if self._gone:
            raise SourceGoneError(f"{self.name} was found gone (promote); the replica reads nothing more from it")
        return self.http.request("GET", path, params=params).json()

    def _bounds(self) -> dict[str, Any]:
        bounds = self._get_json("/v1/log/bounds")
        sid = bounds.get("store_id")
        if sid != self.store_id:
            raise ReplicaError(f"{self.name} now serves another store ({sid}); this replica follows store "
                               f"{self.store_id}")
        return self._note(bounds)

    def _note(self, bounds: dict[str, Any]) -> dict[str, Any]:
        self._durable = int(bounds["durable_lsn"])
        self._history = history_from_json(bounds.get("history", history_to_json(ROOT)), f"{self.name}/v1/log/bounds")
        self._bounds_at = time.monotonic()
        return bounds

    def _open(self, from_lsn: int, wait: float = 0.0) -> SegmentStream:
        self.reset()
        if self._gone:
            raise SourceGoneError(f"{self.name} was found gone (promote); the replica reads nothing more from it")
        stream = self._stream = SegmentStream(self.http, self.name, self.store_id, from_lsn, wait)
        self._durable = max(self._durable, stream.durable_lsn)
        self._history = stream.history
        return stream

    # -- the ReplicaSource protocol -----------------------------------------------

    def durable_lsn(self) -> int:
        """The server's durable LSN; when the replica had everything at the
        last look, a long poll for the next entry (module docstring)."""
        nxt = self._next
        if nxt is None or time.monotonic() - self._bounds_at >= BOUNDS_EVERY_SECONDS:
            return int(self._bounds()["durable_lsn"])
        if nxt <= self._durable:
            return self._durable
        try:
            self._open(nxt, LONG_POLL_SECONDS)
            return self._durable
        except httpx.HTTPError as exc:
            self.reset()
            raise self._unreachable(exc) from exc

    def history(self) -> History:
        """The server's log's history as its last answer stated it (a new
        answer, a segment or the bounds, states it again)."""
        return self._history

    def first_lsn(self) -> int:
        return max(1, int(self._bounds()["first_lsn"]))

    def entries(self, from_lsn: int, last: int) -> Iterator[Entry]:
        """Entries ``from_lsn..last`` (fewer when the server has fewer
        durable now); the answer stays open for the next call (module docstring)."""
        self._next = from_lsn
        try:
            while from_lsn <= last:
                stream = self._stream
                fresh = stream is None or stream.next_lsn != from_lsn
                if fresh:
                    stream = self._open(from_lsn)
                assert stream is not None
                got = 0
                for entry in stream.take(last):
                    got += 1
                    self._next = entry.lsn + 1
                    yield entry
                from_lsn = stream.next_lsn
                if from_lsn <= last:  # this answer ended: the segment's durable end, or a roll
                    self.reset()
                    if got == 0 and fresh:
                        return
        except httpx.HTTPError as exc:
            self.reset()
            raise self._unreachable(exc) from exc

    def reset(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def base(self, last: int) -> snapshot.Snapshot | None:
        self._next = None  # the replica starts again from what this returns
        first = self.first_lsn()
        listing = self._get_json("/v1/snapshots").get("snapshots", [])
        problems = []
        for snap in sorted(listing, key=lambda s: int(s["lsn"]), reverse=True):
            lsn = int(snap["lsn"])
            if lsn > last:
                continue
            if lsn != last and lsn + 1 < first:
                problems.append(f"snapshot {lsn}: the server's log no longer reaches back to LSN {lsn + 1}")
                continue
            try:
                path = self._download(lsn, snap.get("files", []))
                return choose_base([path], self.name, first, last, self.store_id)
            except SnapshotError as exc:
                log.warning("%s: snapshot %d is unusable (%s); trying an older one", self.name, lsn, exc)
                problems.append(f"snapshot {lsn}: {exc}")
        if first == 1:
            return None
        raise SnapshotError(f"no snapshot of {self.name} can start a replica at or below LSN {last}: "
                            + ("; ".join(problems) if problems else
                               f"there is none, and the server's log starts at LSN {first}"))

    def log_source(self, last: int) -> HttpLog:
        return HttpLog(self, self.first_lsn(), last)

    def fence(self) -> None:
        """Promote's fence (module docstring): LockedError while a server answers."""
        try:
            self.http.request("GET", "/healthz")
        except ServerUnavailable as exc:
            self._gone = True
            self.reset()
            log.warning("%s does not answer (%s: %s): promoting with what this replica applied; the server "
                        "last said it had LSN %d durable", self.name, type(exc).__name__, exc, self._durable)
            return None
        except WalkvError:
            pass  # an error status: still a server there
        raise LockedError(f"the walkv server {self.name} still answers: its store is alive; stop it first "
                          "(a replica is promoted only when its source is gone)")

    def hold(self, next_lsn: int) -> None:
        return None  # the server's retention does not know network replicas (module docstring)

    def close(self) -> None:
        self.reset()
        self.http.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    # -- snapshots ---------------------------------------------------------------

    def _download(self, lsn: int, files: list[dict[str, Any]]) -> str:
        """Download snapshot ``lsn``'s files (module docstring); return its directory."""
        root = self._download_dir
        if root is None:
            root = self._temp_dir = self._temp_dir or tempfile.mkdtemp(prefix="walkv-replica-snapshot-")
        shutil.rmtree(root, ignore_errors=True)
        dest = os.path.join(root, snapshot_dir_name(lsn))
        os.makedirs(dest)
        for item in files:
            name, size = item.get("name"), item.get("size")
            if not isinstance(name, str) or (name != MANIFEST_NAME and check_chunk_name(name) is not None):
                raise SnapshotError(f"{self.name} lists a file {name!r} in snapshot {lsn}: not a snapshot's file name")
            got = 0
            try:
                with open(os.path.join(dest, name), "wb") as f, \
                        self.http.stream("GET", f"/v1/snapshots/{lsn}/{name}") as resp:
                    for chunk in resp.iter_bytes(DOWNLOAD_CHUNK_BYTES):
                        f.write(chunk)
                        got += len(chunk)
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from exc
            if size is not None and got != size:
                raise SnapshotError(f"{self.name}/v1/snapshots/{lsn}/{name}: {got} bytes arrived, the listing "
                                    f"says {size}")
        return dest
