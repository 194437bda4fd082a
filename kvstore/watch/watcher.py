"""Watching a store's changes, in log order, from an LSN (``KVStore.watch``).

A watcher reads the log FILES (:class:`kvstore.watch.log_tail.LogTail`, through
the read-only seam), never the writers' memory, up to the durable LSN: it
never shows an entry that a crash could take back. A slow watcher costs the
writers nothing but page cache.

What it yields: :class:`Change` ``(lsn, time, op, key, value, end_key, keyspace)``:

* ``op`` is the Spark ``changes`` table's ``_change_type``
  (``kvstore.entry.codec.UPSERT``/``DELETE``/``DELETE_RANGE``/``EXPIRE``:
  ``"upsert"``, ``"delete"``, ``"delete_range"``, ``"expire"`` (a key whose TTL
  or lease ran out, deleted by the sweeper; :mod:`kvstore.store.expiring`)),
  plus ``"snapshot"`` and ``"progress"`` below. A delete_range is ONE change, ``key`` its start and ``end_key`` its
  end (as written, not clipped to the watched keys; shown when the range
  meets them): ``key`` b"" from the first key, ``end_key`` None to the last
  one (an unbounded end, not the bound the log holds for it,
  ``kvstore.entry.codec.END_OF_KEYS``). The operations of one batch share
  its LSN, in batch order.
* ``time`` is the entry's commit time as an int: microseconds since the Unix
  epoch, UTC (the log's own resolution, and the Spark table's).
* ``keyspace`` is the keyspace the change is in ("": the default one). A
  watcher follows one keyspace (``keyspace=``, default ""), or every one
  (``keyspace=None``). A drop of a keyspace is shown as what it does, a
  ``delete_range`` of every key (``key`` b"", ``end_key`` None), so a
  consumer that applies changes needs nothing new for it.
* A conditional write (:mod:`kvstore.store.txn`) is shown only if its conditions
  held (its conditions are not changes); one that failed shows nothing. The
  log itself says which (:mod:`kvstore.entry.conditions`), so a watcher never
  waits for, or reads, the state.

Where it starts: ``from_lsn`` (default: the LSN after the durable one when
``watch()`` is called, so only new changes). When the log no longer holds
``from_lsn`` (retention deleted its segment after a snapshot covered it), or
retention deletes the next segment before a slow watcher reaches it:

* ``on_gap="error"`` (default): :class:`~wal.errors.LogGapError`, whose
  ``first_available`` names the first LSN the log holds;
* ``on_gap="snapshot"``: every key of the newest snapshot in the watched range
  once, as ``op="snapshot"`` at the snapshot's LSN (``time``: when it was
  taken), then the log after it. Those changes REPLACE the watched range: a
  key the consumer holds that is not among them is gone.

So a change is never missed nor repeated across segment rolls, snapshots and
retention: the watcher either goes on from exactly the next LSN or says so.
Likewise across a change of the log's history (:mod:`wal.timeline`): when a
repair cut, or a failover discarded, LSNs it delivered, it raises
:class:`~wal.errors.ForkedHistoryError` (naming both timelines and the fork
LSN) rather than go on with another history's entries.

Idle: with ``progress_every=s``, when no change was delivered for ``s``
seconds the watcher yields ``Change(lsn, now, "progress", b"", None, None)``:
every change up to ``lsn`` has been delivered, so a consumer can checkpoint
``lsn + 1`` (etcd's progress notify). It is a ``Change`` rather than its own
type so that the iterator has one item type and ``change.lsn`` is always the
position reached. With ``timeout=s`` the iteration ENDS when no change was
delivered for ``s`` seconds. A change's ``lsn`` marks a batch, not an
operation: to resume after a change, start at its LSN and skip what was
already seen of that batch, or checkpoint only at progress markers.

Waking: in the writing process, the store's commit hook notifies a
condition variable once per group commit (nothing when no watcher is
attached); a read-only store (another process writes) polls the ``DURABLE``
marker, sleeping 1..20 ms between looks. Either way a watcher reads at
most once per :data:`BATCH_SECONDS` (5 ms), taking every group committed
meanwhile in one read. Closing the watcher (or the store)
wakes it: the iteration ends (the store closed: :class:`ClosedError`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import snapshot
from kvstore.entry import conditions
from kvstore.entry.codec import (
    CHANGE_NAMES,
    DELETE_RANGE,
    END_OF_KEYS,
    KEYSPACE_SECTION,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_KEYSPACE,
    PUT_CODES,
    as_bytes,
    check_keyspace,
    decode,
)
from kvstore.entry.groups import entry_runs, group_code
from kvstore.watch.hub import WatchHub
from kvstore.watch.log_tail import LogTail
from wal.errors import ClosedError, LogGapError
from wal.fs import OS_FS
from wal.readfs import ReadFS
from wal.timeline import History

SNAPSHOT = "snapshot"
PROGRESS = "progress"
ON_GAP = ("error", "snapshot")
_POLL_MIN, _POLL_MAX = 0.001, 0.02
BATCH_SECONDS = 0.005
"""A watcher reads the log at most once per this interval, so that it takes
several group commits per read instead of one wake-up and one read each:
watchers share the writers' GIL, and without it 8 watchers cost busy writers
more than half their throughput (kv.watch.8w). It adds at most this much to
the delivery latency."""


class Change(NamedTuple):
    """One change (module docstring). ``time``: µs since the epoch, UTC."""

    lsn: int
    time: int
    op: str
    key: bytes
    value: bytes | None
    end_key: bytes | None
    keyspace: str = ""


class Source(NamedTuple):
    """What a watcher needs of its store."""

    wal_dir: str
    snapshots_dir: str
    durable_lsn: Callable[[], int]
    hub: WatchHub
    polls: bool  # True: no local commits to wake it (read-only store)
    fs: ReadFS = OS_FS


def _prefix_end(prefix: bytes) -> bytes | None:
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes((p[-1] + 1,)) if p else None


def key_bounds(prefix: bytes | None, start: bytes | None, stop: bytes | None) -> tuple[bytes, bytes | None]:
    """``[lo, hi)`` of keys watched (``hi`` None: no upper bound)."""
    lo = b"" if start is None else as_bytes(start, "start")
    hi = None if stop is None else as_bytes(stop, "stop")
    if prefix is not None:
        prefix = as_bytes(prefix, "prefix")
        lo = max(lo, prefix)
        pend = _prefix_end(prefix)
        if pend is not None and (hi is None or pend < hi):
            hi = pend
    return lo, hi


class Watcher:
    """An iterator of :class:`Change` (module docstring); a context manager
    too: leaving it, or :meth:`close` (from any thread), stops it."""

    def __init__(self, source: Source, prefix: bytes | None = None, *, start: bytes | None = None,
                 stop: bytes | None = None, from_lsn: int | None = None, timeout: float | None = None,
                 progress_every: float | None = None, on_gap: str = "error", keyspace: str | None = "") -> None:
        """Changes of keys under ``prefix`` and in ``[start, stop)``, from
        ``from_lsn`` (None: the first LSN after ``source.durable_lsn()``),
        in ``keyspace`` ("": the default one; None: every keyspace)."""
        if on_gap not in ON_GAP:
            raise ValueError(f"on_gap must be one of {ON_GAP}, not {on_gap!r}")
        self._keyspace = None if keyspace is None else check_keyspace(keyspace)
        self._lo, self._hi = key_bounds(prefix, start, stop)
        if from_lsn is None:
            from_lsn = source.durable_lsn() + 1
        if type(from_lsn) is not int or from_lsn < 1:
            raise ValueError(f"from_lsn must be an int >= 1, not {from_lsn!r}")
        self._src = source
        self.next_lsn = from_lsn
        """Every change before this LSN has been delivered."""
        self._timeout = timeout
        self._progress_every = progress_every
        self._on_gap = on_gap
        self._closed = False
        self._tail: LogTail | None = None
        self._gen: Iterator[Change] | None = None  # made at the first next(): until then nothing refers back here
        self.batch_left = 0
        """Changes of the last change's batch (its LSN) not delivered yet (a
        staged group's commit, read a part at a time: 1 until its last one)."""
        with source.hub.cond:
            source.hub.add(self)

    def __iter__(self) -> "Watcher":
        return self

    @property
    def history(self) -> History | None:
        """The timeline history the changes read so far are on (the log's as
        its tail found it: :mod:`kvstore.watch.log_tail`; None before the
        first read). A fork below them raises
        :class:`~wal.errors.ForkedHistoryError` from the iteration."""
        return None if self._tail is None else self._tail.history

    def __next__(self) -> Change:
        if self._gen is None:
            self._gen = self._run()
        return next(self._gen)

    def close(self) -> None:
        """Stop: the iteration ends (a blocked ``next`` returns promptly)."""
        hub = self._src.hub
        with hub.cond:
            self._closed = True
            hub.discard(self)
            hub.cond.notify_all()

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------

    def _run(self) -> Iterator[Change]:
        src = self._src
        now = time.monotonic
        last_change = last_progress = now()
        last_read = 0.0
        poll = _POLL_MIN
        try:
            while True:
                if self._closed:
                    return
                if src.hub.closed:
                    raise ClosedError("the store was closed while watching it")
                durable = src.durable_lsn()
                if durable >= self.next_lsn:
                    pause = last_read + BATCH_SECONDS - now()
                    if pause > 0:
                        time.sleep(pause)
                        durable = src.durable_lsn()
                    last_read = now()
                    try:
                        for change in self._read(durable):
                            yield change
                            last_change = last_progress = now()
                    except LogGapError as gap:
                        self._drop_tail()
                        if self._on_gap == "error":
                            raise
                        for change in self._from_snapshot(gap):
                            yield change
                        last_change = last_progress = now()
                    poll = _POLL_MIN
                    continue
                t = now()
                if self._timeout is not None and t - last_change >= self._timeout:
                    return
                if self._progress_every is not None and t - last_progress >= self._progress_every:
                    last_progress = t
                    yield Change(self.next_lsn - 1, time.time_ns() // 1000, PROGRESS, b"", None, None)
                    continue
                wait = _POLL_MAX * 5 if not src.polls else poll
                if self._timeout is not None:
                    wait = min(wait, max(0.0, last_change + self._timeout - t))
                if self._progress_every is not None:
                    wait = min(wait, max(0.0, last_progress + self._progress_every - t))
                with src.hub.cond:
                    if not self._closed and not src.hub.closed and src.durable_lsn() < self.next_lsn:
                        src.hub.cond.wait(wait)
                poll = min(poll * 2, _POLL_MAX)
        finally:
            self._drop_tail()
            self.close()

    def _drop_tail(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    def _read(self, durable: int) -> Iterator[Change]:
        if self._tail is None:
            self._tail = LogTail(self._src.wal_dir, self.next_lsn, fs=self._src.fs)
        for entry in self._tail.read(durable):
            lsn = entry.lsn
            ops = decode(entry.payload, lsn)
            self.next_lsn = lsn + 1
            if group_code(ops) is not None:  # a staged group: nothing at its parts, all of it at its commit
                yield from self._group_changes(lsn, entry.timestamp_us, ops)
                continue
            changes = self._matching(lsn, entry.timestamp_us, conditions.writes_of(ops))
            last = len(changes) - 1
            for i, change in enumerate(changes):
                self.batch_left = last - i
                yield change

    def _group_changes(self, lsn: int, ts: int, ops: Sequence[Sequence[Any]]) -> Iterator[Change]:
        """The changes of a staged group's entry at ``lsn``, a part at a time
        (bounded memory), one change ahead: :attr:`batch_left` is 1 until
        the group's last change, 0 there."""
        changes = (c for _, run in entry_runs(lsn, ops, self._read_back) for c in self._matching(lsn, ts, run))
        held = next(changes, None)
        for change in changes:
            self.batch_left = 1
            yield held  # type: ignore[misc]  # a Change: one was read before this one
            held = change
        if held is not None:
            self.batch_left = 0
            yield held

    def _read_back(self, first: int, last: int) -> Iterator[tuple[int, Sequence[Sequence[Any]]]]:
        """A staged group's parts, LSNs ``first .. last``, read from the log
        (:func:`kvstore.entry.groups.entry_runs`)."""
        tail = LogTail(self._src.wal_dir, first, fs=self._src.fs)
        try:
            for entry in tail.read(last):
                yield entry.lsn, decode(entry.payload, entry.lsn)
        finally:
            tail.close()


    def _matching(self, lsn: int, ts: int, ops: Sequence[Sequence[Any]]) -> list[Change]:
        lo, hi = self._lo, self._hi
        watched = self._keyspace
        ks = ""  # a batch starts in the default keyspace
        out = []
        for op in ops:
            code = op[0]
            if code == OP_KEYSPACE:
                ks = op[1]
                continue
            if code == OP_DROP_KEYSPACE:  # every key of it goes: a delete_range of all
                if watched is None or watched == op[1]:
                    out.append(Change(lsn, ts, DELETE_RANGE, b"", None, None, op[1]))
                continue
            if watched is not None and ks != watched:
                continue
            name = CHANGE_NAMES.get(code)
            if name is None:  # a lease changed: no key did
                continue
            if code != OP_DELETE_RANGE:
                key = op[1]
                if key >= lo and (hi is None or key < hi):
                    out.append(Change(lsn, ts, name, key, op[2] if code in PUT_CODES else None, None, ks))
            else:
                start, end = op[1], op[2]
                if start < end and end > lo and (hi is None or start < hi):
                    out.append(Change(lsn, ts, DELETE_RANGE, start, None, None if end == END_OF_KEYS else end, ks))
        return out

    def _from_snapshot(self, gap: LogGapError) -> Iterator[Change]:
        """Restart from the newest snapshot (module docstring)."""
        snap = snapshot.newest(self._src.snapshots_dir, fs=self._src.fs)
        needed = gap.first_available - 1 if gap.first_available is not None else None
        if snap is None or (needed is not None and snap.info.lsn < needed):
            have = "no snapshot" if snap is None else f"the newest snapshot is at LSN {snap.info.lsn}"
            raise LogGapError(f"{gap}; and {have}, so the watcher cannot catch up from one",
                              first_missing=gap.first_missing, last_missing=gap.last_missing,
                              first_available=gap.first_available) from gap
        info = snap.info
        hi = self._hi
        sections = snap.section_names()
        keyspaces = [""] + [n[len(KEYSPACE_SECTION):] for n in sections if n.startswith(KEYSPACE_SECTION)]
        for ks in keyspaces if self._keyspace is None else [self._keyspace]:
            section = KEYSPACE_SECTION + ks if ks else ""
            if section and section not in sections:
                continue
            for key, value in snap.section_items(section, self._lo or None, hi):
                yield Change(info.lsn, info.created_us, SNAPSHOT, key, value, None, ks)
        self.next_lsn = info.lsn + 1
