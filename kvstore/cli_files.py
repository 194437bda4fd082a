"""``walkv inspect``, ``walkv verify`` and ``walkv repair``: the files themselves.

These commands read segment, index and snapshot files directly, through the
``wal`` and ``snapshot`` packages' readers (never a second framing
implementation), so they work on a store that will not open.

* ``inspect FILE``: each record of a log segment (or a ``.broken`` piece of
  one, or a snapshot chunk) with its offset, fragment types, LSN, size and a
  summary of its operations; ``--raw`` lists the fragments themselves.
* ``verify STORE``: every CRC, segment header and LSN of the log, the sparse
  indexes against their segments, every log entry's batch encoding, every
  snapshot's chunks and checksums, and that the log still covers everything
  after the newest snapshot. It reads only, so it may run beside a writer.
  Exit 0 only when all is well, 4 when something is corrupt, 1 for other
  problems (a damaged index, which the next open rebuilds).
* ``repair STORE``: shows what ``wal.repair`` would cut (the first bad record
  and everything after it, kept in ``.broken`` files), asks, then cuts. It
  holds the store's lock (``STORE/LOCK``, then ``STORE/wal/LOCK``) meanwhile,
  as a writer would, so that no writer can open the store under it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import time
from typing import Any, Callable, Iterator

from kvstore.cli import (
    EXIT_CORRUPT,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CliError,
    escape_field,
    human_bytes,
    require_store,
    store_dirs,
)
from kvstore.progress import Reporter
from wal.lock import DirectoryLock

_FRAGMENT_NAMES = {1: "FULL", 2: "FIRST", 3: "MIDDLE", 4: "LAST"}


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("inspect", "list the records of a log segment (or snapshot chunk) file", cmd_inspect,
            description="List each record of a log segment with its offset, fragment types, LSN, "
                        "commit time, size and a summary of its operations. Also reads .broken "
                        "files left by repair and snapshot chunk files (.wkc). Damaged records are "
                        "listed as BAD with their byte range and the reading goes on.")
    p.add_argument("segment", metavar="SEGMENT", help="a .wal segment file (or .wal.broken, or .wkc chunk)")
    p.add_argument("--raw", action="store_true", help="list every fragment (offset, type, length, CRC ok)")
    p.add_argument("--limit", type=int, help="stop after this many records")
    p.add_argument("--from-lsn", type=int, help="start listing at this LSN")
    p.add_argument("--ops", action="store_true", help="print every operation, not just a summary")
    p.add_argument("--json", action="store_true", help="one JSON object per record")

    p = add("verify", "check every CRC, LSN, header, index and snapshot of a store", cmd_verify,
            description="Read every file of a store and check it: log records (CRC), segment headers, "
                        "the LSN sequence across segments, sparse indexes, the batch encoding of "
                        "every entry, snapshot chunks, counts and checksums, and that the log covers "
                        "everything after the newest snapshot. Safe beside a running writer. "
                        "Exit 0 when all is well, 4 when something is corrupt, 1 for other problems.")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--json", action="store_true", help="the report as JSON")

    p = add("repair", "cut a damaged log at its first bad record (after asking)", cmd_repair,
            description="Find the first bad record in the log, show what would be cut (that record "
                        "and everything after it, kept in .broken files next to the segments), ask, "
                        "then cut. Entries before the bad record are kept; the LMDB state is rebuilt "
                        "from the remaining log at the next open if it had applied more. Refuses "
                        "while another process has the store open (exit 3).")
    p.add_argument("store", metavar="STORE", help="a store (or a bare log directory)")
    p.add_argument("--yes", "-y", action="store_true", help="cut without asking")
    p.add_argument("--dry-run", action="store_true", help="only show what would be cut")


# -- inspect -------------------------------------------------------------------------


def _fragments(path: str) -> Iterator[tuple[int, int, int, str | None]]:
    """``(offset, type, payload length, problem)`` of every fragment, using
    wal.record's own physical reader (the one framing implementation)."""
    from wal.record import HEADER_SIZE, RecordReader

    with open(path, "rb") as fh:
        reader = RecordReader(fh, path=path, start_offset=0, zeros_end=True)
        frag = getattr(reader, "_fragments", None)
        if frag is None:  # pragma: no cover - wal.record changed
            return
        for offset, ftype, item in frag():
            if ftype in _FRAGMENT_NAMES:
                yield offset, ftype, len(item), None  # type: ignore[arg-type]
            elif ftype == -3:  # a corrupt fragment: (end, reason)
                end, reason = item  # type: ignore[misc]
                yield offset, 0, max(0, end - offset - HEADER_SIZE), reason
            elif ftype == -2:  # torn tail
                yield offset, 0, 0, f"torn tail: {item}"
                return
            else:  # end of data
                return


