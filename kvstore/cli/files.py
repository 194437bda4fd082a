"""``walkv verify`` and ``walkv repair``: the files themselves.

These commands read segment, index and snapshot files directly, through the
``wal`` and ``snapshot`` packages' readers (never a second framing
implementation), so they work on a store that will not open.
(``walkv inspect`` is :mod:`kvstore.cli.inspection`.)

* ``verify STORE``: every CRC, segment header and LSN of the log, the sparse
  indexes against their segments, every log entry's batch encoding, every
  snapshot's chunks and checksums, and that the log still covers everything
  after the newest snapshot. It reads only, so it may run beside a writer.
  A snapshot of another store (its manifest's store id is not the log's) is
  reported as a problem naming both ids and counts for nothing.
  Exit 0 only when all is well, 4 when something is corrupt, 1 for other
  problems (a damaged index, which the next open rebuilds).
* ``repair STORE``: shows what :func:`kvstore.store.repair.repair_store`
  would do (the first bad record, the newest snapshot that verifies, which
  LSNs the log keeps, which are taken out because that snapshot holds them,
  and which writes are lost; what is taken out is kept in ``.broken``
  files), asks, then repairs; ``--salvage`` keeps every intact entry after
  the damage too. It holds the store's lock (``STORE/LOCK``, then
  ``STORE/wal/LOCK``) meanwhile, as a writer would, so that no writer can
  open the store under it. Then, for a store, it opens it read-write once
  (the lock let go first), so that its state is rebuilt now and every
  command reads the repaired store; on a whole log whose state a read-only
  open refuses (marked for a rebuild, a writer's machine crash) it does only
  that. Exit 0 when the log was whole or is repaired, 1 for a dry run or a
  refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from kvstore.cli.common import (
    EXIT_CORRUPT,
    EXIT_OK,
    EXIT_PROBLEM,
    AddCommand,
    CliError,
    human_bytes,
    require_store,
)
from kvstore.cli.progress import Reporter
from kvstore.layout import StoreLayout
from wal import SegmentFile
from wal.errors import CorruptionError, Damage, DamageReport, RecordOverLimitError, RecoveryNeededError, WalkvError
from wal.lock import DirectoryLock

if TYPE_CHECKING:
    from kvstore.store.repair import StoreRepair


def add_commands(add: AddCommand) -> None:
    p = add("verify", "check every CRC, LSN, header, index and snapshot of a store or an archive", cmd_verify,
            description="Read every file of a store and check it: log records (CRC), segment headers, "
                        "the LSN sequence across segments, sparse indexes, the batch encoding of "
                        "every entry, snapshot chunks, counts and checksums, and that the log covers "
                        "everything after the newest snapshot. Safe beside a running writer. "
                        "Exit 0 when all is well, 4 when something is corrupt, 1 for other problems. "
                        "Given an archive (a URI, or a directory holding an ARCHIVE object) it checks it "
                        "as `walkv archive-verify` does.")
    p.add_argument("store", metavar="STORE", help="a store, or an archive URI or directory")
    p.add_argument("--json", action="store_true", help="the report as JSON")

    p = add("repair", "repair a damaged log, keeping all its newest good snapshot holds (after asking)",
            cmd_repair,
            description="Find the first bad record in the log and the newest snapshot that verifies, "
                        "show what would change, ask, then repair. Damage at or below the snapshot's LSN "
                        "only takes out log the snapshot covers (the log then starts after the damage); "
                        "damage after it is cut at the first bad record, or with --salvage every intact "
                        "entry after it is kept too. Everything taken out is kept in .broken files next "
                        "to the segments; the report names the LSNs lost. The next open rebuilds the "
                        "state from that snapshot plus the log when it holds writes the log no longer "
                        "has. Refuses while another process has the store open (exit 3).")
    p.add_argument("store", metavar="STORE", help="a store (or a bare log directory)")
    p.add_argument("--yes", "-y", action="store_true", help="repair without asking")
    p.add_argument("--dry-run", action="store_true", help="only show what would change")
    p.add_argument("--salvage", action="store_true",
                   help="keep every intact entry after the damage too; each lost LSN stays as an empty entry")


# -- verify ----------------------------------------------------------------------------


def verify_store(path: str, rep: Reporter) -> dict[str, Any]:
    """Check everything; return ``{"store", "problems": [DamageReport...], "checked": {...}}``."""
    import wal

    layout = require_store(path)
    segs = wal.list_segments(layout.wal_dir)
    checked: dict[str, Any] = {"segments": 0, "log_segments": len(segs), "entries": 0,
                               "log_bytes": sum(s.size for s in segs),
                               "snapshots": 0, "snapshot_pairs": 0, "indexes": 0}
    problems = _verify_framing(layout.wal_dir, segs, rep)
    bad_file = next((p.path for p in problems if p.severity == "corrupt"), None)
    problems += _verify_entries(segs, bad_file, checked, rep)
    durable = wal.read_durable_lsn(layout.wal_dir)
    checked["first_lsn"] = segs[0].first_lsn if segs else None
    checked["durable_lsn"] = durable
    try:
        store_id = wal.read_store_id(layout.wal_dir) if segs else None
    except CorruptionError:
        store_id = None  # a damaged header: reported by the framing check
    snap_problems, snap_lsns = _verify_snapshots(layout, store_id, checked, rep)
    problems += snap_problems
    checked["snapshot_lsns"] = snap_lsns

    # The log covers everything after the newest valid snapshot.
    if segs:
        first = segs[0].first_lsn
        newest = max(snap_lsns, default=0)
        if first > newest + 1:
            problems.append(DamageReport(
                layout.wal_dir, None, newest + 1, Damage.MISSING,
                f"the log starts at LSN {first} but the newest valid snapshot is at LSN {newest}: "
                f"LSNs {newest + 1}..{first - 1} are gone"))
        if durable is not None and snap_lsns and max(snap_lsns) > durable:
            problems.append(DamageReport(
                layout.snapshots_dir, None, None, Damage.SEQUENCE,
                f"the newest snapshot is at LSN {max(snap_lsns)}, past the log's durable LSN {durable} "
                f"(`walkv repair {path}` makes the log start after it)", "problem"))
    return {"store": layout.root, "problems": problems, "checked": checked}


def _verify_framing(wal_dir: str, segs: list[SegmentFile], rep: Reporter) -> list[DamageReport]:
    """Framing, headers and the LSN sequence, by the rules open and repair
    use (``wal.repair``'s look, which changes nothing); and damaged sparse
    indexes, which the next open rebuilds."""
    import wal
    from wal.segment import index_path

    problems: list[DamageReport] = []
    if not segs:
        problems.append(DamageReport(wal_dir, None, None, Damage.MISSING, "the log has no segment files"))
    with rep.task("verifying log records", unit="segments"):
        try:
            found = wal.repair(wal_dir, dry_run=True, lock=False)
        except RecordOverLimitError as e:  # whole, so not damage: reported, never cut
            return problems + [DamageReport(e.path, e.offset, None, Damage.TOO_LARGE, str(e), "problem")]
    if found.cut:
        assert found.kind is not None
        problems.append(DamageReport(found.path, found.offset, None, found.kind,
                                     f"{found.reason} (last good LSN {found.last_good_lsn})"))
    for seg in segs:
        idx = index_path(seg.path)
        if os.path.exists(idx) and wal.read_index(seg.path) is None:
            problems.append(DamageReport(idx, None, None, Damage.CONTENT,
                                         "damaged sparse index (rebuilt at next open)", "problem"))
    return problems


def _verify_entries(segs: list[SegmentFile], bad_file: str | None, checked: dict[str, Any],
                    rep: Reporter) -> list[DamageReport]:
    """Every entry's payload is a walkv batch, and each sparse index agrees
    with its segment; up to the first bad record (past it nothing is
    trusted, and it was reported already): the segment holding it is read
    (and counted) up to it, later ones are not."""
    import wal
    from kvstore.entry.codec import decode
    from wal.record_reader import RecordReader
    from wal.segment import decode_entry, index_path, read_header

    problems: list[DamageReport] = []
    total = checked["log_bytes"]
    done = 0
    with rep.task("verifying entries and indexes", total, "bytes") as progress:
        for i, seg in enumerate(segs):
            if checked["segments"] and segs[i - 1].path == bad_file:
                break  # read up to its first bad record: past it nothing is trusted
            checked["segments"] += 1
            index = wal.read_index(seg.path)
            points = dict(index.points) if index is not None else {}
            last = None
            with open(seg.path, "rb") as fh:
                try:
                    limit = read_header(fh, seg.path)[0].max_record_bytes  # the limit the log was written with
                    reader = RecordReader(fh, path=seg.path, start_offset=0, zeros_end=True, max_record_bytes=limit)
                    for offset, payload in reader.records():
                        if offset == 0:
                            continue  # the segment header
                        entry = decode_entry(payload, seg.path, offset)
                        last = entry.lsn
                        checked["entries"] += 1
                        if points.get(entry.lsn, offset) != offset:
                            problems.append(DamageReport(
                                index_path(seg.path), offset, entry.lsn, Damage.CONTENT,
                                f"sparse index says LSN {entry.lsn} is at offset {points[entry.lsn]}", "problem"))
                            points = {}
                        try:
                            decode(entry.payload, entry.lsn)
                        except CorruptionError as e:
                            problems.append(DamageReport(seg.path, offset, entry.lsn, e.kind,
                                                         f"entry is not a walkv batch: {e.reason}"))
                except CorruptionError:
                    pass  # framing problems: _verify_framing reported them
            if index is not None:
                checked["indexes"] += 1
                is_last = i == len(segs) - 1
                next_first = segs[i + 1].first_lsn if not is_last else None
                if index.first_lsn != seg.first_lsn or (next_first is not None and index.last_lsn != next_first - 1) \
                        or (last is not None and not is_last and index.last_lsn != last and seg.path != bad_file):
                    problems.append(DamageReport(
                        index_path(seg.path), None, None, Damage.SEQUENCE,
                        f"sparse index covers LSNs {index.first_lsn}..{index.last_lsn}, the segment holds "
                        f"{seg.first_lsn}..{last}", "problem"))
                elif index.data_end > seg.size:
                    problems.append(DamageReport(index_path(seg.path), None, None, Damage.CONTENT,
                                                 "sparse index ends past the segment's end", "problem"))
            done += seg.size
            progress(done, total)
    return problems


def _verify_snapshots(layout: StoreLayout, store_id: str | None, checked: dict[str, Any],
                      rep: Reporter) -> tuple[list[DamageReport], list[int]]:
    """Every committed snapshot directory, valid or not; returns the problems
    and the LSNs of the valid ones of this store (``store_id``: the log's)."""
    import snapshot

    problems: list[DamageReport] = []
    snap_lsns = []
    names = sorted(os.listdir(layout.snapshots_dir)) if os.path.isdir(layout.snapshots_dir) else []
    for name in names:
        lsn = snapshot.parse_snapshot_dir_name(name)
        if lsn is None:
            continue
        sp = os.path.join(layout.snapshots_dir, name)
        try:
            snap = snapshot.open(sp)
            if store_id is not None and snap.store_id not in (None, store_id):
                problems.append(DamageReport(
                    sp, None, lsn, Damage.HEADER,
                    f"snapshot belongs to store {snap.store_id}, not to this store {store_id} (the log's): "
                    "left by another store at the same path; it is never used (delete it, or move it aside)",
                    "problem"))
                continue
            with rep.task(f"verifying snapshot {lsn}", snap.info.bytes, "bytes") as progress:
                snap.verify(progress)
        except CorruptionError as e:
            problems.append(DamageReport.of(e, sp))
            continue
        except WalkvError as e:
            problems.append(DamageReport(sp, None, None, Damage.CONTENT, str(e)))
            continue
        checked["snapshots"] += 1
        checked["snapshot_pairs"] += snap.info.count
        snap_lsns.append(lsn)
    return problems, snap_lsns


def cmd_verify(args: argparse.Namespace, rep: Reporter) -> int:
    from kvstore.replica.point_in_time import is_archive

    if is_archive(args.store):  # a URI or an archive directory: `walkv archive-verify`
        from kvstore.cli.archive import cmd_archive_verify

        return cmd_archive_verify(argparse.Namespace(uri=args.store, json=args.json), rep)
    t0 = time.monotonic()
    result = verify_store(args.store, rep)
    problems: list[DamageReport] = result["problems"]
    c = result["checked"]
    result["seconds"] = round(time.monotonic() - t0, 3)
    if args.json:
        result["problems"] = [{"severity": p.severity, "file": p.path, "offset": p.offset, "lsn": p.lsn,
                               "message": p.message} for p in problems]
        print(json.dumps(result, indent=2))
    else:
        of = f" of {c['log_segments']}" if c["segments"] != c["log_segments"] else ""
        stopped = " (the log read up to its first bad record)" if of or any(
            p.severity == "corrupt" for p in problems) else ""
        print(f"{result['store']}: {c['segments']}{of} segments ({human_bytes(c['log_bytes'])}), "
              f"{c['entries']} entries{stopped}, {c['indexes']} indexes, {c['snapshots']} snapshots "
              f"({c['snapshot_pairs']} pairs) checked in {result['seconds']:.2f} s")
        if not problems:
            print("ok: no problems found")
        for p in problems:
            print(p)
        if any(p.severity == "corrupt" for p in problems):
            print(f"to cut the log at its first bad record: walkv repair {args.store}")
    if any(p.severity == "corrupt" for p in problems):
        return EXIT_CORRUPT
    return EXIT_PROBLEM if problems else EXIT_OK


# -- repair -------------------------------------------------------------------------------


def _log_dir(path: str) -> tuple[str, StoreLayout | None]:
    """(log directory, the store's layout or None for a bare log directory)."""
    import wal

    layout = StoreLayout.of(path)
    if os.path.isdir(layout.wal_dir):
        return layout.wal_dir, layout
    if os.path.isdir(layout.root) and wal.list_segments(layout.root):
        return layout.root, None
    require_store(path)  # raises with the reason
    raise CliError(f"{path} is not a walkv store")  # pragma: no cover


def _show_repair(result: StoreRepair, snapshots_dir: str | None) -> None:
    """What a repair found and will do (or did): the first bad record, the
    snapshot the state comes from, which LSNs the log keeps and which are
    gone, and what is taken out of the log (into .broken files)."""
    from kvstore.store.repair import describe

    report = result.log
    print("first bad record:" if report.path else "the log ends before the newest snapshot:")
    if report.path:
        print(f"  file        {report.path}")
        print(f"  offset      {report.offset}")
    print(f"  problem     {report.reason}")
    for why in result.passed_over:
        print(f"passed over:  {why}", file=sys.stderr)
    if result.snapshot is not None:
        print(f"snapshot:     LSN {result.snapshot.lsn} ({result.snapshot.path}), verified: the state is rebuilt "
              "from it plus the log after it")
    elif snapshots_dir is not None:
        print("snapshot:     none that verifies: the state is rebuilt from the log alone")
    first, last = report.first_lsn, report.last_good_lsn
    held = f"LSNs {first}..{last}" if last is not None and first is not None and last >= first else "no entries"
    print(f"the log:      {held} (continuing at LSN {(last or 0) + 1})")
    print(f"  last good   LSN {last}")
    if report.dropped:
        print(f"taken out:    LSNs {describe([report.dropped])}, before the log's new start: the snapshot holds "
              "their writes")
    if report.lost:
        n = sum(b - a + 1 for a, b in report.lost)
        print(f"lost:         LSNs {describe(report.lost)} ({n} write(s) after the "
              + (f"snapshot at LSN {report.base_lsn}" if report.base_lsn else "start of the log") + ")")
        if report.filled:
            print(f"              LSNs {describe(report.filled)} stay in the log as empty entries, so that the "
                  "intact entries after them keep their LSNs")
        elif report.lost[-1][1] > (last or 0):
            print("              (--salvage keeps the intact entries among them)")
    else:
        print("lost:         nothing: every write the snapshot and the intact log hold is kept")
    print(f"to be cut:    {human_bytes(report.dropped_bytes)} ({report.dropped_bytes} bytes)"
          + (f", and {len(report.rewritten)} segment(s) rewritten" if report.rewritten else ""))
    print("              (what is taken out is kept in .broken files next to the segments)")
    if result.rebuild:
        print("state:        LMDB holds writes the log will not have: the next open rebuilds it")


def cmd_repair(args: argparse.Namespace, rep: Reporter) -> int:
    """The repair (module docstring); then, for a store, one read-write open
    (:func:`_open_once`), so that every command reads the repaired store:
    its state rebuilt when the repair marked it so. A store whose log is
    whole but whose state a read-only open refuses gets that open too."""
    from kvstore.store.repair import repair_store

    log_dir, layout = _log_dir(args.store)
    root = layout.root if layout is not None else None
    locks = []
    try:
        if layout is not None:
            locks.append(DirectoryLock(layout.root, f"the store {layout.root}"))
        locks.append(DirectoryLock(log_dir, f"the log {log_dir}"))
        found = repair_store(root, log_dir, salvage=args.salvage, dry_run=True)
        if not found.log.cut:
            print(f"{log_dir}: the log is whole; nothing to cut")
            unreadable = _state_unreadable(layout) if layout is not None else None
            if unreadable is None:
                return EXIT_OK
            print(f"the state:    {unreadable}")
            if args.dry_run:
                print("dry run: nothing was changed")
                return EXIT_PROBLEM
        elif not _cut(args, found, root, log_dir, layout):
            return EXIT_PROBLEM
        elif layout is None:
            return EXIT_OK  # a bare log directory: no state
    finally:
        for lock in reversed(locks):
            lock.release()
    _open_once(args.store, rep)  # the store's locks are let go: it takes them as any writer
    return EXIT_OK


def _cut(args: argparse.Namespace, found: StoreRepair, root: str | None, log_dir: str,
         layout: StoreLayout | None) -> bool:
    """Show what the repair will do, ask, and do it; whether it was done."""
    from kvstore.store.repair import repair_store

    _show_repair(found, layout.snapshots_dir if layout is not None else None)
    if args.dry_run:
        print("dry run: nothing was changed")
        return False
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not cutting: stdin is not a terminal to ask on; pass --yes to cut")
        answer = input("Repair the log as shown? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing was changed")
            return False
    done = repair_store(root, log_dir, salvage=args.salvage).log
    print(f"repaired {log_dir}: took {done.dropped_bytes} bytes out of the log; the log now ends at LSN "
          f"{done.last_good_lsn} (it holds LSNs {done.first_lsn}..{done.last_good_lsn})")
    for f in done.broken_files:
        print(f"  kept {f}")
    for f in done.rewritten:
        print(f"  wrote {f}")
    return True


def _state_unreadable(layout: StoreLayout) -> str | None:
    """Why a read-only open (``walkv get``, ``scan``, ``stats``) would refuse
    the store's state, which only a read-write open rebuilds or recovers
    (None: it reads it)."""
    import kvstore

    if not os.path.isdir(layout.lmdb_dir):
        return f"it has none yet ({os.path.basename(layout.lmdb_dir)}/ is missing)"
    try:
        kvstore.open(layout.root, readonly=True).close()
    except RecoveryNeededError as e:
        return str(e)
    return None


def _open_once(path: str, rep: Reporter) -> None:
    """Open the store read-write once and close it, so that its state is
    rebuilt (or replayed) now and every command reads it after a repair."""
    from kvstore.cli.common import open_store

    with open_store(path, reporter=rep) as db:
        how = f"rebuilt ({db.rebuilt})" if db.rebuilt else f"brought up to date ({db.replayed} entries replayed)"
        print(f"the state:    {how}; it holds LSNs up to {db.applied_lsn}: every command reads the store now")
