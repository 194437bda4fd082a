"""What a store opened with ``readonly=True`` has in place of its writer:
:class:`ReadOnly`; and what such a store sees.

A read-only store opens beside a writer (or none): it reads LMDB through
LMDB's reader lock table and never writes, replays or takes the store lock.
It sees what the writer has written to LMDB: every write acknowledged at
least 52 ms (plus the time of one bulk write of at most 16,384 keys) before,
so it may be up to that far behind the writer's own reads
(:mod:`kvstore.state.overlay`); every write acknowledged by then when the
writer opened the store with ``overlay=False``; with no writer running it
sees the state as the last writer left it (after a crash of that writer,
possibly without its last group, which the next read-write open replays).
It refuses to open a store whose last writer was on a machine that crashed
since. A reader that was open while a writer rebuilt LMDB (after a machine
crash) keeps reading the environment it opened: reopen it to see the new one.

Where a :class:`~kvstore.store.writer.StoreWriter` asks its log, this asks
the files the writer publishes: the LSNs come from the log's ``DURABLE`` file
(:mod:`wal.durable`), the timeline history from the newest segment's header
(:mod:`wal.timeline`), the applied LSN from LMDB's meta record, which the
writer updates in each write transaction. ``sync()`` makes nothing durable
(this process wrote nothing) and says what is; ``close()`` closes LMDB
without a flush (it wrote nothing to flush). What only a writer does
(snapshots, the archive, timelines, a follower's appends) is refused, each
with a message that names who does it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NoReturn

import snapshot
import wal
from kvstore.layout import LMDB_DIR, WAL_DIR
from kvstore.state import State, StateOptions
from kvstore.store import recovery
from wal.errors import ArchiveError, ReadOnlyError, SnapshotError, WalkvError
from wal.segment import read_newest_header
from wal.timeline import ROOT, History, TimelineStart


class ReadOnly:
    """The read-only side of the store at ``path`` (module docstring). Use
    :meth:`open`. Its methods are the :class:`~kvstore.store.writer.StoreWriter`
    methods the store calls, answered from the files."""

    log: wal.Log | None = None
    failure: WalkvError | None = None  # (no log to fail)

    def __init__(self, path: str) -> None:
        self.path = path
        self._wal_dir = os.path.join(path, WAL_DIR)
        self._closed = False

    @classmethod
    def open(cls, path: str, options: StateOptions) -> tuple[ReadOnly, State]:
        """The side and the state, opened for reading only
        (:func:`kvstore.store.recovery.open_readonly_state`)."""
        return cls(path), recovery.open_readonly_state(path, os.path.join(path, LMDB_DIR), options)

    # -- LSNs and history, from the files the writer publishes ----------------------

    @property
    def last_lsn(self) -> int:
        """The durable LSN: what this process can know was written."""
        return wal.read_durable_lsn(self._wal_dir) or 0

    @property
    def durable_lsn(self) -> int:
        return wal.read_durable_lsn(self._wal_dir) or 0

    @property
    def history(self) -> History:
        """As the newest segment's header states it."""
        header = read_newest_header(self._wal_dir)
        return ROOT if header is None else header.history

    def applied_lsn(self, state: State) -> int:
        """What the writer has written to LMDB (its meta record), until closed."""
        return state.applied_lsn if self._closed else state.read_meta_applied()

    def sync(self) -> int:
        """Nothing to make durable: the durable LSN."""
        return self.durable_lsn

    def stats(self) -> dict[str, Any]:
        return {}

    def wait_for_snapshots(self, timeout: float | None) -> None:
        """No automatic snapshots here: returns at once."""

    def close(self, state: State) -> None:
        self._closed = True
        state.close(sync=False)

    # -- what only the writer does ---------------------------------------------------

    def _refuse(self, does: str) -> NoReturn:
        raise ReadOnlyError(f"the store {self.path} was opened with readonly=True; {does}")

    def snapshot(self, state: State, watchers: object, **options: Any) -> snapshot.SnapshotInfo:
        raise SnapshotError(f"the store {self.path} is open read-only; snapshots are taken by its writer")

    def flush_archive(self, timeout: float | None) -> int:
        raise ArchiveError(f"the store {self.path} is open read-only; its writer archives it")

    def start_timeline(self, number: int | None, timeline: TimelineStart | None = None) -> TimelineStart:
        self._refuse("its writer starts timelines")

    def refuse_appends(self, error: WalkvError | None) -> None:
        self._refuse("it writes nothing to refuse")

    def append_replicated(self, entries: Sequence[wal.Entry]) -> int:
        self._refuse("its writer follows its leader")

    def discard_after(self, lsn: int, follow: History, state: State) -> int:
        self._refuse("its writer discards entries")