def _records(path: str) -> Iterator[tuple[str, int, int, Any]]:
    """``("rec", offset, end, payload)`` for each valid record and ``("bad",
    start, end, reason)`` for each damaged range, in file order."""
    from wal.record import RecordReader

    with open(path, "rb") as fh:
        reader = RecordReader(fh, path=path, start_offset=0, zeros_end=True, skip_corrupt=True)
        seen_skips = 0
        for offset, payload in reader.records():
            while seen_skips < len(reader.skipped):
                s, e, why = reader.skipped[seen_skips]
                seen_skips += 1
                yield "bad", s, e, why
            yield "rec", offset, reader.end_offset, payload
        for s, e, why in reader.skipped[seen_skips:]:
            yield "bad", s, e, why
        if reader.torn_tail is not None:
            off, why = reader.torn_tail
            yield "torn", off, off, why


def _fmt_time(us: int) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(us / 1e6)) + f".{us % 1_000_000 // 1000:03d}"
    except (OverflowError, OSError, ValueError):
        return str(us)


def _short(data: bytes, n: int = 40) -> str:
    text = escape_field(data)
    return text if len(text) <= n else text[: n - 1] + "…"


def _op_summary(ops: list, full: bool) -> tuple[str, list[str]]:
    from kvstore.batch import OP_DELETE, OP_DELETE_RANGE, OP_PUT

    counts = {OP_PUT: 0, OP_DELETE: 0, OP_DELETE_RANGE: 0}
    lines = []
    for op in ops:
        counts[op[0]] = counts.get(op[0], 0) + 1
        if op[0] == OP_PUT:
            lines.append(f"put {_short(op[1])} = {_short(op[2])} ({len(op[2])} B)")
        elif op[0] == OP_DELETE:
            lines.append(f"delete {_short(op[1])}")
        else:
            lines.append(f"delete_range [{_short(op[1])}, {_short(op[2])})")
    if len(ops) == 1:
        return lines[0], lines
    parts = [f"{counts[OP_PUT]} put"] if counts[OP_PUT] else []
    if counts[OP_DELETE]:
        parts.append(f"{counts[OP_DELETE]} delete")
    if counts[OP_DELETE_RANGE]:
        parts.append(f"{counts[OP_DELETE_RANGE]} delete_range")
    summary = f"batch of {len(ops)}: " + ", ".join(parts)
    if ops:
        summary += f"; first {lines[0]}"
    return summary, lines


def _kind(path: str) -> str:
    base = os.path.basename(path)
    if base.endswith(".wkc") or base.endswith(".wkc.broken"):
        return "chunk"
    if base.endswith(".idx"):
        return "index"
    return "segment"


