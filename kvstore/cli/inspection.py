"""``walkv inspect``: the records (or fragments) of one segment file.

Reads a log segment (or a ``.broken`` piece of one, or a snapshot chunk)
through ``wal.record``'s own reader, never a second framing implementation:
:class:`~wal.record.RecordReader` with ``skip_corrupt=True`` for the records,
so damage is listed (``BAD`` with its byte range) and reading goes on at the
next block, and the reader's physical layer for the fragments (``--raw``, and
the fragment types of each record). Exit 4 when anything is damaged, and
when the file is not a segment or chunk at all (it does not start with the
header record every segment and chunk starts with;
:class:`~wal.errors.CorruptionError`): a ``.broken`` piece, cut from the
middle of a segment, has none and is listed as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from collections.abc import Iterator
from typing import Any

from kvstore.cli.common import (
    EXIT_CORRUPT,
    EXIT_OK,
    EXIT_USAGE,
    AddCommand,
    CliError,
    count,
    human_bytes,
)
from kvstore.cli.entry_text import fmt_time, op_line, short, summary
from kvstore.cli.progress import Reporter
from kvstore.layout import WAL_DIR

_FRAGMENT_NAMES = {1: "FULL", 2: "FIRST", 3: "MIDDLE", 4: "LAST"}


def add_commands(add: AddCommand) -> None:
    p = add("inspect", "list the records of a log segment (or snapshot chunk) file", cmd_inspect,
            description="List each record of a log segment with its offset, fragment types, LSN, "
                        "commit time, size and a summary of its operations. Also reads .broken "
                        "files left by repair and snapshot chunk files (.wkc). Damaged records are "
                        "listed as BAD with their byte range and the reading goes on.")
    p.add_argument("segment", metavar="SEGMENT", help="a .wal segment file (or .wal.broken, or .wkc chunk)")
    p.add_argument("--raw", action="store_true", help="list every fragment (offset, type, length, CRC ok)")
    p.add_argument("--limit", type=count, help="stop after this many entries (the header is always shown)")
    p.add_argument("--from-lsn", type=int, help="start listing at this LSN")
    p.add_argument("--ops", action="store_true", help="print every operation, not just a summary")
    p.add_argument("--json", action="store_true", help="one JSON object per record")


# -- inspect -------------------------------------------------------------------------


def _fragments(path: str) -> Iterator[tuple[int, int, int, str | None]]:
    """``(offset, type, payload length, problem)`` of every fragment, using
    wal.record's own physical reader (the one framing implementation)."""
    from wal.record_reader import RecordReader

    with open(path, "rb") as fh:
        yield from RecordReader(fh, path=path, start_offset=0, zeros_end=True).fragments()


def _record_limit(path: str) -> int:
    """The record limit the file was written with: a segment's header (for a
    ``.broken`` piece, the header of the segment it was cut from), a chunk's
    manifest; the default when neither can be read."""
    import re

    from snapshot.layout import MANIFEST_NAME
    from snapshot.manifest import read_manifest
    from wal.errors import WalkvError
    from wal.record import DEFAULT_MAX_RECORD_BYTES
    from wal.segment import read_header

    try:
        if _kind(path) == "chunk":
            return read_manifest(os.path.join(os.path.dirname(os.path.abspath(path)), MANIFEST_NAME)).max_record_bytes
        for candidate in (path, re.sub(r"\.broken(-\d+)?$", "", path)):
            try:
                with open(candidate, "rb") as fh:
                    return read_header(fh, candidate)[0].max_record_bytes
            except (OSError, WalkvError):
                continue
    except (OSError, WalkvError):
        pass
    return DEFAULT_MAX_RECORD_BYTES


