"""``walkv put``, ``get``, ``delete``, ``scan`` and ``load``: keys and values.

Keys and values are UTF-8 text on the command line and in output, or hex with
``--hex``. ``scan`` prints ``key<TAB>value`` lines (tabs, newlines and
undecodable bytes backslash-escaped, for people), or JSON lines with
``--json`` in the format ``load`` reads, losslessly: ``{"key": TEXT, "value":
TEXT}``, where a key or value that is not valid UTF-8 is given as hex under
``"key_hex"`` or ``"value_hex"`` instead (with ``--hex``, both are hex under
``"key"`` and ``"value"``), so ``scan --json | load`` copies any bytes (see
:func:`json_row`). ``load`` writes each ``--batch-size`` rows as one atomic
batch; a bad line stops it with the line number, and the batch holding that
line is not written.

``--keyspace NAME`` makes any of them work in the named keyspace
(:mod:`kvstore.store.keyspace`) instead of the default one.

Writers open the store read-write (taking its lock: exit 3 if another process
has it); ``get`` and ``scan`` open it read-only, so they work beside a writer.
"""

from __future__ import annotations

import argparse
import binascii
import csv
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

from kvstore.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    AddCommand,
    CliError,
    count,
    escape_field,
    hex_arg,
    open_store,
    sync_arg,
    to_bytes,
)
from kvstore.cli.progress import Reporter
from kvstore.store.keyspace import Keyspace
from kvstore.store.store import KVStore


def add_commands(add: AddCommand) -> None:
    p = add("put", "set a key to a value (given, from stdin with -, or from a file)", cmd_put,
            description="Set KEY to VALUE: the argument, its bytes as they are read from stdin when VALUE is "
                        "- (`walkv put STORE KEY - < photo.jpg`), or a file's with --file (a value of one "
                        "dash: put it in a file). With --ttl the key expires that many seconds from now.")
    p.add_argument("store", metavar="STORE", help="store directory (created if missing)")
    p.add_argument("key", metavar="KEY")
    p.add_argument("value", metavar="VALUE", nargs="?", help="the value; - reads it from stdin")
    p.add_argument("--file", metavar="PATH", help="read the value from this file (instead of VALUE)")
    p.add_argument("--ttl", metavar="SECONDS", type=float,
                   help="the key expires this many seconds from now (see `walkv stats`: expired keys are "
                        "not counted)")
    hex_arg(p)
    keyspace_arg(p)
    sync_arg(p)

    p = add("get", "print the value of a key (exit 1 if it is absent)", cmd_get)
    p.add_argument("store", metavar="STORE")
    p.add_argument("key", metavar="KEY")
    hex_arg(p)
    p.add_argument("--raw", action="store_true", help="no newline after the value when piped")
    keyspace_arg(p)

    p = add("delete", "delete keys (atomically, in one batch), or a range with --range", cmd_delete)
    p.add_argument("store", metavar="STORE")
    p.add_argument("keys", metavar="KEY", nargs="+")
    p.add_argument("--range", action="store_true", help="delete every key with START <= key < END")
    hex_arg(p)
    keyspace_arg(p)
    sync_arg(p)

    p = add("scan", "print key/value pairs in key order (tab-separated, or JSON lines)", cmd_scan)
    p.add_argument("store", metavar="STORE")
    p.add_argument("--start", help="first key (inclusive)")
    p.add_argument("--stop", help="end key (exclusive)")
    p.add_argument("--prefix", help="only keys with this prefix")
    p.add_argument("--reverse", action="store_true", help="descending key order")
    p.add_argument("--limit", type=count, help="at most this many pairs")
    p.add_argument("--keys-only", action="store_true", help="print keys only")
    p.add_argument("--json", action="store_true",
                   help='JSON lines {"key": .., "value": ..} (what load reads back byte for byte: a key or value '
                        'that is not UTF-8 is hex under "key_hex"/"value_hex")')
    p.add_argument("--count", action="store_true", help="print the number of pairs on stderr")
    hex_arg(p)
    keyspace_arg(p)

    p = add("load", "load key/value pairs from JSON lines or CSV, in atomic batches", cmd_load,
            description="Load key/value pairs from FILE ('-' for stdin): JSON lines "
                        '{"key": "...", "value": "..."} (UTF-8 text; "key_hex"/"value_hex" give bytes '
                        "as hex instead, as scan --json writes bytes that are not UTF-8) or CSV rows "
                        "key,value (an optional header "
                        "row key,value is skipped). Each batch of --batch-size rows is one atomic "
                        "write. A bad line stops the load with its line number: the batches before "
                        "it are written, the batch holding it is not.")
    p.add_argument("store", metavar="STORE", help="store directory (created if missing)")
    p.add_argument("file", metavar="FILE", help="input file, or - for stdin")
    p.add_argument("--format", choices=("jsonl", "csv"), help="input format (default: from the file "
                                                              "name, else from its first byte)")
    p.add_argument("--batch-size", type=int, default=1000, help="rows per atomic batch (default 1000)")
    hex_arg(p)
    keyspace_arg(p)
    sync_arg(p)


