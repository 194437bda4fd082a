"""The exceptions walkv raises, rooted at :class:`WalkvError`, and the one
report of damage a check finds (:class:`DamageReport`).

This is the lowest layer, so every package (``wal``, ``snapshot``, ``kvstore``)
raises these and ``kvstore`` re-exports them. Only these, plus ``TypeError`` and
``ValueError`` for wrong arguments, ever reach a user. Every message says what
happened, where (file, offset, LSN) and what to do next.

Callers tell errors apart by type and by attributes (:attr:`CorruptionError.kind`,
:attr:`LogGapError.first_missing`), never by matching message text. What an
``OSError`` on a file, or a failed log, becomes (the message each states) is
:mod:`wal.failures`.
"""

from __future__ import annotations

import enum
import os
from typing import Literal, NamedTuple

REPAIR_HINT = "run `walkv repair STORE` (or wal.repair(DIR)) to cut the log at the first bad record"
"""What to do about damage in a log: the one wording every layer uses."""

SNAPSHOT_HINT = (
    "the snapshot is damaged: delete its directory and take a new snapshot "
    "(older snapshots and the log are not affected)"
)
"""What to do about a damaged snapshot."""


class WalkvError(Exception):
    """Base class of every error walkv raises on purpose."""


class Damage(str, enum.Enum):
    """What kind of damage a :class:`CorruptionError` reports."""

    CHECKSUM = "checksum"        # a CRC over stored bytes does not match
    FRAMING = "framing"          # a bad record length or type, a fragment out of sequence
    HEADER = "header"            # a file's header: bad magic, version, first LSN, store id
    SEQUENCE = "sequence"        # LSNs missing or out of order between or inside files
    MISSING = "missing"          # a file that must exist does not
    TOO_LARGE = "too_large"      # a record or file over its stored limit
    CONTENT = "content"          # a well-framed record whose contents do not decode
    LMDB = "lmdb"                # the LMDB state machine is damaged (it is rebuilt)
    TIMELINE = "timeline"        # a segment on another timeline than the log's history says


