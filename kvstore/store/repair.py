"""Repairing a store's damaged log without losing what its snapshots hold
(``walkv repair``; :func:`repair_store`).

The log alone is not the store: a snapshot holds every write up to its LSN.
So a repair starts from the newest snapshot of this store that verifies
(its manifest, every chunk's checksum; a damaged newer one is passed over,
with the reason) and hands its LSN to :func:`wal.repair` as the base:

* damage at or below the base only takes out log that the snapshot covers
  (the log then starts after the damage, at base + 1 at the latest);
* damage after the base is cut at the first bad record; with ``salvage``
  every intact entry after it is kept as well, each lost LSN standing as
  an empty batch (a valid entry that writes nothing: :mod:`kvstore.entry.codec`).

Then the state. LMDB is a cache of "newest snapshot + log" and is rebuilt,
not trusted, whenever it may hold writes the log no longer has:

* when the repair took out or filled in LSNs after the base, LMDB may have
  applied them, and :func:`~kvstore.store.recovery.check_state` cannot tell
  when the log is as long as before: its SESSION record is marked
  ``rebuild``, so the next open rebuilds it from the newest good snapshot
  plus the log (and a read-only open refuses until then);
* when it only took out log at or below the base, LMDB agrees with the log
  as it is: an applied LSN within the log is replayed from, one before its
  new start is rebuilt from the snapshot (``check_state``).

The caller holds the store's lock and the log's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import snapshot
import wal
from kvstore.entry.codec import encode
from kvstore.layout import StoreLayout
from kvstore.store import recovery
from kvstore.store.snapshots import own_snapshots
from wal.errors import CorruptionError, SnapshotError
from wal.fs import OS_FS, FileSystem
from wal.salvage import log_store_id
from wal.timeline import ROOT

log = logging.getLogger("walkv.repair")

FILLER = encode([])
"""The payload standing for a lost LSN when salvaging: an empty batch."""


@dataclass
class StoreRepair:
    """What :func:`repair_store` found and did: the log's report, the
    snapshot the state comes from (``None``: none, the log alone), the
    newer snapshots passed over and why, and whether LMDB is to be rebuilt
    at the next open."""

    log: wal.RepairReport
    snapshot: snapshot.SnapshotInfo | None = None
    passed_over: list[str] = field(default_factory=list)
    rebuild: bool = False


def newest_good_snapshot(store_path: str, store_id: str | None) -> tuple[snapshot.Snapshot | None, list[str]]:
    """The newest snapshot of the store ``store_id`` that verifies, and why
    each newer one does not count."""
    passed: list[str] = []
    for info in reversed(own_snapshots(StoreLayout.of(store_path).snapshots_dir, store_id)):
        try:
            snap = snapshot.open(info.path)
            snap.verify()
        except (CorruptionError, SnapshotError) as e:
            passed.append(f"{info.path}: {e}")
            continue
        return snap, passed
    return None, passed


def repair_store(store_path: str | None, wal_dir: str, *, salvage: bool = False, dry_run: bool = False,
                 fs: FileSystem = OS_FS) -> StoreRepair:
    """Repair the log at ``wal_dir`` of the store at ``store_path``
    (``None``: a bare log directory, with no snapshots or state) from its
    newest good snapshot (module docstring)."""
    store_id = log_store_id(wal_dir)
    snap, passed = newest_good_snapshot(store_path, store_id) if store_path is not None else (None, [])
    base = snap.lsn if snap is not None else 0
    lmdb_dir = StoreLayout.of(store_path).lmdb_dir if store_path is not None else None
    rebuild = False

    def mark_state(report: wal.RepairReport) -> None:
        """Before the log changes (so that no crash leaves LMDB trusted
        with writes the log lost): mark LMDB to be rebuilt."""
        nonlocal rebuild
        rebuild = bool(report.lost) and lmdb_dir is not None and os.path.exists(os.path.join(lmdb_dir, "data.mdb"))
        if rebuild and not dry_run:
            assert lmdb_dir is not None
            session = recovery.read_session(lmdb_dir)
            why = (f"`walkv repair` took LSNs {describe(report.lost)} out of the log; the state is rebuilt from "
                   + (f"the snapshot at LSN {base}" if base else "the log") + " and the log after it")
            recovery.write_session(lmdb_dir, session["store_id"] if session else (store_id or ""), clean=False,
                                   history=recovery.session_history(session) or ROOT, fs=fs, rebuild=why)
            log.warning("%s: %s", store_path, why)

    report = wal.repair(wal_dir, fs=fs, dry_run=dry_run, lock=False, base_lsn=base,
                        filler=FILLER if salvage else None,
                        store_id=store_id or (snap.store_id if snap is not None else None), before_change=mark_state)
    if dry_run and report.cut:
        mark_state(report)
    return StoreRepair(report, snap.info if snap is not None else None, passed, rebuild)


def describe(ranges: list[tuple[int, int]]) -> str:
    """``[(3, 3), (5, 9)]`` as ``"3, 5..9"``."""
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in ranges)
