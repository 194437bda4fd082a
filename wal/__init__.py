"""walkv's write-ahead log: LevelDB-format records in segmented files, group commit.

``wal.open(directory, sync="always", segment_bytes=64 << 20)`` opens a log for
its one writer; see :mod:`wal.log` for durability, :mod:`wal.segment` for the
files, :mod:`wal.record` for the framing, :mod:`wal.recovery` for what open
checks and :mod:`wal.repair` for what :func:`repair` does.
"""

from typing import TYPE_CHECKING

# First: decides whether the compiled twins of the hot modules load (see wal.compiled).
from wal.compiled import build_info

# isort: split
from wal.durable import DURABLE_NAME, read_durable_lsn
from wal.errors import (
    ArchiveError,
    ArchiveLagError,
    ClosedError,
    CorruptionError,
    Damage,
    DamageReport,
    DiskFullError,
    ForkedError,
    ForkedHistoryError,
    KeyspaceLimitError,
    LockedError,
    LogFailedError,
    LogGapError,
    ReadOnlyError,
    RecordTooLargeError,
    ReplicaError,
    ReplicaLagError,
    SnapshotError,
    StoreVanishedError,
    ViewExpiredError,
    WalkvError,
)
from wal.lazy import lazy_names
from wal.repair import RepairReport, repair, verify  # not lazy: ``repair`` is a module's name too

if TYPE_CHECKING:
    from wal.group import Group
    from wal.hooks import LogHooks
    from wal.index import SparseIndex, read_index
    from wal.log import SYNC_MODES, Log, open
    from wal.reader import read_log
    from wal.segment import (
        Entry,
        SegmentFile,
        SegmentHeader,
        decode_entry,
        decode_header,
        iter_entries,
        list_segments,
        read_header,
        read_store_id,
    )

_HOMES: dict[str, str] = {
    "Group": "wal.group",
    "LogHooks": "wal.hooks",
    "SparseIndex": "wal.index", "read_index": "wal.index",
    "SYNC_MODES": "wal.log", "Log": "wal.log", "open": "wal.log",
    "read_log": "wal.reader",
    "Entry": "wal.segment", "SegmentFile": "wal.segment", "SegmentHeader": "wal.segment",
    "decode_entry": "wal.segment", "decode_header": "wal.segment", "iter_entries": "wal.segment",
    "list_segments": "wal.segment", "read_header": "wal.segment", "read_store_id": "wal.segment",
}
"""Where each of the log's names lives but those imported above: imported on
first use (:mod:`wal.lazy`), so a process that only reads records or
snapshots (a Spark worker) does not import the writer and its group commit.
The ``TYPE_CHECKING`` imports above say the same for mypy and
tests/test_layers.py. (:func:`repair` is imported up front: the first import
of the module ``wal.repair`` would set the package's ``repair`` to the
module, before a lazy lookup could.)"""

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(globals(), _HOMES)


__all__ = [
    "build_info",
    "Group",
    "LogHooks",
    "DURABLE_NAME",
    "SYNC_MODES",
    "ArchiveError",
    "ArchiveLagError",
    "ClosedError",
    "Damage",
    "DamageReport",
    "DiskFullError",
    "StoreVanishedError",
    "CorruptionError",
    "Entry",
    "ForkedError",
    "ForkedHistoryError",
    "KeyspaceLimitError",
    "LockedError",
    "Log",
    "LogFailedError",
    "LogGapError",
    "ReadOnlyError",
    "RecordTooLargeError",
    "ReplicaError",
    "ReplicaLagError",
    "RepairReport",
    "SegmentFile",
    "SegmentHeader",
    "SnapshotError",
    "SparseIndex",
    "ViewExpiredError",
    "WalkvError",
    "decode_entry",
    "decode_header",
    "iter_entries",
    "list_segments",
    "open",
    "read_durable_lsn",
    "read_header",
    "read_index",
    "read_log",
    "read_store_id",
    "repair",
    "verify",
]
