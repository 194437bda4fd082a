"""``df.write.format("walkv").mode("append"|"overwrite").save(path)``: a DataFrame into a store, atomically.

Rows: ``key`` and ``value`` (binary or string: UTF-8), and optionally
``deleted`` (boolean) or ``_change_type`` (``delete`` makes the row a
delete; ``upsert``/``insert``/``update_postimage`` a put; Delta's
``update_preimage`` rows are skipped), so a ``changes`` read of one store
can be written into another.

The protocol (a task's rows become visible with every other task's, or
none):

1. each task (:meth:`WalkvWriter.write`, on an executor; Spark hands it
   the rows as Arrow record batches, which cost far less to reach Python
   than rows do) stages its rows as a walkv segment file (:mod:`wal.segment` framing, CRC-checked, the
   store's id in its header; one entry per ~4 MiB of operations) under
   ``STORE/spark-staging/<job>/``, written to a temporary name, fsynced and
   renamed, and returns its name as the commit message;
2. the driver's :meth:`~WalkvWriter.commit` opens the store (a store held
   open by another process is :class:`~wal.errors.LockedError` naming it;
   the driver is then the store's only writer, its sweeper off), reads the
   staged files and checks each. A write whose operations fit one log entry
   is ONE batch, as any; a larger one is a staged group
   (:mod:`kvstore.entry.groups`): each staged entry (about 4 MiB, or less
   under a store's smaller ``max_record_bytes``) becomes a part, read one
   at a time (memory holds one part, whatever the size of the write), and
   a commit entry follows them. Either way the write is atomic across a
   crash at any point: nothing of a group applies before its commit is
   durable, and a group whose driver died before its commit is aborted by
   the store's next open. ``overwrite`` puts a ``delete_range`` of every
   key first (the group's first part), so readers see the old state or the
   new one, never a mix;
3. the staging directory is removed after the commit is durable; an abort
   removes it without writing anything (and ``spark-staging/`` goes too
   when no other job's directory is in it). A job that crashed leaves its
   staging directory (never read by anyone else); a later job's commit
   removes staging directories older than a day.

Idempotency (Delta's options): with ``txnAppId`` (a name of the
application, at most 255 characters) and ``txnVersion`` (an int >= 0), a
job applies only when ``txnVersion`` is above the version that application
last committed into the store; otherwise the commit writes nothing and
says so in the log message (``walkv write skipped``), so a retried job
never applies twice. The check is made before anything is written, and
again in log order right before the commit (:mod:`kvstore.store.groups`).
Give both or neither.

Limit: none on the write as a whole. Each row is one operation, whose value
is held to the store's ``max_value_bytes``. Writing to an archive, or to
anything but a local store directory, is refused (``ValueError``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

import kvstore
import wal
from kvstore.archive.objects import encode_segment
from kvstore.entry.codec import (
    END_OF_KEYS,
    ENTRY_OVERHEAD,
    MAX_APP_ID_CHARS,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    batch_bytes,
    encode,
    op_bytes,
    op_count,
    ops_bytes,
    parse,
)
from kvstore.spark.archive import is_archive
from kvstore.spark.files import StoreFiles
from wal.errors import CorruptionError, Damage
from wal.fs import OS_FS

log = logging.getLogger("walkv.spark")

STAGING_DIR = "spark-staging"
STAGE_ENTRY_BYTES = 4 << 20
"""About how many bytes of operations a staged entry (a group's part) holds."""
_OP_SLACK = 16
"""Bytes an op takes in its entry beyond its keys and values (msgpack headers), at most."""
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


def row_op(key: Any, value: Any, deleted: Any, kind: Any) -> list[Any] | None:
    """The batch operation a row stands for (``None``: none, a preimage):
    its ``key``, ``value``, ``deleted`` (None: no such column) and
    ``_change_type`` (``"upsert"`` when there is no such column)."""
    if key is None:
        raise ValueError("a row has a null key; every row needs a key")
    key = _as_bytes(key, "key")
    if kind == "delete":
        return [OP_DELETE, key]
    if kind == "update_preimage":
        return None
    if kind not in _PUT_TYPES:
        raise ValueError(f"_change_type {kind!r} is not one of delete, upsert, insert, update_postimage, "
                         "update_preimage")
    if deleted:
        return [OP_DELETE, key]
    if value is None:
        raise ValueError(f"the row of key {key!r:.60} has a null value and is not a delete")
    return [OP_PUT, key, _as_bytes(value, "value")]


def _column(batch: pa.RecordBatch, name: str, present: bool, default: Any) -> Iterable[Any]:
    """The values of column ``name`` of ``batch`` (``default`` for each row when it has none)."""
    return batch.column(name).to_pylist() if present else repeat(default, batch.num_rows)


class WalkvWriter(DataSourceArrowWriter):
    """One write job (created on the driver, pickled to the tasks, which
    are given the DataFrame's rows as Arrow record batches)."""

    def __init__(self, path: str, columns: list[str], overwrite: bool, app_id: str | None = None,
                 app_version: str | int | None = None) -> None:
        if "://" in path and not path.startswith("file://"):
            raise ValueError(f"walkv writes only to a local store directory, not {path!r}")
        files = StoreFiles(path[len("file://"):] if path.startswith("file://") else path)
        if os.path.isdir(files.location) and is_archive(files):
            raise ValueError(f"{files.display()} is a walkv archive, which is written only by its archiver "
                             "(kvstore.archive.Archiver); write to the store, or restore the archive first")
        for needed in ("key", "value"):
            if needed not in columns:
                raise ValueError(f"a DataFrame written to walkv needs a {needed!r} column; it has {columns}")
        if (app_id is None) != (app_version is None):
            raise ValueError("give both txnAppId and txnVersion (Delta's idempotent writes), or neither")
        self.app_id = app_id or ""
        try:
            self.app_version = int(app_version) if app_version is not None else 0
        except ValueError:
            raise ValueError(f"txnVersion must be an int >= 0, not {app_version!r:.80}") from None
        if self.app_version < 0 or len(self.app_id) > MAX_APP_ID_CHARS:
            raise ValueError(f"txnVersion must be an int >= 0 and txnAppId at most {MAX_APP_ID_CHARS} characters")
        self.path = files.location
        self.overwrite = overwrite
        self.has_deleted = "deleted" in columns
        self.has_type = "_change_type" in columns
        self.job = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        with kvstore.open(self.path) as db:  # fails now, not after the tasks ran: LockedError names the holder
            self.store_id = wal.read_store_id(os.path.join(self.path, "wal")) or ""
            self.max_payload = (db.max_record_bytes or 64 << 20) - ENTRY_OVERHEAD  # what db.batch() takes
        # a staged entry is a part of a group: it must fit a record with its head op, and an op's slack
        self.entry_bytes = min(STAGE_ENTRY_BYTES, self.max_payload // 2)
        OS_FS.makedirs(self.staging)  # made here, once: a task finding it gone knows the job was aborted

    @property
    def staging(self) -> str:
        return os.path.join(self.path, STAGING_DIR, self.job)

    # -- tasks -------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        entries: list[bytes] = []
        ops: list[list[Any]] = []
        size = n = nbytes = 0
        for batch in iterator:
            for row in zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                           _column(batch, "deleted", self.has_deleted, None),
                           _column(batch, "_change_type", self.has_type, "upsert")):
                op = row_op(*row)
                if op is None:
                    continue
                op_size = sum(len(x) for x in op[1:]) + _OP_SLACK
                if ops and size + op_size > self.entry_bytes:
                    entries.append(encode(ops))
                    n, nbytes, ops, size = n + len(ops), nbytes + ops_bytes(entries[-1], len(ops)), [], 0
                ops.append(op)
                size += op_size
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

    def staged_batches(self, messages: list[StagedFile | None]) -> Iterator[bytes]:
        """Every staged entry's payload (a batch), file by file (one entry in
        memory at a time), each file checked to hold as many operations as
        its task wrote (the ops themselves are checked where they are
        written: as a group's parts, or one by one into a batch)."""
        for m in messages:
            if m is None:
                continue
            got = 0
            with open(m.path, "rb") as f:
                for entry in wal.iter_entries(f, m.path):
                    try:
                        got += op_count(entry.payload)
                    except ValueError as exc:
                        raise CorruptionError(str(exc), kind=Damage.CONTENT, path=m.path, lsn=entry.lsn,
                                              hint="rerun the write; nothing of it was applied") from None
                    yield entry.payload
            if got != m.ops:
                raise CorruptionError(f"staged file holds {got} operations, its task wrote {m.ops}",
                                      kind=Damage.SEQUENCE, path=m.path, offset=0,
                                      hint="rerun the write; nothing of it was applied")

    def commit(self, messages: list[StagedFile | None]) -> None:  # type: ignore[override]
        count = sum(m.ops for m in messages if m is not None) + (1 if self.overwrite else 0)
        total = batch_bytes(count, sum(m.nbytes for m in messages if m is not None)
                            + (op_bytes(_CLEAR) if self.overwrite else 0))
        try:
            with kvstore.open(self.path, sweep_interval=None) as db:  # the only writer (kvstore.store.groups)
                done = db.committed_version(self.app_id) if self.app_id else None
                if done is not None and done >= self.app_version:
                    log.info("walkv write skipped: application %r committed version %d into %s already (this "
                             "job's txnVersion is %d); nothing was written", self.app_id, done, self.path,
                             self.app_version)
                    lsn = None
                elif total <= self.max_payload and not self.app_id:
                    lsn = self._one_batch(db, messages)
                else:
                    lsn = db.write_group(self._parts(messages), app_id=self.app_id, app_version=self.app_version)
                    if lsn is None:
                        log.info("walkv write skipped: application %r committed version %d or later into %s "
                                 "meanwhile; nothing was written", self.app_id, self.app_version, self.path)
        except BaseException:  # nothing was applied (a group's parts were aborted): leave no staging behind
            self.abort(messages)
            raise
        if lsn is not None:
            log.info("walkv write committed %d operations at LSN %s into %s", count, lsn, self.path)
        self._remove(self.staging)
        self._remove_stale()
        self._remove_root()

    def _one_batch(self, db: kvstore.KVStore, messages: list[StagedFile | None]) -> int | None:
        """Write the staged operations as one batch (they fit one entry)."""
        with db.batch() as b:
            if self.overwrite:
                b.delete_range(_CLEAR[1], _CLEAR[2])
            for payload in self.staged_batches(messages):
                for op in parse(payload):
                    if op[0] == OP_PUT:
                        b.put(op[1], op[2])
                    elif op[0] == OP_DELETE:
                        b.delete(op[1])
                    elif op[0] == OP_DELETE_RANGE:
                        b.delete_range(op[1], op[2])
        return b.lsn

    def _parts(self, messages: list[StagedFile | None]) -> Iterator[list[list[Any]] | bytes]:
        """The parts of a staged group: ``overwrite``'s clear first (parts
        apply in order, at the commit), then each staged entry as it is."""
        if self.overwrite:
            yield [list(_CLEAR)]
        yield from self.staged_batches(messages)

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
