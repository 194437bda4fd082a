"""walkv's write-ahead log: LevelDB-format records in segmented files, group commit.

``wal.open(directory, sync="always", segment_bytes=64 << 20)`` opens a log for
its one writer; see :mod:`wal.log` for durability, :mod:`wal.segment` for the
files, :mod:`wal.record` for the framing, :mod:`wal.recovery` for what open
checks and what :func:`repair` does.
"""

from wal.errors import (
    ClosedError,
    CorruptionError,
    LockedError,
    LogFailedError,
    LogGapError,
    ReadOnlyError,
    RecordTooLargeError,
    SnapshotError,
    WalkvError,
)
from wal.log import SYNC_MODES, Log, open
from wal.recovery import RepairReport, repair, verify
from wal.segment import (
    DURABLE_NAME, Entry, SegmentFile, SegmentHeader, SparseIndex, decode_entry, decode_header, iter_entries,
    list_segments, read_durable_lsn, read_index, read_log, read_store_id, read_header,
)

__all__ = [
    "SYNC_MODES", "ClosedError", "CorruptionError", "Entry", "LockedError", "Log", "LogFailedError", "LogGapError", "ReadOnlyError",
    "RecordTooLargeError", "RepairReport", "SnapshotError", "WalkvError", "open", "read_durable_lsn",
    "DURABLE_NAME", "SegmentFile", "SegmentHeader", "SparseIndex", "decode_entry", "decode_header",
    "iter_entries", "read_header", "list_segments", "read_index", "read_log", "read_store_id",
    "repair", "verify",
]
