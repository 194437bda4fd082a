"""CRC-32C (Castagnoli) and LevelDB's CRC mask.

crcmod is the implementation that is always there. When a hardware-accelerated
package (``google_crc32c`` or ``crc32c``) is importable it is used instead;
``tests/test_crc.py`` proves both give identical values. Set
``WALKV_PURE_CRC=1`` to force crcmod.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

import crcmod.predefined

BytesLike = bytes | bytearray | memoryview
"""What :func:`crc32c` and :func:`extend` take (``extend_bytes`` takes ``bytes`` only)."""

MASK_DELTA: Final = 0xA282EAD8
"""The constant LevelDB adds to a rotated CRC (see :func:`mask`); the framing's hot
loops inline :func:`mask` with it."""


def _crcmod_crc32c() -> Callable[[BytesLike], int]:
    fn: Callable[..., int] = crcmod.predefined.mkCrcFun("crc-32c")

    def crc32c(data: BytesLike) -> int:
        return fn(data)
    return crc32c


def _crcmod_extend() -> Callable[[int, BytesLike], int]:
    fn: Callable[..., int] = crcmod.predefined.mkCrcFun("crc-32c")

    def extend(crc: int, data: BytesLike) -> int:
        return fn(data, crc)
    return extend


def _fast() -> tuple[str, Callable[[BytesLike], int], Callable[[int, BytesLike], int],
                     Callable[[int, bytes], int]] | None:
    if os.environ.get("WALKV_PURE_CRC"):
        return None
    try:
        import google_crc32c  # type: ignore[import-not-found,unused-ignore]  # optional: may not be installed

        if google_crc32c.implementation == "c":
            value, ext = google_crc32c.value, google_crc32c.extend
            # google_crc32c takes only bytes; walkv's hot paths pass bytes already.
            return (
                "google_crc32c",
                lambda data: value(data if type(data) is bytes else bytes(data)),
                lambda crc, data: ext(crc, data if type(data) is bytes else bytes(data)),
                ext,
            )
    except ImportError:
        pass
    try:
        import crc32c as _c  # type: ignore[import-not-found,unused-ignore]  # optional: may not be installed

        fn = lambda crc, data: _c.crc32c(data, crc)
        return "crc32c", _c.crc32c, fn, fn
    except ImportError:
        return None


pure_crc32c: Final = _crcmod_crc32c()
pure_extend: Final = _crcmod_extend()
_chosen: Final = _fast() or ("crcmod", pure_crc32c, pure_extend, pure_extend)
# ``extend_bytes`` is ``extend`` for callers that pass ``bytes`` only (the
# framing's hot paths), skipping the conversion of other bytes-like objects.
# (Final: compiled, every caller reads them from a C static, not a dictionary.)
IMPLEMENTATION: Final[str] = _chosen[0]
crc32c: Final[Callable[[BytesLike], int]] = _chosen[1]
extend: Final[Callable[[int, BytesLike], int]] = _chosen[2]
extend_bytes: Final[Callable[[int, bytes], int]] = _chosen[3]


def mask(crc: int) -> int:
    """LevelDB's mask: storing the CRC of data that itself contains CRCs is
    problematic, so the stored value is rotated right by 15 bits plus a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF
