"""Whether LMDB can be trusted at open, replaying the log, rebuilding LMDB.

LMDB is a cache of "newest snapshot + log". It runs with
``MDB_NOSYNC``: a crash of the process cannot corrupt it (dirty pages are in
the kernel's page cache and reach the disk later), a crash of the machine can
(pages reach the disk in any order, and the newest meta page may point at
pages that never did). So on open:

* after a clean close, or after a process crash (same kernel boot), LMDB is
  used as is and the log is replayed from its applied LSN + 1;
* after a machine crash (the kernel's boot id differs from the one recorded
  at open and there was no clean close), or on any sign of damage (LMDB will
  not open or read, its store id is not the log's, its applied LSN is past
  the log's end or before the log's start, an interrupted rebuild), LMDB is
  deleted and rebuilt: from the newest snapshot when there is one, then the
  log (:func:`rebuild_state`).

The evidence for that choice lives in a small file beside LMDB, never inside
it: after a machine crash a page of LMDB may be any older version of itself,
including one that says "closed cleanly".

``STORE/lmdb/SESSION`` (JSON, replaced atomically: temp file, fsync, rename,
fsync directory)::

    {"format": 1, "store_id": "<log store id>", "boot_id": "<kernel boot id>",
     "clean": false, "pid": 1234, "time": 1700000000.0,
     "history": [[1, 1, 0], [2, 70, 8312...]]}

* Written with ``"clean": false`` and the current boot id before the first
  LMDB write of a session (and made durable first), so any later LMDB write
  that reaches the disk is covered by it.
* Rewritten with ``"clean": true`` at close, after LMDB was flushed
  (``mdb_env_sync``), while the store's lock is still held.
* A missing or unreadable SESSION means LMDB cannot be trusted.
* ``"history"``: the log's timeline history (:mod:`wal.timeline`) the
  entries LMDB applied are on, written whenever the log's history changes
  (a new timeline) before an entry of the new timeline is applied. LMDB
  whose applied LSNs are not all on the log's history (a deposed leader's,
  a log cut under it) is rebuilt. A record without it (walkv before
  timelines) is on timeline 1.
* ``"rebuild": "<why>"`` (written by ``walkv repair`` when it took LSNs
  out of the log that LMDB may have applied) means the next read-write
  open rebuilds LMDB from the newest snapshot plus the log, saying why; a
  read-only open refuses until then.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Iterable, Iterator, NamedTuple, Protocol

import snapshot
import wal
from kvstore.entry.codec import decode_all
from kvstore.layout import SESSION_NAME
from kvstore.state.machine import State, StateOptions
from kvstore.store import snapshots
from wal.errors import REPAIR_HINT, CorruptionError, Damage, LogGapError, RecoveryNeededError, SnapshotError, WalkvError
from wal.fs import OS_FS, FileSystem
from wal.progress import Progress
from wal.timeline import ROOT, History, fork_point, history_from_json, history_to_json, timeline_at

log = logging.getLogger("walkv.recovery")

SESSION_FORMAT = 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


REPLAY_CHUNK_ENTRIES = 4096
REPLAY_CHUNK_BYTES = 16 << 20
PROGRESS_EVERY = 2.0


class LogSource(Protocol):
    """The log a replay reads: the open :class:`wal.Log` of a store, or a
    restore's view of another store's log files."""

    @property
    def directory(self) -> str: ...
    @property
    def first_lsn(self) -> int: ...
    @property
    def last_lsn(self) -> int: ...

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *,
                     durable_only: bool = True) -> Iterator[wal.Entry]: ...


def boot_id() -> str:
    """The running kernel's boot id (Linux), or ``"unknown"`` elsewhere, which
    makes every unclean close look like a machine crash (safe, slower)."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def read_session(lmdb_dir: str) -> dict | None:
    """The SESSION record, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(lmdb_dir, SESSION_NAME), "rb") as f:
            raw = f.read(1 << 16)
        rec = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("format") != SESSION_FORMAT:
        return None
    if not isinstance(rec.get("clean"), bool) or not isinstance(rec.get("boot_id"), str):
        return None
    return rec


def write_session(lmdb_dir: str, store_id: str, *, clean: bool, history: History,
                  fs: FileSystem = OS_FS, rebuild: str | None = None) -> None:
    """Replace the SESSION record atomically and durably (``history``: the
    timeline history LMDB's entries are on; ``rebuild``: why the next open
    must rebuild LMDB)."""
    rec = {"format": SESSION_FORMAT, "store_id": store_id, "boot_id": boot_id(),
           "clean": clean, "pid": os.getpid(), "time": time.time(), "history": history_to_json(history),
           **({"rebuild": rebuild} if rebuild else {})}
    path = os.path.join(lmdb_dir, SESSION_NAME)
    tmp = path + ".tmp"
    fs.write_file(tmp, json.dumps(rec, sort_keys=True).encode() + b"\n")
    fs.rename(tmp, path)
    fs.fsync_dir(lmdb_dir)


def distrust_reason(lmdb_dir: str, session: dict | None, store_id: str) -> str | None:
    """Why LMDB at ``lmdb_dir`` must be rebuilt, judged from SESSION alone
    (None: it may be used, subject to the checks in :func:`check_state`)."""
    if not os.path.exists(os.path.join(lmdb_dir, "data.mdb")):
        return "there is no LMDB state yet"
    if session is None:
        return "its SESSION record is missing or unreadable"
    if isinstance(session.get("rebuild"), str):
        return session["rebuild"]
    if session.get("store_id") != store_id:
        return (f"it was built from another log (store id {session.get('store_id')!r}, "
                f"the log's is {store_id!r})")
    if not session["clean"] and session["boot_id"] != boot_id():
        return ("the machine crashed while the store was open (the kernel's boot id "
                "changed and the store was not closed cleanly)")
    return None


def session_history(session: dict | None) -> History:
    """The timeline history a SESSION record states (timeline 1 when it states none)."""
    try:
        return history_from_json(session["history"], "SESSION") if session and "history" in session else ROOT
    except ValueError:
        return ()


def check_state(state: State, store_id: str, first_lsn: int, last_lsn: int, history: History = ROOT,
                applied_history: History = ROOT) -> str | None:
    """Why an opened LMDB cannot be used with a log holding ``first_lsn..last_lsn``
    on ``history`` (None: it can); ``applied_history`` is the timeline history
    its SESSION says its entries are on."""
    if not state.initialized:
        return "its meta database is empty"
    if not state.complete:
        return "a rebuild of it was interrupted"
    if state.store_id != store_id:
        return f"its store id {state.store_id!r} is not the log's {store_id!r}"
    if state.applied_lsn > last_lsn:
        return (f"it has applied LSN {state.applied_lsn}, past the log's last LSN "
                f"{last_lsn} (the log lost its tail, or was cut by a repair)")
    if state.applied_lsn < first_lsn - 1:
        return (f"it has applied LSN {state.applied_lsn}, but the log starts at LSN "
                f"{first_lsn} (older entries were truncated)")
    if not applied_history:
        return "its SESSION record's timeline history is unreadable"
    fork = fork_point(applied_history, state.applied_lsn, history)
    if fork is not None:
        return (f"it has applied LSNs up to {state.applied_lsn} on {timeline_at(applied_history, fork + 1)}, but "
                f"the log's history left that timeline after LSN {fork} (a fork: its entries after it are not "
                f"the log's)")
    return None


def replay(state: State, wal_log: LogSource, *, to_lsn: int | None = None,
           progress: Progress | None = None, what: str = "replay") -> int:
    """Apply the log's entries after ``state.applied_lsn`` (up to ``to_lsn``,
    default the log's end) in bounded chunks, each one LMDB write transaction.
    Returns the number of entries applied. Reports progress through
    ``progress(done, total)`` and, for replays that take more than a few
    seconds, through ``logging``.

    Each payload is validated (:func:`kvstore.entry.codec.decode`) as it is read: a
    corrupt entry raises :class:`CorruptionError` naming the file, offset or
    LSN and the repair command, and its chunk is not applied.
    """
    start = state.applied_lsn + 1
    last = wal_log.last_lsn if to_lsn is None else min(to_lsn, wal_log.last_lsn)
    if start > last:
        return 0
    total = last - start + 1
    t0 = time.monotonic()
    next_report = t0 + PROGRESS_EVERY
    reported = False
    done = 0
    if progress is not None:
        progress(0, total)
    try:
        apply = state.apply
        for first, payloads in _chunks(wal_log.read_entries(start, last, durable_only=False), start):
            apply(first, decode_all(payloads, first))
            done += len(payloads)
            if progress is not None:
                progress(done, total)
            now = time.monotonic()
            if now >= next_report:
                next_report = now + PROGRESS_EVERY
                reported = True
                log.info("%s of %s: %d of %d log entries applied (%.0f/s)", what,
                         state.path, done, total, done / (now - t0))
    except CorruptionError as exc:
        if exc.hint is None:
            raise exc.with_hint(REPAIR_HINT) from None
        raise
    except LogGapError as exc:  # retention removed entries this replay needs
        raise CorruptionError(f"cannot replay the log from LSN {start}: {exc}", kind=Damage.SEQUENCE,
                              path=wal_log.directory, offset=0, lsn=exc.first_missing,
                              hint=REPAIR_HINT) from None
    if state.applied_lsn != last:
        raise CorruptionError(
            f"the log ended at LSN {state.applied_lsn} while replaying to LSN {last}",
            kind=Damage.SEQUENCE, path=wal_log.directory, offset=0, lsn=state.applied_lsn + 1,
            hint=REPAIR_HINT)
    if progress is not None:
        progress(done, total)
    elapsed = time.monotonic() - t0
    if reported or elapsed >= PROGRESS_EVERY:
        log.info("%s of %s done: %d log entries in %.1f s", what, state.path, done, elapsed)
    return done


def _chunks(entries: Iterator[wal.Entry], first: int) -> Iterator[tuple[int, list[bytes]]]:
    """The payloads of consecutive entries from LSN ``first``, as ``(LSN of
    the first, payloads)`` chunks of at most ``REPLAY_CHUNK_ENTRIES`` entries
    and about ``REPLAY_CHUNK_BYTES``. When reading fails, the payloads read
    before the failure are validated first: the first bad entry in log order
    is the one reported, as if each had been decoded as it was read."""
    payloads: list[bytes] = []
    add = payloads.append
    size = 0
    room = REPLAY_CHUNK_ENTRIES
    most_bytes = REPLAY_CHUNK_BYTES
    try:
        for entry in entries:
            payload = entry[2]
            add(payload)
            size += len(payload)
            room -= 1
            if size >= most_bytes or not room:
                yield first, payloads
                first += len(payloads)
                payloads = []
                add = payloads.append
                size = 0
                room = REPLAY_CHUNK_ENTRIES
    except Exception:
        decode_all(payloads, first)
        raise
    if payloads:
        yield first, payloads


def remove_state(lmdb_dir: str, fs: FileSystem = OS_FS) -> None:
    """Delete the LMDB environment directory durably (SESSION first, so that
    a crash half-way leaves an environment that is never trusted)."""
    if not os.path.exists(lmdb_dir):
        return
    names = sorted(fs.listdir(lmdb_dir), key=lambda n: n != SESSION_NAME)
    for name in names:
        path = os.path.join(lmdb_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            fs.unlink(path)
        if name == SESSION_NAME:
            fs.fsync_dir(lmdb_dir)
    fs.rmdir(lmdb_dir)
    fs.fsync_dir(os.path.dirname(os.path.abspath(lmdb_dir)))


def rebuild_state(
    lmdb_dir: str,
    wal_log: LogSource,
    *,
    store_id: str,
    base: snapshot.Snapshot | None = None,
    base_lsn: int = 0,
    progress: Progress | None = None,
    fs: FileSystem = OS_FS,
    state_options: StateOptions = StateOptions(),
    history: History = ROOT,
) -> State:
    """Delete LMDB and build it again: the ``base`` snapshot (every section:
    the keyspaces' and the expiry metadata's too) as of ``base_lsn`` (the
    newest snapshot; none: an empty state at LSN 0), then the log from
    ``base_lsn + 1`` (on timeline ``history``). Returns the open state.

    Crash-safe: the old environment is deleted durably first, SESSION says
    "not clean" before the first LMDB write, and ``complete`` is set only once
    the base is loaded, so an interrupted rebuild is simply redone.
    """
    if base_lsn < wal_log.first_lsn - 1:
        if base is None:
            raise SnapshotError(
                f"cannot rebuild the state of {os.path.dirname(lmdb_dir)}: the log starts at "
                f"LSN {wal_log.first_lsn} (older entries were deleted after a snapshot covered "
                f"them) and no snapshot was found. Restore the snapshots directory, or "
                f"restore the store from a backup.")
        raise SnapshotError(
            f"the newest snapshot is at LSN {base_lsn}, but the log starts at LSN "
            f"{wal_log.first_lsn}: the entries between are gone")
    if base_lsn > wal_log.last_lsn:
        raise CorruptionError(
            f"the snapshot is at LSN {base_lsn}, past the log's last LSN {wal_log.last_lsn}",
            kind=Damage.SEQUENCE, path=wal_log.directory, offset=0, hint=REPAIR_HINT)
    remove_state(lmdb_dir, fs)
    fs.makedirs(lmdb_dir)
    write_session(lmdb_dir, store_id, clean=False, history=history, fs=fs)
    state = State(lmdb_dir, state_options)
    try:
        state.initialize(store_id, base_lsn, complete=base is None)
        if base is not None:
            n = state.load_base(iter_pairs(base), base_lsn,
                                sections={name: iter_pairs(base.section_items(name))
                                          for name in base.section_names()})
            log.info("rebuild of %s: loaded %d pairs of the snapshot at LSN %d",
                     lmdb_dir, n, base_lsn)
        replay(state, wal_log, progress=progress, what="rebuild")
    except BaseException:
        state.close(sync=False)
        raise
    return state


def iter_pairs(pairs: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """Check that base pairs are sorted (LMDB's bulk load assumes nothing, but
    a snapshot that is not sorted is not one walkv wrote)."""
    prev = None
    for k, v in pairs:
        if prev is not None and k <= prev:
            raise SnapshotError(f"snapshot pairs are not sorted: {k!r} after {prev!r}")
        prev = k
        yield k, v



class Opened(NamedTuple):
    """What :func:`open_state` did: the state to use, how many log entries it
    replayed, and why LMDB was rebuilt (``None``: it was trusted)."""

    state: State
    replayed: int
    rebuilt: str | None


def trusted_state(lmdb_dir: str, store_id: str, first_lsn: int, last_lsn: int, options: StateOptions,
                  fs: FileSystem = OS_FS, history: History = ROOT) -> tuple[State | None, str | None]:
    """``(state, None)``: the LMDB state at ``lmdb_dir``, trusted as it is
    (:func:`distrust_reason`, :func:`check_state` against a log holding
    ``first_lsn..last_lsn`` on ``history``) and its session marked open (on
    ``history``); ``(None, why)`` when it must be rebuilt."""
    session = read_session(lmdb_dir)
    reason = distrust_reason(lmdb_dir, session, store_id)
    if reason is not None:
        return None, reason
    try:
        state = State(lmdb_dir, options)
    except CorruptionError as exc:
        return None, f"LMDB will not open ({exc})"
    reason = check_state(state, store_id, first_lsn, last_lsn, history, session_history(session))
    try:
        if reason is None:
            write_session(lmdb_dir, store_id, clean=False, history=history, fs=fs)
            return state, None
    except BaseException:
        state.close(sync=False)
        raise
    state.close(sync=False)
    return None, reason


def open_state(store_path: str, lmdb_dir: str, wal_log: wal.Log, *, fs: FileSystem,
               options: StateOptions, progress: Progress | None = None) -> Opened:
    """Open a writer's LMDB state: trust it (:func:`trusted_state`) and
    replay the log after its applied LSN, or rebuild it from the newest
    usable snapshot plus the log."""
    store_id = wal_log.store_id
    history = wal_log.history
    state, reason = trusted_state(lmdb_dir, store_id, wal_log.first_lsn, wal_log.last_lsn, options, fs, history)
    if state is not None:
        try:
            return Opened(state, replay(state, wal_log, progress=progress), None)
        except BaseException:
            state.close(sync=False)
            raise
    fresh = reason == "there is no LMDB state yet" and wal_log.last_lsn == 0
    if not fresh:
        log.warning("rebuilding the LMDB state of %s from the log: %s", store_path, reason)
    found = snapshots.rebuild_base(store_path, store_id)
    base, base_lsn = found if found is not None else (None, 0)
    state = rebuild_state(lmdb_dir, wal_log, store_id=store_id, base=base, base_lsn=base_lsn,
                          progress=progress, fs=fs, state_options=options, history=history)
    return Opened(state, state.applied_entries, None if fresh else reason)


def open_readonly_state(store_path: str, lmdb_dir: str, options: StateOptions) -> State:
    """Open the state of a store another process may be writing, for reading
    only; refused after a machine crash of its writer (LMDB may be damaged
    until a read-write open recovers it)."""
    if not os.path.isdir(store_path):
        raise WalkvError(f"{store_path} is not a walkv store (no such directory)")
    session = read_session(lmdb_dir)
    if session is not None and not session["clean"] and session["boot_id"] != boot_id():
        raise RecoveryNeededError(
            f"{store_path} was open for writing when its machine crashed; its LMDB "
            f"state may be damaged. Open it read-write once to recover it.")
    if session is not None and isinstance(session.get("rebuild"), str):
        raise RecoveryNeededError(f"{store_path}: {session['rebuild']}; open it read-write once to rebuild its state")
    return State(lmdb_dir, options, readonly=True)
