"""``walkv watch``: follow a store's changes as ``tail -f`` follows a file.

It opens the store read-only (so it runs beside the writer, which it never
slows but for page cache) and prints each durable change in log order, one
line each, flushed at once: ``LSN<TAB>time<TAB>op<TAB>key<TAB>value`` (a
``delete_range`` shows its end key where a put shows its value; with
``--all-keyspaces`` a keyspace column comes before the key), or JSON lines
with ``--json``::

    {"lsn": 7, "time_us": 1764625913195000, "op": "upsert", "keyspace": "",
     "key": "user:1", "value": "ann", "end_key": null}

where a key, value or end key that is not UTF-8 is given as hex under
``key_hex``/``value_hex``/``end_key_hex`` instead (with ``--hex``, all are hex),
as ``walkv scan --json`` writes them (:func:`kvstore.cli.kv.json_row`). A
``delete_range`` to the end of the keys has ``end_key`` null.

It starts after the store's durable LSN (new changes only) or at
``--from-lsn``, and runs until SIGINT (Ctrl-C) or SIGTERM, ``--count`` changes,
or ``--idle`` seconds without one; then it closes the store and says on stderr
where it stopped and how to go on (``--from-lsn``), and exits 0. LSNs the log no
longer holds (retention after a snapshot) are an error naming the first one it
holds (exit 1), as is a fork of the store's history under the watcher
(:mod:`kvstore.watch.watcher`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import Any

from kvstore.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    AddCommand,
    CliError,
    count,
    escape_field,
    hex_arg,
    open_store,
    to_bytes,
)
from kvstore.cli.entry_text import fmt_time
from kvstore.cli.kv import keyspace_arg
from kvstore.cli.progress import Reporter
from kvstore.watch import Change


def add_commands(add: AddCommand) -> None:
    p = add("watch", "follow a store's changes as they are made (as tail -f does)", cmd_watch,
            description="Print each durable change of a store in log order as it is made: LSN, time, op "
                        "(upsert, delete, delete_range, expire), key and value, or JSON lines with --json. "
                        "Reads only, beside the writer. Starts with the next change (or --from-lsn) and "
                        "runs until Ctrl-C or SIGTERM, --count changes or --idle seconds without one; "
                        "then says on stderr the --from-lsn to go on from.")
    p.add_argument("store", metavar="STORE", help="a store (or a read replica's directory)")
    p.add_argument("--prefix", help="only keys with this prefix")
    p.add_argument("--from-lsn", type=int, metavar="LSN",
                   help="start at this LSN (1: every change the log still holds; default: new changes only)")
    p.add_argument("--json", action="store_true", help="JSON lines (bytes that are not UTF-8 as hex under *_hex)")
    keyspace_arg(p)
    p.add_argument("--all-keyspaces", action="store_true", help="changes of every keyspace, each naming its own")
    p.add_argument("--count", type=count, metavar="N", help="stop after N changes")
    p.add_argument("--idle", type=float, metavar="SECONDS", help="stop after this many seconds without a change")
    hex_arg(p)


class _Terminated(Exception):
    """SIGTERM arrived: stop as Ctrl-C does."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def change_row(change: Change, hex_mode: bool) -> dict[str, Any]:
    """One change as a JSON object (module docstring)."""
    row: dict[str, Any] = {"lsn": change.lsn, "time_us": change.time, "op": change.op, "keyspace": change.keyspace}
    for name, data in (("key", change.key), ("value", change.value), ("end_key", change.end_key)):
        if data is None:
            row[name] = None
        elif hex_mode:
            row[name] = data.hex()
        else:
            try:
                row[name] = data.decode("utf-8")
            except UnicodeDecodeError:
                row[f"{name}_hex"] = data.hex()
    return row


def _line(change: Change, hex_mode: bool, keyspaces: bool) -> str:
    """One change as a tab-separated line (module docstring)."""
    def text(data: bytes | None) -> str:
        return "" if data is None else data.hex() if hex_mode else escape_field(data)

    last = change.end_key if change.op == "delete_range" else change.value
    fields = [str(change.lsn), fmt_time(change.time), change.op]
    if keyspaces:
        fields.append(change.keyspace or "(default)")
    return "\t".join([*fields, text(change.key), text(last)])


def cmd_watch(args: argparse.Namespace, rep: Reporter) -> int:
    if args.idle is not None and not args.idle > 0:
        raise CliError(f"--idle must be a positive number of seconds, not {args.idle}", EXIT_USAGE)
    if args.from_lsn is not None and args.from_lsn < 1:
        raise CliError(f"--from-lsn must be 1 or more, not {args.from_lsn}", EXIT_USAGE)
    if args.all_keyspaces and args.keyspace:
        raise CliError("give --keyspace NAME or --all-keyspaces, not both", EXIT_USAGE)
    prefix = None if args.prefix is None else to_bytes(args.prefix, args.hex, "--prefix")
    out = sys.stdout
    if args.json and hasattr(out, "reconfigure"):
        out.reconfigure(encoding="utf-8")
    seen = 0
    reason = "stopped"
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with open_store(args.store, readonly=True) as db:
            watcher = db.watch(prefix, from_lsn=args.from_lsn, timeout=args.idle,
                               keyspace=None if args.all_keyspaces else args.keyspace)
            next_lsn = watcher.next_lsn
            try:
                with watcher:
                    if args.count == 0:
                        return EXIT_OK
                    for change in watcher:
                        if args.json:
                            out.write(json.dumps(change_row(change, args.hex), ensure_ascii=False) + "\n")
                        else:
                            out.write(_line(change, args.hex, args.all_keyspaces) + "\n")
                        out.flush()
                        seen += 1
                        if args.count is not None and seen >= args.count:
                            reason = f"--count {args.count} reached"
                            break
                    else:
                        reason = f"no change for {args.idle:g} s"
            except (KeyboardInterrupt, _Terminated) as stop:
                reason = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated (SIGTERM)"
            finally:
                # every change before next_lsn was shown (a batch's last ones may not be, after --count)
                next_lsn = watcher.next_lsn - (1 if watcher.batch_left else 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not args.quiet:
        print(f"walkv watch: {reason}; {seen} changes; to go on: --from-lsn {next_lsn}", file=sys.stderr)
    return EXIT_OK