def keyspace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keyspace", metavar="NAME", default="",
                   help="work in the named keyspace (default: the default keyspace)")


def in_keyspace(db: KVStore, name: str) -> KVStore | Keyspace:
    """``db``, or its keyspace ``name`` (a bad name: a usage error)."""
    if not name:
        return db
    try:
        return db.keyspace(name)
    except (TypeError, ValueError) as e:
        raise CliError(f"--keyspace {name!r}: {e}", EXIT_USAGE) from None


# -- put / get / delete / scan ---------------------------------------------------


def _value(args: argparse.Namespace) -> bytes:
    """``put``'s value: VALUE, stdin's bytes for ``-``, or ``--file``'s
    (read whole; with ``--hex`` they are hex text)."""
    if (args.value is None) == (args.file is None):
        raise CliError("give the value once: VALUE (- for stdin) or --file PATH", EXIT_USAGE)
    if args.value is not None and args.value != "-":
        return to_bytes(args.value, args.hex, "value")
    if args.file is not None:
        try:
            with open(args.file, "rb") as fh:
                data = fh.read()
        except OSError as e:
            raise CliError(f"cannot read {args.file}: {e.strerror}") from None
    else:
        data = sys.stdin.buffer.read()
    if not args.hex:
        return data
    try:
        return binascii.unhexlify(data.strip())
    except (binascii.Error, ValueError):
        raise CliError("the value read is not valid hex (use pairs of 0-9a-f)", EXIT_USAGE) from None


def cmd_put(args: argparse.Namespace, rep: Reporter) -> int:
    key = to_bytes(args.key, args.hex, "key")
    value = _value(args)
    with open_store(args.store, create=True, reporter=rep, sync=args.sync) as db:
        lsn = in_keyspace(db, args.keyspace).put(key, value, ttl=args.ttl)
    if not args.quiet:
        print(f"ok: LSN {lsn}", file=sys.stderr)
    return EXIT_OK


def cmd_get(args: argparse.Namespace, rep: Reporter) -> int:
    key = to_bytes(args.key, args.hex, "key")
    with open_store(args.store, readonly=True) as db:
        value = in_keyspace(db, args.keyspace).get(key)
    if value is None:
        where = f"keyspace {args.keyspace!r} of " if args.keyspace else ""
        raise CliError(f"key {args.key!r} not found in {where}{args.store}")
    out = sys.stdout.buffer
    if args.hex:
        out.write(value.hex().encode() + b"\n")
    else:
        out.write(value)
        if sys.stdout.isatty() or not args.raw:
            out.write(b"\n")
    out.flush()
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, rep: Reporter) -> int:
    keys = [to_bytes(k, args.hex, "key") for k in args.keys]
    lsn: int | None
    with open_store(args.store, reporter=rep, sync=args.sync) as db:
        space = in_keyspace(db, args.keyspace)
        if args.range:
            if len(keys) != 2:
                raise CliError("--range takes exactly two keys: START END", EXIT_USAGE)
            lsn = space.delete_range(keys[0], keys[1])
        elif len(keys) == 1:
            lsn = space.delete(keys[0])
        else:
            with space.batch() as b:
                for k in keys:
                    b.delete(k)
            lsn = b.lsn
    if not args.quiet:
        print(f"ok: LSN {lsn}", file=sys.stderr)
    return EXIT_OK