def _records(path: str) -> Iterator[tuple[str, int, int, Any]]:
    """``("rec", offset, end, payload)`` for each valid record and ``("bad",
    start, end, reason)`` for each damaged range, in file order; records are
    bounded by the limit the file was written with (:func:`_record_limit`)."""
    from wal.record_reader import RecordReader

    limit = _record_limit(path)
    with open(path, "rb") as fh:
        reader = RecordReader(fh, path=path, start_offset=0, zeros_end=True, skip_corrupt=True,
                              max_record_bytes=limit)
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


def _check_header(path: str, kind: str) -> None:
    """:class:`CorruptionError` (exit 4) unless ``path`` starts with the
    header record of a segment (or of a chunk, for ``kind`` "chunk"); a
    ``.broken`` piece and an index are not checked."""
    import re

    from snapshot.chunk import CHUNK_MAGIC
    from snapshot.chunk import decode_header as decode_chunk_header
    from wal.errors import CorruptionError, Damage
    from wal.segment import SEGMENT_MAGIC, decode_header

    if kind == "index" or re.search(r"\.broken(-\d+)?$", path):
        return
    what, magic = ("snapshot chunk", CHUNK_MAGIC) if kind == "chunk" else ("log segment", SEGMENT_MAGIC)
    first = next((r for r in _records(path) if r[0] == "rec" or r[1] == 0), None)  # damage elsewhere: later
    reason = None
    if os.path.getsize(path) == 0:
        reason = "it is empty"
    elif first is None or first[0] != "rec" or first[1] != 0:
        reason = "its first bytes are not a record" + (f" ({first[3]})" if first is not None and first[1] == 0
                                                        and first[0] != "rec" else "")
    else:
        payload = first[3]
        try:
            (decode_chunk_header if kind == "chunk" else decode_header)(payload, path)
        except CorruptionError:
            if payload[:8] == magic:
                raise  # one of walkv's, with a bad header: the error says what to do
            reason = f"its first record is not a {what} header"
    if reason is not None:
        raise CorruptionError(
            f"not a walkv {what}: {reason}", kind=Damage.HEADER, path=path, offset=0,
            hint=f"give a segment (STORE/{WAL_DIR}/<first LSN>.wal) or a snapshot chunk (.wkc); if it was one, "
                 f"its header is damaged: `walkv inspect --raw {path}` lists its fragments")


def _kind(path: str) -> str:
    base = os.path.basename(path)
    if base.endswith((".wkc", ".wkc.broken")):
        return "chunk"
    if base.endswith(".idx"):
        return "index"
    return "segment"


def cmd_inspect(args: argparse.Namespace, rep: Reporter) -> int:
    path = args.segment
    if not os.path.exists(path):
        raise CliError(f"no such file: {path}")
    if os.path.isdir(path):
        example = os.path.join(path, WAL_DIR, "<first LSN>.wal")
        raise CliError(f"{path} is a directory; give one segment file (e.g. {example})", EXIT_USAGE)
    if args.raw:
        return _inspect_raw(path, args)
    kind = _kind(path)
    _check_header(path, kind)
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

    listed = 0  # the records --limit counts: all but the header
    for what, offset, end, item in _records(path):
        if args.limit is not None and listed >= args.limit:
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
        row = _describe(kind, path, offset, item, args.ops)
        if row.get("lsn") is not None:
            if args.from_lsn is not None and row["lsn"] < args.from_lsn:
                continue
            if last_lsn is not None and row["lsn"] != last_lsn + 1:
                row["problem"] = f"LSN {row['lsn']} does not follow {last_lsn}"
                bad += 1
            last_lsn = row["lsn"]
        n += 1
        listed += not _is_header(path, kind, offset)
        row.update(offset=offset, fragments=names, bytes=len(item))
        if args.json:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            continue
        lsn = "" if row.get("lsn") is None else str(row["lsn"])
        ts = fmt_time(row["timestamp_us"]) if row.get("timestamp_us") else ""
        print(f"{offset:>10}  {frag_text:<16} {lsn:>10}  {ts:<23}  {len(item):>7}  {row['summary']}")
        if row.get("problem"):
            print(f"{'':>10}  !! {row['problem']}")
        for op in row.get("ops", []) if len(row.get("ops", [])) > 1 else []:
            print(f"{'':>12}{op['text']}")
    if not args.json:
        print(f"{n} records" + (f", {bad} damaged ranges" if bad else "")
              + (f", LSNs up to {last_lsn}" if last_lsn is not None else ""))
    return EXIT_CORRUPT if bad else EXIT_OK


