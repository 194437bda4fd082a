"""kvstore/entry/codec.py's two encoders of a batch: msgspec's (used when
installed) writes exactly the bytes msgpack's does, for every op shape and
every size boundary of the MessagePack forms a batch uses (fixint/uint,
fixstr/str8/str16, bin8/bin16/bin32, fixarray/array16/array32)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.entry import codec, packing

msgspec = pytest.importorskip("msgspec")
fast = msgspec.msgpack.Encoder().encode


def reference(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


sizes = st.sampled_from([0, 1, 15, 16, 31, 32, 100, 255, 256, 511, 512, 65535, 65536])
blobs = st.one_of(st.binary(max_size=40), sizes.map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256)))
ints = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1),
                 st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, -1,
                                  -32, -33, -128, -129]))
names = st.one_of(st.text(max_size=40), sizes.map(lambda n: "k" * n))
ops = st.lists(st.one_of(
    st.tuples(st.just(codec.OP_PUT), blobs, blobs),
    st.lists(st.one_of(ints, blobs, names), max_size=18),  # any op shape, lists or tuples, arrays past 15
    st.tuples(st.just(codec.OP_KEYSPACE), names),
    st.tuples(st.just(codec.OP_PUT_EXPIRING), blobs, blobs, ints),
), max_size=20)


@given(ops)
def test_msgspec_writes_msgpacks_bytes(batch: list) -> None:
    assert fast(batch) == reference(batch)
    assert codec.pack_ops(batch) == reference(batch)


def test_a_batch_past_every_array_header_form() -> None:
    for n in (15, 16, 65535, 65536):
        batch = [(codec.OP_PUT, b"%08d" % i, b"v") for i in range(n)]
        assert fast(batch) == reference(batch) == codec.pack_ops(batch)


def test_the_codec_uses_msgspec_when_it_is_installed() -> None:
    assert codec.pack_ops is not packing.msgpack_pack_ops
    assert codec.pack_ops([(1, b"k", b"v")]) == b"\x91\x93\x01\xc4\x01k\xc4\x01v"


def test_the_contexts_that_travel_as_lists_encode_as_lists() -> None:
    from kvstore.entry.conditions import Outcome

    for batch in (codec.PlainPuts([(1, b"k", b"v")]), Outcome([[5, b"k"], [1, b"k", b"v"]])):
        assert fast(batch) == reference(list(batch)) == codec.pack_ops(batch)
