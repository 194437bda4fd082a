"""An archive's layout: one prefix of an object store (or a directory) per store.

::

    ROOT/ARCHIVE                                identity (JSON): format, version, store id
    ROOT/LEASE                                  the writing archiver's lease (JSON)
    ROOT/wal/<first:020d>-<last:020d>.wal       log objects of timeline 1: LSNs first..last
    ROOT/wal/tl-<T:020d>-<uid:016x>.history     timeline T's lineage (JSON), before its objects
    ROOT/wal/tl-<T:020d>-<uid:016x>/<first:020d>-<last:020d>.wal
                                                log objects of timeline T (every other one)
    ROOT/snapshots/snap-<lsn:020d>/chunk-*.wkc  snapshot chunks (snapshot.chunk), timeline 1
    ROOT/snapshots/snap-<lsn:020d>/MANIFEST     written last (snapshot.manifest)
    ROOT/snapshots/tl-<T:020d>-<uid:016x>/snap-<lsn:020d>/...
                                                snapshots on timeline T (every other one)

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
* Timelines (:mod:`wal.timeline`). A store's history can change course (a
  repair that cuts, a promote, a failover), after which the same LSNs hold
  other entries. Each timeline's objects are kept apart, so that the LSNs of
  two histories never share a name and a reader never mixes them:

  - a log object holds entries of ONE timeline, the one its directory names:
    its header's history ends with that timeline (a piece is cut where a
    timeline begins; a segment on which one begins is shipped as pieces).
    Timeline 1 (uid 0, every store's first) keeps the names above, so that
    archives written before timelines read unchanged; every other timeline's
    objects go under ``wal/tl-<T>-<uid>/``, both fields in the name because
    two promotions nobody coordinated may both take number ``T``;
  - ``wal/tl-<T>-<uid>.history`` holds timeline ``T``'s lineage (its history,
    :func:`wal.timeline.history_to_json`, ending with ``T``: every ancestor and
    the LSN where each began), written before the first object of ``T``. It
    never changes (a timeline's ancestors are fixed when it begins), and a
    single listing of ``wal/`` gives every timeline and, reading these small
    objects only, every lineage, as PostgreSQL's ``.history`` files do.
    Timeline 1 has none: its lineage is itself. (No identity version
    changes: every object this walkv writes has a format 3 header, which a
    walkv before timelines refuses to read, so it cannot misread a forked
    archive);
  - a snapshot at LSN ``S`` lies under the timeline ``S`` is on (for the
    store that took it), so that a restore along a lineage uses a snapshot
    only where the lineage passes through it (``timeline_at(lineage, S)``);
  - a reader follows one lineage (by default the timeline with the highest
    number, as numbers only grow along a history; two with that number and
    different uids are refused rather than one picked, and the user names
    one: :mod:`kvstore.archive.timelines`): each LSN range is read from the
    objects of the timeline the lineage puts there, so the old timeline's
    objects past a fork stay as another restore target and are never read
    beside the new ones;
  - fencing: an archiver never ships entries of timeline ``T`` past LSN
    ``L`` when the archive holds a timeline numbered above ``T`` (or another
    uid with ``T``'s number) whose lineage left ``T`` at or before ``L``: a newer
    writer (a promoted replica, an elected leader) archives the same store,
    and the older one stops (:class:`~wal.errors.ArchiveFencedError`).
* Two kinds of log objects exist: *pieces* (the durable tail of the active
  segment, shipped every interval) and *whole segments* (a sealed segment,
  uploaded as it is). A piece never crosses a local segment boundary, so a
  whole segment covers its pieces exactly; it is uploaded before they are
  deleted, so coverage never shrinks. Readers chain a timeline's objects by
  LSN and prefer the longest object starting where the chain stands.
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
* Retention (:mod:`kvstore.archive.retention`) deletes a snapshot's
  ``MANIFEST`` first (it stops existing at once), then its chunks; then the
  log objects no lineage keeps, so what remains of every lineage is one
  contiguous run, from its oldest kept snapshot on. History objects are
  never deleted: a few hundred bytes each, and what fences an older
  writer's archiver.
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
from typing import Any, Final, NamedTuple

from wal.errors import ArchiveError, CorruptionError, Damage
from wal.timeline import History, TimelineStart, history_from_json, history_to_json

ARCHIVE_NAME = "ARCHIVE"
LEASE_NAME = "LEASE"
WAL_DIR = "wal"
SNAPSHOTS_DIR = "snapshots"
ARCHIVE_FORMAT = "walkv-archive"
ARCHIVE_VERSION = 1
DIGITS = 20

HISTORY_FORMAT = "walkv-timeline"
HISTORY_SUFFIX = ".history"

_LOG_RE = re.compile(r"(\d{20})-(\d{20})\.wal")
_TIMELINE_RE = re.compile(r"tl-(\d{20})-([0-9a-f]{16})")
_TMP_RE = re.compile(r"\..*\.tmp-[0-9a-f]{16}")


class TimelineId(NamedTuple):
    """A timeline as the archive names it: its number and uid (where it
    begins is in its lineage, :mod:`wal.timeline`)."""

    timeline: int
    uid: int = 0

    @classmethod
    def of(cls, start: TimelineStart) -> TimelineId:
        return cls(start.timeline, start.uid)

    def __str__(self) -> str:
        return str(TimelineStart(self.timeline, 0, self.uid))


ROOT_TIMELINE: Final = TimelineId(1, 0)
"""Timeline 1, every store's first: its objects keep the names of archives before timelines."""


