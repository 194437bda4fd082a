"""Reading a committed snapshot: open, iterate, range reads, verify.

Every file is read through a read-only file seam (:mod:`wal.readfs`; local
files by default), so a snapshot on HDFS or S3 is opened and checked the same
way as a local one. Opening lists the directory and reads and checks the
MANIFEST: every chunk it names must be there, a file, the size it gives; no
chunk data is read. Iteration streams one record at a time and checks each
record as it goes and each chunk as a whole when it reaches the chunk's end
(see :func:`snapshot.chunk_reader.read_chunk_columns`). Reads go to the
default section unless a section is named (:meth:`Snapshot.section_items`);
:meth:`Snapshot.verify` checks every section. A Snapshot holds no open
files, so it needs no closing and can be used from several threads; it
pickles (with its file seam) for another process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from itertools import chain, starmap
from typing import BinaryIO

from snapshot.chunk import ChunkInfo, check_file_sums
from snapshot.chunk_reader import read_chunk_columns
from snapshot.layout import MANIFEST_NAME, parse_snapshot_dir_name
from snapshot.manifest import Manifest, SnapshotInfo, read_manifest
from wal.crc import extend
from wal.errors import SNAPSHOT_HINT, CorruptionError, Damage, SnapshotError
from wal.fs import OS_FS, FileSystem
from wal.readfs import FileInfo, ReadFS

_CHECK_BLOCK = 8 << 20  # bytes per read of a whole-file check

Columns = tuple[tuple[bytes, ...], tuple[bytes, ...]]


class Snapshot:
    """A snapshot opened with :func:`open_snapshot` (``snapshot.open``)."""

    def __init__(self, path: str, manifest: Manifest, fs: ReadFS = OS_FS) -> None:
        self.path = path
        self.fs = fs
        self.manifest = manifest
        self.lsn = manifest.lsn
        self.count = manifest.keys
        """The keys it holds (the pairs of its bookkeeping sections, a store's TTL records, not counted)."""
        self.pairs = manifest.count
        """Every pair of every section."""
        self.bytes = manifest.bytes
        self.store_id = manifest.store_id
        self.created_us = manifest.created_us
        self.version = manifest.version
        self.all_chunks: tuple[ChunkInfo, ...] = manifest.chunks
        """Every chunk file, of every section (what a copy of the snapshot copies)."""
        self._sections: dict[str, tuple[ChunkInfo, ...]] = {name: () for name in ("", *manifest.sections)}
        for c in manifest.chunks:
            self._sections[c.section] += (c,)
        self.chunks: tuple[ChunkInfo, ...] = self._sections[""]
        """The default section's chunks, in key order."""

    def __repr__(self) -> str:
        return f"<Snapshot {self.path} lsn={self.lsn} count={self.count} chunks={len(self.chunks)}>"

    @property
    def info(self) -> SnapshotInfo:
        return self.manifest.info(self.path)

    def __len__(self) -> int:
        return self.pairs

    def section_names(self) -> list[str]:
        """The named sections, sorted (the default section "" is not listed;
        a section with no pairs is)."""
        return list(self.manifest.sections)

    def section_chunks(self, name: str) -> tuple[ChunkInfo, ...]:
        """The chunks of section ``name`` ("" is the default section), in
        key order; a KeyError names a section the snapshot does not hold."""
        try:
            return self._sections[name]
        except KeyError:
            raise KeyError(f"snapshot {self.path} has no section {name!r}") from None

    def section_items(self, name: str, start: bytes | None = None,
                      stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Section ``name``'s pairs with ``start <= key < stop``, in key order."""
        chunks = self.section_chunks(name)
        return chain.from_iterable(starmap(zip, self.columns(start, stop, chunks=chunks)))

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) pair in key order."""
        return self.items()

    def chunk_path(self, i: int) -> str:
        """The path of the default section's chunk ``i``."""
        return self.fs.join(self.path, self.chunks[i].name)

    def open_chunk(self, i: int) -> BinaryIO:
        """Open the default section's chunk ``i`` for reading (never through a symlink)."""
        return open_chunk(self.fs, self.path, self.chunks[i])

    def iter_chunk_columns(self, i: int, start: bytes | None = None,
                           stop: bytes | None = None) -> Iterator[Columns]:
        """The default section's chunk ``i`` as ``(keys, values)`` columns, one record at a time."""
        return read_chunk_file(self.fs, self.path, self.chunks[i], start=start, stop=stop)

    def iter_chunk(self, i: int) -> Iterator[tuple[bytes, bytes]]:
        """The default section's chunk ``i``'s pairs in key order."""
        return chain.from_iterable(starmap(zip, self.iter_chunk_columns(i)))

    def columns(self, start: bytes | None = None, stop: bytes | None = None, *,
                chunks: tuple[ChunkInfo, ...] | None = None) -> Iterator[Columns]:
        """``(keys, values)`` columns for ``start <= key < stop``, in key order,
        of ``chunks`` (one section's; default: the default section's).
        Chunks wholly outside the range are not opened."""
        for x, what in ((start, "start"), (stop, "stop")):
            if x is not None and not isinstance(x, bytes):
                raise TypeError(f"{what} must be bytes or None, not {type(x).__name__}")
        return self._columns(start, stop, self.chunks if chunks is None else chunks)

    def _columns(self, start: bytes | None, stop: bytes | None,
                 chunks: tuple[ChunkInfo, ...]) -> Iterator[Columns]:
        if start is not None and stop is not None and start >= stop:
            return
        for c in chunks:
            if start is not None and c.last_key < start:
                continue
            if stop is not None and c.first_key >= stop:
                return
            yield from read_chunk_file(self.fs, self.path, c, start=start, stop=stop)

    def items(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """The default section's pairs with ``start <= key < stop`` (either
        bound optional), in key order."""
        cols = self.columns(start, stop)
        return chain.from_iterable(starmap(zip, cols))

    def verify_checksums(self) -> None:
        """Check every chunk file's size and CRC-32C against the manifest (a
        read of the files, no decoding: about 10x cheaper than
        :meth:`verify`). It proves the files are the bytes their writer
        fsynced; what a reader then decodes is checked as it reads. What a
        rebuild or a restore checks before it loads a snapshot, so that a
        damaged one is passed over before anything was loaded from it."""
        for c in self.all_chunks:
            check_chunk_bytes(self.fs, self.path, c)

    def verify(self, progress: Callable[[int, int | None], None] | None = None) -> None:
        """Read every chunk of every section in full and check everything:
        each record's CRC and shape, key order within and across chunks,
        counts, key ranges, sizes and checksums against the manifest. Raises
        CorruptionError naming the file (and offset) at the first problem.
        ``progress(bytes checked, total bytes)`` is called after each chunk."""
        done = 0
        if progress is not None:
            progress(0, self.bytes)
        for c in self.all_chunks:
            for _ in read_chunk_file(self.fs, self.path, c):
                pass
            done += c.bytes
            if progress is not None:
                progress(done, self.bytes)


def check_chunk_bytes(fs: ReadFS, directory: str, chunk: ChunkInfo,
                      each_block: Callable[[bytes], object] | None = None) -> None:
    """Read ``chunk``'s file in the snapshot ``directory`` whole, handing each
    block read to ``each_block`` (a copy's writer), and check its size and
    CRC-32C against the manifest's entry: :class:`CorruptionError` naming
    the file when either differs. What was checked is the bytes the writer
    fsynced, not their content (:func:`read_chunk_file` checks that)."""
    crc = size = 0
    path = fs.display(fs.join(directory, chunk.name))
    with open_chunk(fs, directory, chunk) as f:
        while block := f.read(_CHECK_BLOCK):
            if each_block is not None:
                each_block(block)
            crc = extend(crc, block)
            size += len(block)
    check_file_sums(chunk, size, crc, path)


def _is_local_symlink(fs: ReadFS, path: str) -> bool:
    """Whether ``path`` is a symlink on the local file system. The seam shows
    no links, but a local one could lead a reader out of the snapshot's
    directory, so snapshot files are never read through one."""
    return isinstance(fs, FileSystem) and os.path.islink(path)


def open_chunk(fs: ReadFS, directory: str, chunk: ChunkInfo) -> BinaryIO:
    """The file of ``chunk`` (a manifest entry: its name is a plain file name)
    in the snapshot ``directory``, open for reading through ``fs``."""
    path = fs.join(directory, chunk.name)
    if _is_local_symlink(fs, path):
        raise _damaged("snapshot chunk is a symlink, not a regular file", fs, path, Damage.MISSING)
    try:
        return fs.open_input(path)
    except FileNotFoundError:
        raise _damaged("snapshot chunk file is missing", fs, path, Damage.MISSING) from None
    except OSError as e:
        raise SnapshotError(f"cannot open snapshot chunk {fs.display(path)}: {e}") from e


def read_chunk_file(fs: ReadFS, directory: str, chunk: ChunkInfo, *, start: bytes | None = None,
                    stop: bytes | None = None) -> Iterator[Columns]:
    """``chunk`` of the snapshot ``directory`` as ``(keys, values)`` columns
    for ``start <= key < stop``, read through ``fs`` and checked as
    :func:`snapshot.chunk_reader.read_chunk_columns` does. What an executor given one
    :class:`ChunkInfo` reads."""
    with open_chunk(fs, directory, chunk) as f:
        yield from read_chunk_columns(f, chunk, path=fs.display(fs.join(directory, chunk.name)),
                                      start=start, stop=stop)


def _damaged(message: str, fs: ReadFS, path: str, kind: Damage) -> CorruptionError:
    """A whole snapshot file missing or wrong (offset 0)."""
    return CorruptionError(message, kind=kind, path=fs.display(path), offset=0, hint=SNAPSHOT_HINT)


def _exists_as_dir(fs: ReadFS, path: str) -> bool:
    parent, name = os.path.split(path.rstrip("/"))
    return any(e.name == name and e.is_dir for e in fs.list_dir(parent or "."))


def open_snapshot(path: str | os.PathLike[str], *, fs: ReadFS = OS_FS) -> Snapshot:
    """Open the snapshot directory ``path`` (``.../snap-<20-digit LSN>``),
    reading through ``fs``.

    Checks the manifest (CRC, shape, totals, chunk names, LSN equal to the
    directory name's) and that every chunk file is there with the size the
    manifest gives. Raises SnapshotError when ``path`` is not a snapshot
    directory, CorruptionError (naming the file) when it is damaged or
    incomplete. Chunk contents are checked as they are read, or all at once
    by :meth:`Snapshot.verify`.
    """
    path = os.fspath(path)
    name = os.path.basename(os.path.normpath(path))
    dir_lsn = parse_snapshot_dir_name(name)
    if dir_lsn is None:
        raise SnapshotError(f"{fs.display(path)} is not a snapshot directory (its name must be snap-<20-digit LSN>)")
    try:
        entries: dict[str, FileInfo] = {e.name: e for e in fs.list_dir(path)}
    except OSError as e:
        raise SnapshotError(f"cannot list the snapshot directory {fs.display(path)}: {e}") from e
    if not entries and not _exists_as_dir(fs, path):
        raise SnapshotError(f"no snapshot directory at {fs.display(path)}")
    manifest_path = fs.join(path, MANIFEST_NAME)
    if _is_local_symlink(fs, manifest_path):
        raise _damaged("snapshot MANIFEST is a symlink, not a regular file", fs, manifest_path, Damage.MISSING)
    listed = entries.get(MANIFEST_NAME)
    if listed is None:
        raise _damaged("snapshot has no MANIFEST (incomplete or damaged)", fs, manifest_path, Damage.MISSING)
    manifest = read_manifest(manifest_path, fs=fs, size=listed.size)
    if manifest.lsn != dir_lsn:
        raise CorruptionError(
            f"manifest says LSN {manifest.lsn} but the directory is named for LSN {dir_lsn}",
            kind=Damage.HEADER,
            path=fs.display(manifest_path),
            offset=0,
            hint=SNAPSHOT_HINT,
        )
    for c in manifest.chunks:
        cpath = fs.join(path, c.name)
        entry = entries.get(c.name)
        if entry is None:
            raise _damaged("snapshot chunk file is missing", fs, cpath, Damage.MISSING)
        if entry.is_dir or _is_local_symlink(fs, cpath):
            raise _damaged("snapshot chunk is not a regular file", fs, cpath, Damage.MISSING)
        if entry.size != c.bytes:
            raise _damaged(
                f"chunk file is {entry.size} bytes, the manifest says {c.bytes} (truncated or overwritten)",
                fs, cpath, Damage.TOO_LARGE if entry.size > c.bytes else Damage.FRAMING,
            )
    return Snapshot(path, manifest, fs)


def verify(path: str | os.PathLike[str],
           progress: Callable[[int, int | None], None] | None = None, *, fs: ReadFS = OS_FS) -> SnapshotInfo:
    """Open and fully verify the snapshot at ``path``; return its info."""
    snap = open_snapshot(path, fs=fs)
    snap.verify(progress)
    return snap.info
