"""What the ``walkv`` command modules share: exit codes, :class:`CliError`,
argument helpers, key/value text conversion, sizes and opening a store."""

from __future__ import annotations

import argparse
import binascii
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from kvstore.cli.progress import Reporter
from kvstore.layout import REPLICA_NAME, StoreLayout
from kvstore.store.opening import describe
from wal.errors import RecoveryNeededError

if TYPE_CHECKING:
    from kvstore.store.store import KVStore

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CORRUPT = 4

Command = Callable[[argparse.Namespace, Reporter], int]
"""A command: the parsed arguments and the progress reporter in, the exit code out."""


class AddCommand(Protocol):
    """Registers one command with the ``walkv`` parser (see :func:`kvstore.cli.main.build_parser`)."""

    def __call__(self, name: str, help: str, fn: Command,
                 description: str | None = None) -> argparse.ArgumentParser: ...


class CliError(Exception):
    """A failure to report as one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_PROBLEM) -> None:
        super().__init__(message)
        self.code = code


# -- stores and files ----------------------------------------------------------------


def is_replica(layout: StoreLayout) -> bool:
    """Whether the directory is a read replica's (it has a ``REPLICA`` record
    and no log: :mod:`kvstore.replica.directory`)."""
    return os.path.isfile(os.path.join(layout.root, REPLICA_NAME)) and not os.path.isdir(layout.wal_dir)


def require_store(path: str, *, replica_ok: bool = False) -> StoreLayout:
    """The store's layout; CliError when ``path`` is not a walkv store (a
    directory with a log directory in it), or, with ``replica_ok`` (the
    commands that only read), a read replica's directory."""
    layout = StoreLayout.of(path)
    if not os.path.exists(layout.root):
        raise CliError(f"no store at {path} (no such directory)")
    if not os.path.isdir(layout.root):
        raise CliError(f"{path} is not a walkv store (not a directory)")
    if is_replica(layout):
        if replica_ok:
            return layout
        raise CliError(f"{path} is a read replica, not a store (it has a {REPLICA_NAME} record and no log): "
                       "`walkv get`, `scan` and `stats` read it; run this command on its source, or promote "
                       "the replica (kvstore.open_replica(SOURCE, DIR).promote()) to make it a store")
    if not os.path.isdir(layout.wal_dir):
        names = sorted(os.listdir(layout.root))
        held = f"it holds {describe(layout.root, names)} but" if names else "it is an empty directory: it has"
        raise CliError(f"{path} is not a walkv store ({held} no {os.path.basename(layout.wal_dir)}/ directory)")
    return layout


def allocated_bytes(path: str) -> int:
    """Disk space allocated to one file (0 when it is gone)."""
    try:
        return os.lstat(path).st_blocks * 512
    except OSError:
        return 0


def dir_bytes(path: str, allocated: bool = False) -> int:
    """Bytes of the files under ``path``: their sizes, or the disk space
    allocated to them (preallocated segments and LMDB's map are sparse, so the
    two differ)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            file = os.path.join(dirpath, name)
            if allocated:
                total += allocated_bytes(file)
                continue
            try:
                total += os.lstat(file).st_size
            except OSError:  # removed while we walked (a trimmed segment)
                continue
    return total


def open_store(path: str, *, readonly: bool = False, create: bool = False,
               reporter: Reporter | None = None, **options: Any) -> KVStore:
    """Open a store for a command, with a replay progress bar."""
    import kvstore

    if readonly:
        # A store beside its writer, or a replica beside its follower: reads
        # only (LMDB's reader table aside, nothing in the directory changes).
        layout = require_store(path, replica_ok=True)
        if not os.path.isdir(layout.lmdb_dir):
            if is_replica(layout):
                raise CliError(f"the replica {path} has no state yet ({os.path.basename(layout.lmdb_dir)}/ is "
                               "missing); `walkv replica SOURCE DIR` builds it")
            # Never opened for writing yet (or its LMDB was removed): only a
            # read-write open can build the state; say so.
            raise CliError(f"{path} has no state yet ({os.path.basename(layout.lmdb_dir)}/ is missing); "
                           f"`walkv repair {path}` builds it (or any write command)")
        try:
            return kvstore.open(path, readonly=True)
        except RecoveryNeededError as e:
            fix = (f"`walkv replica SOURCE {path}` recovers it" if is_replica(layout) else
                   f"`walkv repair {path}` does that (its log whole, it changes nothing else)")
            raise CliError(f"{e}: {fix}") from None
    if not create:
        require_store(path)
    if reporter is not None:
        with reporter.task("replaying the log", unit="entries") as progress:
            return kvstore.open(path, progress=progress, **options)
    return kvstore.open(path, **options)


# -- text -------------------------------------------------------------------------------


def to_bytes(text: str, hex_mode: bool, what: str) -> bytes:
    """A key or value given on the command line, as bytes (hex with ``--hex``)."""
    if hex_mode:
        try:
            return binascii.unhexlify(text.strip())
        except (binascii.Error, ValueError):
            raise CliError(f"{what} {text!r} is not valid hex (use pairs of 0-9a-f)", EXIT_USAGE) from None
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # pragma: no cover - lone surrogates
        raise CliError(f"{what} is not valid text; use --hex", EXIT_USAGE) from None


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


def print_table(rows: list[tuple[str, str]], stream: TextIO | None = None) -> None:
    """Two aligned columns, indented."""
    out = stream or sys.stdout
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=out)


# -- argument parsing ---------------------------------------------------------------


def hex_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hex", action="store_true", help="keys and values are hex strings (for binary data)")


def sync_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sync", choices=("always", "batch", "none"), default="always",
                   help="durability of the writes (default: always, fsynced before returning)")


def count(text: str) -> int:
    """An argument that counts things (``--limit``): an int, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is below 0: give 0 or more")
    return n
