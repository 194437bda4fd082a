"""The ``walkv`` command line.

``walkv --help`` lists the commands; ``walkv COMMAND --help`` explains one.
This module parses arguments and maps errors to exit codes; the commands live
in :mod:`kvstore.cli.kv` (put, get, delete, scan, load),
:mod:`kvstore.cli.watch` (watch), :mod:`kvstore.cli.stats` (stats, keyspaces), :mod:`kvstore.cli.inspection` (inspect),
:mod:`kvstore.cli.files` (verify, repair), :mod:`kvstore.cli.admin`
(snapshot, restore, export, bench), :mod:`kvstore.cli.replica` (replica), :mod:`kvstore.cli.serve` (serve) and
:mod:`kvstore.cli.demo` (the main job).

Exit codes, for scripts::

    0  ok
    1  a problem was found or the operation failed (a missing key, a bad
       input line, a store that does not exist, LSNs asked for that the
       log no longer holds, a write to a store opened read-only, an object
       store that refuses or does not answer, a restore target that is not
       a new or empty directory)
    2  usage error (bad arguments)
    3  the store is locked by another process
    4  corruption (a bad CRC, a broken LSN sequence, a damaged snapshot;
       ``inspect`` given a file that is not a segment or chunk)

Errors are one line on stderr, ``walkv: error: ...``, with no traceback
unless ``--verbose`` (``-v``) is given. Progress bars appear only when stderr
is a terminal (:mod:`kvstore.cli.progress`).

Keys and values are UTF-8 text on the command line and on output, or hex
with ``--hex`` (for binary data). ``scan --json`` prints JSON lines in the
format ``load`` reads, losslessly (bytes that are not UTF-8 as hex under
``key_hex``/``value_hex``), so ``walkv scan A --json | walkv load B -``
copies a store. ``get``, ``scan`` and ``stats`` also read a read replica's
directory (:mod:`kvstore.cli.stats` shows its lag).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from importlib.metadata import PackageNotFoundError, version

from kvstore.cli import admin, archive, demo, files, inspection, kv, replica, serve, stats, subscriptions, watch
from kvstore.cli.common import (
    EXIT_CORRUPT,
    EXIT_LOCKED,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CliError,
    Command,
)
from kvstore.cli.progress import Reporter, setup_logging
from wal.errors import (
    CorruptionError,
    LockedError,
    LogGapError,
    ReadOnlyError,
    WalkvError,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``walkv`` parser: every command, in the order ``--help`` lists them."""

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="more detail: info logs, tracebacks on errors (-vv: debug)")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars, only errors on stderr")

    parser = argparse.ArgumentParser(
        prog="walkv",
        description="walkv: an embedded key-value database with a write-ahead log, group commit, "
                    "LMDB state, snapshots and Spark export.",
        epilog="exit codes: 0 ok, 1 problem found or failed, 2 usage error, 3 store locked, "
               "4 corruption. `walkv COMMAND --help` for each command.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"walkv {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, help: str, fn: Command,
            description: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description or help, parents=[common])
        p.set_defaults(func=fn)
        return p

    p = add("demo", "run the main job: workload, crash and recovery, snapshot, restore, Spark export",
            demo.cmd_demo, description=demo.DESCRIPTION)
    demo.add_arguments(p)
    kv.add_commands(add)
    watch.add_commands(add)
    stats.add_commands(add)
    inspection.add_commands(add)
    files.add_commands(add)
    admin.add_commands(add)
    archive.add_commands(add)
    replica.add_commands(add)
    subscriptions.add_commands(add)
    serve.add_commands(add)

    return parser


def _version() -> str:
    try:
        return version("walkv")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def error_code(exc: BaseException) -> int:
    """The exit code for an error, by its type (never by its message)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, LockedError):
        return EXIT_LOCKED
    if isinstance(exc, CorruptionError):
        return EXIT_CORRUPT
    if isinstance(exc, (LogGapError, ReadOnlyError)):
        return EXIT_PROBLEM  # the log no longer holds those LSNs; a write on a read-only store
    if isinstance(exc, WalkvError):
        return EXIT_PROBLEM
    if isinstance(exc, (ValueError, TypeError)):
        return EXIT_USAGE
    return EXIT_PROBLEM


def main(argv: list[str] | None = None) -> int:
    """Run ``walkv`` with ``argv`` (default: the process's arguments); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose = getattr(args, "verbose", 0) or 0
    args.quiet = getattr(args, "quiet", False)
    setup_logging(args.verbose, args.quiet)
    rep = Reporter(enabled=False if args.quiet else None)
    try:
        with rep:
            return int(args.func(args, rep) or 0)
    except KeyboardInterrupt:
        print("walkv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `walkv scan STORE | head`: the reader went away; say nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PROBLEM
    except Exception as exc:  # noqa: BLE001 - the one place errors become exit codes
        if args.verbose:
            traceback.print_exc()
        known = isinstance(exc, (CliError, WalkvError, ValueError, TypeError, OSError))
        text = str(exc) if known else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
            text = f"{text} ({exc.filename})"
        if not known and not args.verbose:
            text += " (an internal error: run again with --verbose and report it)"
        print(f"walkv: error: {' '.join(text.split())}", file=sys.stderr)
        return error_code(exc)
