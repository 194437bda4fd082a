"""Reading a committed snapshot: open, iterate, range reads, verify.

Opening reads and checks the MANIFEST and stats every chunk file (present,
a regular file, the size the manifest says); it reads no chunk data.
Iteration streams one record at a time and checks each record as it goes
and each chunk as a whole when it reaches the chunk's end (see
:func:`snapshot.chunk.read_chunk_columns`). A Snapshot holds no open files,
so it needs no closing and can be used from several threads.
"""

from __future__ import annotations

import errno
import os
import stat
from itertools import chain, starmap
from typing import BinaryIO, Callable, Iterator

from wal.errors import CorruptionError, SnapshotError
from snapshot.chunk import ChunkInfo, read_chunk_columns
from snapshot.layout import CORRUPTION_HINT, MANIFEST_NAME, parse_snapshot_dir_name
from snapshot.manifest import Manifest, SnapshotInfo, read_manifest

Columns = tuple[tuple[bytes, ...], tuple[bytes, ...]]


class Snapshot:
    """A snapshot opened with :func:`open_snapshot` (``snapshot.open``)."""

    def __init__(self, path: str, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest
        self.lsn = manifest.lsn
        self.count = manifest.count
        self.bytes = manifest.bytes
        self.store_id = manifest.store_id
        self.created_us = manifest.created_us
        self.version = manifest.version
        self.chunks: list[ChunkInfo] = list(manifest.chunks)

    def __repr__(self) -> str:
        return f"<Snapshot {self.path} lsn={self.lsn} count={self.count} chunks={len(self.chunks)}>"

    @property
    def info(self) -> SnapshotInfo:
        return self.manifest.info(self.path)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) pair in key order."""
        return self.items()

    def chunk_path(self, i: int) -> str:
        return os.path.join(self.path, self.chunks[i].name)

    def open_chunk(self, i: int) -> BinaryIO:
        """Open chunk ``i``'s file for reading (never through a symlink)."""
        return _open_chunk(self.chunk_path(i))

    def iter_chunk_columns(self, i: int, start: bytes | None = None,
                           stop: bytes | None = None) -> Iterator[Columns]:
        """Chunk ``i`` as ``(keys, values)`` columns, one record at a time."""
        path = self.chunk_path(i)
        with _open_chunk(path) as f:
            yield from read_chunk_columns(f, self.chunks[i], path=path, start=start, stop=stop)

    def iter_chunk(self, i: int) -> Iterator[tuple[bytes, bytes]]:
        """Chunk ``i``'s pairs in key order."""
        return chain.from_iterable(starmap(zip, self.iter_chunk_columns(i)))

    def columns(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[Columns]:
        """``(keys, values)`` columns for ``start <= key < stop``, in key order.
        Chunks wholly outside the range are not opened."""
        for x, what in ((start, "start"), (stop, "stop")):
            if x is not None and not isinstance(x, bytes):
                raise TypeError(f"{what} must be bytes or None, not {type(x).__name__}")
        return self._columns(start, stop)

    def _columns(self, start: bytes | None, stop: bytes | None) -> Iterator[Columns]:
        if start is not None and stop is not None and start >= stop:
            return
        for i, c in enumerate(self.chunks):
            if start is not None and c.last_key < start:
                continue
            if stop is not None and c.first_key >= stop:
                return
            yield from self.iter_chunk_columns(i, start, stop)

    def items(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < stop`` (either bound optional), in key order."""
        cols = self.columns(start, stop)
        return chain.from_iterable(starmap(zip, cols))

    def verify(self, progress: Callable[[int, int | None], None] | None = None) -> None:
        """Read every chunk in full and check everything: each record's CRC
        and shape, key order within and across chunks, counts, key ranges,
        sizes and checksums against the manifest. Raises CorruptionError
        naming the file (and offset) at the first problem. ``progress(bytes
        checked, total bytes)`` is called after each chunk."""
        done = 0
        if progress is not None:
            progress(0, self.bytes)
        for i, c in enumerate(self.chunks):
            for _ in self.iter_chunk_columns(i):
                pass
            done += c.bytes
            if progress is not None:
                progress(done, self.bytes)


def _open_chunk(path: str) -> BinaryIO:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise CorruptionError("snapshot chunk file is missing", path=path, hint=CORRUPTION_HINT) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptionError("snapshot chunk is a symlink", path=path, hint=CORRUPTION_HINT) from None
        raise SnapshotError(f"cannot open snapshot chunk {path}: {e}") from e
    return os.fdopen(fd, "rb", buffering=0)


def open_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Open the snapshot directory ``path`` (``.../snap-<20-digit LSN>``).

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
        raise SnapshotError(f"{path} is not a snapshot directory (its name must be snap-<20-digit LSN>)")
    if not os.path.isdir(path):
        raise SnapshotError(f"no snapshot directory at {path}")
    manifest_path = os.path.join(path, MANIFEST_NAME)
    manifest = read_manifest(manifest_path)
    if manifest.lsn != dir_lsn:
        raise CorruptionError(
            f"manifest says LSN {manifest.lsn} but the directory is named for LSN {dir_lsn}",
            path=manifest_path,
            hint=CORRUPTION_HINT,
        )
    for c in manifest.chunks:
        cpath = os.path.join(path, c.name)
        try:
            st = os.lstat(cpath)
        except FileNotFoundError:
            raise CorruptionError("snapshot chunk file is missing", path=cpath, hint=CORRUPTION_HINT) from None
        except OSError as e:
            raise SnapshotError(f"cannot stat snapshot chunk {cpath}: {e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise CorruptionError("snapshot chunk is not a regular file", path=cpath, hint=CORRUPTION_HINT)
        if st.st_size != c.bytes:
            raise CorruptionError(
                f"chunk file is {st.st_size} bytes, the manifest says {c.bytes} (truncated or overwritten)",
                path=cpath,
                hint=CORRUPTION_HINT,
            )
    return Snapshot(path, manifest)


def verify(path: str | os.PathLike[str],
           progress: Callable[[int, int | None], None] | None = None) -> SnapshotInfo:
    """Open and fully verify the snapshot at ``path``; return its info."""
    snap = open_snapshot(path)
    snap.verify(progress)
    return snap.info
