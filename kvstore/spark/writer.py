"""``df.write.format("walkv").mode("append"|"overwrite").save(path)``: a DataFrame into a store, atomically.

Rows: ``key`` and ``value`` (binary or string: UTF-8), and optionally
``deleted`` (boolean) or ``_change_type`` (``delete`` makes the row a
delete; ``upsert``/``insert``/``update_postimage`` a put; Delta's
``update_preimage`` rows are skipped), so a ``changes`` read of one store
can be written into another.

The protocol (a task's rows become visible with every other task's, or
none):

1. each task (:meth:`WalkvWriter.write`, on an executor) stages its rows as
   a walkv segment file (:mod:`wal.segment` framing, CRC-checked, the
   store's id in its header; one entry per ~4 MiB of operations) under
   ``STORE/spark-staging/<job>/``, written to a temporary name, fsynced and
   renamed, and returns its name as the commit message;
2. the driver's :meth:`~WalkvWriter.commit` opens the store (a store held
   open by another process is :class:`~wal.errors.LockedError` naming it),
   reads every staged file, checks each, and writes all of their operations
   as ONE batch: one log entry, which the log makes atomic across a crash at
   any point (a torn entry is cut at open, a durable one is replayed whole).
   ``overwrite`` puts a ``delete_range`` of every key first, in the same
   entry, so readers see the old state or the new one, never a mix;
3. the staging directory is removed after the entry is durable; an abort
   removes it without writing anything (and ``spark-staging/`` goes too
   when no other job's directory is in it). A job that crashed leaves its
   staging directory (never read by anyone else); a later job's commit
   removes staging directories older than a day.

Limit: one entry holds at most the store's ``max_record_bytes`` less
:data:`~kvstore.entry.codec.ENTRY_OVERHEAD` (64 MiB by default: about 500,000
rows of 16-byte keys and 100-byte values). The batch's encoded size is
counted exactly from the tasks' encoded operations (plus the range delete of
``overwrite``, :func:`kvstore.entry.codec.batch_bytes`), and a larger one is
refused before anything is read or written
(:class:`~wal.errors.RecordTooLargeError`, a ``ValueError``, naming the
size): atomic multi-entry groups would need a commit marker the store's
replay honours, which the log does not have. Writing to an archive, or to
anything but a local store directory, is refused (``ValueError``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

import kvstore
import wal
from kvstore.archive.objects import encode_segment
from kvstore.entry.codec import (
    END_OF_KEYS,
    ENTRY_OVERHEAD,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    batch_bytes,
    decode,
    encode,
    op_bytes,
    ops_bytes,
)
from kvstore.spark.archive import is_archive
from kvstore.spark.files import StoreFiles
from wal.errors import CorruptionError, Damage, RecordTooLargeError
from wal.fs import OS_FS

log = logging.getLogger("walkv.spark")

STAGING_DIR = "spark-staging"
STAGE_ENTRY_BYTES = 4 << 20
STALE_SECONDS = 24 * 3600
_PUT_TYPES = {"upsert", "insert", "update_postimage"}
_CLEAR = (OP_DELETE_RANGE, b"", END_OF_KEYS)
"""What ``overwrite`` puts first in the batch: every key deleted."""


@dataclass
class StagedFile(WriterCommitMessage):
    """A task's staged rows: the file's path, its operations and their
    bytes as the batch encodes them (:func:`kvstore.entry.codec.ops_bytes`)."""

    path: str
    ops: int
    nbytes: int


def _as_bytes(v: Any, what: str) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"column {what} must be binary or string, not {type(v).__name__}")


def row_op(row: Any, has_deleted: bool, has_type: bool) -> list[Any] | None:
    """The batch operation a row stands for (``None``: none, a preimage)."""
    if row["key"] is None:
        raise ValueError("a row has a null key; every row needs a key")
    key = _as_bytes(row["key"], "key")
    if has_type:
        kind = row["_change_type"]
        if kind == "delete":
            return [OP_DELETE, key]
        if kind == "update_preimage":
            return None
        if kind not in _PUT_TYPES:
            raise ValueError(f"_change_type {kind!r} is not one of delete, upsert, insert, update_postimage, "
                             "update_preimage")
    if has_deleted and row["deleted"]:
        return [OP_DELETE, key]
    if row["value"] is None:
        raise ValueError(f"the row of key {key!r:.60} has a null value and is not a delete")
    return [OP_PUT, key, _as_bytes(row["value"], "value")]


class WalkvWriter(DataSourceWriter):
    """One write job (created on the driver, pickled to the tasks)."""

    def __init__(self, path: str, columns: list[str], overwrite: bool) -> None:
        if "://" in path and not path.startswith("file://"):
            raise ValueError(f"walkv writes only to a local store directory, not {path!r}")
        files = StoreFiles(path[len("file://"):] if path.startswith("file://") else path)
        if os.path.isdir(files.location) and is_archive(files):
            raise ValueError(f"{files.display()} is a walkv archive, which is written only by its archiver "
                             "(kvstore.archive.Archiver); write to the store, or restore the archive first")
        for needed in ("key", "value"):
            if needed not in columns:
                raise ValueError(f"a DataFrame written to walkv needs a {needed!r} column; it has {columns}")
        self.path = files.location
        self.overwrite = overwrite
        self.has_deleted = "deleted" in columns
        self.has_type = "_change_type" in columns
        self.job = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        with kvstore.open(self.path) as db:  # fails now, not after the tasks ran: LockedError names the holder
            self.store_id = wal.read_store_id(os.path.join(self.path, "wal")) or ""
            self.max_payload = (db.max_record_bytes or 64 << 20) - ENTRY_OVERHEAD  # what db.batch() takes
        OS_FS.makedirs(self.staging)  # made here, once: a task finding it gone knows the job was aborted

    @property
    def staging(self) -> str:
        return os.path.join(self.path, STAGING_DIR, self.job)

    # -- tasks -------------------------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> StagedFile:
        entries: list[bytes] = []
        ops: list[list[Any]] = []
        size = n = nbytes = 0
        for row in iterator:
            op = row_op(row, self.has_deleted, self.has_type)
            if op is None:
                continue
            ops.append(op)
            size += sum(len(x) for x in op[1:]) + 8
            if size >= STAGE_ENTRY_BYTES:
                entries.append(encode(ops))
                n, nbytes, ops, size = n + len(ops), nbytes + ops_bytes(entries[-1], len(ops)), [], 0
        if ops:
            entries.append(encode(ops))
            n, nbytes = n + len(ops), nbytes + ops_bytes(entries[-1], len(ops))
        if not os.path.isdir(self.staging):
            raise RuntimeError(f"the write job's staging directory {self.staging} is gone: the job was aborted")
        data, _ = encode_segment(self.store_id, 1, [wal.Entry(i + 1, 0, p) for i, p in enumerate(entries)])
        name = f"task-{uuid.uuid4().hex}.wal"
        final = os.path.join(self.staging, name)
        tmp = os.path.join(self.staging, f".{name}.tmp")
        OS_FS.write_file(tmp, data)
        OS_FS.rename(tmp, final)
        OS_FS.fsync_dir(self.staging)
        return StagedFile(final, n, nbytes)

    # -- the driver ----------------------------------------------------------------

    def staged_ops(self, messages: list[StagedFile | None]) -> list[list[Any]]:
        """Every staged operation, task by task, each file checked."""
        ops: list[list[Any]] = []
        for m in messages:
            if m is None:
                continue
            got = 0
            with open(m.path, "rb") as f:
                for entry in wal.iter_entries(f, m.path):
                    batch = decode(entry.payload, entry.lsn)
                    got += len(batch)
                    ops.extend(batch)
            if got != m.ops:
                raise CorruptionError(f"staged file holds {got} operations, its task wrote {m.ops}",
                                      kind=Damage.SEQUENCE, path=m.path, offset=0,
                                      hint="rerun the write; nothing of it was applied")
        return ops

    def commit(self, messages: list[StagedFile | None]) -> None:  # type: ignore[override]
        count = sum(m.ops for m in messages if m is not None) + (1 if self.overwrite else 0)
        total = batch_bytes(count, sum(m.nbytes for m in messages if m is not None)
                            + (op_bytes(_CLEAR) if self.overwrite else 0))
        if total > self.max_payload:
            self.abort(messages)
            raise RecordTooLargeError(
                f"the DataFrame's batch is {total:,} bytes encoded ({count:,} operations"
                + (", the first overwrite's delete of every key" if self.overwrite else "")
                + f"); one atomic walkv batch holds at most {self.max_payload:,} bytes (the store's "
                f"max_record_bytes less {ENTRY_OVERHEAD}): write it in parts (each part is atomic). Nothing "
                "was written."
            )
        ops = self.staged_ops(messages)
        with kvstore.open(self.path) as db:
            with db.batch() as b:
                if self.overwrite:
                    b.delete_range(_CLEAR[1], _CLEAR[2])
                for op in ops:
                    if op[0] == OP_PUT:
                        b.put(op[1], op[2])
                    elif op[0] == OP_DELETE:
                        b.delete(op[1])
                    elif op[0] == OP_DELETE_RANGE:
                        b.delete_range(op[1], op[2])
        log.info("walkv write committed %d operations at LSN %s into %s", len(ops), b.lsn, self.path)
        self._remove(self.staging)
        self._remove_stale()
        self._remove_root()

    def abort(self, messages: list[StagedFile | None]) -> None:  # type: ignore[override]
        # Spark may abort while a cancelled task still stages its file: rename
        # the job's directory away first (atomic), so that no task can add to
        # it any more (their paths name the old one), then delete it.
        aborted = os.path.join(self.path, STAGING_DIR, f".aborted-{self.job}")
        try:
            os.rename(self.staging, aborted)
        except FileNotFoundError:
            return
        self._remove(aborted)
        self._remove_root()

    def _remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def _remove_root(self) -> None:
        """``spark-staging/`` itself, once no job has a directory in it."""
        try:
            os.rmdir(os.path.join(self.path, STAGING_DIR))
        except OSError:
            pass  # another job's (or a crashed one's, removed when stale) is in it

    def _remove_stale(self) -> None:
        root = os.path.join(self.path, STAGING_DIR)
        now = time.time()
        for name in os.listdir(root) if os.path.isdir(root) else []:
            p = os.path.join(root, name)
            if now - os.path.getmtime(p) > STALE_SECONDS:
                self._remove(p)


__all__ = ["STAGING_DIR", "StagedFile", "WalkvWriter", "row_op"]
