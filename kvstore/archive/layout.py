"""An archive's layout: one prefix of an object store (or a directory) per store.

::

    ROOT/ARCHIVE                               identity (JSON): format, version, store id
    ROOT/LEASE                                 the writing archiver's lease (JSON)
    ROOT/wal/<first:020d>-<last:020d>.wal      log objects: LSNs first..last
    ROOT/snapshots/snap-<lsn:020d>/chunk-*.wkc snapshot chunks (snapshot.chunk)
    ROOT/snapshots/snap-<lsn:020d>/MANIFEST    written last (snapshot.manifest)

Rules, and the reason for each:

* ``ARCHIVE`` is written once, first, before any other object, and names the
  store id (the id in the store's log headers). An archiver or reader finding
  another store's id refuses (:class:`~wal.errors.ArchiveError`): two stores
  shipping into one prefix would interleave two histories under the same
  LSNs, and a restore would mix them silently.
* A log object is a complete walkv segment file (:mod:`wal.segment`): a header
  whose first LSN is ``first`` and whose store id is the store's, then exactly
  the entries ``first..last``, consecutive, with their commit timestamps.
  So ``wal.iter_entries``, ``walkv inspect`` and LevelDB's log reader read it
  as they read a local segment, and every byte is CRC-checked as it is read.
  The name carries both ends so that a listing alone gives the coverage (no
  object is opened to plan a read or to resume shipping).
* Two kinds of log objects exist: *pieces* (the durable tail of the active
  segment, shipped every interval) and *whole segments* (a sealed segment,
  uploaded as it is). A piece never crosses a local segment boundary, so a
  whole segment covers its pieces exactly; it is uploaded before they are
  deleted, so coverage never shrinks. Readers chain objects by LSN and
  prefer the longest object starting where the chain stands.
* A snapshot directory holds the local snapshot's files; its chunks are
  uploaded first and ``MANIFEST`` last, because the manifest is the commit
  point: without a valid manifest the directory is no snapshot (exactly as
  locally, :mod:`snapshot.layout`). A snapshot is uploaded only once the
  log objects reach its LSN, so the archive's log is never behind its
  newest snapshot.
* Nothing is overwritten in place. On object stores a PUT is atomic (the
  object appears whole or not at all); on a local directory or ``file://``
  an object is written under a temporary name (a leading ``.`` and a
  ``.tmp-`` suffix, which no pattern above matches), fsynced and renamed.
  A reader therefore never sees a half-written object under a valid name.
* Retention deletes a snapshot's ``MANIFEST`` first (it stops existing at
  once), then its chunks; then the log objects whose every LSN the oldest
  kept snapshot covers, oldest first, so what remains is always a
  contiguous log starting at or before that snapshot.
* Listings are untrusted: only names matching the patterns above are used,
  and the path to an object is always built from the parsed numbers, never
  taken from the listing. ``../``, foreign files, temporary names and
  directory markers are ignored, never followed.
* ``LEASE`` names the one archiver writing the prefix (owner id, host, pid,
  expiry in unix seconds). It is renewed while the archiver runs; another
  archiver refuses (:class:`~wal.errors.LockedError`) while it is live. A
  lease past its expiry, or one held by a process of this host that no
  longer exists (a sidecar killed with SIGKILL), is taken over. Object
  stores have no lock: the lease is written, then read back, and the
  archiver renews it only while it still names it (last writer wins; the
  loser stops).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, NamedTuple

from wal.errors import ArchiveError, CorruptionError, Damage

ARCHIVE_NAME = "ARCHIVE"
LEASE_NAME = "LEASE"
WAL_DIR = "wal"
SNAPSHOTS_DIR = "snapshots"
ARCHIVE_FORMAT = "walkv-archive"
ARCHIVE_VERSION = 1
DIGITS = 20

_LOG_RE = re.compile(r"(\d{20})-(\d{20})\.wal")
_TMP_RE = re.compile(r"\..*\.tmp-[0-9a-f]{16}")


class LogObject(NamedTuple):
    """One log object of the archive: LSNs ``first..last`` at ``path``."""

    first: int
    last: int
    path: str
    size: int = 0


def log_object_name(first: int, last: int) -> str:
    return f"{first:0{DIGITS}d}-{last:0{DIGITS}d}.wal"


def parse_log_object_name(name: str) -> tuple[int, int] | None:
    """``(first, last)`` of a log object name, or ``None`` for any other name
    (including ranges that run backwards)."""
    m = _LOG_RE.fullmatch(name)
    if m is None:
        return None
    first, last = int(m.group(1)), int(m.group(2))
    return (first, last) if 1 <= first <= last else None


def temp_name(name: str, token: str) -> str:
    """The name an object is written under before its rename (local targets)."""
    return f".{name}.tmp-{token}"


def is_temp_name(name: str) -> bool:
    return bool(_TMP_RE.fullmatch(name))


def encode_identity(store_id: str) -> bytes:
    return json.dumps({"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "store_id": store_id,
                       "created": time.time()}, sort_keys=True).encode() + b"\n"


IDENTITY_HINT = ("`walkv archive-verify URI` checks the rest of the archive; if the prefix is walkv's, its "
                 "identity is lost: archive the store to a new prefix (restores need the identity)")


def decode_identity(data: bytes, shown: str) -> str:
    """The store id in an ``ARCHIVE`` object (``shown``: its redacted name);
    bytes that are no identity are damage (:class:`CorruptionError`), a
    version this walkv does not read is :class:`ArchiveError`."""
    try:
        rec = json.loads(data)
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or rec.get("format") != ARCHIVE_FORMAT or not isinstance(rec.get("store_id"), str):
        raise CorruptionError("the archive identity is damaged: not the JSON walkv writes (or the prefix is used by "
                              "something else)", kind=Damage.CONTENT, path=shown, offset=0, hint=IDENTITY_HINT)
    if rec.get("version") != ARCHIVE_VERSION:
        raise ArchiveError(f"{shown} is archive format version {rec.get('version')!r}; this walkv reads "
                           f"version {ARCHIVE_VERSION}: upgrade walkv")
    return str(rec["store_id"])


class Lease(NamedTuple):
    owner: str
    host: str
    pid: int
    expires: float

    def encode(self) -> bytes:
        return json.dumps(self._asdict(), sort_keys=True).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Lease | None:
        """The lease in ``data``, or ``None`` when it is not one (treated as no lease)."""
        try:
            rec: Any = json.loads(data)
            return cls(str(rec["owner"]), str(rec["host"]), int(rec["pid"]), float(rec["expires"]))
        except (ValueError, TypeError, KeyError):
            return None


__all__ = [
    "ARCHIVE_NAME", "LEASE_NAME", "SNAPSHOTS_DIR", "WAL_DIR", "Lease", "LogObject", "decode_identity",
    "encode_identity", "is_temp_name", "log_object_name", "parse_log_object_name", "temp_name",
]