def cmd_inspect(args: argparse.Namespace, rep: Reporter) -> int:
    path = args.segment
    if not os.path.exists(path):
        raise CliError(f"no such file: {path}")
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory; give one segment file (e.g. {os.path.join(path, 'wal', '<first LSN>.wal')})",
                       EXIT_USAGE)
    if args.raw:
        return _inspect_raw(path, args)
    kind = _kind(path)
    out = sys.stdout
    size = os.path.getsize(path)
    n = bad = 0
    last_lsn = None
    if not args.json:
        print(f"{path}: {human_bytes(size)}, {kind}")
        print(f"{'offset':>10}  {'fragments':<16} {'LSN':>10}  {'time':<23}  {'bytes':>7}  operations")
    frags = _fragments(path)
    pending: list[tuple[int, int, int, str | None]] = []

    def frags_until(end: int) -> list[str]:
        names = []
        for f in pending:
            if f[0] < end:
                names.append(_FRAGMENT_NAMES.get(f[1], "BAD"))
        pending[:] = [f for f in pending if f[0] >= end]
        for f in frags:
            if f[0] >= end:
                pending.append(f)
                break
            names.append(_FRAGMENT_NAMES.get(f[1], "BAD"))
        return names

    for what, offset, end, item in _records(path):
        if args.limit is not None and n >= args.limit:
            break
        if what != "rec":
            frags_until(end)
            if what == "bad":
                bad += 1
            row = {"offset": offset, "end": end, "problem": item, "kind": what}
            if args.json:
                out.write(json.dumps(row) + "\n")
            else:
                label = "BAD" if what == "bad" else "TORN TAIL"
                print(f"{offset:>10}  {label:<16} {'':>10}  {'':<23}  {end - offset:>7}  {item}")
            continue
        names = frags_until(end)
        frag_text = names[0] if len(names) == 1 else f"{names[0]}+{len(names) - 2}M+{names[-1]}" \
            if len(names) > 2 else "+".join(names)
        row = _describe(kind, offset, item, args.ops)
        if row.get("lsn") is not None:
            if args.from_lsn is not None and row["lsn"] < args.from_lsn:
                continue
            if last_lsn is not None and row["lsn"] != last_lsn + 1:
                row["problem"] = f"LSN {row['lsn']} does not follow {last_lsn}"
                bad += 1
            last_lsn = row["lsn"]
        n += 1
        row.update(offset=offset, fragments=names, bytes=len(item))
        if args.json:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            continue
        lsn = "" if row.get("lsn") is None else str(row["lsn"])
        ts = _fmt_time(row["timestamp_us"]) if row.get("timestamp_us") else ""
        print(f"{offset:>10}  {frag_text:<16} {lsn:>10}  {ts:<23}  {len(item):>7}  {row['summary']}")
        if row.get("problem"):
            print(f"{'':>10}  !! {row['problem']}")
        for line in row.get("ops", []):
            print(f"{'':>12}{line}")
    if not args.json:
        print(f"{n} records" + (f", {bad} damaged ranges" if bad else "")
              + (f", LSNs up to {last_lsn}" if last_lsn is not None else ""))
    return EXIT_CORRUPT if bad else EXIT_OK


def _describe(kind: str, offset: int, payload: bytes, full_ops: bool) -> dict[str, Any]:
    from wal.errors import CorruptionError

    if kind == "chunk":
        return _describe_chunk(offset, payload)
    if kind == "index":
        return {"summary": "sparse index record"}
    if offset == 0:
        from wal.segment import decode_header

        try:
            h = decode_header(payload, None)  # type: ignore[arg-type]
        except CorruptionError as e:
            return {"summary": "header?", "problem": e.reason}
        return {"summary": f"segment header: version {h.version}, store {h.store_id}, first LSN {h.first_lsn}, "
                           f"created {_fmt_time(h.created_us)}",
                "header": {"version": h.version, "store_id": h.store_id, "first_lsn": h.first_lsn,
                           "created_us": h.created_us}}
    from kvstore.batch import decode
    from wal.segment import decode_entry

    try:
        entry = decode_entry(payload, None, offset)
    except CorruptionError as e:
        return {"summary": "?", "problem": e.reason}
    row: dict[str, Any] = {"lsn": entry.lsn, "timestamp_us": entry.timestamp_us}
    try:
        ops = decode(entry.payload, entry.lsn)
    except CorruptionError as e:
        row["summary"] = f"not a walkv batch ({len(entry.payload)} bytes)"
        row["problem"] = e.reason
        return row
    summary, lines = _op_summary(ops, full_ops)
    row["summary"] = summary
    if full_ops and len(lines) > 1:
        row["ops"] = lines
    return row


