"""What a failure becomes: walkv's error, from the hierarchy in :mod:`wal.errors`,
for an ``OSError`` met on a file (:func:`file_error`) and for a log that
failed (:func:`log_failed`), each message stating what failed, where, what
the facts support about durability, and what to do.

A room of its own: the hierarchy says what kinds of failure there are; this
module says, for the two failures every layer meets, exactly what to tell the
user.
"""

from __future__ import annotations

import errno

from wal.errors import DiskFullError, LogFailedError, StoreVanishedError, WalkvError


def file_error(error: OSError, doing: str) -> WalkvError:
    """walkv's error for an ``OSError`` met while ``doing`` something, naming
    the file and what to do (a full disk and a permission problem each say so)."""
    where = error.filename or "?"
    if error.errno == errno.ENOSPC:
        return DiskFullError(f"{doing}: the disk is full ({where}); free space and try again")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return WalkvError(
            f"{doing}: cannot access {where} ({error.strerror}); check its owner and mode (walkv's files "
            "are read and written by the user that owns the store) and that the file system is writable"
        )
    return WalkvError(f"{doing}: {error.strerror or error} ({where})")


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError):
        if error.errno == errno.ENOSPC:
            return f"the disk is full ({error.filename or 'no space left on the device'})"
        return f"{error.strerror or error}{f' ({error.filename})' if error.filename else ''}"
    if isinstance(error, WalkvError):
        return str(error)
    return repr(error)


def _lsns(first: int, last: int) -> str:
    return f"LSN {first} is" if first == last else f"LSNs {first}..{last} are"


def log_failed(directory: str, error: BaseException, first_lsn: int, durable: int, written: int) -> LogFailedError:
    """The one error a log gives once handling LSN ``first_lsn`` and later
    failed (a write, an fsync, the ``commit`` hook that applies them, or
    the directory vanishing), stating only what the facts support:

    * LSNs up to ``durable`` were fsynced; those below ``first_lsn`` were
      acknowledged. LSNs ``first_lsn..durable`` (when the failure came after
      their fsync, e.g. applying them) are in the log but were not
      acknowledged: a reopen applies them.
    * LSNs ``durable+1 .. first_lsn-1`` were acknowledged (``sync="batch"``/
      ``"none"``) but not fsynced: a machine crash may lose them.
    * LSNs from ``max(first_lsn, durable+1)`` to ``written`` reached the OS
      unacknowledged: they may or may not be there after a reopen.

    When the log's directory vanished (:class:`StoreVanishedError`) none of
    that holds any more: nothing is claimed durable.
    """
    what = _describe(error)
    if isinstance(error, StoreVanishedError):
        return StoreVanishedError(
            f"the log at {directory} can no longer be written: {what}. Nothing this log wrote can be "
            f"counted on as durable there any more (entries up to LSN {written} went into files that are "
            f"no longer at that path, including any acknowledged since the directory vanished), and LSN "
            f"{first_lsn} and later were refused. It refuses every further append and recreates nothing. "
            "Close the store; restore its files from a copy if they were deleted by mistake."
        )
    full = isinstance(error, DiskFullError) or (isinstance(error, OSError) and error.errno == errno.ENOSPC)
    parts = [f"the log at {directory} failed at LSN {first_lsn}: {what}. It refuses every further append."]
    acked = first_lsn - 1
    if durable >= first_lsn:
        parts.append(f"LSNs up to {acked} were acknowledged and are durable. {_lsns(first_lsn, durable)} "
                     "durable in the log but not acknowledged (the failure came after the fsync); "
                     f"the next open applies {'it' if first_lsn == durable else 'them'}.")
    else:
        parts.append(f"LSNs up to {durable} are durable." if durable > 0 else "No LSN is durable yet.")
        if acked > durable:
            parts.append(f"LSNs {durable + 1}..{acked} were acknowledged but not fsynced: a crash of the "
                         "machine may lose them, a crash of the process does not.")
    unsure = max(first_lsn, durable + 1)
    if written >= unsure:
        parts.append(f"{_lsns(unsure, written)} written to the OS but not acknowledged; a reopen may or may "
                     "not find them.")
    parts.append(f"Close it and reopen{' after freeing space' if full else ''}.")
    cls = DiskFullError if full else LogFailedError
    return cls(" ".join(parts))
