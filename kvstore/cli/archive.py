"""``walkv archive``, ``walkv archive-ls``, ``walkv archive-verify``: a store's
log and snapshots off the machine (:mod:`kvstore.archive`).

* ``archive STORE URI``: the sidecar archiver. Ships what the store's
  ``DURABLE`` marker says is durable (the writer may be another process),
  every ``--interval`` seconds, until SIGINT or SIGTERM (then one last round
  and the lease released); ``--once`` ships once and exits. Lag and errors
  go to stderr when they change. Exit 3 when another archiver holds the
  archive's lease. It publishes the archived LSN in ``STORE/ARCHIVED``
  (:mod:`kvstore.archive.marker`), which bounds the writer's local log retention
  (delete that file when you stop archiving the store for good).
* ``archive-ls URI``: the archive's store id, its timelines (each one's
  lineage and the LSNs it reaches), the LSN and time range the followed
  lineage covers (the latest, or ``--timeline``), its objects and snapshots.
* ``archive-verify URI``: every object's CRCs, LSNs and store id, the log's
  continuity, every snapshot's checksums. Exit 4 when anything is damaged.

URIs are shown with credentials redacted, always.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import threading
from typing import Any

from kvstore.archive import Archiver, ArchiveReader
from kvstore.archive.layout import LogObject, TimelineId
from kvstore.archive.marker import publish_archived
from kvstore.archive.objects import lineage_chain
from kvstore.cli.common import EXIT_CORRUPT, EXIT_OK, AddCommand, human_bytes, print_table, require_store
from kvstore.cli.progress import Reporter
from kvstore.layout import StoreLayout
from wal.errors import CorruptionError
from wal.fs import OS_FS


def add_commands(add: AddCommand) -> None:
    p = add("archive", "ship a store's log and snapshots to an archive (S3, GCS, HDFS, file://, a directory)",
            cmd_archive,
            description="Ship what is durable in STORE (written by this or another process) to the archive at "
                        "URI, as immutable objects, every --interval seconds until SIGINT/SIGTERM, or once "
                        "with --once. Resumes from what the archive holds. Exit 3 when another archiver "
                        "writes the same archive.")
    p.add_argument("store", metavar="STORE")
    p.add_argument("uri", metavar="URI")
    p.add_argument("--once", action="store_true", help="ship what is durable now, then exit")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between rounds (default 1)")
    p.add_argument("--keep-snapshots", type=int, default=None, metavar="N",
                   help="archive retention: keep the newest N snapshots and the log after the oldest of them")
    p.add_argument("--keep-seconds", type=float, default=None, metavar="S",
                   help="archive retention: keep snapshots younger than S seconds (and the log they need)")

    p = add("archive-ls", "list an archive: store id, timelines, LSN and time range, objects, snapshots",
            cmd_archive_ls)
    p.add_argument("uri", metavar="URI")
    p.add_argument("--json", action="store_true", help="the listing as JSON")
    timeline_arg(p)

    p = add("archive-verify", "check every object and snapshot of an archive (exit 4 on damage)",
            cmd_archive_verify)
    p.add_argument("uri", metavar="URI")
    p.add_argument("--json", action="store_true", help="the problems as JSON")


def _lag_line(st: dict[str, Any]) -> str:
    text = (f"archived LSN {st['archived_lsn']} of {st['durable_lsn']} durable "
            f"(lag {st['lag_lsns']} entries, {st['lag_seconds']:.1f} s; {st['uploads']} uploads, "
            f"{human_bytes(st['bytes'])})")
    if st["failing"]:
        text += f"; failing: {st['last_error']}"
    return text


def cmd_archive(args: argparse.Namespace, rep: Reporter) -> int:
    require_store(args.store)
    store = os.path.abspath(args.store)
    archiver = Archiver(store, args.uri, interval=args.interval, keep_snapshots=args.keep_snapshots,
                        keep_seconds=args.keep_seconds, on_archived=lambda lsn: publish_archived(store, lsn))
    archiver.target.require_directory()  # a file in the way: say so now, not at every retry
    if args.once:
        lsn = archiver.ship_once()
        archiver.stop()
        if archiver.failed is not None:
            raise archiver.failed
        print(f"archived {args.store} to {archiver.uri} up to LSN {lsn}")
        if not args.quiet:
            print(f"walkv: {_retention_note(store, lsn)}", file=sys.stderr)
        return EXIT_OK
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        archiver.start()
        rep.console_print(f"walkv: archiving {args.store} to {archiver.uri} (SIGINT or SIGTERM stops)")
        shown = ""
        while not stop.wait(max(args.interval, 0.5)):
            if archiver.failed is not None:
                break
            line = _lag_line(archiver.stats())
            if line != shown and not args.quiet:
                rep.console_print(f"walkv: {line}")
                shown = line
    finally:
        archiver.stop()
        for s, h in old.items():
            signal.signal(s, h)
    if archiver.failed is not None:
        raise archiver.failed
    if not args.quiet:
        st = archiver.stats()
        print(f"walkv: stopped; {_lag_line(st)}", file=sys.stderr)
        print(f"walkv: {_retention_note(store, st['archived_lsn'])}", file=sys.stderr)
    return EXIT_OK


def _retention_note(store: str, lsn: int) -> str:
    """What ``STORE/ARCHIVED`` (left behind by the sidecar) does to the
    writer's local retention from now on (:mod:`kvstore.archive.marker`)."""
    marker = StoreLayout(OS_FS, store).archived_path
    return (f"{marker} says LSN {lsn}: the store's writer keeps every log segment past it (local retention "
            "waits for the archive) until an archiver publishes more; archive again (or run `walkv archive` "
            f"without --once), or delete {marker} when you stop archiving this store")