def _describe_chunk(offset: int, payload: bytes) -> dict[str, Any]:
    import msgpack

    if offset == 0:
        try:
            magic, version, index, lsn = struct.unpack("<8sHIQ", payload)
            return {"summary": f"chunk header: {magic!r} version {version}, chunk {index}, snapshot LSN {lsn}"}
        except struct.error:
            return {"summary": "chunk header?", "problem": "unexpected header size"}
    try:
        keys, values = msgpack.unpackb(payload, use_list=True)
        return {"summary": f"{len(keys)} pairs, keys {_short(keys[0], 24)} .. {_short(keys[-1], 24)}"}
    except Exception as e:  # noqa: BLE001
        return {"summary": "?", "problem": f"not a chunk data record ({e})"}


def _inspect_raw(path: str, args: argparse.Namespace) -> int:
    from wal.record import BLOCK_SIZE

    n = bad = 0
    if not args.json:
        print(f"{'offset':>10}  {'block':>6}  {'type':<7} {'length':>6}  status")
    for offset, ftype, length, problem in _fragments(path):
        if args.limit is not None and n >= args.limit:
            break
        n += 1
        if problem:
            bad += 1
        if args.json:
            print(json.dumps({"offset": offset, "block": offset // BLOCK_SIZE,
                              "type": _FRAGMENT_NAMES.get(ftype, "BAD"), "length": length,
                              "problem": problem}))
        else:
            print(f"{offset:>10}  {offset // BLOCK_SIZE:>6}  {_FRAGMENT_NAMES.get(ftype, 'BAD'):<7} "
                  f"{length:>6}  {problem or 'ok'}")
    if not args.json:
        print(f"{n} fragments" + (f", {bad} bad" if bad else ""))
    return EXIT_CORRUPT if bad else EXIT_OK


# -- verify ----------------------------------------------------------------------------


class Problem(dict):
    """One finding: ``{"severity": "corrupt"|"problem", "file", "offset", "lsn", "message"}``."""


def _problem(message: str, *, severity: str = "corrupt", file: str | None = None,
             offset: int | None = None, lsn: int | None = None) -> Problem:
    return Problem(severity=severity, file=file, offset=offset, lsn=lsn, message=message)


def _from_error(e: Exception, severity: str = "corrupt") -> Problem:
    return _problem(getattr(e, "reason", None) or str(e), severity=severity, file=getattr(e, "path", None),
                    offset=getattr(e, "offset", None), lsn=getattr(e, "lsn", None))


