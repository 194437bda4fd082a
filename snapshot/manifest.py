"""The MANIFEST file: what a snapshot holds, and the proof that it is whole.

Format (version 3 when the snapshot has sections, else version 2, which
walkv before sections reads too; version 1 is read too)::

    MANIFEST := one wal.record record, nothing after it
    payload  := msgpack map, str keys:
      "format"     str  = "walkv-snapshot"
      "version"    int  = 2, or 3 when "sections" is there
      "lsn"        int  the LSN the snapshot is consistent at (0 <= lsn < 2**64)
      "store_id"   str | nil   the store it was taken from (the log's store id)
      "created_us" int  creation time, unix microseconds
      "count"      int  number of (key, value) pairs = sum of the chunks' pairs
      "bookkeeping" [str] (optional) sections whose pairs are the writer's own
                   metadata, not keys (a store's TTL records); the listing's
                   count (SnapshotInfo.count) leaves their pairs out
      "bytes"      int  total chunk file bytes = sum of the chunks' bytes
      "max_record_bytes" int  the largest data record the chunks may hold
                       (version 2; version 1 manifests state none, and their
                       chunks hold records of at most 64 MiB)
      "sections"   array of str (version 3): the named sections, sorted,
                   distinct, each 1..100 characters; a section with no
                   pairs is listed and has no chunks
      "chunks"     array, in (section, key) order, of maps:
          "section"   str  (version 3; absent = "", the default section)
                      the section the chunk belongs to, one of "sections"
          "name"      str  chunk file name, a plain name inside the directory
          "first_key" bin  "last_key" bin   the chunk's key range (inclusive)
          "records"   int  data records (the header record not counted), >= 1
          "pairs"     int  (key, value) pairs, >= records
          "bytes"     int  size of the chunk file
          "crc32c"    int  CRC-32C (unmasked) of the whole chunk file

Rules, and the reason for each:

* One ``wal.record`` record: the manifest is CRC-protected and its length is
  bounded (:data:`MAX_MANIFEST_BYTES`) before anything is allocated. A torn,
  truncated or padded manifest is corruption, never a shorter snapshot.
* Written last: it can name only chunks that are already durable, so a
  snapshot without a valid manifest does not exist.
* It is untrusted input: every field is type- and range-checked, chunk names
  must be plain file names and distinct, chunk key ranges must be ordered
  and disjoint, totals must add up, and the LSN must match the directory
  name (checked by the reader). Any disagreement is
  :class:`~wal.errors.CorruptionError` naming the file.
* The record limit travels with the snapshot: a store with a raised
  ``max_record_bytes`` writes chunks with larger records, and every reader
  (restore, verify, Spark) bounds records by the limit the manifest states,
  never more than :data:`~wal.record.MAX_RECORD_LIMIT` (1 GiB: a manifest
  claiming more is corruption). Version 2 added it, so a walkv that reads
  only version 1 says "upgrade" rather than calling large records damage.
* Sections are named sorted maps beside the default one (the store keeps
  a keyspace or its own metadata in one): each is its own sorted run of
  chunks, so key order and disjointness are checked within a section, and
  a reader of the default section never sees another's pairs. A snapshot
  with sections is version 3 because a reader that ignored the unknown
  "section" key would read every section's pairs as the default section's;
  one without sections stays version 2, readable by walkv before sections.
  "count" and "bytes" total every section.
* Unknown keys are ignored, so optional fields can be added without a
  version change; a version above 3 is refused with
  :class:`~wal.errors.SnapshotError` (written by a newer walkv, not damaged).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import msgpack

from snapshot.chunk import HEADER_SIZE, MAX_RECORD_BYTES, ChunkInfo
from snapshot.layout import MAX_LSN, check_chunk_name
from wal.errors import SNAPSHOT_HINT, CorruptionError, Damage, SnapshotError
from wal.fs import OS_FS
from wal.readfs import ReadFS
from wal.record import BLOCK_SIZE, MAX_RECORD_LIMIT, RecordWriter
from wal.record_reader import RecordReader

MANIFEST_FORMAT = "walkv-snapshot"
MANIFEST_VERSION = 3
"""The newest version this walkv reads and writes (with sections)."""
_PLAIN_VERSION = 2
"""The version written for a snapshot without sections."""
MAX_SECTION_NAME = 100
MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest payload (about 100,000 chunks with 511-byte keys)."""
MAX_MANIFEST_FILE_BYTES = MAX_MANIFEST_BYTES + MAX_MANIFEST_BYTES // 4096 + BLOCK_SIZE
_MAX_STORE_ID = 256
_MAX_INT = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A committed snapshot, as listed or returned by :func:`snapshot.write`."""

    lsn: int
    path: str
    count: int
    bytes: int
    chunks: int
    created_us: int
    store_id: str | None


@dataclass(frozen=True, slots=True)
class Manifest:
    lsn: int
    store_id: str | None
    created_us: int
    count: int
    bytes: int
    chunks: tuple[ChunkInfo, ...]
    """Every chunk of every section, in (section, key) order."""
    version: int = MANIFEST_VERSION
    max_record_bytes: int = MAX_RECORD_BYTES
    sections: tuple[str, ...] = ()
    """The named sections, sorted (the default section "" is not listed)."""
    bookkeeping: tuple[str, ...] = ()
    """The sections whose pairs are the writer's own metadata, not keys (a
    store's TTL and lease records): not counted in :attr:`keys`."""

    @property
    def keys(self) -> int:
        """The pairs that are keys: :attr:`count` less those of the bookkeeping sections."""
        if not self.bookkeeping:
            return self.count
        return self.count - sum(c.pairs for c in self.chunks if c.section in self.bookkeeping)

    def info(self, path: str) -> SnapshotInfo:
        return SnapshotInfo(
            lsn=self.lsn,
            path=path,
            count=self.keys,
            bytes=self.bytes,
            chunks=len(self.chunks),
            created_us=self.created_us,
            store_id=self.store_id,
        )


