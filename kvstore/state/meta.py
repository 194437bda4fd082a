"""walkv's bookkeeping in the state machine's LMDB environment: plain keys of
LMDB's main (unnamed) database, beside the record of ``data``. (Keeping them
there rather than in a second named database saves a page copy per write
transaction: the main database's leaf is rewritten by every commit anyway, for
``data``'s root.)

==================  ======================================================
``walkv.format``    ``b"1"``; another number is refused
``walkv.store_id``  the log's store id (hex); a mismatch means this LMDB
                    was built from another log, so it is rebuilt
``walkv.applied``   uint64 little-endian: every log entry up to this LSN
                    is in LMDB, none after it. Written in the same write
                    transaction as the entries it covers, so LMDB's own
                    atomicity makes applying idempotent (replay skips
                    LSNs at or below it). Entries after it may be applied
                    in memory only, in the overlay (:mod:`kvstore.state.overlay`):
                    ``State.applied_lsn`` is what this process's reads see,
                    ``LmdbCommits.applied_lsn`` what LMDB holds
                    (:mod:`kvstore.state.commits`).
``walkv.complete``  ``b"1"`` once a rebuild's base (snapshot) load is
                    done; ``b"0"`` while it runs, so an interrupted
                    rebuild is redone
==================  ======================================================
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

import lmdb

from wal.errors import WalkvError

FORMAT: Final = b"1"
K_FORMAT: Final = b"walkv.format"
K_STORE_ID: Final = b"walkv.store_id"
K_APPLIED: Final = b"walkv.applied"
K_COMPLETE: Final = b"walkv.complete"

_U64: Final = struct.Struct("<Q")
pack_lsn: Final = _U64.pack
"""``walkv.applied``'s value for an LSN."""


class Meta(NamedTuple):
    """The bookkeeping an environment holds (see the module docstring)."""

    initialized: bool
    """``walkv.format`` is there: the environment was initialized."""
    store_id: str | None
    applied_lsn: int
    complete: bool


def applied_of(value: bytes | memoryview | None) -> int:
    """The LSN a ``walkv.applied`` value records (0: none)."""
    return _U64.unpack(value)[0] if value and len(value) == 8 else 0


def read_meta(txn: lmdb.Transaction, main: Any, path: str) -> Meta:
    """The bookkeeping in ``txn``'s snapshot (``main``: the main database's
    handle); a :class:`~wal.errors.WalkvError` for another format, naming ``path``."""
    fmt = txn.get(K_FORMAT, db=main)
    if fmt is not None and fmt != FORMAT:
        raise WalkvError(f"{path}: LMDB state format {fmt!r} is not this "
                         f"walkv's ({FORMAT!r}); use the walkv that wrote it")
    sid = txn.get(K_STORE_ID, db=main)
    return Meta(fmt is not None, bytes(sid).decode("ascii", "replace") if sid else None,
                applied_of(txn.get(K_APPLIED, db=main)), txn.get(K_COMPLETE, db=main) == b"1")


def write_meta(main: Any, store_id: str, applied_lsn: int, complete: bool, txn: lmdb.Transaction) -> None:
    """In the write transaction ``txn``: the whole bookkeeping of a fresh (or rebuilding) environment."""
    txn.put(K_FORMAT, FORMAT, db=main)
    txn.put(K_STORE_ID, store_id.encode("ascii"), db=main)
    mark_complete(main, applied_lsn, complete, txn)


def mark_complete(main: Any, applied_lsn: int, complete: bool, txn: lmdb.Transaction) -> None:
    """In the write transaction ``txn``: ``walkv.applied`` and ``walkv.complete``."""
    txn.put(K_APPLIED, pack_lsn(applied_lsn), db=main)
    txn.put(K_COMPLETE, b"1" if complete else b"0", db=main)