def verify_store(path: str, rep: Reporter) -> dict[str, Any]:
    """Check everything; return ``{"problems": [...], "checked": {...}}``."""
    import snapshot
    import wal
    from kvstore.batch import decode
    from snapshot.layout import parse_snapshot_dir_name
    from wal.errors import CorruptionError, WalkvError
    from wal.record import RecordReader
    from wal.segment import decode_entry, list_segments, read_index

    d = require_store(path)
    problems: list[Problem] = []
    checked: dict[str, Any] = {"segments": 0, "entries": 0, "log_bytes": 0, "snapshots": 0,
                               "snapshot_pairs": 0, "indexes": 0}
    segs = list_segments(d["wal"])
    total = sum(os.path.getsize(s.path) for s in segs)
    checked["log_bytes"] = total
    if not segs:
        problems.append(_problem("the log has no segment files", file=d["wal"]))

    # 1. Framing, headers, LSN sequence (wal.verify: the same rules as open and repair).
    with rep.task("verifying log records", len(segs), "segments") as progress:
        for text in wal.verify(d["wal"], progress=progress):
            # "<segment>: offset N: reason (last good LSN M)" or "<index>: damaged sparse index ..."
            m = re.match(r"^(.*?): offset (\d+): (.*)$", text, re.S)
            if m:
                problems.append(_problem(m.group(3), file=m.group(1), offset=int(m.group(2))))
            else:
                file, _, rest = text.partition(": ")
                sev = "problem" if file.endswith(".idx") else "corrupt"
                problems.append(_problem(rest or text, severity=sev, file=file if rest else None))
    log_bad_file = next((p["file"] for p in problems if p["severity"] == "corrupt"), None)

    # 2. Every entry's payload is a walkv batch; sparse indexes agree with their segments.
    durable = wal.read_durable_lsn(d["wal"])
    done = 0
    with rep.task("verifying entries and indexes", total, "bytes") as progress:
        for i, seg in enumerate(segs):
            if log_bad_file == seg.path:
                break  # past the first bad record nothing is trusted; reported above
            checked["segments"] += 1
            index = read_index(seg.path)
            points = dict(index.points) if index is not None else {}
            last = None
            with open(seg.path, "rb") as fh:
                reader = RecordReader(fh, path=seg.path, start_offset=0, zeros_end=True)
                try:
                    for offset, payload in reader.records():
                        if offset == 0:
                            continue
                        entry = decode_entry(payload, seg.path, offset)
                        last = entry.lsn
                        checked["entries"] += 1
                        if points.get(entry.lsn, offset) != offset:
                            problems.append(_problem(
                                f"sparse index says LSN {entry.lsn} is at offset {points[entry.lsn]}",
                                severity="problem", file=seg.path[:-4] + ".idx", offset=offset, lsn=entry.lsn))
                            points = {}
                        try:
                            decode(entry.payload, entry.lsn)
                        except CorruptionError as e:
                            problems.append(_problem(f"entry is not a walkv batch: {e.reason}", file=seg.path,
                                                     offset=offset, lsn=entry.lsn))
                except CorruptionError:
                    pass  # framing problems were reported by wal.verify
            if index is not None:
                checked["indexes"] += 1
                is_last = i == len(segs) - 1
                next_first = segs[i + 1].first_lsn if not is_last else None
                if index.first_lsn != seg.first_lsn or (next_first is not None and index.last_lsn != next_first - 1) \
                        or (last is not None and not is_last and index.last_lsn != last):
                    problems.append(_problem(
                        f"sparse index covers LSNs {index.first_lsn}..{index.last_lsn}, the segment holds "
                        f"{seg.first_lsn}..{last}", severity="problem", file=seg.path[:-4] + ".idx"))
                elif index.data_end > os.path.getsize(seg.path):
                    problems.append(_problem("sparse index ends past the segment's end", severity="problem",
                                             file=seg.path[:-4] + ".idx"))
            done += os.path.getsize(seg.path)
            progress(done, total)
    checked["first_lsn"] = segs[0].first_lsn if segs else None
    checked["durable_lsn"] = durable

    # 3. Snapshots: every committed directory, valid or not.
    snap_lsns = []
    names = sorted(os.listdir(d["snapshots"])) if os.path.isdir(d["snapshots"]) else []
    for name in names:
        lsn = parse_snapshot_dir_name(name)
        if lsn is None:
            continue
        sp = os.path.join(d["snapshots"], name)
        try:
            snap = snapshot.open(sp)
            with rep.task(f"verifying snapshot {lsn}", snap.info.bytes, "bytes") as progress:
                snap.verify(progress)
        except (CorruptionError, WalkvError) as e:
            problems.append(_from_error(e) if isinstance(e, CorruptionError) else
                            _problem(str(e), file=sp))
            continue
        checked["snapshots"] += 1
        checked["snapshot_pairs"] += snap.info.count
        snap_lsns.append(lsn)

    # 4. The log covers everything after the newest valid snapshot.
    if segs:
        first = segs[0].first_lsn
        newest = max(snap_lsns, default=0)
        if first > newest + 1:
            problems.append(_problem(
                f"the log starts at LSN {first} but the newest valid snapshot is at LSN {newest}: "
                f"LSNs {newest + 1}..{first - 1} are gone", file=d["wal"], lsn=newest + 1))
        if durable is not None and snap_lsns and max(snap_lsns) > durable:
            problems.append(_problem(
                f"the newest snapshot is at LSN {max(snap_lsns)}, past the log's durable LSN {durable}",
                severity="problem", file=d["snapshots"]))
    checked["snapshot_lsns"] = snap_lsns
    return {"store": d["root"], "problems": problems, "checked": checked}


