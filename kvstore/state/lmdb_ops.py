"""LMDB cursor and transaction helpers of the state machine (kvstore/state/machine.py):
seeking with bounds of any length, range deletes, batched puts, mapping LMDB
read errors to walkv's, and giving ``data.mdb`` real blocks.

Keys are 1..511 bytes (LMDB's default maximum key size); range bounds may be
512 bytes, so a bound longer than a key is compared by its first 511 bytes.
"""

from __future__ import annotations

import errno
import operator
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, cast

import lmdb

from kvstore.entry.codec import KEYSPACE_CODES, OP_DELETE, OP_KEYSPACE, OP_PUT
from kvstore.entry.limits import MAX_KEY_BYTES
from wal.errors import CorruptionError, DiskFullError, WalkvError

_key: Final = operator.itemgetter(1)
_value: Final = operator.itemgetter(2)


def _pairs(run: Sequence[Sequence[Any]]) -> zip[tuple[bytes, bytes]]:
    """The (key, value) pairs of put ops, for ``putmulti``: zipped, not
    ``map(itemgetter(1, 2), run)``, because zip hands out one tuple again
    and again once its taker dropped it (100,000 puts: 2 ms less)."""
    return zip(map(_key, run), map(_value, run))


def seek_ge(cur: lmdb.Cursor, bound: bytes) -> bool:
    """Position at the first key >= ``bound`` (any length); False if none."""
    if not bound:
        return cur.first()
    if len(bound) <= MAX_KEY_BYTES:
        return cur.set_range(bound)
    head = bound[:MAX_KEY_BYTES]  # keys are <= 511 bytes: k >= bound iff k > head
    if not cur.set_range(head):
        return False
    return cur.next() if cur.key() == head else True


def seek_lt(cur: lmdb.Cursor, bound: bytes | None) -> bool:
    """Position at the last key < ``bound`` (None: the last key); False if none."""
    if bound is None:
        return cur.last()
    if not bound:
        return False
    if len(bound) <= MAX_KEY_BYTES:
        return cur.prev() if cur.set_range(bound) else cur.last()
    head = bound[:MAX_KEY_BYTES]  # k < bound iff k <= head
    if not cur.set_range(head):
        return cur.last()
    return True if cur.key() == head else cur.prev()


def position(cur: lmdb.Cursor, lo: bytes, hi: bytes | None, last: bytes | None,
              reverse: bool):
    """An LMDB cursor iterator at the first key of the scan (after ``last``,
    when resuming), or None when the range is empty."""
    if not reverse:
        if last is None:
            ok = seek_ge(cur, lo)
        else:
            ok = cur.set_range(last) and (cur.key() != last or cur.next())
        return cur.iternext() if ok else None
    ok = seek_lt(cur, last if last is not None else hi)
    return cur.iterprev() if ok else None


APPEND_RUN: Final = 1024
"""A run of at least this many puts whose keys ascend past the database's
last key is appended (:func:`put_run`)."""


def put_run(txn: lmdb.Transaction, run: Sequence[Sequence[Any]], db: Any = None) -> None:
    """Put a run of put ops ([1, key, value] or tuples) in one LMDB call, into
    ``db`` (None: the transaction's, ``data``). A long run whose keys
    strictly ascend, all after the database's last key (a bulk load of
    sorted keys, time-ordered keys), is put with ``MDB_APPEND``, which fills
    pages at the end of the tree without searching it (100,000 such puts:
    14 ms instead of 26); the check stops at the first key out of order, so
    other runs pay next to nothing for it."""
    if len(run) == 1:
        op = run[0]
        txn.put(op[1], op[2], db=db)
        return
    cur = txn.cursor(db)
    if len(run) >= APPEND_RUN and _ascends_past_last(cur, run):
        added = cur.putmulti(_pairs(run), append=True)[1]
        if added != len(run):  # LMDB skips a key out of order: never here, the keys were checked
            raise WalkvError(f"appending {len(run)} ascending keys to LMDB added {added}")
    else:
        cur.putmulti(_pairs(run))


def _ascends_past_last(cur: lmdb.Cursor, run: Sequence[Sequence[Any]]) -> bool:
    """Do the keys of ``run`` strictly ascend, the first after the last key
    of ``cur``'s database?"""
    prev: bytes = run[0][1]
    if cur.last():
        last: bytes = cur.key()  # type: ignore[assignment]  # bytes: walkv never sets buffers=True
        if last >= prev:
            return False
    # (Iterated, not indexed: compiled, run[i] boxes i and takes the generic item path: twice
    # the cost, 100,000 keys 2.7 ms instead of 1.4.)
    started = False  # (the first key is prev itself)
    for op in run:
        key: bytes = op[1]
        if started and key <= prev:
            return False
        started = True
        prev = key
    return True


