"""The ``walkv`` command line.

``walkv --help`` lists the commands; ``walkv COMMAND --help`` explains one.
This module parses arguments, maps errors to exit codes and holds the helpers
the command modules share; the commands live in :mod:`kvstore.cli_kv` (put,
get, delete, scan, load), :mod:`kvstore.cli_admin` (stats, snapshot, restore,
export, bench), :mod:`kvstore.cli_inspect` (inspect), :mod:`kvstore.cli_files`
(verify, repair) and :mod:`kvstore.cli_demo` (the main job).

Exit codes, for scripts::

    0  ok
    1  a problem was found or the operation failed (a missing key, a bad
       input line, a store that does not exist)
    2  usage error (bad arguments)
    3  the store is locked by another process
    4  corruption (a bad CRC, a broken LSN sequence, a damaged snapshot)

Errors are one line on stderr, ``walkv: error: ...``, with no traceback
unless ``--verbose`` (``-v``) is given. Progress bars appear only when stderr
is a terminal (:mod:`kvstore.progress`).

Keys and values are UTF-8 text on the command line and on output, or hex
with ``--hex`` (for binary data). ``scan --json`` prints JSON lines in the
format ``load`` reads, so ``walkv scan A --json | walkv load B -`` copies a
store.
"""

from __future__ import annotations

import argparse
import binascii
import os
import sys
from typing import Any, Callable

from kvstore.progress import Reporter, setup_logging

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CORRUPT = 4


class CliError(Exception):
    """A failure to report as one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_PROBLEM) -> None:
        super().__init__(message)
        self.code = code


# -- helpers shared by the command modules --------------------------------------


def store_dirs(path: str) -> dict[str, str]:
    root = os.path.abspath(path)
    return {"root": root, "wal": os.path.join(root, "wal"), "lmdb": os.path.join(root, "lmdb"),
            "snapshots": os.path.join(root, "snapshots")}


def require_store(path: str) -> dict[str, str]:
    """The store's directories; CliError when ``path`` is not a walkv store."""
    d = store_dirs(path)
    if not os.path.exists(d["root"]):
        raise CliError(f"no store at {path} (no such directory)")
    if not os.path.isdir(d["root"]):
        raise CliError(f"{path} is not a walkv store (not a directory)")
    if not os.path.isdir(d["wal"]):
        raise CliError(f"{path} is not a walkv store (it has no wal/ directory)")
    return d


def to_bytes(text: str, hex_mode: bool, what: str) -> bytes:
    if hex_mode:
        try:
            return binascii.unhexlify(text.strip())
        except (binascii.Error, ValueError):
            raise CliError(f"{what} {text!r} is not valid hex (use pairs of 0-9a-f)", EXIT_USAGE) from None
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # pragma: no cover - lone surrogates
        raise CliError(f"{what} is not valid text; use --hex", EXIT_USAGE) from None


def from_bytes(data: bytes, hex_mode: bool) -> str:
    if hex_mode:
        return data.hex()
    return data.decode("utf-8", "backslashreplace")


def escape_field(data: bytes) -> str:
    """Text for a tab-separated line: UTF-8 with tabs, newlines, backslashes
    and undecodable bytes written as backslash escapes."""
    text = data.decode("utf-8", "backslashreplace")
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def open_store(path: str, *, readonly: bool = False, create: bool = False,
               reporter: Reporter | None = None, **options: Any):
    """Open a store for a command, with a replay progress bar."""
    import kvstore

    if not create:
        require_store(path)
    if readonly:
        if not os.path.isdir(os.path.join(path, "lmdb")):
            # Never opened for writing yet (or its LMDB was removed): only a
            # read-write open can build the state; say so.
            raise CliError(f"{path} has no state yet (lmdb/ is missing); open it read-write once "
                           "(any write command, or `walkv snapshot`) to rebuild it")
        return kvstore.open(path, readonly=True)
    if reporter is not None:
        with reporter.task("replaying the log", unit="entries") as progress:
            return kvstore.open(path, progress=progress, **options)
    return kvstore.open(path, **options)


def print_table(rows: list[tuple[str, str]], stream=None) -> None:
    stream = stream or sys.stdout
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=stream)


# -- argument parsing ---------------------------------------------------------------


def hex_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hex", action="store_true", help="keys and values are hex strings (for binary data)")


def sync_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sync", choices=("always", "batch", "none"), default="always",
                   help="durability of the writes (default: always, fsynced before returning)")


def build_parser() -> argparse.ArgumentParser:
    from kvstore import cli_admin, cli_demo, cli_files, cli_inspect, cli_kv

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

    def add(name: str, help: str, fn: Callable[..., int], description: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description or help, parents=[common])
        p.set_defaults(func=fn)
        return p

    p = add("demo", "run the main job: workload, crash and recovery, snapshot, restore, Spark export",
            cli_demo.cmd_demo, description=cli_demo.DESCRIPTION)
    cli_demo.add_arguments(p)

    cli_kv.add_commands(add)
    cli_admin.add_commands(add, "stats")
    cli_inspect.add_commands(add)
    cli_files.add_commands(add)
    cli_admin.add_commands(add, "jobs")

    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("walkv")
    except Exception:  # noqa: BLE001
        return "unknown"


def error_code(exc: BaseException) -> int:
    from wal.errors import CorruptionError, LockedError, WalkvError

    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, LockedError):
        return EXIT_LOCKED
    if isinstance(exc, CorruptionError):
        return EXIT_CORRUPT
    if isinstance(exc, WalkvError):
        return EXIT_PROBLEM
    if isinstance(exc, (ValueError, TypeError)):
        return EXIT_USAGE
    return EXIT_PROBLEM


def main(argv: list[str] | None = None) -> int:
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
        from wal.errors import WalkvError

        if args.verbose:
            import traceback

            traceback.print_exc()
        known = isinstance(exc, (CliError, WalkvError, ValueError, TypeError, OSError))
        text = str(exc) if known else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
            text = f"{text} ({exc.filename})"
        if not known and not args.verbose:
            text += " (an internal error: run again with --verbose and report it)"
        print(f"walkv: error: {' '.join(text.split())}", file=sys.stderr)
        return error_code(exc)


if __name__ == "__main__":
    # Run the module's importable copy, so that kvstore.cli_* modules and this
    # entry point share one CliError class.
    from kvstore.cli import main as _main

    sys.exit(_main())
