"""What the ``walkv`` command modules share: exit codes, :class:`CliError`,
argument helpers, key/value text conversion and opening a store."""

from __future__ import annotations

import argparse
import binascii
import os
import sys
from typing import Any

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