def delete_range(txn: lmdb.Transaction, start: bytes, end: bytes, db: Any = None) -> None:
    if start >= end:
        return
    cur = txn.cursor(db)
    if not seek_ge(cur, start):
        return
    delete = cur.delete
    key = cur.key
    while True:
        k: bytes = key()  # type: ignore[assignment]  # bytes: walkv never sets buffers=True
        if not k or k >= end:
            return
        delete()


def read_error(exc: lmdb.Error, path: str) -> Exception:
    if isinstance(exc, lmdb.CorruptedError | lmdb.PageNotFoundError |
                  lmdb.PanicError | lmdb.DiskError):
        return CorruptionError(
            f"LMDB read failed: {exc}", path=path,
            hint="close the store and reopen it read-write: walkv rebuilds "
                 "LMDB from the log when it finds it damaged")
    if isinstance(exc, lmdb.ReadersFullError):
        return WalkvError(f"too many concurrent LMDB readers ({path}): {exc}; "
                          f"raise the max_readers option")
    return WalkvError(f"LMDB read failed ({path}): {exc}")


def preallocate(path: str, size: int) -> None:
    """Give ``data.mdb`` (already initialised by LMDB) real blocks up to
    ``size``: with MDB_WRITEMAP LMDB makes the file as long as the map but
    sparse, and a write to a hole on a full disk is a SIGBUS, while
    allocating here turns a full disk into an error."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)  # no fallocate here: a sparse file it is
            elif exc.errno == errno.ENOSPC:
                raise DiskFullError(
                    f"no space to give the LMDB map of {path} {size >> 20} MiB of blocks") from None
            else:
                raise
    finally:
        os.close(fd)


def write_values(txn: lmdb.Transaction, values: dict[bytes, bytes | None]) -> None:
    """Write an overlay dictionary (key: newest value, None: deleted) inside
    ``txn``: its puts with one putmulti call, then its deletes (each key is
    there once, so their order does not matter; sorting them first costs
    more than it saves LMDB)."""
    deletes = [key for key, value in values.items() if value is None]
    if not deletes:  # (the common overlay: its items are the pairs, no list of them to build)
        txn.cursor().putmulti(cast("Iterable[tuple[bytes, bytes]]", values.items()))  # (no None among them)
        return
    if len(deletes) < len(values):
        txn.cursor().putmulti([(key, value) for key, value in values.items() if value is not None])
    delete = txn.delete
    for key in deletes:
        delete(key)


KeyspaceDB = Callable[[lmdb.Transaction, str], Any]
"""``keyspace_db(txn, name)``: keyspace ``name``'s database in the write
transaction ``txn``, created if need be
(:meth:`kvstore.state.environment.Environment.keyspace_db_in`)."""


def apply_ops(txn: lmdb.Transaction, ops: Sequence[Sequence[Any]], keyspace_db: KeyspaceDB | None = None) -> None:
    """Apply operations in order inside ``txn``, starting in the default
    keyspace (``data``). Puts go to LMDB in runs, through one putmulti call
    each: py-lmdb releases the GIL on every call, and with another thread
    running Python each release costs a GIL hand-off (a put goes from ~1.5
    to ~20 us), so calls are few. Keyspace ops (``[16, name]``, ``[17,
    name]``) need ``keyspace_db``."""
    run: list[Sequence[Any]] = []
    db = None  # the transaction's own: data, the default keyspace
    for op in ops:
        code = op[0]
        if code == OP_PUT:
            run.append(op)
            continue
        if run:
            put_run(txn, run, db)
            run = []
        if code == OP_DELETE:
            txn.delete(op[1], db=db)
        elif code in KEYSPACE_CODES:  # keyspaces: switch the database, or empty one
            assert keyspace_db is not None, "keyspace ops need keyspace_db"
            target = keyspace_db(txn, op[1])
            if code == OP_KEYSPACE:
                db = target
            else:
                txn.drop(target, delete=False)  # emptied, not deleted: handles stay valid (lmdb_env)
        else:
            delete_range(txn, op[1], op[2], db)
    if run:
        put_run(txn, run, db)