def cmd_scan(args: argparse.Namespace, rep: Reporter) -> int:
    h = args.hex
    start = None if args.start is None else to_bytes(args.start, h, "--start")
    stop = None if args.stop is None else to_bytes(args.stop, h, "--stop")
    prefix = None if args.prefix is None else to_bytes(args.prefix, h, "--prefix")
    n = 0
    out = sys.stdout
    if args.json and hasattr(out, "reconfigure"):
        out.reconfigure(encoding="utf-8")  # what load reads, whatever the locale says
    with open_store(args.store, readonly=True) as db:
        it = in_keyspace(db, args.keyspace).scan(start, stop, prefix=prefix, reverse=args.reverse)
        try:
            for key, value in it:
                if args.limit is not None and n >= args.limit:
                    break
                if args.json:
                    out.write(json_row(key, None if args.keys_only else value, h) + "\n")
                elif h:
                    out.write(key.hex() if args.keys_only else f"{key.hex()}\t{value.hex()}")
                    out.write("\n")
                else:
                    out.write(escape_field(key) if args.keys_only else f"{escape_field(key)}\t{escape_field(value)}")
                    out.write("\n")
                n += 1
        finally:
            it.close()  # release the scan's LMDB snapshot now
    out.flush()
    if args.count:
        print(f"{n} keys", file=sys.stderr)
    return EXIT_OK


# -- the JSON lines of scan and load ------------------------------------------------


