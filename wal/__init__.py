"""walkv's write-ahead log: LevelDB-format records in segmented files, group commit.

``wal.open(directory, sync="always", segment_bytes=64 << 20)`` opens a log for
its one writer; see :mod:`wal.log` for durability, :mod:`wal.segment` for the
files, :mod:`wal.record` for the framing, :mod:`wal.recovery` for what open
checks and :mod:`wal.repair` for what :func:`repair` does.
"""

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
from wal.group import Group
from wal.hooks import LogHooks
from wal.index import SparseIndex, read_index
from wal.log import SYNC_MODES, Log, open
from wal.reader import read_log
from wal.repair import RepairReport, repair, verify
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
