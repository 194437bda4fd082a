"""Staged groups as readers of the log see them: what one entry changes,
a group whole at its commit (the format, and why: :mod:`kvstore.entry.codec`).

:func:`entry_runs` is the one way every reader of changes (watch, Spark's
``changes`` and ``state``, export) turns an entry into the ops it applies: a
plain batch is itself; a part or an abort is nothing; a commit is every
part's ops, read back from the LSNs just before it (``read_back``, the
reader's own entry reader: parts and commit are consecutive), then its own,
one run per entry (bounded memory: a part at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from kvstore.entry.codec import GROUP_CODES, OP_GROUP_ABORT, OP_GROUP_COMMIT, OP_GROUP_PART
from wal.errors import CorruptionError, Damage

Ops = Sequence[Sequence[Any]]
ReadBack = Callable[[int, int], Iterable[tuple[int, Ops]]]
"""``read_back(first, last)``: ``(lsn, ops)`` of the log's entries ``first .. last``, decoded, in order."""


class Commit(NamedTuple):
    """The head op of a group's commit, ``[21, group, first_part_lsn, part_count, app_id, app_version]``."""

    group: bytes
    first_part_lsn: int
    part_count: int
    app_id: str
    app_version: int


def group_code(ops: Ops) -> int | None:
    """The group op code heading ``ops`` (a part, a commit, an abort), or None for a plain batch."""
    if ops:
        code = ops[0][0]
        if code in GROUP_CODES:
            return int(code)
    return None


def commit_of(ops: Ops) -> Commit | None:
    """The commit ``ops`` (a decoded entry) is, or None."""
    if group_code(ops) != OP_GROUP_COMMIT:
        return None
    return Commit(*ops[0][1:])


def _bad(lsn: int, reason: str) -> CorruptionError:
    return CorruptionError(f"the staged group committed at LSN {lsn} {reason}", kind=Damage.SEQUENCE, lsn=lsn,
                           hint="run `walkv verify STORE`; a group's parts come right before its commit")


def check_part(lsn: int, part_lsn: int, ops: Ops, commit: Commit, index: int) -> Ops:
    """The ops of part ``index`` of ``commit`` (at LSN ``lsn``), read at ``part_lsn``: checked to be that part."""
    head = ops[0] if ops else None
    if head is None or head[0] != OP_GROUP_PART or head[1] != commit.group or head[2] != index:
        raise _bad(lsn, f"expects its part {index} at LSN {part_lsn}, which holds "
                        f"{'another entry' if head is None else repr(list(head))[:80]}")
    return ops[1:]


def entry_runs(lsn: int, ops: Ops, read_back: ReadBack) -> Iterator[tuple[int, Ops]]:
    """``(index of its first op, ops)`` runs of what entry ``lsn`` (decoded:
    ``ops``) applies, each run starting in the default keyspace: a plain batch
    is one run (from 0); a part or an abort none; a commit one run per part,
    in order, then its own ops (without its head), numbered through the
    group. A commit whose parts the log does not hold right before it is
    :class:`~wal.errors.CorruptionError`."""
    code = group_code(ops)
    if code is None:
        yield 0, ops
        return
    if code == OP_GROUP_PART or code == OP_GROUP_ABORT:
        return
    commit = Commit(*ops[0][1:])
    first, count = commit.first_part_lsn, commit.part_count
    if first + count != lsn:
        raise _bad(lsn, f"names {count} part(s) from LSN {first}, which do not end right before it")
    index = offset = 0
    if count:
        for part_lsn, part in read_back(first, lsn - 1):
            if part_lsn != first + index:
                raise _bad(lsn, f"expects its part {index} at LSN {first + index}, not {part_lsn}")
            body = check_part(lsn, part_lsn, part, commit, index)
            yield offset, body
            offset += len(body)
            index += 1
    if index != count:
        raise _bad(lsn, f"has {count} part(s); the log holds {index} of them")
    yield offset, ops[1:]


def group_start(lsn: int, read_back: ReadBack, first_available: int) -> int:
    """Where a reader from ``lsn`` must find the log: ``lsn``, or the LSN of
    the first part of the staged group that spans it (entry ``lsn - 1`` is
    one of its parts, whose commit may not be written yet; or entry ``lsn``
    is one of its parts or its commit). What keeps a log (the store's
    retention, the archive's) keeps it from there, so that the reader can
    read the group back. ``first_available``: the log's first LSN (what it no
    longer holds, it cannot keep)."""
    first = max(lsn - 1, first_available)
    if first > lsn:
        return lsn
    for at, ops in read_back(first, lsn):
        code = group_code(ops)
        if code == OP_GROUP_PART:
            return at - int(ops[0][2])
        if code == OP_GROUP_COMMIT and at == lsn:
            return int(ops[0][2])
    return lsn


__all__ = ["Commit", "ReadBack", "check_part", "commit_of", "entry_runs", "group_code", "group_start"]