def _describe(kind: str, path: str, offset: int, payload: bytes, full_ops: bool) -> dict[str, Any]:
    """One record of a segment (or chunk) file, as a row of ``inspect``'s listing."""
    from wal.errors import CorruptionError

    if kind == "chunk":
        return _describe_chunk(offset, payload)
    if kind == "index":
        return {"summary": "sparse index record"}
    if offset == 0:
        from wal.segment import decode_header

        try:
            h = decode_header(payload, path)
        except CorruptionError as e:
            return {"summary": "header?", "problem": e.reason}
        return {"summary": f"segment header: version {h.version}, store {h.store_id}, first LSN {h.first_lsn}, "
                           f"created {fmt_time(h.created_us)}",
                "header": {"version": h.version, "store_id": h.store_id, "first_lsn": h.first_lsn,
                           "created_us": h.created_us}}
    from kvstore.entry.codec import OP_NAMES, decode
    from wal.segment import decode_entry

    try:
        entry = decode_entry(payload, path, offset)
    except CorruptionError as e:
        return {"summary": "?", "problem": e.reason}
    row: dict[str, Any] = {"lsn": entry.lsn, "timestamp_us": entry.timestamp_us}
    try:
        ops = decode(entry.payload, entry.lsn)
    except CorruptionError as e:
        row["summary"] = f"not a walkv batch ({len(entry.payload)} bytes)"
        row["problem"] = e.reason
        return row
    row["summary"] = summary(ops)
    if full_ops:
        row["ops"] = [{"op": OP_NAMES[op[0]], "text": op_line(op)} for op in ops]
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
        keys, _values = msgpack.unpackb(payload, use_list=True)
        return {"summary": f"{len(keys)} pairs, keys {short(keys[0], 24)} .. {short(keys[-1], 24)}"}
    except (msgpack.UnpackException, ValueError, TypeError, IndexError, AttributeError) as e:
        # not msgpack, not a (keys, values) pair, no keys, or keys that are not bytes
        return {"summary": "?", "problem": f"not a chunk data record ({e})"}


def _is_header(path: str, kind: str, offset: int) -> bool:
    """Whether the record at ``offset`` is the file's header (a segment's or
    a chunk's first record; a ``.broken`` piece and an index have none)."""
    import re

    return offset == 0 and kind != "index" and not re.search(r"\.broken(-\d+)?$", path)


def _first_offset(path: str, kind: str, from_lsn: int | None) -> int:
    """The offset of the first record at or past LSN ``from_lsn`` (0: no
    ``--from-lsn``; the file's size when no record is that far)."""
    from wal.errors import CorruptionError
    from wal.segment import decode_entry

    if from_lsn is None or kind != "segment":
        return 0
    for what, offset, _end, item in _records(path):
        if what != "rec" or _is_header(path, kind, offset):
            continue
        try:
            if decode_entry(item, path, offset).lsn >= from_lsn:
                return offset
        except CorruptionError:
            continue
    return os.path.getsize(path)


def _inspect_raw(path: str, args: argparse.Namespace) -> int:
    from wal.record import BLOCK_SIZE

    kind = _kind(path)
    start = _first_offset(path, kind, args.from_lsn)
    n = bad = listed = 0
    if not args.json:
        print(f"{'offset':>10}  {'block':>6}  {'type':<7} {'length':>6}  status")
    for offset, ftype, length, problem in _fragments(path):
        header = _is_header(path, kind, offset)
        if offset < start and not header:
            continue
        if args.limit is not None and listed >= args.limit:
            break
        n += 1
        listed += not header
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
