"""The write side of the LMDB state machine: write transactions that grow
the map as often as it fills, and growing it (:class:`StateWrites`, which
:class:`kvstore.state.machine.State` extends with what it writes: meta, applied
entries, the overlay).

Growing the map needs LMDB to itself: py-lmdb's abort and remap wait for
every call in flight, and would starve behind busy readers, so the writer
holds readers out (:class:`kvstore.state.readers.ReadGate`) and waits for open
views (:mod:`kvstore.state.view`) first.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import lmdb

from kvstore.state.lmdb_env import MIB, clear_stale_readers, grow_size
from kvstore.state.lmdb_ops import preallocate
from kvstore.state.reads import StateReads
from wal.errors import DiskFullError, LogFailedError

log = logging.getLogger("walkv.state")

SWEEP_SECONDS = 1.0
"""How often the writer sweeps stale readers and expired views."""
MAX_GROW_STEP = 256 << 20
"""The map grows by its size (doubling) up to this step, then by this step:
at most this much is allocated ahead of the data."""
ROOM_AHEAD_BYTES = 1 << 20
"""A write transaction expected to add at least this many bytes makes room
in the map before it starts (:meth:`StateWrites.make_room`)."""


class StateWrites(StateReads):
    """Write transactions and map growth of one LMDB environment. Subclasses
    set ``writemap``, ``map_grows``, ``lmdb_applied_lsn`` and ``_failure``."""

    writemap: bool
    map_grows: int
    lmdb_applied_lsn: int
    lmdb_commits: int
    apply_seconds: float
    apply_max_seconds: float
    _last_sweep: float
    _failure: Exception | None

    def maintain_now_and_then(self) -> None:
        """At most every :data:`SWEEP_SECONDS`, from a writing thread: drop
        idle threads' stale read transactions, close expired views, clear
        dead processes' reader slots."""
        now = time.perf_counter()
        if now - self._last_sweep > SWEEP_SECONDS:
            self._last_sweep = now
            self._sweep()
            self.expire_views()
            clear_stale_readers(self.env)

    def _with_write(self, fn: Callable[[lmdb.Transaction], object]) -> None:
        """Run ``fn(txn)`` in one write transaction, growing the map and
        retrying as often as it fills."""
        while True:
            txn = self.env.begin(write=True, db=self.data_db)
            try:
                fn(txn)
                txn.commit()
                return
            except lmdb.MapFullError:
                self.grow(txn)
            except BaseException:
                self._abort_write(txn)
                raise

    def make_room(self, nbytes: int) -> None:
        """Before a write transaction that adds about ``nbytes`` of keys and
        values: grow the map now if they might not fit (twice their size:
        pages split by random inserts are about half full), so that the
        transaction is not redone after MDB_MAP_FULL (a batch of 100,000
        puts into a new store was written three times). Only a hint: a
        disk too full for the estimate leaves it to MDB_MAP_FULL."""
        if nbytes < ROOM_AHEAD_BYTES:
            return
        info = self.env.info()
        need = ((info["last_pgno"] + 1) * self.env.stat()["psize"] + 2 * nbytes + MIB - 1) & ~(MIB - 1)
        if need > info["map_size"]:
            try:
                self.grow(at_least=need)
            except DiskFullError:
                pass

    def _write_applied(self, write: Callable[[lmdb.Transaction], None], lsn: int) -> None:
        """Run ``write`` in one write transaction (growing the map as often
        as it fills) that makes LSNs up to ``lsn`` applied in LMDB; then bump
        ``gen`` so cached read transactions are renewed. A failure is kept
        and raised again by every later apply and flush (the writes it
        carried are in the log: the next open replays them)."""
        t0 = time.perf_counter()
        try:
            self._with_write(write)
        except BaseException as exc:
            if isinstance(exc, lmdb.Error):
                exc = LogFailedError(f"applying LSNs up to {lsn} to LMDB ({self.path}) failed: {exc}")
            if isinstance(exc, Exception):
                self._failure = exc
            raise exc from None
        self.lmdb_applied_lsn = lsn
        self.gen += 1
        dt = time.perf_counter() - t0
        self.lmdb_commits += 1
        self.apply_seconds += dt
        if dt > self.apply_max_seconds:
            self.apply_max_seconds = dt
        self.maintain_now_and_then()

    def _abort_write(self, txn: lmdb.Transaction) -> None:
        """Abort a write transaction with readers held out of LMDB (py-lmdb's
        abort waits for every call in flight and starves behind busy
        readers)."""
        gate = self.gate
        gate.acquire_exclusive()
        try:
            txn.abort()
        finally:
            gate.release_exclusive()

    def grow(self, failed: lmdb.Transaction | None = None, at_least: int = 0) -> None:
        """Grow the map: double up to :data:`MAX_GROW_STEP`, then by that
        step; by less (at least 1 MiB) when only less fits on the file system,
        so a full disk fills up whatever the step and a replay after freeing
        a little space needs only that little (a transaction that still does
        not fit grows again); :class:`~wal.errors.DiskFullError` when not even
        1 MiB fits. ``failed`` is the write transaction that hit MDB_MAP_FULL,
        aborted here. Waits for
        readers to leave LMDB (py-lmdb's abort and remap wait for every call
        in flight, and would starve behind busy readers); their open
        transactions are invalidated (cached ones are renewed, scans
        re-seek). Stale readers (their processes died) are cleared first:
        when there were any, the failed transaction is only retried."""
        if clear_stale_readers(self.env) and failed is not None and not at_least:
            self._abort_write(failed)
            return
        old = self.env.info()["map_size"]
        try:
            new = grow_size(self.path, old, min(old, MAX_GROW_STEP), at_least)
        except BaseException:
            if failed is not None:
                self._abort_write(failed)
            raise
        gate = self.gate
        if failed is not None:
            self._abort_write(failed)
        self.exclusive_without_views()  # waits for open views (kvstore/state/view.py)
        try:
            if self.writemap:
                preallocate(os.path.join(self.path, "data.mdb"), new)
            self.env.set_mapsize(new)
            self.map_gen += 1
        finally:
            gate.release_exclusive()
        self.map_grows += 1
        log.info("LMDB map of %s grown from %d to %d MiB", self.path,
                 old >> 20, new >> 20)
