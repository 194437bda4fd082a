"""Writing a staged group, an atomic write of any size (the format, and why:
:mod:`kvstore.entry.codec`; how it is applied: :mod:`kvstore.state.groups`),
and aborting the groups whose writer died.

:func:`write_group` appends the parts, each a log entry of its own (so each
is held to the log's record limit, not the whole), then the commit. Until the
commit is durable nothing of the group is visible; once it is, all of it is,
at the commit's LSN. Durability: the commit's, per the store's sync mode.

Consecutive LSNs: readers of the log read a group back from the LSNs right
before its commit, so nothing may be appended between a group's entries.
The caller of :func:`write_group` is the store's only writer while it runs:
no other thread writes, and the sweeper is off (``sweep_interval=None``) or
has no key with a TTL to sweep, as in the Spark writer's driver, which opens
the store for itself (:mod:`kvstore.spark.writer`). Each append's LSN is
checked: a write that came between two parts aborts the group (its parts
are dropped) and raises :class:`~wal.errors.WalkvError`.

Idempotency (Delta's ``txnAppId``/``txnVersion``): a group with an
``app_id`` is written only when ``app_version`` is above the version that
application last committed, decided twice against the state every earlier
entry left: before the first part (nothing is written: the job ran
already), and again right before the commit, as conditions are decided in
log order; a group that lost there is logged as an abort, so the log alone
says what happened.

Retention (:func:`group_start`): the log is kept from the first part of a
group that spans the first LSN retention would keep (a part right before
it, or a part or the commit at it), so that a reader from there (a
watcher, Spark) finds the parts.

Orphans (:func:`abort_orphans`): a writer that died between its parts and
its commit leaves durable parts with neither. The next open of the store
for writing (the process lock says no writer is left) appends an abort for
each, right after them (nothing was written since), so that every reader
of the log, replicas included, sees the group end. A store opened for a
cluster (``sync_replicas`` or ``fence``) leaves them to its leader's log.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import wal
from kvstore.entry import groups as entry_groups
from kvstore.entry.codec import (
    MAX_APP_ID_CHARS,
    OP_DROP_KEYSPACE,
    OP_GROUP_ABORT,
    OP_GROUP_COMMIT,
    OP_GROUP_PART,
    OP_KEYSPACE,
    decode,
    pack_ops,
    parse,
    with_head,
)
from kvstore.state import State
from wal.errors import WalkvError
from wal.segment import Payload

log = logging.getLogger("walkv.store")

Ops = Sequence[Sequence[Any]]
Append = Callable[[Payload, list], int]
"""The store's one way into the log (``payload, ops -> LSN``)."""


def committed_version(state: State, app_id: str) -> int | None:
    """The last version application ``app_id`` committed (None: none)."""
    return state.lmdb.read(lambda txn: state.groups.app_version(txn, app_id))


def _check_app(app_id: object, app_version: object) -> None:
    if type(app_id) is not str or len(app_id) > MAX_APP_ID_CHARS:
        raise ValueError(f"app_id must be a str of at most {MAX_APP_ID_CHARS} characters, not {app_id!r:.80}")
    if type(app_version) is not int or not 0 <= app_version < 1 << 63:
        raise ValueError(f"app_version must be an int 0 .. 2**63 - 1, not {app_version!r:.80}")


def _abort(append: Append, group: bytes) -> int:
    ops = [[OP_GROUP_ABORT, group]]
    return append(pack_ops(ops), ops)


def _checked(payload: bytes, writable_keyspace: Callable[[str], str] | None) -> list:
    """The ops of ``payload``, checked as the log's readers will decode them,
    and their keyspaces by ``writable_keyspace``."""
    ops = parse(payload)
    if writable_keyspace is not None:
        for name in {op[1] for op in ops if op[0] == OP_KEYSPACE or op[0] == OP_DROP_KEYSPACE}:
            writable_keyspace(name)
    return ops


def write_group(append: Append, state: State, last_lsn: Callable[[], int], parts: Iterable[Ops | bytes],
                ops: Ops = (), *, app_id: str = "", app_version: int = 0,
                writable_keyspace: Callable[[str], str] | None = None) -> int | None:
    """Append ``parts`` (each a list of writes, or a batch of them encoded
    as :mod:`kvstore.entry.codec` encodes one; one log entry each) and then
    a commit carrying ``ops`` (module docstring); the commit's LSN, or None
    when application ``app_id`` committed ``app_version`` or a later one
    already (nothing of this group is applied). Each entry is checked as
    its readers decode it: an op a group cannot hold is a ``ValueError``, a
    part over the log's record limit :class:`~wal.errors.RecordTooLargeError`,
    and each keyspace it names with ``writable_keyspace`` (the store's check).
    A failure while writing the parts (theirs, or the iterator's) aborts
    the group, then raises."""
    _check_app(app_id, app_version)

    def already() -> bool:
        done = committed_version(state, app_id) if app_id else None
        return done is not None and done >= app_version

    if already():
        return None
    group = uuid.uuid4().bytes
    first = last_lsn() + 1
    count = 0
    try:
        for part in parts:
            head = [OP_GROUP_PART, group, count]
            payload = with_head(head, part) if isinstance(part, bytes) else pack_ops([head, *part])
            lsn = append(payload, _checked(payload, writable_keyspace))
            if lsn != first + count:
                raise WalkvError(f"a write at LSN {first + count} came between the parts of a staged group "
                                 f"(its part {count} is at LSN {lsn}); the group is aborted. Write a group "
                                 "while no other thread writes the store")
            count += 1
        if already():  # decided in log order, right before the commit: logged as an abort
            _abort(append, group)
            return None
        payload = pack_ops([[OP_GROUP_COMMIT, group, first, count, app_id, app_version], *ops])
        return append(payload, _checked(payload, writable_keyspace))
    except BaseException:
        if count:
            try:
                _abort(append, group)
            except Exception as exc:  # the log failed: the next open aborts the orphaned parts
                log.warning("could not abort the staged group after a failure (%s); the store's next open "
                            "aborts it", exc)
        raise


def abort_orphans(append: Append, state: State, path: str) -> int:
    """Abort every group with parts and no commit or abort (module
    docstring); how many were."""
    orphans = state.lmdb.read(state.groups.open_groups)
    for group, parts in orphans:
        lsn = _abort(append, group)
        log.warning("aborted a staged group of %d part(s) whose writer stopped before its commit, at LSN %d "
                    "of %s: nothing of it was applied", parts, lsn, path)
    return len(orphans)


def group_start(log: wal.Log, lsn: int) -> int:
    """Where the store's retention keeps ``log`` from, for a reader from
    ``lsn`` (:func:`kvstore.entry.groups.group_start`)."""
    return entry_groups.group_start(lsn, lambda first, last: ((at, decode(payload, at)) for at, payload in
                                                              log.read(first, last)), log.first_lsn)


__all__ = ["abort_orphans", "committed_version", "group_start", "write_group"]
