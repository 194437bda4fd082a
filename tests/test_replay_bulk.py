"""Replay decodes a chunk of payloads in one pass (``batch.decode_all``): the
same ops as decoding each entry as it is read, and the same error, naming the
first bad entry in log order, even when damage the reader finds follows it in
the same chunk."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
import wal
from kvstore.entry.codec import decode, decode_all
from kvstore.store import recovery
from tests.entries import encode_delete, encode_put
from tests.test_kvstore import abandon, append_raw
from wal.errors import CorruptionError, Damage
from wal.segment import SegmentScan

_NOT_BATCHES = [b"\x92\x01\x02", b"\xc1", msgpack.packb([[1, "text", b"v"]]), msgpack.packb([[9, b"k"]]), b""]
payloads = st.lists(st.one_of(
    st.builds(encode_put, st.binary(min_size=1, max_size=20), st.binary(max_size=30)),
    st.builds(encode_delete, st.binary(min_size=1, max_size=20)),
    st.sampled_from(_NOT_BATCHES),
), max_size=20)


@settings(max_examples=200, deadline=None)
@given(payloads, st.integers(1, 1000))
def test_decode_all_is_decode_of_each(ps: list[bytes], first: int) -> None:
    want_ops, want_error = [], None
    for lsn, p in enumerate(ps, first):
        try:
            want_ops.append(decode(p, lsn))
        except CorruptionError as e:
            want_error = (str(e), e.lsn, e.kind)
            break
    try:
        got = decode_all(ps, first)
    except CorruptionError as e:
        assert (str(e), e.lsn, e.kind) == want_error
    else:
        assert want_error is None and got == want_ops


def _flip_payload_byte(store: str, lsn: int) -> int:
    """Damage the record of ``lsn`` (its CRC fails); return its offset."""
    for name in sorted(os.listdir(os.path.join(store, "wal"))):
        path = os.path.join(store, "wal", name)
        if not name.endswith(".wal"):
            continue
        with open(path, "rb") as f:
            found = [off for off, e in SegmentScan(f, path).entries() if e.lsn == lsn]
        if found:
            with open(path, "r+b") as f:
                f.seek(found[0] + 7 + 16 + 2)
                byte = f.read(1)[0]
                f.seek(found[0] + 7 + 16 + 2)
                f.write(bytes([byte ^ 0xFF]))
            return found[0]
    raise AssertionError(f"LSN {lsn} is not in the log")


@pytest.mark.parametrize("bad_payload", [True, False])
def test_first_damage_in_log_order_is_reported(tmp_path, monkeypatch, bad_payload: bool) -> None:
    store = str(tmp_path / "store")
    abandon(kvstore.open(store))
    entries = [encode_put(b"k%03d" % i, b"v" * 300) for i in range(120)]
    if bad_payload:
        entries[14] = b"\x92\x01\x02"  # LSN 15: msgpack, not a batch
    append_raw(store, entries, segment_bytes=16 << 10)
    offset = _flip_payload_byte(store, 30)  # LSN 30: its CRC fails, in the same chunk and sealed segment
    with wal.open(os.path.join(store, "wal"), sync="none") as lg:  # damage only replay reads
        assert lg.last_lsn == 120
    monkeypatch.setattr(recovery, "REPLAY_CHUNK_ENTRIES", 40)
    with pytest.raises(CorruptionError) as info:
        kvstore.open(store)
    if bad_payload:
        assert (info.value.kind, info.value.lsn) == (Damage.CONTENT, 15)
    else:
        assert (info.value.kind, info.value.offset) == (Damage.CHECKSUM, offset)
    assert info.value.hint is not None and "walkv repair" in info.value.hint


def test_replay_applies_in_chunks_across_segments(tmp_path, monkeypatch) -> None:
    store = str(tmp_path / "store")
    abandon(kvstore.open(store))
    append_raw(store, [encode_put(b"k%04d" % i, os.urandom(300)) for i in range(700)]
               + [encode_delete(b"k%04d" % i) for i in range(0, 700, 2)], segment_bytes=16 << 10)
    monkeypatch.setattr(recovery, "REPLAY_CHUNK_ENTRIES", 97)
    with kvstore.open(store) as d:
        assert d.replayed == 1050 and len(d) == 350
        assert all(k.startswith(b"k") and int(k[1:]) % 2 == 1 for k, _ in d.items())
