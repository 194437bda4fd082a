"""The consumers a store's log retention waits for, as files any process can
write: named subscriptions and live holds.

Layout of ``STORE/subscriptions/``::

    sub-<name>.json    a named, durable subscription (:mod:`kvstore.watch.subscription`)
    sub-<name>.json.lock  flock'd around each update of it (wal.lock.held), so an
                       acknowledgement and an invalidation never undo each other
    live-<id>/LOCK     a live consumer in another process (a replica following the
    live-<id>/NEXT     store): it holds LOCK (wal.lock) while it runs; NEXT is the
                       first LSN it still needs, as decimal text
    new-<id>/          a live hold being made: renamed to live-<id> once locked,
                       with NEXT written (so retention never takes a hold being
                       made for a dead one's)

A subscription record is JSON ``{"format": 1, "name", "next": [lsn, skip],
"prefix", "start", "stop", "created_us", "invalidated", "history", "forked"}``:
its consumer has handled every change before LSN ``lsn`` and the first
``skip`` changes of ``lsn`` (a batch is several changes at one LSN); the key
range is hex (null: none); ``invalidated`` is null or why retention, or a
fork, made it unusable. ``history`` is the timeline history the acknowledged
position is on (:func:`wal.timeline.history_to_json`, up to the timeline of
LSN ``lsn - 1``), because an LSN alone does not say which entry it was: after
a repair that cut, or a failover, the same LSNs hold other entries, and a
position past that fork is invalid (:mod:`kvstore.watch.subscription`). A
record without it was written before timelines and reads as timeline 1.
``forked`` is null, or ``{"fork_lsn", "mine", "theirs"}`` when a fork
invalidated it (its error names both timelines). Both fields are optional
so that records of either version read in either. Every
record is replaced whole by a rename, so a reader sees the old one or the
new one; acknowledgements are not fsynced (they survive a crash of any
process; a crash of the machine may take the newest back, so a consumer sees
those changes again: at least once). Creating and dropping fsync the directory.

Why files and not the log or LMDB: a consumer in a ``readonly=True`` process
(and over the network, later) acknowledges without the writer, and the
writer's retention reads every position when it trims, from any process.

Retention (:func:`retention_floor`, called by the writer after each
snapshot) keeps every segment a consumer still needs: named subscriptions,
live holds whose LOCK is still held (a dead holder's directory is removed),
and the writer's own live watchers. A bound, ``max_retained_bytes``, stops it
from growing without limit because of a consumer that went away (as
PostgreSQL's ``max_slot_wal_keep_size`` does for replication slots): a named
subscription that would keep more log than that is invalidated, visibly (its
record says why; its consumer gets :class:`~wal.errors.SubscriptionInvalidatedError`
naming it; ``stats()`` lists it); a live hold or watcher past the bound is
not waited for (it meets :class:`~wal.errors.LogGapError` as before).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from kvstore.layout import SUBSCRIPTIONS_DIR, WAL_DIR
from wal.errors import (
    ClosedError,
    LockedError,
    SubscriptionForkedError,
    SubscriptionInvalidatedError,
    WalkvError,
)
from wal.fs import OS_FS
from wal.lock import DirectoryLock, held
from wal.segment import SegmentFile, list_segments
from wal.timeline import ROOT, History, TimelineStart, history_from_json, history_to_json

log = logging.getLogger("walkv.subscriptions")

FORMAT = 1
DEFAULT_MAX_RETAINED_BYTES = 1 << 30
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SUB_PREFIX, _SUB_SUFFIX, _LIVE_PREFIX, _NEXT_NAME = "sub-", ".json", "live-", "NEXT"
_NEW_PREFIX = "new-"
_NEW_GONE_SECONDS = 600.0  # a new-<id> directory this old, and unlocked, was left by a holder that died making it


class Fork(NamedTuple):
    """Where the store's history left the timeline of a subscription's
    acknowledged changes: ``mine`` that timeline, ``theirs`` the store's
    after ``fork_lsn``."""

    fork_lsn: int
    mine: TimelineStart
    theirs: TimelineStart


class Record(NamedTuple):
    """A subscription record (module docstring)."""

    name: str
    next_lsn: int
    skip: int
    prefix: bytes | None
    start: bytes | None
    stop: bytes | None
    created_us: int
    invalidated: str | None
    history: History = ROOT
    forked: Fork | None = None


class SubscriptionInfo(NamedTuple):
    """``db.subscriptions()``: a subscription, where it is and how far behind."""

    name: str
    acked_lsn: int        # every change up to this LSN is acknowledged
    lag_lsns: int         # durable LSNs after it
    lag_bytes: int        # log bytes retention keeps for it
    invalidated: str | None


def directory(store_path: str) -> str:
    return os.path.join(store_path, SUBSCRIPTIONS_DIR)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"a subscription name is 1-100 letters, digits, '.', '_' or '-' (starting with a "
                         f"letter or digit), not {name!r}")
    return name


def _record_path(store_path: str, name: str) -> str:
    return os.path.join(directory(store_path), _SUB_PREFIX + name + _SUB_SUFFIX)


def _hex(b: bytes | None) -> str | None:
    return None if b is None else b.hex()


def _unhex(s: Any) -> bytes | None:
    return None if s is None else bytes.fromhex(s)


def read(store_path: str, name: str) -> Record | None:
    """The record of subscription ``name``, or None when there is none."""
    path = _record_path(store_path, name)
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read(1 << 16))
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}")
        lsn, skip = raw["next"]
        history = ROOT if raw.get("history") is None else history_from_json(raw["history"], "history")
        forked = raw.get("forked")
        if forked is not None:
            mine, theirs = (history_from_json([forked[k]], k)[0] for k in ("mine", "theirs"))
            forked = Fork(int(forked["fork_lsn"]), mine, theirs)
        return Record(raw["name"], int(lsn), int(skip), _unhex(raw["prefix"]), _unhex(raw["start"]),
                      _unhex(raw["stop"]), int(raw["created_us"]), raw["invalidated"], history, forked)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise WalkvError(f"{path} is not a walkv subscription record ({exc}); drop the subscription "
                         f"(`walkv subscriptions STORE --drop {name}`) and create it again") from None


def write(store_path: str, rec: Record, *, new: bool = False) -> None:
    """Replace the record whole (module docstring); ``new``: make its name durable."""
    parent = directory(store_path)
    if new:
        OS_FS.makedirs(parent)
    forked = rec.forked
    data = json.dumps({"format": FORMAT, "name": rec.name, "next": [rec.next_lsn, rec.skip],
                       "prefix": _hex(rec.prefix), "start": _hex(rec.start), "stop": _hex(rec.stop),
                       "created_us": rec.created_us, "invalidated": rec.invalidated,
                       "history": history_to_json(rec.history),
                       "forked": None if forked is None else {
                           "fork_lsn": forked.fork_lsn, "mine": history_to_json([forked.mine])[0],
                           "theirs": history_to_json([forked.theirs])[0]}}).encode()
    path = _record_path(store_path, rec.name)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as f:
        f.write(data)
        if new:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if new:
        OS_FS.fsync_dir(parent)


def update(store_path: str, name: str, change: Callable[[Record], Record | None]) -> Record:
    """Read the record of ``name``, and write ``change(record)`` unless it
    returns None, with no other update in between (by any process): an
    acknowledgement and an invalidation never undo each other. ClosedError
    when the subscription was dropped; the record as it is now on return."""
    with held(_record_path(store_path, name) + ".lock"):
        rec = read(store_path, name)
        if rec is None:
            raise ClosedError(f"the subscription {name!r} of {store_path} was dropped")
        new = change(rec)
        if new is not None:
            write(store_path, new)
            return new
        return rec


def drop(store_path: str, name: str) -> bool:
    """Remove subscription ``name``; False when there was none."""
    path = _record_path(store_path, check_name(name))
    try:
        with held(path + ".lock"):
            os.unlink(path)
    except FileNotFoundError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + ".lock")
    OS_FS.fsync_dir(directory(store_path))
    return True


def records(store_path: str) -> list[Record]:
    try:
        names = sorted(os.listdir(directory(store_path)))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if n.startswith(_SUB_PREFIX) and n.endswith(_SUB_SUFFIX):
            rec = read(store_path, n[len(_SUB_PREFIX):-len(_SUB_SUFFIX)])
            if rec is not None:
                out.append(rec)
    return out


def invalidated_error(store_path: str, rec: Record) -> SubscriptionInvalidatedError:
    drop = f"db.drop_subscription({rec.name!r}) or `walkv subscriptions {store_path} --drop {rec.name}`"
    if rec.forked is not None:
        fork = rec.forked.fork_lsn
        return SubscriptionForkedError(
            f"the subscription {rec.name!r} of {store_path} was invalidated: {rec.invalidated}. Those changes "
            f"are in no history the store has now. If what was done with its changes after LSN {fork} can be "
            f"undone, undo it, drop the subscription ({drop}) and subscribe again with from_lsn={fork + 1}; "
            "otherwise drop it and start again from a snapshot (Spark table=snapshot, or "
            "watch(on_gap='snapshot'))", name=rec.name, next_lsn=rec.next_lsn, mine=rec.forked.mine,
            theirs=rec.forked.theirs, fork_lsn=fork)
    return SubscriptionInvalidatedError(
        f"the subscription {rec.name!r} of {store_path} was invalidated: {rec.invalidated}. Its changes "
        f"from LSN {rec.next_lsn} on are no longer kept; drop it ({drop}) and subscribe again, from a snapshot "
        f"(Spark table=snapshot, or watch(on_gap='snapshot')) if it needs every key",
        name=rec.name, next_lsn=rec.next_lsn)


# -- live holds --------------------------------------------------------------------


class LiveHold:
    """A consumer in this process that needs the log from :attr:`next_lsn` on,
    for as long as it runs (module docstring). :meth:`move` is cheap enough to
    call after every step: it rewrites NEXT at most once a second."""

    def __init__(self, store_path: str, next_lsn: int) -> None:
        OS_FS.makedirs(directory(store_path))
        hold_id = uuid.uuid4().hex
        # Made as new-<id>, renamed once locked and with NEXT written (module docstring).
        self.path = os.path.join(directory(store_path), f"{_NEW_PREFIX}{hold_id}")
        OS_FS.makedirs(self.path)
        self._lock: DirectoryLock | None = None
        try:
            self._lock = DirectoryLock(self.path, f"the live consumer {self.path}")
            self.next_lsn = 0
            self._written_at = 0.0
            self.move(next_lsn, force=True)
            live = os.path.join(directory(store_path), f"{_LIVE_PREFIX}{hold_id}")
            os.rename(self.path, live)
            self.path = live
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            self.release()
            raise

    def move(self, next_lsn: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if next_lsn <= self.next_lsn or (not force and now - self._written_at < 1.0):
            return
        nxt = os.path.join(self.path, _NEXT_NAME)
        with open(nxt + ".tmp", "w") as f:
            f.write(f"{next_lsn}\n")
        os.replace(nxt + ".tmp", nxt)
        self.next_lsn, self._written_at = next_lsn, now

    def release(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            shutil.rmtree(self.path, ignore_errors=True)
            lock.release()


def _live_positions(store_path: str) -> list[tuple[str, int]]:
    """``(directory, next LSN)`` of every live hold whose holder runs; the
    directories of dead holders are removed."""
    try:
        names = os.listdir(directory(store_path))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        path = os.path.join(directory(store_path), n)
        if n.startswith(_NEW_PREFIX):
            try:
                if time.time() - os.stat(path).st_mtime < _NEW_GONE_SECONDS:
                    continue  # being made
            except OSError:
                continue
        elif not n.startswith(_LIVE_PREFIX):
            continue
        try:
            probe = DirectoryLock(path)
        except LockedError:
            try:
                with open(os.path.join(path, _NEXT_NAME)) as f:
                    out.append((path, int(f.read(32))))
            except (OSError, ValueError):
                pass  # being created: its holder writes NEXT before it reads anything
            continue
        except OSError:
            continue
        probe.release()
        log.info("removing the hold of a consumer that is gone: %s", path)
        shutil.rmtree(path, ignore_errors=True)
    return out


# -- retention ---------------------------------------------------------------------


def _bytes_from(segments: list[SegmentFile], lsn: int) -> int:
    """Bytes of the sealed segments that hold ``lsn`` or anything after it:
    what retention keeps for a consumer at ``lsn`` (the active segment is
    always kept)."""
    return sum(seg.size for seg, nxt in zip(segments, segments[1:]) if nxt.first_lsn - 1 >= lsn)


def retention_floor(store_path: str, max_retained_bytes: int, watchers: Iterable[int] = ()) -> int | None:
    """The lowest LSN the log must keep for its consumers (None: none needs
    any), after invalidating the named subscriptions past the bound (module
    docstring). ``watchers``: the next LSNs of this process's live watchers."""
    segments = list_segments(os.path.join(store_path, WAL_DIR))
    needs: list[int] = []

    def within(lsn: int, who: str) -> bool:
        kept = _bytes_from(segments, lsn)
        if kept <= max_retained_bytes:
            return True
        log.warning("%s needs the log of %s from LSN %d (%d bytes), past max_retained_bytes=%d: not kept for it",
                    who, store_path, lsn, kept, max_retained_bytes)
        return False

    for rec in records(store_path):
        if rec.invalidated is not None:
            continue
        if within(rec.next_lsn, f"the subscription {rec.name!r}"):
            needs.append(rec.next_lsn)
            continue

        def invalidate(now: Record) -> Record | None:
            if now.invalidated is not None or _bytes_from(segments, now.next_lsn) <= max_retained_bytes:
                return None  # acknowledged meanwhile, or invalidated already
            return now._replace(invalidated=f"it needed the log from LSN {now.next_lsn} on "
                                            f"({_bytes_from(segments, now.next_lsn)} bytes), past "
                                            f"max_retained_bytes={max_retained_bytes}")
        try:
            now = update(store_path, rec.name, invalidate)
        except ClosedError:
            continue  # dropped meanwhile
        if now.invalidated is None:
            needs.append(now.next_lsn)
    for path, lsn in _live_positions(store_path):
        if within(lsn, f"the live consumer {path}"):
            needs.append(lsn)
    for lsn in watchers:
        if within(lsn, "a watcher of this process"):
            needs.append(lsn)
    return min(needs) if needs else None


def infos(store_path: str, durable_lsn: int) -> list[SubscriptionInfo]:
    """Every named subscription, with its lag (module docstring)."""
    segments = list_segments(os.path.join(store_path, WAL_DIR))
    out = []
    for rec in records(store_path):
        acked = rec.next_lsn - 1
        out.append(SubscriptionInfo(rec.name, acked, max(0, durable_lsn - acked),
                                    _bytes_from(segments, rec.next_lsn) if acked < durable_lsn else 0,
                                    rec.invalidated))
    return out
