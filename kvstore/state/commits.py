"""The state machine's LMDB commits: every write transaction that carries
applied entries (or the overlay's writes) into LMDB, and what they count.

Each such transaction writes the highest LSN it carries as LMDB's applied LSN
(:data:`kvstore.state.meta.K_APPLIED`) in the same transaction, so LMDB never
holds a write without the LSN that covers it, nor that LSN without the write:
recovery replays the log from there (:mod:`kvstore.store.recovery`). A
write-through transaction writes the overlay's frozen writes first, then the
group's, so LMDB's applied LSN never passes a write the overlay still holds.

Durability: LMDB is opened with ``sync=False, metasync=False``: its fsyncs are
not on the commit path, the log's are. A process crash cannot corrupt such an
environment (dirty pages live in the kernel's page cache), a machine crash can
(pages reach the disk in any order), so whether to trust it at open is decided
from the SESSION record (kvstore/store/recovery.py), never from LMDB's contents.
The other options, and why: :mod:`kvstore.state.lmdb_env`.

A commit that fails (a full disk) is kept as :attr:`LmdbCommits.failure` and
raised again by every later apply and flush, so the log fails at its next
group; the writes it carried are in the log, and the next open replays them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import lmdb
from lmdb import Transaction

from kvstore.entry.conditions import Ops
from kvstore.state.environment import Environment
from kvstore.state.expiry import Expiry
from kvstore.state.lmdb_ops import apply_ops, put_run, write_values
from kvstore.state.meta import K_APPLIED, pack_lsn
from kvstore.state.overlay import Overlay
from wal.errors import LogFailedError

Write = Callable[[Transaction], None]
"""What a commit runs in its write transaction."""


@final
class LmdbCommits:
    """The write transactions of one state machine's LMDB environment (see
    the module docstring), the LSN the last of them made applied in LMDB,
    a kept failure, and counters (updated only by the committing thread,
    read approximately by :meth:`kvstore.state.machine.State.stats`).

    ``reads_changed()`` is called, with the overlay's flush lock held, after
    a commit that may have changed which keys have an expiry;
    ``publishing(last)`` in a write-through transaction (or a group's, by
    :mod:`kvstore.state.groups`) just before the commit that makes LSNs up to
    ``last`` visible (:mod:`kvstore.state.exact_reads`; a flush changes no
    value a read sees, and does not call it); ``written_through(last,
    expiry)`` after a write-through transaction up to LSN ``last`` committed
    (``expiry``: it went through the expiry metadata).
    """

    lmdb: Environment
    overlay: Overlay
    expiry: Expiry
    path: str
    applied_lsn: int
    """The highest LSN LMDB holds (the state's applied LSN may be higher: the overlay's)."""
    count: int
    """Write transactions that applied entries (or the overlay)."""
    seconds: float
    """... their time, in all."""
    max_seconds: float
    """... the longest one's."""
    failure: Exception | None
    """A commit that failed: raised by every later apply and flush."""
    reads_changed: Callable[[], None]
    publishing: Callable[[int], None]
    written_through: Callable[[int, bool], None]

    def __init__(self, env: Environment, overlay: Overlay, expiry: Expiry, applied_lsn: int, *,
                 reads_changed: Callable[[], None], publishing: Callable[[int], None],
                 written_through: Callable[[int, bool], None]) -> None:
        self.lmdb = env
        self.overlay = overlay
        self.expiry = expiry
        self.path = env.path
        self.applied_lsn = applied_lsn
        self.count = 0
        self.seconds = 0.0
        self.max_seconds = 0.0
        self.failure = None
        self.reads_changed = reads_changed
        self.publishing = publishing
        self.written_through = written_through

    def flush(self) -> None:
        """Write the overlay to LMDB (one write transaction, one
        ``putmulti`` call) and record its highest LSN there as applied.
        Called when the overlay is full, by its thread, before reads of LMDB
        as a whole, and at close; any thread may call it."""
        overlay = self.overlay
        if not overlay.active and overlay.frozen is None:
            return  # (a flush in progress holds ``frozen``: wait for it below)
        if self.failure is not None:
            raise self.failure
        with overlay.flush_lock:
            if self.lmdb.closed:
                return
            frozen = overlay.freeze()
            if frozen is None:
                return
            values, lsn = frozen
            main = self.lmdb.main_db
            expiry = self.expiry

            def write(txn: Transaction) -> None:
                write_values(txn, values)
                if expiry.keys:
                    expiry.drop(txn, values)
                txn.put(K_APPLIED, pack_lsn(lsn), True, True, False, main)
            self.run(write, lsn)
            overlay.thaw()
            self.reads_changed()

    def write_through(self, ops: Ops, last: int, size_hint: int, *, puts_only: bool, expiry: bool,
                      hold: bool) -> ThroughWrite | None:
        """Apply ``ops`` (ending at LSN ``last``; ``size_hint``: their size
        as logged, :meth:`kvstore.state.environment.Environment.make_room`) to
        LMDB now, after what the overlay holds, in one write transaction;
        through the expiry metadata (:mod:`kvstore.state.expiry`) when
        ``expiry``, else with :func:`kvstore.state.lmdb_ops.put_run` when
        ``puts_only``. With ``hold``, the transaction is left open, with the
        overlay's flush lock held, and returned for its holder to commit or
        abort (:mod:`kvstore.state.staged`)."""
        overlay = self.overlay
        env = self.lmdb
        main = env.main_db
        metadata = self.expiry
        overlay.flush_lock.acquire()
        held = False
        try:
            frozen = overlay.freeze()
            env.make_room(size_hint)

            def write(txn: Transaction) -> None:
                if frozen is not None:
                    write_values(txn, frozen[0])
                    if metadata.keys:
                        metadata.drop(txn, frozen[0])
                if expiry:
                    metadata.apply(txn, ops, env.keyspace_db_in)
                elif puts_only:
                    put_run(txn, ops)
                else:
                    apply_ops(txn, ops, env.keyspace_db_in)
                txn.put(K_APPLIED, pack_lsn(last), True, True, False, main)
                if not hold:  # (a held transaction is published by ThroughWrite.commit)
                    self.publishing(last)
            if hold:
                t0 = time.perf_counter()
                txn = self.begin(write, last)
                held = True
                return ThroughWrite(self, txn, write, last, frozen is not None, expiry, time.perf_counter() - t0)
            self.run(write, last)
            self._through_committed(last, frozen is not None, expiry)
            return None
        finally:
            if not held:
                overlay.flush_lock.release()

    def _through_committed(self, last: int, thaw: bool, expiry: bool) -> None:
        """After a write-through transaction up to LSN ``last`` committed (the
        overlay's lock held): its frozen part (``thaw``) is in LMDB, the
        LSN applied."""
        if thaw:
            self.overlay.thaw()
        self.written_through(last, expiry)

    def run(self, write: Write, lsn: int) -> None:
        """Run ``write`` in one write transaction (growing the map as often
        as it fills) that makes LSNs up to ``lsn`` applied in LMDB. A failure
        is kept and raised again by every later apply and flush."""
        t0 = time.perf_counter()
        try:
            self.lmdb.write(write)
        except BaseException as exc:
            raise self._failed(exc, lsn) from None
        self._committed(lsn, time.perf_counter() - t0)

    def begin(self, write: Write, lsn: int) -> Transaction:
        """:meth:`run`'s ``write`` in a transaction left open
        (:meth:`kvstore.state.environment.Environment.begin_write`)."""
        try:
            return self.lmdb.begin_write(write)
        except BaseException as exc:
            raise self._failed(exc, lsn) from None

    def commit(self, txn: Transaction, write: Write, lsn: int, seconds: float) -> None:
        """Commit what :meth:`begin` wrote (``seconds``: the time that took),
        as :meth:`run` would have."""
        t0 = time.perf_counter()
        try:
            self.lmdb.commit_write(txn, write)
        except BaseException as exc:
            raise self._failed(exc, lsn) from None
        self._committed(lsn, seconds + time.perf_counter() - t0)

    def _committed(self, lsn: int, seconds: float) -> None:
        """A write transaction that took ``seconds`` committed LSNs up to ``lsn``."""
        self.applied_lsn = lsn
        self.count += 1
        self.seconds += seconds
        if seconds > self.max_seconds:
            self.max_seconds = seconds
        self.lmdb.maintain_now_and_then()

    def _failed(self, exc: BaseException, lsn: int) -> BaseException:
        """Keep a failure to apply LSNs up to ``lsn``; return what to raise."""
        if isinstance(exc, lmdb.Error):
            exc = LogFailedError(f"applying LSNs up to {lsn} to LMDB ({self.path}) failed: {exc}")
        if isinstance(exc, Exception):
            self.failure = exc
        return exc


@final
@dataclass
class ThroughWrite:
    """One write-through transaction (:meth:`LmdbCommits.write_through`
    with ``hold``), written and open, with the overlay's lock held and its
    frozen part in it: to be committed (then the overlay is thawed and the
    LSN applied) or aborted, on the thread that began it."""

    commits: LmdbCommits
    txn: Transaction
    write: Write
    last: int
    thaw: bool
    expiry: bool
    seconds: float

    def commit(self) -> None:
        commits = self.commits
        try:
            commits.publishing(self.last)
            commits.commit(self.txn, self.write, self.last, self.seconds)
            commits._through_committed(self.last, self.thaw, self.expiry)
        finally:
            commits.overlay.flush_lock.release()

    def abort(self, why: Exception) -> None:
        """Drop the transaction; ``why`` is kept as the commits' failure (the
        overlay stays frozen: its writes are not in LMDB)."""
        commits = self.commits
        try:
            commits.failure = why
            commits.lmdb.abort_write(self.txn)
        finally:
            commits.overlay.flush_lock.release()