class CorruptionError(WalkvError):
    """Stored bytes are not what walkv wrote: a CRC mismatch, a bad length, a
    broken LSN sequence, a missing segment, an untrusted manifest.

    ``kind`` (a :class:`Damage`) says what is wrong; ``path``, ``offset`` and
    ``lsn`` say where (``offset`` is the byte offset in ``path`` where the bad
    data starts; 0 for a damaged or missing whole file); ``reason`` is the
    message without location and hint; ``hint`` says what to do.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: Damage = Damage.CONTENT,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        lsn: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.kind = kind
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset
        self.lsn = lsn
        self.reason = message
        self.hint = hint
        where = []
        if self.path is not None:
            where.append(self.path)
        if offset is not None:
            where.append(f"offset {offset}")
        if lsn is not None:
            where.append(f"LSN {lsn}")
        text = message
        if where:
            text = f"{message} ({', '.join(where)})"
        if hint:
            text = f"{text}; {hint}"
        super().__init__(text)

    def with_hint(self, hint: str) -> CorruptionError:
        """The same damage with another hint (a layer above knows better what to do)."""
        return CorruptionError(self.reason, kind=self.kind, path=self.path, offset=self.offset,
                               lsn=self.lsn, hint=hint)


Severity = Literal["corrupt", "problem"]
"""How bad a :class:`DamageReport` is: "corrupt" (stored bytes are damaged;
the check commands exit 4) or "problem" (something the next open rebuilds,
or a person decides: a damaged sparse index, a whole record over the limit
this walkv reads, a snapshot of another store; exit 1)."""


class DamageReport(NamedTuple):
    """One thing a check found wrong (``walkv verify``, ``walkv
    archive-verify``, :meth:`kvstore.archive.ArchiveReader.verify`).

    Where: ``path`` (a file, or an archive object as shown to people),
    ``offset`` in it and ``lsn``, each when known. What: ``kind`` and
    ``message`` (without location or hint). How bad: ``severity``.
    ``str()`` is the one way it is printed:
    ``CORRUPT: PATH, offset N, LSN L: MESSAGE``.
    """

    path: str | None
    offset: int | None
    lsn: int | None
    kind: Damage
    message: str
    severity: Severity = "corrupt"

    def __str__(self) -> str:
        where = [] if self.path is None else [self.path]
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.lsn is not None:
            where.append(f"LSN {self.lsn}")
        return f"{self.severity.upper()}: {', '.join(where)}: {self.message}"

    @classmethod
    def of(cls, error: CorruptionError, path: str | None = None, severity: Severity = "corrupt") -> DamageReport:
        """The report of ``error``; ``path`` names the file when the error does not."""
        return cls(error.path or path, error.offset, error.lsn, error.kind, error.reason, severity)


class LogGapError(WalkvError):
    """LSNs a reader needs are no longer in the log (retention deleted their
    segments after a snapshot covered them) or were never there.

    ``first_missing`` and ``last_missing`` name the gap (inclusive);
    ``first_available`` is the first LSN the log still holds (``None`` when
    unknown).
    """

    def __init__(self, message: str, *, first_missing: int, last_missing: int,
                 first_available: int | None = None) -> None:
        self.first_missing = first_missing
        self.last_missing = last_missing
        self.first_available = first_available
        super().__init__(message)


class SubscriptionInvalidatedError(WalkvError):
    """A named subscription fell so far behind that retention stopped keeping
    the log for it (past ``max_retained_bytes``): ``name`` names it,
    ``next_lsn`` is the first LSN it had not acknowledged. Drop it and
    subscribe again."""

    def __init__(self, message: str, *, name: str, next_lsn: int) -> None:
        self.name = name
        self.next_lsn = next_lsn
        super().__init__(message)


class RecordTooLargeError(WalkvError, ValueError):
    """A payload, key or value is over its configured limit. Nothing was written."""


class RecordOverLimitError(WalkvError):
    """A log record is whole (every fragment's checksum is good) but larger
    than the limit its segment's header states, which is the most this walkv
    reads from that segment. It is not damage, so :func:`wal.repair` refuses
    to cut it (cutting would drop an acknowledged write). ``path`` and
    ``offset`` say where it is, ``size`` how large it is, ``limit`` the
    limit."""

    def __init__(self, message: str, *, path: str, offset: int, size: int, limit: int) -> None:
        self.path = path
        self.offset = offset
        self.size = size
        self.limit = limit
        super().__init__(message)


class KeyspaceLimitError(WalkvError):
    """A write would create one keyspace more than a store holds
    (``kvstore.state.lmdb_env.MAX_KEYSPACES``). Nothing was written."""


class LockedError(WalkvError):
    """Another writer holds the directory's lock file."""


class NotAStoreError(WalkvError):
    """The path given to open a store is not one and cannot become one: a
    file, or a directory that holds other things and no log
    (:mod:`kvstore.store.opening`). Nothing was made there."""


class RecoveryNeededError(WalkvError):
    """A read-only open found a state only a read-write open can make usable
    (LMDB marked for a rebuild by ``walkv repair``, or left open by a writer
    whose machine crashed): open the store read-write once (``walkv repair
    STORE`` does only that when its log is whole)."""


class ClosedError(WalkvError):
    """The log, store or snapshot was used after ``close()``."""


class ReadOnlyError(WalkvError):
    """A write was attempted on a store opened with ``readonly=True``."""


class LogFailedError(WalkvError):
    """An fsync or write failed (or the disk is full). The log refuses every
    further append: a failed fsync may have dropped dirty pages, so retrying and
    trusting the data would be wrong. Everything fsynced before is safe (with
    ``sync="always"``, everything acknowledged); the message says which LSNs
    are at risk. Close and reopen (after freeing space) to go on."""


class DiskFullError(LogFailedError):
    """A write, an fsync or a preallocation (a log segment, the LMDB map)
    found no space left on the file system. Free space, then reopen."""


class StoreVanishedError(LogFailedError):
    """The directory of an open log (or its lock file) was deleted or
    replaced under it (``rm -rf STORE``, a new store made at the same path).
    Nothing written to the old files can be counted on: they are no longer
    where any reader or a reopen looks. The log refuses every further append,
    and nothing recreates the directory."""


class OutcomeUnknownError(WalkvError):
    """A write was sent, but whether it took effect is unknown: the connection
    to the server broke after the request went out, or the writer lost its
    replicas or its lease after the write reached its log. It may be applied
    (now or once a leader that holds it serves again) or never be. Read the
    key to find out; only an idempotent write (a put of a value, a delete) is
    safe to send again as it is."""


class SyncReplicationError(LogFailedError, OutcomeUnknownError):
    """A write was durable in the leader's log but fewer than the
    ``sync_replicas`` it needed confirmed it within ``sync_timeout``: it was
    not acknowledged, and the store refuses every further write until it is
    reopened (it never degrades to fewer replicas without saying so). ``lsn``
    is the entry, ``holding`` how many replicas held it, ``required`` how
    many it needed."""

    def __init__(self, message: str, *, lsn: int, holding: int, required: int) -> None:
        super().__init__(message)
        self.lsn = lsn
        self.holding = holding
        self.required = required


class FencedError(LogFailedError, OutcomeUnknownError):
    """This node stopped being the cluster's writer while a write was in its
    log and not yet acknowledged: its lease ran out (a pause, a partition
    from the coordinator) or a newer epoch exists. Nothing is acknowledged
    after that; the node steps down and follows the new leader, discarding
    what only it holds."""


class NotLeaderError(ReadOnlyError):
    """A write was sent to a node of a cluster that is not its leader.
    ``leader`` is the leader's URL as this node knows it (None: no leader
    right now, an election is on) and ``epoch`` the epoch it knows; send the
    write there (``kvstore.connect([...])`` does)."""

    def __init__(self, message: str, *, leader: str | None, epoch: int) -> None:
        super().__init__(message)
        self.leader = leader
        self.epoch = epoch


class CoordinatorError(WalkvError):
    """The cluster's coordinator (etcd) could not be reached, or refused a
    request; ``code`` is its gRPC status code when it answered one."""

    def __init__(self, message: str, *, code: object = None) -> None:
        super().__init__(message)
        self.code = code


class SnapshotError(WalkvError):
    """A snapshot could not be written, found or used."""


class ArchiveError(WalkvError):
    """An archive (:mod:`kvstore.archive`) cannot be used as asked: it belongs
    to another store, it is not a walkv archive, or the object store failed."""


class ArchiveUnavailableError(ArchiveError):
    """The object store holding an archive failed or did not answer in time
    (a refused connection, a request that timed out, an error from the
    service): ``uri`` (credentials redacted) names the archive, ``timed_out``
    says whether it was a timeout. It may work later: the archiver retries
    it; a command reports it in one line."""

    def __init__(self, message: str, *, uri: str, timed_out: bool) -> None:
        self.uri = uri
        self.timed_out = timed_out
        super().__init__(message)


class ArchiveLagError(ArchiveError):
    """The archive did not catch up in time: ``archived_lsn`` is what it
    holds, ``target_lsn`` what was waited for (the lag is their difference)."""

    def __init__(self, message: str, *, archived_lsn: int, target_lsn: int) -> None:
        self.archived_lsn = archived_lsn
        self.target_lsn = target_lsn
        super().__init__(message)


class ArchiveFencedError(ArchiveError):
    """The archive holds a newer history of the store than the one an
    archiver ships (:mod:`kvstore.archive.layout`, fencing): a timeline
    numbered above the archiver's (a promoted replica, a newly elected
    leader), or another with its number, whose lineage left the archiver's
    timeline after LSN ``fork_lsn``. Shipping the entries after it would put
    an older writer's history beside the newer one's, so the archiver stops
    (retrying cannot help). ``mine`` and ``theirs`` are the two
    :class:`~wal.timeline.TimelineStart` after the fork."""

    def __init__(self, message: str, *, mine: object, theirs: object, fork_lsn: int) -> None:
        super().__init__(message)
        self.mine = mine
        self.theirs = theirs
        self.fork_lsn = fork_lsn


class RestoreTimeError(WalkvError):
    """A point-in-time restore (``to_time``) asked for a time before the
    first entry its source holds, so the restored store would be empty (as
    Litestream, walkv refuses rather than build it). ``first_lsn`` and
    ``first_time_us`` (its commit time, unix microseconds) name that entry;
    both are ``None`` when the source holds no entry at all. Pass
    ``allow_empty=True`` (``walkv restore --allow-empty``) to build the empty
    store."""

    def __init__(self, message: str, *, first_lsn: int | None, first_time_us: int | None) -> None:
        self.first_lsn = first_lsn
        self.first_time_us = first_time_us
        super().__init__(message)


class ReplicaError(WalkvError):
    """A read replica (:mod:`kvstore.replica.replica`) cannot follow its source as
    asked: the source is another store than the one the replica holds, or its
    directory is not a replica's."""


class ReplicaLagError(ReplicaError):
    """A replica did not reach ``target_lsn`` in time (``rep.wait_for``):
    ``applied_lsn`` is what it had applied when the wait ended."""

    def __init__(self, message: str, *, applied_lsn: int, target_lsn: int) -> None:
        self.applied_lsn = applied_lsn
        self.target_lsn = target_lsn
        super().__init__(message)


class SourceGoneError(ReplicaError):
    """A replica's source was found gone by its fence (an HTTP source whose
    server no longer answers, :mod:`kvstore.replica.http_source`): nothing
    more can be read from it, so the catch-up of ``rep.promote()`` ends with
    what the replica applied. Never reaches a caller of ``promote``."""


class LeaseNotFoundError(WalkvError):
    """A write under a lease, a keep-alive or a revoke named a lease that is
    not alive at its place in the log (it expired, was revoked, or never
    was). Writes under it were not applied; its LSN was consumed.
    ``lease_id`` names it."""

    def __init__(self, message: str, *, lease_id: int) -> None:
        super().__init__(message)
        self.lease_id = lease_id


class ForkedError(WalkvError):
    """A log, store or LMDB environment was used in a process forked from the
    one that opened it (``os.fork()``, ``multiprocessing`` with the fork start
    method). The child may neither write (its appends would race the parent's
    and lose acknowledged writes) nor read through the parent's LMDB handles;
    open the store again in the child (``readonly=True`` beside the parent's
    writer). See :mod:`wal.forkguard`."""


class ForkedHistoryError(WalkvError):
    """Two histories of one store forked (:mod:`wal.timeline`): a reader holds
    entries past the LSN where the log it reads left their timeline (a
    replica of a store that was repaired, promoted or failed over; a deposed
    leader; an archive or subscription position on a dead branch). Mixing the
    two would give a state neither history had, so it is refused; a replica
    rebuilds from a snapshot. ``mine`` and ``theirs`` are the two
    :class:`~wal.timeline.TimelineStart` after the fork, ``fork_lsn`` the
    last LSN both share."""

    def __init__(self, message: str, *, mine: object, theirs: object, fork_lsn: int) -> None:
        super().__init__(message)
        self.mine = mine
        self.theirs = theirs
        self.fork_lsn = fork_lsn


class SubscriptionForkedError(SubscriptionInvalidatedError, ForkedHistoryError):
    """A named subscription acknowledged changes past the LSN where the
    store's history left their timeline (:mod:`wal.timeline`: a repair cut
    them, a failover discarded them): those changes are in no history the
    store has now, so the subscription cannot go on from its position and is
    invalidated (its record says why). ``name`` and ``next_lsn`` as
    :class:`SubscriptionInvalidatedError`; ``mine`` (the timeline its
    acknowledged changes are on), ``theirs`` (the store's from
    ``fork_lsn + 1``) and ``fork_lsn`` (the last LSN both share) as
    :class:`ForkedHistoryError`. A consumer that can undo what it did with the
    changes after ``fork_lsn`` drops the subscription and subscribes again
    from ``fork_lsn + 1``; else it drops it and starts again from a snapshot.

    Both an invalidation (the same remedy: drop it and subscribe again, and
    a stream of it ends as an invalidated one does, 410 over HTTP) and a fork
    (the same facts, for code that handles every reader's fork alike)."""

    def __init__(self, message: str, *, name: str, next_lsn: int, mine: object, theirs: object,
                 fork_lsn: int) -> None:
        WalkvError.__init__(self, message)
        self.name = name
        self.next_lsn = next_lsn
        self.mine = mine
        self.theirs = theirs
        self.fork_lsn = fork_lsn


class ViewExpiredError(ClosedError):
    """A consistent read view (``db.view()``) was used after its time limit:
    an open view pins LMDB pages and holds off map growth, so it is closed
    for good once older than its ``max_seconds``. Take a new view."""
