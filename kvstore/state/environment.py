"""The LMDB environment of one store's state machine, shared by any number of
reading threads and one writer (:class:`Environment`): the open environment
and its two databases (and the keyspaces' named ones,
:mod:`kvstore.state.keyspace_dbs`), the read gate, the registry of what may be inside
LMDB (each thread's cached read transaction, open views), the counters those
transactions are checked against, write transactions that grow the map as
often as it fills, and closing. How it is opened, and with which options:
:mod:`kvstore.state.lmdb_env`.

Readers take no lock (:mod:`kvstore.state.readers`). Growing the map needs
LMDB to itself: py-lmdb's abort and remap wait for every call in flight, and
would starve behind busy readers, so the writer holds readers out
(:class:`kvstore.state.readers.ReadGate`) and waits for open views
(:mod:`kvstore.state.view`) first. The same moment drops idle threads' stale
read transactions (a sweep, at most every :data:`SWEEP_SECONDS`) and closes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import lmdb
from mypy_extensions import mypyc_attr

from kvstore.state.keyspace_dbs import KeyspaceDbs
from kvstore.state.lmdb_env import MAX_KEYSPACES, MIB, clear_stale_readers, grow_size, open_env, reader_table
from kvstore.state.lmdb_ops import preallocate, read_error
from kvstore.state.meta import K_APPLIED, applied_of
from kvstore.state.prefault import Prefault, SequentialScan, map_address
from kvstore.state.readers import Generation, Reader, ReaderHandle, ReadGate
from kvstore.state.view import View
from wal.errors import ClosedError, DiskFullError, ForkedError
from wal.forkguard import Refusing, forked_error, keep_forever, track

log = logging.getLogger("walkv.state")

SWEEP_SECONDS = 1.0
"""How often the writer sweeps stale readers and expired views."""
MAX_GROW_STEP = 256 << 20
"""The map grows by its size (doubling) up to this step, then by this step:
at most this much is allocated ahead of the data."""
ROOM_AHEAD_BYTES = 1 << 20
"""A write transaction expected to add at least this many bytes makes room
in the map before it starts (:meth:`Environment.make_room`)."""
T = TypeVar("T")


@mypyc_attr(native_class=False)  # wal.forkguard holds it weakly: compiled classes take no weak references
class Environment:
    """One open LMDB environment and how its readers and its writer share it
    (see the module docstring): what views and scans read through
    (:class:`kvstore.state.readers.ReadSource`)."""

    def __init__(self, path: str, *, readonly: bool, map_size: int, writemap: bool, max_readers: int) -> None:
        self.path = path
        self.readonly = readonly
        self.writemap = writemap and not readonly
        self.closed = False  # (an attribute, not a property: State.apply reads it once per group)
        self._forked = False
        self._pid = os.getpid()
        self.generation = Generation()  # bumped after every commit and remap: cached transactions renew
        self.map_gen = 0          # bumped whenever open transactions die
        self._held_gen = 0
        self._readers: weakref.WeakSet[ReaderHandle] = weakref.WeakSet()
        self._views: weakref.WeakSet[View] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self.views_allowed = threading.Event()  # cleared while a remap waits for views
        self.views_allowed.set()
        # Refusing in a forked child: compiled readers check the declared type at run time, so it says so.
        self.gate: ReadGate | Refusing = ReadGate(self._reader_list, self._on_block, self._on_release)
        self.map_grows = 0
        self._last_sweep = time.perf_counter()
        self.prefault = Prefault()  # a bulk write's new pages, faulted in ahead of it (make_room)
        self._map_address: tuple[int, int | None] = (-1, None)  # (map_gen, where the map is)
        self.env, self.main_db, self.data_db = open_env(
            path, readonly=readonly, map_size=map_size, writemap=self.writemap,
            max_readers=max_readers)
        # the keyspaces' named databases (kvstore/state/keyspace_dbs.py), their
        # methods bound here: a keyspace's read looks its handle up once
        self.keyspaces = KeyspaceDbs(self.env, self.main_db, self.data_db, path)
        self.keyspace_db = self.keyspaces.get
        self.keyspace_db_in = self.keyspaces.get_in
        self.keyspace_names = self.keyspaces.names
        track(self)

    # -- keyspaces: named databases (kvstore/state/keyspace_dbs.py) ---------------

    @property
    def keyspace_epoch(self) -> int:
        """Bumped whenever a keyspace's handle is added (:attr:`KeyspaceDbs.epoch
        <kvstore.state.keyspace_dbs.KeyspaceDbs.epoch>`)."""
        return self.keyspaces.epoch

    def keyspace_slots_left(self) -> int:
        """How many more keyspaces this environment can hold (:data:`MAX_KEYSPACES`)."""
        return MAX_KEYSPACES - len(self.read(self.keyspace_names))

    # -- what may be inside LMDB: the gate waits for it ------------------------

    @property
    def gen(self) -> int:
        """The commit counter's value (:class:`~kvstore.state.readers.Generation`)."""
        return self.generation.value

    def _reader_list(self) -> list[Reader | View]:
        """Whatever may be inside LMDB: the gate waits for their ``busy``."""
        with self._readers_lock:
            return [*(h.reader for h in self._readers), *self._views]

    def register_reader(self, handle: ReaderHandle) -> None:
        """Track a thread's cached read transaction (swept when stale) for as
        long as its thread holds ``handle``."""
        with self._readers_lock:
            self._readers.add(handle)

    def register_view(self, view: View) -> None:
        """Track an open view (closed with the environment)."""
        with self._readers_lock:
            self._views.add(view)

    def _on_block(self) -> None:
        # A writer wants LMDB to itself: no cached transaction matches -2.
        self._held_gen = self.generation.value
        self.generation.value = -2

    def _on_release(self) -> None:
        # Every cached transaction predates what the writer did: renew.
        self.generation.value = self._held_gen + 1

    # -- open views (kvstore/state/view.py) --------------------------------------

    def _open_views(self) -> list[View]:
        with self._readers_lock:
            return [v for v in self._views if v.open]

    def _close_views(self, *, every: bool) -> bool:
        """With the gate held exclusively: close expired views (``every``:
        all of them, the store is closing) and views of this thread (it is
        the one that would wait for them); True if other views stay open."""
        me = threading.get_ident()
        left = False
        for v in self._open_views():
            if every:
                v.kill(self.closed_error())
            elif v.expired:
                v.kill(v._expired())
            elif v.owner == me:
                v.kill(v._expired(": LMDB's map had to grow while it was open in the thread that wrote"))
            else:
                left = True
        return left

    def exclusive_without_views(self) -> None:
        """Hold the gate exclusively with no view open (to remap): close
        expired views and this thread's, wait for the others to close or
        expire (see :mod:`kvstore.state.view`)."""
        gate = self.gate
        delay = 0.0005
        self.views_allowed.clear()  # no new view until then: a stream of views would starve it
        try:
            while True:
                gate.acquire_exclusive()
                if not self._close_views(every=False):
                    return
                gate.release_exclusive()
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        finally:
            self.views_allowed.set()  # new ones wait at the gate until the remap ends

    def expire_views(self) -> None:
        """Close views over their time limit (the writer's periodic sweep),
        so that a forgotten view pins pages for a bounded time."""
        if not any(v.expired for v in self._open_views()):
            return
        gate = self.gate
        gate.acquire_exclusive(cached_only=True)
        try:
            for v in self._open_views():
                if v.expired:
                    v.kill(v._expired())
        finally:
            gate.release_exclusive()

    # -- the writer's sweep ------------------------------------------------------

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

    def _sweep(self) -> None:
        """Drop cached read transactions older than the newest commit, so an
        idle reading thread does not pin old pages."""
        with self._readers_lock:
            readers = [h.reader for h in self._readers]
        gen = self.gen
        if not any(r.txn is not None and r.gen != gen for r in readers):
            return
        gate = self.gate
        gate.acquire_exclusive(cached_only=True)
        try:
            for r in readers:
                if r.txn is not None and r.gen != gen:
                    try:
                        r.txn.abort()
                    except lmdb.Error:
                        pass
                    r.txn = None
                    r.gen = -1
        finally:
            gate.release_exclusive()

    # -- reading in a fresh transaction ---------------------------------------------

    def enter_read(self) -> None:
        """Pass the gate (ClosedError when closed)."""
        gate = self.gate
        gate.enter()
        if self.closed:
            gate.exit()
            raise self.closed_error()

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in a fresh read transaction, inside the gate."""
        for attempt in (0, 1):
            self.enter_read()
            try:
                try:
                    with self.env.begin(db=self.data_db) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    if attempt:
                        raise
                except lmdb.Error as exc:
                    raise read_error(exc, self.path) from None
            finally:
                self.gate.exit()
            self.adopt_mapsize()
        raise AssertionError("unreachable")

    def applied_in(self, txn: lmdb.Transaction) -> int:
        """The applied LSN recorded in ``txn``'s snapshot of LMDB."""
        return applied_of(txn.get(K_APPLIED, db=self.main_db))

    def adopt_mapsize(self) -> None:
        """Read-only: another process grew the map; adopt its size."""
        gate = self.gate
        self.exclusive_without_views()
        try:
            self.env.set_mapsize(0)
            self.map_gen += 1
        finally:
            gate.release_exclusive()

    def stats(self) -> dict[str, int | None]:
        """How LMDB looks now. Readers, from LMDB's reader table (every
        process's, this call's own read transaction included):
        ``lmdb_reader_slots`` slots in use, ``lmdb_readers_reading`` of them
        inside a read transaction, ``lmdb_oldest_reader_lag`` how many write
        transactions were committed since the snapshot the oldest of those
        sees (None: no reader). Pages those commits freed cannot be reused
        while it reads, so a lag that keeps growing means a reader holds a
        snapshot too long (an idle iterator, a long view) or died holding one
        (cleared within a second by the writer)."""
        dstat, info, psize, (slots, reading, oldest) = self.read(partial(_stats_in, self.env, self.data_db))
        return {
            "map_grows": self.map_grows,
            "lmdb_map_bytes": info["map_size"],
            "lmdb_used_bytes": (info["last_pgno"] + 1) * psize,
            "lmdb_entries": dstat["entries"],
            "lmdb_depth": dstat["depth"],
            "lmdb_readers": info["num_readers"],
            "lmdb_reader_slots": slots,
            "lmdb_readers_reading": reading,
            "lmdb_oldest_reader_lag": None if oldest is None else info["last_txnid"] - oldest,
        }

    # -- writing ----------------------------------------------------------------------

    def write(self, fn: Callable[[lmdb.Transaction], object]) -> None:
        """Run ``fn(txn)`` in one write transaction, growing the map and
        retrying as often as it fills; once it is committed, cached read
        transactions are renewed (``gen``)."""
        self.commit_write(self.begin_write(fn), fn)

    def begin_write(self, fn: Callable[[lmdb.Transaction], object]) -> lmdb.Transaction:
        """:meth:`write` in two halves, for a write to be made visible later
        (:class:`kvstore.state.staged.StagedApply`): begin a write
        transaction and run ``fn(txn)`` in it (growing the map and retrying
        as often as it fills), and return it open, invisible to every
        reader. End it with :meth:`commit_write` or :meth:`abort_write`, on
        this thread (LMDB's writer lock belongs to the thread that began it);
        other writers wait meanwhile."""
        while True:
            self.keyspaces.write_begins()
            try:
                txn = self.env.begin(write=True, db=self.data_db)
            except BaseException:
                self.keyspaces.write_ended()
                raise
            try:
                fn(txn)
                return txn
            except lmdb.MapFullError:
                self.keyspaces.forget_created()
                self.keyspaces.write_ended()
                self.grow(txn)
            except BaseException:
                self.abort_write(txn)
                raise

    def commit_write(self, txn: lmdb.Transaction, fn: Callable[[lmdb.Transaction], object]) -> None:
        """Commit ``txn``, begun by :meth:`begin_write` with ``fn`` (written
        again in a new transaction when the commit finds the map full), and
        renew cached read transactions (``gen``)."""
        while True:
            try:
                txn.commit()
                break
            except lmdb.MapFullError:
                self.keyspaces.forget_created()
                self.keyspaces.write_ended()
                self.grow(txn)
                txn = self.begin_write(fn)
            except BaseException:
                self.abort_write(txn)
                raise
        self.keyspaces.write_ended()
        self.generation.value += 1

    def abort_write(self, txn: lmdb.Transaction) -> None:
        """Drop ``txn``, begun by :meth:`begin_write`: nothing it wrote was
        ever visible."""
        self.keyspaces.forget_created()
        self.keyspaces.write_ended()
        self._abort_write(txn)

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
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        need = (used + 2 * nbytes + MIB - 1) & ~(MIB - 1)
        if need > info["map_size"]:
            try:
                self.grow(at_least=need)
            except DiskFullError:
                pass
        if self.writemap:
            self._prefault(used, nbytes)

    def _prefault(self, used: int, nbytes: int) -> None:
        """Fault in the ``nbytes`` of the map after its first ``used`` on a
        helper thread (:mod:`kvstore.state.prefault`): where a write that adds
        about ``nbytes`` puts its new pages (all of them, when the data has
        no free pages to reuse: a growing store)."""
        map_size = self.env.info()["map_size"]
        address = self._map_start(map_size)
        if address is not None:
            self.prefault.start(address + used, min(nbytes, map_size - used))

    def sequential_scan(self) -> SequentialScan:
        """The map read ahead while a scan of all of it runs, in a read
        transaction held meanwhile (so the map is not remapped): ``with
        env.sequential_scan() as scan:`` (:class:`~kvstore.state.prefault.SequentialScan`)."""
        map_size = self.env.info()["map_size"]
        return SequentialScan(self._map_start(map_size), map_size)

    def _map_start(self, map_size: int) -> int | None:
        """Where this process maps ``data.mdb`` now (looked up once per map)."""
        gen, address = self._map_address
        if gen != self.map_gen:
            address = map_address(os.path.join(self.path, "data.mdb"), map_size)
            self._map_address = (self.map_gen, address)
        return address

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
            self.prefault.wait()  # (it must not outlive the old mapping)
            self.env.set_mapsize(new)
            self.map_gen += 1
        finally:
            gate.release_exclusive()
        self.map_grows += 1
        log.info("LMDB map of %s grown from %d to %d MiB", self.path,
                 old >> 20, new >> 20)

    # -- lifecycle ----------------------------------------------------------------------

    def closed_error(self) -> ClosedError | ForkedError:
        if self._forked:
            return forked_error(f"the LMDB environment {self.path}", self._pid)
        return ClosedError(f"the store {os.path.dirname(self.path)} is closed")

    def close(self, *, sync: bool) -> None:
        """Wait for readers to leave, close every open view, flush LMDB to
        disk (``sync``) and close."""
        gate = self.gate
        gate.acquire_exclusive()
        try:
            self._close_views(every=True)
            self.closed = True
            self.prefault.wait()
            try:
                if sync:
                    self.env.sync(True)
            finally:
                self.env.close()
        finally:
            gate.release_exclusive()

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): LMDB must not be used
        across fork, so every read and write raises ForkedError (the get
        fast path misses on ``gen``, every other path passes the gate) and
        close() does nothing. Nothing to do if it was closed before the fork."""
        if self.closed:
            return
        self._forked = True
        self.closed = True
        self.generation.value = -7  # no cached transaction carries it
        self.gate = Refusing(f"the LMDB environment {self.path}", self._pid)
        keep_forever(self.env, self.path, self._pid)


def _stats_in(env: lmdb.Environment, data: lmdb._Database, txn: lmdb.Transaction) -> tuple[Any, Any, int, Any]:
    """What :meth:`Environment.stats` reads in one read transaction ``txn``."""
    return txn.stat(data), env.info(), env.stat()["psize"], reader_table(env)
