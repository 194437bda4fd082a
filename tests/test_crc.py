"""CRC-32C (Castagnoli) and LevelDB's mask: known values, and the fast and the
pure (crcmod) implementations agree byte for byte.

The vectors are RFC 3720 section B.4 (the ones LevelDB's util/crc32c_test.cc
checks) plus the usual "123456789" check value. A bitwise reference CRC written
here from the polynomial gives a third, independent opinion.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wal.crc as wcrc
from wal.crc import crc32c, extend, mask, pure_crc32c, pure_extend, unmask

# The reflected Castagnoli polynomial 0x1EDC6F41.
_POLY = 0x82F63B78


def bitwise_crc32c(data: bytes, crc: int = 0) -> int:
    """Slow reference: CRC-32C straight from its definition."""
    c = crc ^ 0xFFFFFFFF
    for byte in data:
        c ^= byte
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def ref_mask(crc: int) -> int:
    """LevelDB util/crc32c.h Mask(): rotate right by 15 bits, add kMaskDelta."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


ISCSI_READ_PDU = bytes(
    [
        0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ]
)  # fmt: skip

KNOWN = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (ISCSI_READ_PDU, 0xD9963A56),
]
KNOWN_IDS = ["empty", "123456789", "32-zeros", "32-ff", "ascending", "descending", "iscsi-read-pdu"]

CRC_FUNCTIONS = {"crc32c": crc32c, "pure_crc32c": pure_crc32c, "bitwise": bitwise_crc32c}


@pytest.mark.parametrize("data,expected", KNOWN, ids=KNOWN_IDS)
@pytest.mark.parametrize("name", sorted(CRC_FUNCTIONS))
def test_known_values(name: str, data: bytes, expected: int) -> None:
    assert CRC_FUNCTIONS[name](data) == expected


@pytest.mark.parametrize("data,expected", KNOWN, ids=KNOWN_IDS)
def test_google_crc32c_known_values(data: bytes, expected: int) -> None:
    google_crc32c = pytest.importorskip("google_crc32c")
    assert google_crc32c.value(data) == expected


@pytest.mark.parametrize("ext", [extend, pure_extend], ids=["extend", "pure_extend"])
def test_extend_matches_one_shot(ext) -> None:
    # LevelDB CRC.Extend
    assert ext(crc32c(b"hello "), b"world") == crc32c(b"hello world")
    assert ext(0, b"123456789") == 0xE3069283
    assert ext(ext(ext(0, b"123"), b""), b"456789") == 0xE3069283
    # The record writer's trick: CRC of the type byte, extended by the payload.
    assert ext(crc32c(b"\x01"), b"foo") == crc32c(b"\x01foo")


def test_values_differ() -> None:
    assert crc32c(b"a") != crc32c(b"foo")


def test_crc_accepts_bytes_like() -> None:
    data = b"123456789"
    for value in (bytearray(data), memoryview(data)):
        assert crc32c(value) == 0xE3069283
        assert pure_crc32c(value) == 0xE3069283
        assert extend(0, value) == 0xE3069283
        assert pure_extend(0, value) == 0xE3069283


# -- mask ------------------------------------------------------------------


def test_mask_known_values() -> None:
    assert mask(0) == 0xA282EAD8
    assert mask(0xE3069283) == 0xC78AB0E5
    assert unmask(0xC78AB0E5) == 0xE3069283
    assert unmask(0xA282EAD8) == 0


def test_mask_leveldb_properties() -> None:
    # LevelDB CRC.Mask
    crc = crc32c(b"foo")
    assert crc != mask(crc)
    assert crc != mask(mask(crc))
    assert crc == unmask(mask(crc))
    assert crc == unmask(unmask(mask(mask(crc))))


@settings(max_examples=300)
@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_mask_round_trip(x: int) -> None:
    m = mask(x)
    assert 0 <= m <= 0xFFFFFFFF
    assert m == ref_mask(x)
    assert unmask(m) == x
    assert mask(unmask(x)) == x  # a bijection on 32-bit values


