"""The exceptions walkv raises, rooted at :class:`WalkvError`.

This is the lowest layer, so every package (``wal``, ``snapshot``, ``kvstore``)
raises these and ``kvstore`` re-exports them. Only these, plus ``TypeError`` and
``ValueError`` for wrong arguments, ever reach a user. Every message says what
happened, where (file, offset, LSN) and what to do next.

Callers tell errors apart by type and by attributes (:attr:`CorruptionError.kind`,
:attr:`LogGapError.first_missing`), never by matching message text.
"""

from __future__ import annotations

import enum
import errno
import os

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


class LockedError(WalkvError):
    """Another writer holds the directory's lock file."""


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


class SnapshotError(WalkvError):
    """A snapshot could not be written, found or used."""


def file_error(error: OSError, doing: str) -> WalkvError:
    """walkv's error for an ``OSError`` met while ``doing`` something, naming
    the file and what to do (a full disk and a permission problem each say so)."""
    where = error.filename or "?"
    if error.errno == errno.ENOSPC:
        return LogFailedError(f"{doing}: the disk is full ({where}); free space and try again")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return WalkvError(
            f"{doing}: cannot access {where} ({error.strerror}); check its owner and mode (walkv's files "
            "are read and written by the user that owns the store) and that the file system is writable"
        )
    return WalkvError(f"{doing}: {error.strerror or error} ({where})")


def log_failed(directory: str, error: BaseException, first_lsn: int, durable: int, written: int) -> LogFailedError:
    """The error a log gives once a write or fsync of LSN ``first_lsn`` and
    later failed: what is durable, what was acknowledged but is at risk
    (``sync="batch"``/``"none"``), and what was never acknowledged."""
    full = isinstance(error, OSError) and error.errno == errno.ENOSPC
    at_risk = (f" LSNs {durable + 1}..{written} were acknowledged but not fsynced, and may be lost."
               if written > durable else "")
    return LogFailedError(
        f"the log at {directory} failed while writing LSN {first_lsn} and later: "
        f"{'the disk is full' if full else repr(error)}. It refuses every further append. Entries up to "
        f"LSN {durable} are durable.{at_risk} LSN {first_lsn} and later were not acknowledged; they may "
        f"or may not be in the log after a reopen. Close it and reopen{' after freeing space' if full else ''}."
    )