def cmd_verify(args: argparse.Namespace, rep: Reporter) -> int:
    t0 = time.monotonic()
    result = verify_store(args.store, rep)
    problems = result["problems"]
    c = result["checked"]
    result["seconds"] = round(time.monotonic() - t0, 3)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['store']}: {c['segments']} segments ({human_bytes(c['log_bytes'])}), "
              f"{c['entries']} entries, {c['indexes']} indexes, {c['snapshots']} snapshots "
              f"({c['snapshot_pairs']} pairs) checked in {result['seconds']:.2f} s")
        if not problems:
            print("ok: no problems found")
        for p in problems:
            where = []
            if p["file"]:
                where.append(p["file"])
            if p["offset"] is not None:
                where.append(f"offset {p['offset']}")
            if p["lsn"] is not None:
                where.append(f"LSN {p['lsn']}")
            print(f"{p['severity'].upper()}: {', '.join(where)}: {p['message']}")
        if any(p["severity"] == "corrupt" for p in problems):
            print(f"to cut the log at its first bad record: walkv repair {args.store}")
    if any(p["severity"] == "corrupt" for p in problems):
        return EXIT_CORRUPT
    return EXIT_PROBLEM if problems else EXIT_OK


# -- repair -------------------------------------------------------------------------------


def _log_dir(path: str) -> tuple[str, str | None]:
    """(log directory, store root or None for a bare log directory)."""
    from wal.segment import list_segments

    d = store_dirs(path)
    if os.path.isdir(d["wal"]):
        return d["wal"], d["root"]
    if os.path.isdir(d["root"]) and list_segments(d["root"]):
        return d["root"], None
    require_store(path)  # raises with the reason
    raise CliError(f"{path} is not a walkv store")  # pragma: no cover


def cmd_repair(args: argparse.Namespace, rep: Reporter) -> int:
    import snapshot
    import wal

    log_dir, root = _log_dir(args.store)
    locks = []
    try:
        if root is not None:
            locks.append(DirectoryLock(root, f"the store {root}"))
        locks.append(DirectoryLock(log_dir, f"the log {log_dir}"))
        report = wal.repair(log_dir, dry_run=True, lock=False)
        if not report.cut:
            print(f"{log_dir}: the log is whole; nothing to cut")
            return EXIT_OK
        later = [s.path for s in wal.segment.list_segments(log_dir) if s.path > (report.path or "")]
        print("first bad record:")
        print(f"  file        {report.path}")
        print(f"  offset      {report.offset}")
        print(f"  problem     {report.reason}")
        print(f"  last good   LSN {report.last_good_lsn} (kept, with everything before it)")
        print(f"to be cut:    {human_bytes(report.dropped_bytes)} ({report.dropped_bytes} bytes): "
              f"{report.path} from offset {report.offset}"
              + (f", and {len(later)} later segment(s)" if later else ""))
        print("              (the cut bytes are kept in .broken files next to the segments)")
        if root is not None:
            newer = [s.lsn for s in snapshot.list_snapshots(os.path.join(root, "snapshots"))
                     if s.lsn > (report.last_good_lsn or 0)]
            if newer:
                print(f"warning:      snapshot(s) at LSN {', '.join(map(str, newer))} hold writes past the cut; "
                      "they stay, and the store will rebuild from the newest snapshot the log still reaches",
                      file=sys.stderr)
        if args.dry_run:
            print("dry run: nothing was changed")
            return EXIT_PROBLEM
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError("not cutting: stdin is not a terminal to ask on; pass --yes to cut")
            answer = input("Cut the log here? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                print("nothing was changed")
                return EXIT_PROBLEM
        done = wal.repair(log_dir, lock=False)
        print(f"cut {done.path} at offset {done.offset}; dropped {done.dropped_bytes} bytes; "
              f"the log now ends at LSN {done.last_good_lsn}")
        for f in done.broken_files:
            print(f"  kept {f}")
        return EXIT_OK
    finally:
        for lock in reversed(locks):
            lock.release()