@settings(max_examples=200)
@given(st.binary(max_size=256))
def test_mask_changes_real_crcs(data: bytes) -> None:
    crc = crc32c(data)
    assert mask(crc) != crc
    assert unmask(mask(crc)) == crc


# -- the implementations agree ----------------------------------------------


@settings(max_examples=200)
@given(st.binary(max_size=4096))
def test_pure_matches_bitwise_reference(data: bytes) -> None:
    assert pure_crc32c(data) == bitwise_crc32c(data)
    assert crc32c(data) == pure_crc32c(data)


@settings(max_examples=300)
@given(st.binary(max_size=70000), st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_fast_matches_crcmod(data: bytes, seed: int) -> None:
    google_crc32c = pytest.importorskip("google_crc32c")
    assert google_crc32c.value(data) == pure_crc32c(data)
    assert google_crc32c.extend(seed, data) == pure_extend(seed, data)
    assert crc32c(data) == pure_crc32c(data)
    assert extend(seed, data) == pure_extend(seed, data)


@settings(max_examples=100)
@given(st.binary(max_size=2000), st.integers(min_value=0, max_value=2000))
def test_extend_is_concatenation(data: bytes, cut: int) -> None:
    cut = min(cut, len(data))
    for one, ext in ((crc32c, extend), (pure_crc32c, pure_extend)):
        assert ext(one(data[:cut]), data[cut:]) == one(data)


def test_large_random_buffers_agree() -> None:
    google_crc32c = pytest.importorskip("google_crc32c")
    rnd = random.Random(20240601)
    for size in (1, 7, 8, 63, 64, 65, 4095, 4096, 32761, 32768, 100_000, 1 << 20):
        data = rnd.randbytes(size)
        assert google_crc32c.value(data) == pure_crc32c(data), size


def test_fast_implementation_is_used_when_available() -> None:
    try:
        import google_crc32c
    except ImportError:
        pytest.skip("google_crc32c not installed")
    if os.environ.get("WALKV_PURE_CRC"):
        assert wcrc.IMPLEMENTATION == "crcmod"
    elif google_crc32c.implementation == "c":
        assert wcrc.IMPLEMENTATION == "google_crc32c"


# -- WALKV_PURE_CRC=1 ---------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import hashlib, io, random, sys
    import wal.crc
    from wal.record import RecordWriter
    rnd = random.Random(7)
    f = io.BytesIO()
    w = RecordWriter(f)
    for size in (0, 1, 100, 32761, 32762, 100000, 5, 32754, 3):
        w.add_record(rnd.randbytes(size))
    print(wal.crc.IMPLEMENTATION)
    print(hashlib.sha256(f.getvalue()).hexdigest())
    print(len(f.getvalue()))
    print(hex(wal.crc.crc32c(b"123456789")))
    """
)


def _run_child(pure: bool) -> list[str]:
    env = dict(os.environ)
    env.pop("WALKV_PURE_CRC", None)
    if pure:
        env["WALKV_PURE_CRC"] = "1"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()


def test_pure_crc_env_forces_crcmod_and_same_bytes() -> None:
    pure = _run_child(pure=True)
    default = _run_child(pure=False)
    assert pure[0] == "crcmod"
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            assert default[0] == "google_crc32c"
    except ImportError:
        pass
    # The same records give the same file bytes whichever CRC computed them.
    assert pure[1:] == default[1:]
    assert pure[3] == "0xe3069283"

    # ... and the same as this process writes.
    from wal.record import RecordWriter

    rnd = random.Random(7)
    f = io.BytesIO()
    w = RecordWriter(f)
    for size in (0, 1, 100, 32761, 32762, 100000, 5, 32754, 3):
        w.add_record(rnd.randbytes(size))
    assert hashlib.sha256(f.getvalue()).hexdigest() == pure[1]
