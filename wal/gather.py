"""Framing one record whose payload is given as pieces, for a gathered write
(``os.pwritev``): the bytes are exactly :func:`wal.record.frame_into`'s for
the joined payload (the one framing format, :mod:`wal.record`), but the
payload is never copied, so a 64 MiB value is logged without a second
64 MiB buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from wal.crc import crc32c, extend, mask
from wal.record import BLOCK_SIZE, FIRST, FRAGMENT_HEADER, FULL, HEADER_SIZE, LAST, MIDDLE

_TYPE_CRC = [crc32c(bytes([t])) for t in range(LAST + 1)]


def frame_pieces(out: list[bytes | memoryview], pieces: Sequence[bytes | memoryview], offset: int) -> int:
    """Append the bytes of one record, whose payload is the concatenation of
    ``pieces``, written at file ``offset`` to ``out``, without copying the
    payload: ``out`` gets fragment headers and memoryviews into ``pieces``
    (for a gathered write, ``os.pwritev``). The bytes are those
    :func:`frame_into` produces for the joined payload. Returns the file
    offset just after the record."""
    views = [memoryview(p).cast("B") for p in pieces]
    n = sum(map(len, views))
    left = BLOCK_SIZE - offset % BLOCK_SIZE
    piece = 0  # the piece, and the position in it, the next fragment starts at
    at = 0
    pos = 0
    begin = True
    while True:
        if left < HEADER_SIZE:
            if left:
                out.append(bytes(left))
            offset += left
            left = BLOCK_SIZE
        size = min(left - HEADER_SIZE, n - pos)
        end = pos + size == n
        ftype = (FULL if end else FIRST) if begin else (LAST if end else MIDDLE)
        header_at = len(out)
        out.append(b"")  # the header, once the CRC is known
        crc = _TYPE_CRC[ftype]
        want = size
        while want:
            view = views[piece]
            take = min(want, len(view) - at)
            part = view[at : at + take]
            crc = extend(crc, cast(bytes, part))  # extend takes any bytes-like object
            out.append(part)
            want -= take
            at += take
            if at == len(view):
                piece += 1
                at = 0
        out[header_at] = FRAGMENT_HEADER.pack(mask(crc), size, ftype)
        offset += HEADER_SIZE + size
        left -= HEADER_SIZE + size
        pos += size
        begin = False
        if end:
            return offset