class LogObject(NamedTuple):
    """One log object of the archive: LSNs ``first..last`` of ``timeline`` at ``path``."""

    first: int
    last: int
    path: str
    size: int = 0
    timeline: TimelineId = ROOT_TIMELINE


def log_object_name(first: int, last: int) -> str:
    return f"{first:0{DIGITS}d}-{last:0{DIGITS}d}.wal"


def timeline_name(tid: TimelineId) -> str:
    """``tl-<T>-<uid>``: the directory of a timeline's objects (not timeline 1's)."""
    return f"tl-{tid.timeline:0{DIGITS}d}-{tid.uid:016x}"


def parse_timeline_name(name: str) -> TimelineId | None:
    """The timeline a ``tl-<T>-<uid>`` name stands for, or None for any other name."""
    m = _TIMELINE_RE.fullmatch(name)
    if m is None:
        return None
    tid = TimelineId(int(m.group(1)), int(m.group(2), 16))
    return tid if tid.timeline >= 1 and tid != ROOT_TIMELINE else None


def log_dir(tid: TimelineId) -> tuple[str, ...]:
    """The names under the root of the directory holding ``tid``'s log objects."""
    return (WAL_DIR,) if tid == ROOT_TIMELINE else (WAL_DIR, timeline_name(tid))


def snapshots_dir(tid: TimelineId) -> tuple[str, ...]:
    """The names under the root of the directory holding snapshots on ``tid``."""
    return (SNAPSHOTS_DIR,) if tid == ROOT_TIMELINE else (SNAPSHOTS_DIR, timeline_name(tid))


def history_object_name(tid: TimelineId) -> str:
    """The name (in ``wal/``) of the object holding ``tid``'s lineage."""
    return timeline_name(tid) + HISTORY_SUFFIX


def parse_history_object_name(name: str) -> TimelineId | None:
    return parse_timeline_name(name[: -len(HISTORY_SUFFIX)]) if name.endswith(HISTORY_SUFFIX) else None


def encode_lineage(store_id: str, lineage: History) -> bytes:
    """A history object: timeline ``lineage[-1]``'s lineage (module docstring)."""
    last = lineage[-1]
    return json.dumps({"format": HISTORY_FORMAT, "version": ARCHIVE_VERSION, "store_id": store_id,
                       "timeline": last.timeline, "uid": last.uid, "history": history_to_json(lineage),
                       "created": time.time()}, sort_keys=True).encode() + b"\n"


def decode_lineage(data: bytes, tid: TimelineId, store_id: str, shown: str) -> History:
    """The lineage in the history object of ``tid`` (``shown``: its redacted
    name); anything else, a lineage that does not end with ``tid`` or one of
    another store than ``store_id`` ("": not compared) is damage
    (:class:`CorruptionError`)."""
    hint = ("`walkv archive-verify URI` checks the rest; while the store's log still holds this timeline, its "
            "archiver writes the object again once it is deleted")
    try:
        rec = json.loads(data)
        if not isinstance(rec, dict) or rec.get("format") != HISTORY_FORMAT:
            raise ValueError("not the JSON walkv writes")
        lineage = history_from_json(rec.get("history"), shown)
    except ValueError as e:
        raise CorruptionError(f"the timeline history object is damaged: {e}", kind=Damage.CONTENT, path=shown,
                              offset=0, hint=hint) from None
    if store_id and rec.get("store_id") != store_id:
        raise CorruptionError(f"the timeline history object belongs to store {rec.get('store_id')}, not "
                              f"{store_id}", kind=Damage.HEADER, path=shown, offset=0, hint=hint)
    if TimelineId.of(lineage[-1]) != tid:
        raise CorruptionError(f"the timeline history object ends with {lineage[-1]}, but its name says {tid}",
                              kind=Damage.TIMELINE, path=shown, offset=0, hint=hint)
    return lineage


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


class ArchiverLease(NamedTuple):
    """The record in ``ROOT/LEASE``: which archiver writes the prefix, and
    until when (unix seconds). Not a key's TTL lease (:class:`kvstore.Lease`)
    nor the cluster's writer lease, which etcd grants."""

    owner: str
    host: str
    pid: int
    expires: float

    def encode(self) -> bytes:
        return json.dumps(self._asdict(), sort_keys=True).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> ArchiverLease | None:
        """The lease in ``data``, or ``None`` when it is not one (treated as no lease)."""
        try:
            rec: Any = json.loads(data)
            return cls(str(rec["owner"]), str(rec["host"]), int(rec["pid"]), float(rec["expires"]))
        except (ValueError, TypeError, KeyError):
            return None


__all__ = [
    "ARCHIVE_NAME", "LEASE_NAME", "ROOT_TIMELINE", "SNAPSHOTS_DIR", "WAL_DIR", "ArchiverLease", "LogObject", "TimelineId",
    "decode_identity", "decode_lineage", "encode_identity", "encode_lineage", "history_object_name", "is_temp_name",
    "log_dir", "log_object_name", "parse_history_object_name", "parse_log_object_name", "parse_timeline_name",
    "snapshots_dir", "temp_name", "timeline_name",
]
