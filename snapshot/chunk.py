"""Chunk files: one contiguous key range of a snapshot, readable on its own.

This module owns their format: the header, a data record's encoding and its
checks, and :class:`ChunkInfo` (a chunk as the manifest describes it).
Reading a chunk file back, checked whole against its manifest entry, is
:mod:`snapshot.chunk_reader`; writing one is :mod:`snapshot.chunk_writer`.

Format of ``chunk-NNNNNN.wkc`` (version 1)::

    chunk   := header data+                   wal.record records (LevelDB framing:
                                              32 KiB blocks, CRC-32C per fragment),
                                              nothing after the last record
    header  := magic:8 = b"WALKVSNC"  version:uint16le = 1
               chunk_index:uint32le  snapshot_lsn:uint64le          (22 bytes)
    data    := msgpack array [keys, values]   two msgpack arrays of the same
                                              length n >= 1, every element bin

Rules, and the reason for each:

* Framing is ``wal.record`` (the one framing implementation): every fragment is
  CRC-checked and lengths are bounded, so a damaged chunk is found, not
  misread, and a length field claiming gigabytes allocates nothing.
* The header makes a chunk identifiable alone (a file handed to a Spark
  executor, or copied out of its directory, still says which snapshot and
  position it is): the reader checks index and LSN against the manifest.
* A data record holds about ``record_bytes`` (default 64 KiB) of keys and
  values, stored as columns, ``[keys, values]``, not as n ``[key, value]``
  pairs: one msgpack call packs or unpacks a whole record, n fewer arrays make
  both about 1.5-2x faster, and the columns become Arrow arrays in Spark
  with no transposition.
* Keys are strictly increasing, bytewise, inside a record, across the
  records of a chunk and across chunks (chunk i's last key < chunk i+1's
  first key): the snapshot is one sorted map, chunks cover disjoint ranges,
  and a key range read can skip whole chunks and records.
* The manifest (``snapshot.manifest``) records each chunk's first and last
  key, record and pair counts, byte size and CRC-32C of the whole file; a
  full read checks all of them, which catches a record lost, repeated or
  reordered whole (each of which the per-fragment CRCs cannot see).
* Empty chunks and empty records are never written: an empty snapshot has
  no chunks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import islice
from operator import lt

import msgpack

from wal.errors import SNAPSHOT_HINT, CorruptionError, Damage
from wal.record import DEFAULT_MAX_RECORD_BYTES

CHUNK_MAGIC = b"WALKVSNC"
CHUNK_VERSION = 1
_HEADER = struct.Struct("<8sHIQ")
HEADER_SIZE = _HEADER.size  # 22
MAX_RECORD_BYTES = DEFAULT_MAX_RECORD_BYTES
"""The default record limit of a snapshot's chunks (a snapshot holding a
larger pair states its own limit in its manifest, up to
:data:`~wal.record.MAX_RECORD_LIMIT`, 1 GiB), and the limit of a manifest
of version 1, which states none."""


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One chunk as the manifest describes it; all a reader needs to read and
    check the chunk file alone (picklable, for Spark executors)."""

    index: int
    name: str
    lsn: int
    first_key: bytes
    last_key: bytes
    records: int
    pairs: int
    bytes: int
    crc32c: int
    max_record_bytes: int = MAX_RECORD_BYTES  # the limit the chunk was written with (from the manifest)
    section: str = ""  # the snapshot section it belongs to ("": the default one)


def encode_header(index: int, lsn: int) -> bytes:
    return _HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, index, lsn)


def decode_header(payload: bytes, path: str | None) -> tuple[int, int]:
    """A header record's ``(chunk_index, snapshot_lsn)``, checked: size,
    magic and version."""
    if len(payload) != HEADER_SIZE or payload[:8] != CHUNK_MAGIC:
        raise damaged_chunk("not a walkv snapshot chunk (bad header record)", path, 0, Damage.HEADER)
    _, version, index, lsn = _HEADER.unpack(payload)
    if version != CHUNK_VERSION:
        raise damaged_chunk(f"chunk format version {version}, the manifest says {CHUNK_VERSION}", path, 0,
                      Damage.HEADER)
    return index, lsn


def damaged_chunk(message: str, path: str | None, offset: int = 0, kind: Damage = Damage.CONTENT) -> CorruptionError:
    """A damaged chunk: ``offset`` is where the bad data starts (0: the file as a whole)."""
    return CorruptionError(message, kind=kind, path=path, offset=offset, hint=SNAPSHOT_HINT)


def check_file_sums(chunk: ChunkInfo, size: int, crc: int, path: str | None) -> None:
    """A chunk file of ``size`` bytes whose CRC-32C is ``crc`` against its
    manifest entry ``chunk``: a CorruptionError naming ``path`` when either differs."""
    if size != chunk.bytes:
        raise damaged_chunk(f"chunk file is {size} bytes, the manifest says {chunk.bytes}", path, 0,
                            Damage.TOO_LARGE if size > chunk.bytes else Damage.FRAMING)
    if crc != chunk.crc32c:
        raise damaged_chunk(f"chunk file checksum {crc:#010x} differs from the manifest's {chunk.crc32c:#010x}",
                            path, 0, Damage.CHECKSUM)


def decode_record(payload: bytes, path: str | None = None, offset: int = 0
                  ) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """A data record's ``(keys, values)``, checked: shape, types, key order.

    Raises CorruptionError naming ``path`` and ``offset`` for anything else.
    """
    try:
        obj = msgpack.unpackb(payload, use_list=False, raw=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for malformed input
        raise damaged_chunk(f"data record is not valid msgpack ({type(e).__name__}: {e})", path, offset) from None
    if type(obj) is not tuple or len(obj) != 2:
        raise damaged_chunk("data record is not a [keys, values] array", path, offset)
    keys, values = obj
    if type(keys) is not tuple or type(values) is not tuple:
        raise damaged_chunk("data record's keys or values are not arrays", path, offset)
    if len(keys) != len(values):
        raise damaged_chunk(f"data record has {len(keys)} keys but {len(values)} values", path, offset)
    if not keys:
        raise damaged_chunk("data record is empty", path, offset)
    types = set(map(type, keys))
    types.update(map(type, values))
    if types != {bytes}:
        raise damaged_chunk("data record holds a key or value that is not bytes", path, offset)
    if not all(map(lt, keys, islice(keys, 1, None))):
        raise damaged_chunk("keys inside a data record are not strictly increasing", path, offset)
    return keys, values