def json_row(key: bytes, value: bytes | None, hex_mode: bool) -> str:
    """One JSON line of ``scan --json``, which ``load`` reads back to the same
    bytes: ``{"key": TEXT, "value": TEXT}``, each field the UTF-8 text of the
    bytes, or, for bytes that are not valid UTF-8, their hex under
    ``"key_hex"``/``"value_hex"`` instead; with ``--hex``, hex under
    ``"key"``/``"value"``. ``value`` None: the key only (``--keys-only``)."""
    row: dict[str, str] = {}
    for name, data in (("key", key), ("value", value)):
        if data is None:
            continue
        if hex_mode:
            row[name] = data.hex()
            continue
        try:
            row[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            row[f"{name}_hex"] = data.hex()
    return json.dumps(row, ensure_ascii=False)


def _json_field(obj: dict[str, object], name: str, hex_mode: bool, lineno: int) -> bytes:
    """``name`` ("key" or "value") of a JSON line, as bytes (:func:`json_row`'s format)."""
    text, hexed = obj.get(name), obj.get(f"{name}_hex")
    if text is None and hexed is None:
        raise BadLine(lineno, f'no {name}: expected an object {{"key": ..., "value": ...}} ("{name}_hex" for hex)')
    if text is not None and hexed is not None:
        raise BadLine(lineno, f'give the {name} once, as "{name}" or as "{name}_hex", not both')
    if not isinstance(text if hexed is None else hexed, str):
        raise BadLine(lineno, f"the {name} must be a JSON string")
    if hexed is not None:
        return _field(str(hexed), True, lineno, f"{name}_hex")
    return _field(str(text), hex_mode, lineno, name)


# -- load ------------------------------------------------------------------------


class BadLine(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


def _detect_format(path: str, fmt: str | None, first: bytes) -> str:
    if fmt:
        return fmt
    low = path.lower()
    if low.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if low.endswith((".csv", ".tsv")):
        return "csv"
    return "jsonl" if first.lstrip().startswith(b"{") else "csv"


def _jsonl_rows(stream: io.BufferedReader, hex_mode: bool) -> Iterator[tuple[int, bytes, bytes, int]]:
    """(line number, key, value, bytes read so far) for each JSON line."""
    done = 0
    for lineno, raw in enumerate(stream, 1):
        done += len(raw)
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise BadLine(lineno, f"not valid JSON ({e.msg})") from None
        except UnicodeDecodeError as e:
            raise BadLine(lineno, f"not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise BadLine(lineno, 'expected an object {"key": ..., "value": ...}')
        yield lineno, _json_field(obj, "key", hex_mode, lineno), _json_field(obj, "value", hex_mode, lineno), done


def _csv_rows(stream: io.BufferedReader, hex_mode: bool) -> Iterator[tuple[int, bytes, bytes, int]]:
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="", errors="strict")
    reader = csv.reader(text)
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if lineno == 1 and [c.strip().lower() for c in row] == ["key", "value"]:
                continue  # a header row
            if len(row) != 2:
                raise BadLine(lineno, f"expected 2 fields (key,value), found {len(row)}")
            yield lineno, _field(row[0], hex_mode, lineno, "key"), _field(row[1], hex_mode, lineno, "value"), \
                _tell(stream)
    except csv.Error as e:
        raise BadLine(reader.line_num, f"bad CSV: {e}") from None
    except UnicodeDecodeError as e:
        raise BadLine(reader.line_num + 1, f"not valid UTF-8 ({e.reason})") from None
    finally:
        text.detach()


def _tell(stream: io.BufferedReader) -> int:
    try:
        return stream.tell()
    except (OSError, ValueError):
        return 0


def _field(text: str, hex_mode: bool, lineno: int, what: str) -> bytes:
    if hex_mode:
        try:
            return binascii.unhexlify(text.strip())
        except (binascii.Error, ValueError):
            raise BadLine(lineno, f"{what} is not valid hex") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 bytes stand for it
        raise BadLine(lineno, f"{what} is not valid Unicode text (a lone surrogate); give bytes that are not "
                              f'UTF-8 as hex under "{what}_hex"') from None


def cmd_load(args: argparse.Namespace, rep: Reporter) -> int:
    from wal.errors import WalkvError

    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1", EXIT_USAGE)
    raw: BinaryIO
    if args.file == "-":
        raw = sys.stdin.buffer
        total = None
    else:
        try:
            raw = open(args.file, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as e:
            raise CliError(f"cannot read {args.file}: {e.strerror}") from None
        total = os.fstat(raw.fileno()).st_size
    # peek() needs a BufferedReader; a replaced sys.stdin may not give one.
    stream: io.BufferedReader = (raw if isinstance(raw, io.BufferedReader)
                                 else io.BufferedReader(raw))  # type: ignore[arg-type]  # BinaryIO omits readinto; files have it
    fmt = _detect_format(args.file, args.format, stream.peek(64)[:64])
    rows = _jsonl_rows(stream, args.hex) if fmt == "jsonl" else _csv_rows(stream, args.hex)
    loaded = batches = 0
    first_line = 0
    t0 = time.monotonic()
    try:
        with open_store(args.store, create=True, reporter=rep, sync=args.sync) as db, \
                rep.task(f"loading {os.path.basename(args.file)}", total, "bytes") as progress:
            done = False
            while not done:
                pending = 0
                first_line = 0
                try:
                    with in_keyspace(db, args.keyspace).batch() as b:
                        for lineno, key, value, pos in rows:
                            if not first_line:
                                first_line = lineno
                            try:
                                b.put(key, value)
                            except (ValueError, TypeError, WalkvError) as e:
                                raise BadLine(lineno, str(e)) from None
                            pending += 1
                            if pending >= args.batch_size:
                                progress(pos, total)
                                break
                        else:
                            done = True
                except BadLine as e:
                    where = f"lines {first_line}..{e.line - 1} " if first_line and first_line < e.line else ""
                    raise CliError(
                        f"{args.file}: line {e.line}: {e}. Stopped there: {loaded} rows in {batches} "
                        f"batches were loaded before it; the batch holding line {e.line} "
                        f"({where}not yet written) was discarded") from None
                if pending:
                    loaded += pending
                    batches += 1
            progress(total or 0, total)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    if not args.quiet:
        dt = time.monotonic() - t0
        print(f"loaded {loaded} rows in {batches} batches from {args.file} ({fmt}, {dt:.2f} s)",
              file=sys.stderr)
    return EXIT_OK