def encode_manifest(manifest: Manifest) -> bytes:
    """The bytes of a MANIFEST file (framed, ready to write): version 3
    when ``manifest`` has sections, else version 2."""
    body: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION if manifest.sections else _PLAIN_VERSION,
        "lsn": manifest.lsn,
        "store_id": manifest.store_id,
        "created_us": manifest.created_us,
        "count": manifest.count,
        "bytes": manifest.bytes,
        "max_record_bytes": manifest.max_record_bytes,
        "chunks": [
            {
                "name": c.name,
                "first_key": c.first_key,
                "last_key": c.last_key,
                "records": c.records,
                "pairs": c.pairs,
                "bytes": c.bytes,
                "crc32c": c.crc32c,
                **({"section": c.section} if c.section else {}),
            }
            for c in manifest.chunks
        ],
    }
    if manifest.sections:
        body["sections"] = list(manifest.sections)
    if manifest.bookkeeping:
        body["bookkeeping"] = list(manifest.bookkeeping)
    payload = msgpack.packb(body, use_bin_type=True)
    out = io.BytesIO()
    RecordWriter(out, offset=0, max_record_bytes=MAX_MANIFEST_BYTES).add_record(payload)
    return out.getvalue()


class _Checker:
    """Builds the CorruptionError of a bad manifest and checks its fields."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def fail(self, message: str, offset: int = 0, kind: Damage = Damage.CONTENT) -> CorruptionError:
        return CorruptionError(message, kind=kind, path=self.path, offset=offset, hint=SNAPSHOT_HINT)

    def field(self, m: dict[str, Any], key: str, where: str = "manifest") -> Any:
        if key not in m:
            raise self.fail(f"{where} has no {key!r}")
        return m[key]

    def int_(self, m: dict[str, Any], key: str, where: str = "manifest", lo: int = 0, hi: int = _MAX_INT) -> int:
        v = self.field(m, key, where)
        if type(v) is not int:
            raise self.fail(f"{where} {key!r} is {type(v).__name__}, not an integer")
        if not lo <= v <= hi:
            raise self.fail(f"{where} {key!r} = {v} is out of range [{lo}, {hi}]")
        return v

    def bytes_(self, m: dict[str, Any], key: str, where: str) -> bytes:
        v = self.field(m, key, where)
        if type(v) is not bytes:
            raise self.fail(f"{where} {key!r} is {type(v).__name__}, not bytes")
        return v


def decode_manifest(data: bytes, path: str | None = None) -> Manifest:
    """Parse and check the bytes of a MANIFEST file.

    Raises CorruptionError (naming ``path``) for anything but a well-formed
    manifest of version 1 to 3, SnapshotError for a newer version.
    """
    ck = _Checker(path)
    if len(data) > MAX_MANIFEST_FILE_BYTES:
        raise ck.fail(f"manifest is {len(data)} bytes, over the limit of {MAX_MANIFEST_FILE_BYTES}",
                      kind=Damage.TOO_LARGE)
    reader = RecordReader(io.BytesIO(data), path=path, start_offset=0, max_record_bytes=MAX_MANIFEST_BYTES)
    records = reader.records()
    try:
        first = next(records, None)
        second = next(records, None) if first is not None else None
    except CorruptionError as e:
        raise ck.fail(e.reason, e.offset or 0, e.kind) from e
    if first is None:
        if reader.torn_tail is not None:
            raise ck.fail(f"manifest is truncated ({reader.torn_tail[1]})", reader.torn_tail[0], Damage.FRAMING)
        raise ck.fail("manifest is empty", kind=Damage.FRAMING)
    if second is not None:
        raise ck.fail("manifest holds more than one record", second[0], Damage.FRAMING)
    if reader.torn_tail is not None or reader.end_offset != len(data):
        raise ck.fail("manifest has bytes after its record", reader.end_offset, Damage.FRAMING)
    try:
        m = msgpack.unpackb(first[1], raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for malformed input
        raise ck.fail(f"manifest is not valid msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict):
        raise ck.fail(f"manifest is a msgpack {type(m).__name__}, not a map")
    if m.get("format") != MANIFEST_FORMAT:
        raise ck.fail("not a walkv snapshot manifest (no 'format': 'walkv-snapshot')")
    version = ck.int_(m, "version", lo=1)
    if version > MANIFEST_VERSION:
        raise SnapshotError(
            f"snapshot manifest {path} has format version {version}; this walkv reads "
            f"version {MANIFEST_VERSION}: upgrade walkv to read it"
        )
    lsn = ck.int_(m, "lsn", hi=MAX_LSN)
    store_id = ck.field(m, "store_id")
    if store_id is not None and (type(store_id) is not str or len(store_id) > _MAX_STORE_ID):
        raise ck.fail("manifest 'store_id' is not a string of at most 256 characters or nil")
    created_us = ck.int_(m, "created_us")
    count = ck.int_(m, "count")
    total_bytes = ck.int_(m, "bytes")
    limit = ck.int_(m, "max_record_bytes", lo=1, hi=MAX_RECORD_LIMIT) if version >= 2 else MAX_RECORD_BYTES
    sections = _sections(ck, m) if version >= 3 else ()
    raw_chunks = ck.field(m, "chunks")
    if type(raw_chunks) is not list:
        raise ck.fail("manifest 'chunks' is not an array")

    chunks: list[ChunkInfo] = []
    names: set[str] = set()
    prev_last: bytes | None = None
    prev_section = ""
    sum_pairs = 0
    sum_bytes = 0
    for i, c in enumerate(raw_chunks):
        where = f"manifest chunk {i}"
        if not isinstance(c, dict):
            raise ck.fail(f"{where} is not a map")
        name = ck.field(c, "name", where)
        why = check_chunk_name(name)
        if why is not None:
            raise ck.fail(f"{where}: {why}")
        if name in names:
            raise ck.fail(f"{where}: chunk name {name!r} appears twice")
        names.add(name)
        section = c.get("section", "") if version >= 3 else ""
        if section != "" and section not in sections:
            raise ck.fail(f"{where}: section {section!r:.120} is not one of the manifest's 'sections'")
        if section < prev_section:
            raise ck.fail(f"{where}: section {section!r:.120} comes after {prev_section!r:.120}")
        if section != prev_section:
            prev_section, prev_last = section, None  # each section is its own sorted run
        first_key = ck.bytes_(c, "first_key", where)
        last_key = ck.bytes_(c, "last_key", where)
        nrecords = ck.int_(c, "records", where, lo=1)
        pairs = ck.int_(c, "pairs", where, lo=nrecords)
        size = ck.int_(c, "bytes", where, lo=HEADER_SIZE + 7)
        crc = ck.int_(c, "crc32c", where, hi=0xFFFFFFFF)
        if first_key > last_key or (first_key == last_key and pairs != 1):
            raise ck.fail(f"{where}: first key is not below its last key")
        if prev_last is not None and not prev_last < first_key:
            raise ck.fail(f"{where}: key range overlaps or precedes the previous chunk's")
        prev_last = last_key
        sum_pairs += pairs
        sum_bytes += size
        chunks.append(ChunkInfo(i, name, lsn, first_key, last_key, nrecords, pairs, size, crc, limit, section))
    if sum_pairs != count:
        raise ck.fail(f"manifest 'count' is {count} but its chunks hold {sum_pairs} pairs")
    if sum_bytes != total_bytes:
        raise ck.fail(f"manifest 'bytes' is {total_bytes} but its chunks add up to {sum_bytes}")
    bookkeeping = m.get("bookkeeping", [])  # optional: older manifests count every pair as a key
    if type(bookkeeping) is not list or not all(type(n) is str and n in sections for n in bookkeeping):
        raise ck.fail("manifest 'bookkeeping' is not an array of the manifest's section names")
    return Manifest(lsn, store_id, created_us, count, total_bytes, tuple(chunks), version, limit, sections,
                    tuple(bookkeeping))


def check_section_name(name: object) -> str | None:
    """Why ``name`` cannot name a section (a str of 1..100 characters), or None."""
    if type(name) is not str:
        return f"a section name is a str, not {type(name).__name__}"
    if not 1 <= len(name) <= MAX_SECTION_NAME:
        return f"a section name has 1 to {MAX_SECTION_NAME} characters, not {len(name)}"
    return None


def _sections(ck: _Checker, m: dict[str, Any]) -> tuple[str, ...]:
    """A version-3 manifest's 'sections': sorted, distinct, valid names."""
    raw = ck.field(m, "sections")
    if type(raw) is not list:
        raise ck.fail("manifest 'sections' is not an array")
    for name in raw:
        why = check_section_name(name)
        if why is not None:
            raise ck.fail(f"manifest 'sections': {why}")
    if not all(a < b for a, b in zip(raw, raw[1:])):
        raise ck.fail("manifest 'sections' are not sorted and distinct")
    return tuple(raw)


def read_manifest(path: str, *, fs: ReadFS = OS_FS, size: int | None = None) -> Manifest:
    """Read and check the MANIFEST file ``path`` through ``fs``. An oversized
    file is refused before it is read (``size``: its size, when the caller
    has listed it already). Raises CorruptionError when it is missing or
    damaged, SnapshotError when it cannot be read."""
    shown = fs.display(path)
    try:
        if size is None:
            size = fs.file_size(path)
        if size > MAX_MANIFEST_FILE_BYTES:
            raise CorruptionError(f"manifest is {size} bytes, over the limit of {MAX_MANIFEST_FILE_BYTES}",
                                  kind=Damage.TOO_LARGE, path=shown, offset=0, hint=SNAPSHOT_HINT)
        with fs.open_input(path) as f:
            data = f.read(MAX_MANIFEST_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CorruptionError("snapshot has no MANIFEST (incomplete or damaged)", kind=Damage.MISSING,
                              path=shown, offset=0, hint=SNAPSHOT_HINT) from None
    except OSError as e:
        raise SnapshotError(f"cannot read snapshot manifest {shown}: {e}") from e
    return decode_manifest(data, shown)