def _time(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc).isoformat(timespec="milliseconds")


def timeline_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeline", default=None, metavar="T",
                   help="the archive's timeline whose lineage to follow: 'latest' (the default: the highest "
                        "number), a number N, or N:UID (as archive-ls shows them)")


def _timelines(reader: ArchiveReader, objects: list[LogObject], followed: TimelineId) -> list[dict[str, Any]]:
    """Each timeline of the archive: where it begins, its parent, the LSNs its lineage reaches."""
    out = []
    for tid in sorted(reader.timelines.listed().timelines):
        row: dict[str, Any] = {"timeline": tid.timeline, "uid": f"{tid.uid:x}", "followed": tid == followed}
        try:
            lineage = reader.timelines.lineage(tid)
        except CorruptionError as e:
            row["error"] = str(e)
            out.append(row)
            continue
        c = lineage_chain(objects, lineage)
        parent = lineage[-2] if len(lineage) > 1 else None
        row.update(first_lsn=lineage[-1].first_lsn, parent=None if parent is None else parent.timeline,
                   parent_uid=None if parent is None else f"{parent.uid:x}",
                   log_first_lsn=c.first, log_last_lsn=c.last, paths=[o.path for o in c.objects])
        out.append(row)
    return out


def _timeline_row(t: dict[str, Any]) -> tuple[str, str]:
    name = f"timeline {t['timeline']}" + (f":{t['uid']}" if t["uid"] != "0" else "")
    if "error" in t:
        return name, f"DAMAGED: {t['error']}"
    text = f"LSNs {t['log_first_lsn']}..{t['log_last_lsn']}" if t["log_last_lsn"] else "no LSN yet"
    if t["parent"] is not None:
        text += f"; begins at LSN {t['first_lsn']}, forked from timeline {t['parent']}" + (
            f":{t['parent_uid']}" if t["parent_uid"] != "0" else "")
    return name, text + ("  (followed)" if t["followed"] else "")


def cmd_archive_ls(args: argparse.Namespace, rep: Reporter) -> int:
    reader = ArchiveReader(args.uri, timeline=args.timeline)
    objects = reader.log_objects()
    followed = reader.history[-1]
    reader.choice = TimelineId.of(followed)
    timelines = _timelines(reader, objects, reader.choice)
    on_chains = {p for t in timelines for p in t.pop("paths", [])}
    c = reader.chain()
    first_time = last_time = None
    if c.objects:
        for e in reader.read_entries(c.first, c.first):
            first_time = e.timestamp_us
        for e in reader.read_entries(c.objects[-1].first, c.last):
            last_time = e.timestamp_us
    snaps = reader.snapshots()
    out = {
        "uri": reader.uri, "store_id": reader.store_id, "timelines": timelines,
        "log": {"timeline": followed.timeline, "timeline_uid": f"{followed.uid:x}", "first_lsn": c.first,
                "last_lsn": c.last, "first_time": _time(first_time), "last_time": _time(last_time),
                "objects": len(c.objects), "redundant_objects": sum(o.path not in on_chains for o in objects),
                "bytes": sum(o.size for o in objects), "gap_after_lsn": c.last if c.gap_after is not None else None},
        "snapshots": [{"lsn": s.lsn, "count": s.count, "bytes": s.bytes, "created": _time(s.created_us)}
                      for s in snaps],
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    lg = out["log"]
    assert isinstance(lg, dict)
    print(f"archive {reader.uri} (store {reader.store_id})")
    if len(timelines) > 1:
        print("timelines:")
        print_table([_timeline_row(t) for t in timelines])
    rows = [("log LSNs", f"{lg['first_lsn']}..{lg['last_lsn']}" if c.objects else "none"),
            ("log times", f"{lg['first_time']} .. {lg['last_time']}" if c.objects else "-"),
            ("log objects", f"{lg['objects']} ({lg['redundant_objects']} redundant), {human_bytes(lg['bytes'])}")]
    if c.gap_after is not None:
        rows.append(("GAP", f"no object holds LSN {c.last + 1}; more objects from LSN {c.next_first}"))
    print_table(rows)
    print("snapshots:" if snaps else "snapshots: none")
    print_table([(f"LSN {s.lsn}", f"{s.count} keys, {human_bytes(s.bytes)}, {_time(s.created_us)}") for s in snaps])
    return EXIT_OK


def cmd_archive_verify(args: argparse.Namespace, rep: Reporter) -> int:
    reader = ArchiveReader(args.uri, checking=True)
    with rep.task("verifying the archive", unit="bytes") as progress:
        problems = reader.verify(progress)
    if args.json:
        print(json.dumps({"uri": reader.uri, "ok": not problems,
                          "problems": [{"object": p.path, "offset": p.offset, "lsn": p.lsn,
                                        "kind": p.kind.value, "message": p.message} for p in problems]}, indent=2))
    else:
        for p in problems:
            print(p)
        print(f"archive {reader.uri}: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
    return EXIT_CORRUPT if problems else EXIT_OK
