"""An archive (:mod:`kvstore.archive`) as the Spark source reads it: the same tables as from the store.

``load(location)`` takes a store or an archive; :func:`open_files` tells
them apart by the archive's identity object (``ARCHIVE``,
:mod:`kvstore.archive.layout`), which a store never has. An archive is read
through :class:`~kvstore.archive.reader.ArchiveReader`:

* its log is the reader's chain of log objects; the archive's last LSN
  plays the durable LSN (nothing past it exists), its store id the log's;
* one input partition per log object (objects are at most a segment, so
  they are not split) and one per snapshot chunk (the archive's snapshots
  have the local layout, under ``snapshots/``);
* a task reads its LSNs with :meth:`ArchiveReader.read_entries`, which
  reads each object whole (one request), checks its header's store id and
  every CRC, and follows the chain as it is when the task runs (a whole
  segment that replaced shipped pieces holds the same LSNs).

Credentials in a URI are never shown: every path in a message goes through
the archive's :meth:`~kvstore.archive.target.ArchiveTarget.display`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import wal
from kvstore.archive.layout import ARCHIVE_NAME
from kvstore.archive.reader import ArchiveReader
from kvstore.spark.files import LogSlice, StoreFiles
from wal.errors import CorruptionError, Damage
from wal.timeline import History

_HINT = "run `walkv archive-verify URI`"


def is_archive(files: StoreFiles) -> bool:
    """Whether ``files``'s location holds an archive's identity object."""
    layout = files.layout
    return layout.fs.read_file(layout.fs.join(layout.root, ARCHIVE_NAME)) is not None


def open_files(location: str) -> StoreFiles:
    """The files of the store or archive at ``location``."""
    files = StoreFiles(location)
    return ArchiveFiles(files.location) if is_archive(files) else files


class ArchiveFiles(StoreFiles):
    """An archive read as a store (see the module docstring). Pickles as its location."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._reader: ArchiveReader | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._reader = None

    def __repr__(self) -> str:
        return f"ArchiveFiles({self.display()!r})"

    @property
    def reader(self) -> ArchiveReader:
        if self._reader is None:
            self._reader = ArchiveReader(self.location)
        return self._reader

    def display(self, path: str | None = None) -> str:
        return self.reader.target.display(path)

    def check_store(self) -> None:
        self.reader  # noqa: B018 -- opening checks the identity

    def durable_lsn(self) -> int:
        return self.reader.last_lsn

    def store_id(self) -> str | None:
        return self.reader.store_id

    def history(self) -> History:
        return self.reader.history

    def _active_bytes(self, seg: wal.SegmentFile, durable: int) -> int:
        return seg.size  # an object holds what it holds: none is being written

    def segments(self, durable: int) -> list[wal.SegmentFile]:
        return [s for s in self.reader.segments() if s.first_lsn <= durable]

    def _check_segment_store(self, seg: wal.SegmentFile, ours: str | None) -> None:
        return None  # each object's header is checked when a task reads it

    def _split_segment(self, seg: wal.SegmentFile, sealed: bool, lo: int, hi: int,
                       max_bytes: int) -> list[LogSlice]:
        return [LogSlice(seg.path, 0, lo, hi, seg.size)]

    def iter_slice(self, piece: LogSlice) -> Iterator[wal.Entry]:
        expected = piece.from_lsn
        for entry in self.reader.read_entries(piece.from_lsn, piece.to_lsn):
            if entry.lsn != expected:
                raise CorruptionError(f"expected LSN {expected}, found {entry.lsn}", kind=Damage.SEQUENCE,
                                      path=self.display(piece.path), offset=0, lsn=entry.lsn, hint=_HINT)
            yield entry
            expected += 1
        if expected <= piece.to_lsn:
            raise CorruptionError(f"the archive's log ends at LSN {expected - 1}, the plan said {piece.to_lsn}",
                                  kind=Damage.SEQUENCE, path=self.display(piece.path), offset=0, lsn=expected,
                                  hint=_HINT)


__all__ = ["ArchiveFiles", "is_archive", "open_files"]
