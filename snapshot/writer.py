"""Writing a snapshot from a sorted stream of (key, value) pairs, or as a
copy of another snapshot's files.

The protocol (the reasons are in :mod:`snapshot.layout`): fill a private
``snap-<lsn>.tmp-<hex>/`` directory with chunk files, each fsynced, then the
MANIFEST, fsynced; fsync the directory; rename it to ``snap-<lsn>``; fsync the
parent. A crash before the rename leaves a ``.tmp-`` leftover that no reader
accepts and :func:`snapshot.cleanup_incomplete` removes.

Speed: pairs are taken from the iterator in slices sized to fill one record
(about ``record_bytes``), and every per-pair step (splitting pairs, type and
order checks, msgpack) runs inside C over whole slices; Python code runs once
per record, not once per pair.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import replace
from itertools import islice
from operator import lt
from typing import Any

import msgpack

from snapshot.chunk import HEADER_SIZE, MAX_RECORD_BYTES, ChunkInfo
from snapshot.chunk_writer import ChunkWriter
from snapshot.layout import (
    MANIFEST_NAME,
    MAX_LSN,
    DirLock,
    chunk_file_name,
    discard_dir,
    remove_tree,
    snapshot_dir_name,
    tmp_dir_name,
)
from snapshot.manifest import Manifest, SnapshotInfo, check_section_name, encode_manifest
from snapshot.reader import Snapshot, check_chunk_bytes, open_snapshot
from wal.errors import CorruptionError, SnapshotError
from wal.fs import OS_FS, FileSystem
from wal.progress import Progress
from wal.record import MAX_RECORD_LIMIT

log = logging.getLogger("walkv.snapshot")


DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_RECORD_BYTES = 64 << 10
_FIRST_SLICE = 16  # pairs in the first slice; later slices adapt to the pair size
_MAX_SLICE = 1 << 16
_PAIR_OVERHEAD = 3  # msgpack bytes per key or value header, about
_PROGRESS_EVERY = 16  # records

_BYTES_ONLY = {bytes}


def write(
    parent: str | os.PathLike[str],
    lsn: int,
    items: Iterable[tuple[bytes, bytes]],
    *,
    sections: Mapping[str, Iterable[tuple[bytes, bytes]]] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    record_bytes: int = DEFAULT_RECORD_BYTES,
    max_record_bytes: int = MAX_RECORD_BYTES,
    store_id: str | None = None,
    fs: FileSystem | None = None,
    progress: Progress | None = None,
    total: int | None = None,
    exist_ok: bool = False,
    before_commit: Callable[[], None] | None = None,
    bookkeeping: Collection[str] = (),
) -> SnapshotInfo:
    """Write the snapshot ``parent/snap-<lsn>/`` from ``items``.

    ``items`` yields ``(key, value)`` tuples (or 2-item lists) of bytes with
    strictly increasing keys, as a py-lmdb cursor opened with
    ``buffers=False`` does; a key out of order or repeated is a ValueError, a
    key or value that is not bytes (a memoryview, say) a TypeError, and
    nothing is left behind. ``items`` is the default section; ``sections``
    maps each further section's name (a str of 1..100 characters, not "")
    to its pairs, in the same form: each is written as its own sorted run
    of chunks after the default section's, in name order, and listed in the
    manifest even when it has no pairs (a bad name is a ValueError, before
    anything is written). The iterables are read one after another, in
    that order. ``bookkeeping`` names the sections that hold the caller's
    own metadata rather than keys: the returned and listed ``count`` leaves
    their pairs out (the manifest's ``count`` totals every pair).
    Chunks are closed once they reach ``chunk_bytes``; data records hold
    about ``record_bytes`` of keys and values each. ``max_record_bytes``
    is the record limit the manifest states (readers bound memory by it; a
    store passes its log's limit); a single pair whose record is larger
    raises it for this snapshot, up to :data:`~wal.record.MAX_RECORD_LIMIT`
    (1 GiB; a larger pair is a RecordTooLargeError), so every pair the store
    holds can be written.
    ``progress(pairs_written, total)`` is called every few records.
    ``before_commit()`` runs once every item was read and written, just
    before the commit (the rename); if it raises, nothing is committed.

    Durability: when ``write`` returns, the snapshot and every byte it holds
    are durable (files and directories fsynced). If it raises, or the process
    or machine dies first, no snapshot at ``lsn`` exists (listing and opening
    ignore the leftover; :func:`snapshot.cleanup_incomplete` removes it),
    except that an error from the very last step (the parent directory's
    fsync, after the rename) leaves a complete snapshot whose name may not
    survive a power loss.

    A valid snapshot at ``lsn`` already there is a SnapshotError, or, with
    ``exist_ok=True``, is returned as is (``items`` is not read; the parent
    directory is fsynced again, so retrying after that last-step error makes
    the snapshot durable). A broken one is replaced.

    Memory does not grow with the snapshot: the writer holds one slice of
    pairs, about ``record_bytes`` of them (when pair sizes jump, at most
    twice as many pairs as filled the previous record), and 1 MiB of output.
    """
    parent = os.fspath(parent)
    if type(lsn) is not int or not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"lsn must be an integer in [0, 2**64), not {lsn!r}")
    for name, v in (("chunk_bytes", chunk_bytes), ("record_bytes", record_bytes),
                    ("max_record_bytes", max_record_bytes)):
        if type(v) is not int or v < 1:
            raise ValueError(f"{name} must be a positive integer, not {v!r}")
    if max_record_bytes > MAX_RECORD_LIMIT:
        raise ValueError(f"max_record_bytes must be at most {MAX_RECORD_LIMIT} (1 GiB), not {max_record_bytes}")
    _check_store_id(store_id)
    named = dict(sections or {})
    for section in named:
        why = check_section_name(section)
        if why is not None:
            raise ValueError(f"bad snapshot section name {section!r:.120}: {why}")
    runs: list[tuple[str, Iterable[tuple[bytes, bytes]]]] = [("", items), *sorted(named.items())]
    written: int | None = None  # the pairs, once fill wrote them

    def fill(fs: FileSystem, tmp: str) -> Manifest:
        nonlocal written
        chunks: list[ChunkInfo] = []
        count = 0
        limit = max(max_record_bytes, HEADER_SIZE)
        records = 0
        cw: ChunkWriter | None = None
        try:
            for section, pairs_in in runs:
                for payload, first, last, pairs in _records(pairs_in, record_bytes):
                    records += 1
                    if cw is None:
                        name = chunk_file_name(len(chunks))
                        cw = ChunkWriter(fs, os.path.join(tmp, name), name, index=len(chunks), lsn=lsn,
                                         max_record_bytes=MAX_RECORD_LIMIT)
                    cw.add(payload, first, last, pairs)
                    if len(payload) > limit:
                        limit = len(payload)  # a pair larger than the limit: raised for this snapshot
                    count += pairs
                    if cw.size >= chunk_bytes:
                        chunks.append(replace(cw.finish(), section=section))
                        cw = None
                        if progress is not None:
                            progress(count, total)
                    elif progress is not None and records % _PROGRESS_EVERY == 0:
                        progress(count, total)
                if cw is not None:  # a section ends its chunk: the next section starts its own
                    chunks.append(replace(cw.finish(), section=section))
                    cw = None
        finally:
            if cw is not None:
                cw.abort()
        written = count
        return Manifest(
            lsn=lsn,
            store_id=store_id,
            created_us=time.time_ns() // 1000,
            count=count,
            bytes=sum(c.bytes for c in chunks),
            chunks=tuple(replace(c, max_record_bytes=limit) for c in chunks),
            max_record_bytes=limit,
            sections=tuple(name for name, _ in runs[1:]),
            bookkeeping=tuple(sorted(n for n in bookkeeping if n in named)),
        )

    info = _commit(fs or OS_FS, parent, lsn, fill, exist_ok=exist_ok, before_commit=before_commit)
    if progress is not None and written is not None:
        progress(written, total)
    return info


def copy(source: Snapshot, parent: str | os.PathLike[str], *, store_id: str | None,
         fs: FileSystem | None = None) -> SnapshotInfo:
    """Write ``parent/snap-<lsn>/`` as a copy of ``source`` (same LSN, same
    chunks byte for byte) that names ``store_id`` as its store: what a
    restore gives its new store when no log entry follows the snapshot it
    restored, at the cost of a file copy rather than of encoding every pair
    again. Each chunk's bytes are checked as they are copied against the
    CRC and size ``source``'s manifest states
    (:func:`snapshot.reader.check_chunk_bytes`), so a chunk that changed or
    was damaged since it was read is a CorruptionError naming it, and
    nothing is committed. Durability and a snapshot already at the LSN: as
    :func:`write` (without ``exist_ok``)."""
    parent = os.fspath(parent)
    _check_store_id(store_id)

    def fill(fs: FileSystem, tmp: str) -> Manifest:
        for chunk in source.all_chunks:
            _copy_chunk(source, chunk, fs, os.path.join(tmp, chunk.name))
        return replace(source.manifest, store_id=store_id, created_us=time.time_ns() // 1000)

    return _commit(fs or OS_FS, parent, source.lsn, fill)


def _copy_chunk(source: Snapshot, chunk: ChunkInfo, fs: FileSystem, path: str) -> None:
    """Copy one chunk file of ``source`` to ``path``, fsynced, checked against its manifest entry."""
    out = fs.open(path, create=True, exclusive=True)
    written = [0]

    def write(block: bytes) -> None:
        out.pwrite(block, written[0])
        written[0] += len(block)

    try:
        check_chunk_bytes(source.fs, source.path, chunk, write)
        out.sync()
    finally:
        out.close()


def _commit(fs: FileSystem, parent: str, lsn: int, fill: Callable[[FileSystem, str], Manifest], *,
            exist_ok: bool = False, before_commit: Callable[[], None] | None = None) -> SnapshotInfo:
    """The protocol of the module docstring around ``fill(fs, tmp)``, which
    writes the chunk files into ``tmp`` (each fsynced) and returns the
    manifest that names them; ``exist_ok`` and ``before_commit``: :func:`write`'s."""
    final = os.path.join(parent, snapshot_dir_name(lsn))
    try:
        existing = _existing(fs, final)
        if existing is not None:
            if exist_ok:
                fs.fsync_dir(parent)
                return existing
            raise SnapshotError(f"a snapshot at LSN {lsn} already exists: {final}")
        fs.makedirs(parent)  # durably, when it is new
        tmp = os.path.join(parent, tmp_dir_name(lsn))
        fs.mkdir(tmp)  # made durable by the parent's fsync below, under the cleanup
    except OSError as e:
        raise SnapshotError(f"cannot write a snapshot at LSN {lsn} in {parent}: {e}") from e

    lock = DirLock(tmp)
    committed = False
    try:
        fs.fsync_dir(parent)
        manifest = fill(fs, tmp)
        fs.fsync_dir(tmp)  # every chunk's name is durable before the manifest names it
        fs.write_file(os.path.join(tmp, MANIFEST_NAME), encode_manifest(manifest))
        fs.fsync_dir(tmp)
        if before_commit is not None:
            before_commit()  # e.g. the store makes its log durable up to ``lsn``
        existing = _existing(fs, final)
        if existing is not None:  # another writer committed the same LSN meanwhile
            if exist_ok:
                return existing  # (finally removes ours)
            raise SnapshotError(f"a snapshot at LSN {lsn} already exists: {final}")
        if os.path.lexists(final):
            log.warning("replacing the broken snapshot %s", final)
            discard_dir(fs, parent, os.path.basename(final), lsn)
        fs.rename(tmp, final)  # the commit point
        committed = True
        fs.fsync_dir(parent)
        log.info("wrote snapshot %s: %d pairs in %d chunks, %d bytes", final, manifest.count, len(manifest.chunks),
                 manifest.bytes)
        return manifest.info(final)
    except OSError as e:
        if committed:
            raise SnapshotError(
                f"snapshot {final} is written but the fsync of {parent} failed ({e}); "
                "its name may not survive a power loss: retry with exist_ok=True before relying on it"
            ) from e
        raise SnapshotError(f"cannot write a snapshot at LSN {lsn} in {parent}: {e}") from e
    finally:
        lock.release()
        if not committed:
            _remove_quietly(fs, tmp)


def _check_store_id(store_id: object) -> None:
    if store_id is not None and (not isinstance(store_id, str) or len(store_id) > 256):
        raise ValueError("store_id must be None or a string of at most 256 characters")


def _existing(fs: FileSystem, final: str) -> SnapshotInfo | None:
    """The valid snapshot already at ``final``, else None (missing or broken)."""
    if not os.path.lexists(final):
        return None
    try:
        return open_snapshot(final, fs=fs).info
    except (CorruptionError, SnapshotError):
        return None


def _remove_quietly(fs: FileSystem, path: str) -> None:
    try:
        remove_tree(fs, path)
    except Exception as e:  # noqa: BLE001 - the leftover is harmless; cleanup_incomplete takes it later
        log.warning("could not remove the incomplete snapshot %s (%s); cleanup_incomplete will", path, e)


def _records(items: Iterable[tuple[bytes, bytes]], record_bytes: int
             ) -> Iterator[tuple[bytes, bytes, bytes, int]]:
    """Yield ``(payload, first_key, last_key, pairs)``, one data record each,
    after checking arity, types and strict key order (TypeError/ValueError
    naming the bad pair)."""
    it = iter(items)
    pack = msgpack.Packer(use_bin_type=True).pack
    n = _FIRST_SLICE
    cap = max(1, min(_MAX_SLICE, record_bytes))
    prev: bytes | None = None
    while True:
        batch = list(islice(it, n))
        if not batch:
            return
        # All in C, over the whole slice: dict() splits the pairs (refusing
        # any item that is not a pair) and drops repeated keys, which the
        # length test catches; lt checks the order and refuses keys that
        # cannot be compared with the first, which must be bytes.
        try:
            pairs = dict(batch)
            keys = list(pairs)
            ok = (len(keys) == len(batch) and type(keys[0]) is bytes
                  and (prev is None or prev < keys[0])
                  and all(map(lt, keys, islice(keys, 1, None))))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            _explain(batch, prev)
        values = list(pairs.values())
        if set(map(type, values)) != _BYTES_ONLY:
            _explain(batch, prev)
        prev = keys[-1]
        payload = pack((keys, values))
        size = len(payload)
        if size > 2 * record_bytes and len(keys) > 1:
            for k, v in _split(keys, values, record_bytes):
                yield pack((k, v)), k[0], k[-1], len(k)
        else:
            yield payload, keys[0], keys[-1], len(keys)
        n = max(1, min(2 * n, cap, n * record_bytes // size))


def _split(keys: list[bytes], values: list[bytes], record_bytes: int
           ) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Cut an oversized slice (the pair sizes jumped) into records of about
    ``record_bytes`` each."""
    begin = 0
    acc = 0
    for i, (k, v) in enumerate(zip(keys, values)):
        size = len(k) + len(v) + 2 * _PAIR_OVERHEAD
        if acc and acc + size > record_bytes:
            yield keys[begin:i], values[begin:i]
            begin = i
            acc = 0
        acc += size
    yield keys[begin:], values[begin:]


def _explain(batch: list[Any], prev: bytes | None) -> None:
    """Raise the TypeError/ValueError that says which pair is wrong."""
    for pair in batch:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"snapshot items must be (key, value) pairs, got {type(pair).__name__} {pair!r:.80}")
        key, value = pair
        for what, x in (("key", key), ("value", value)):
            if type(x) is not bytes:
                raise TypeError(f"snapshot {what}s must be bytes, got {type(x).__name__} for key {key!r:.80}")
        if prev is not None and not prev < key:
            raise ValueError(
                f"snapshot keys must be strictly increasing: {key!r:.80} comes after {prev!r:.80}"
            )
        prev = key
    raise AssertionError("unreachable: batch has no bad pair")  # pragma: no cover
