"""kvstore/entry/codec.py: the log entry payload of the key-value store."""

from __future__ import annotations

import ast
import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.entry import codec as batch
from kvstore.entry.codec import (
    END_OF_KEYS,
    MAX_KEY_BYTES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    check_bound,
    check_key,
    check_value,
    decode,
    encode,
)
from kvstore.store.write_batch import WriteBatch
from tests.entries import encode_delete, encode_delete_range, encode_put
from wal.errors import ClosedError, CorruptionError, RecordTooLargeError


def packb(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# -- the format, from the contract's description (not from our encoder) --------

def test_put_payload_is_the_contract_bytes() -> None:
    assert encode_put(b"k", b"v") == packb([[1, b"k", b"v"]])
    # fixarray(1) fixarray(3) 1 bin8(1) "k" bin8(1) "v"
    assert encode_put(b"k", b"v") == b"\x91\x93\x01\xc4\x01k\xc4\x01v"


_LENGTHS = st.sampled_from([0, 1, 255, 256, 65535, 65536, 70000])


@given(st.integers(1, MAX_KEY_BYTES), _LENGTHS | st.integers(0, 300), st.binary(min_size=1, max_size=1))
@settings(max_examples=60)
def test_put_entry_writes_msgpacks_bytes(key_len, value_len, fill) -> None:
    # put_entry writes msgpack's encoding out by hand: every bin8/16/32 boundary of the key and value
    key, value = fill * key_len, fill * value_len
    payload, ops = batch.put_entry(key, value, 1 << 20)
    assert ops == [[OP_PUT, key, value]]
    assert payload == packb([[OP_PUT, key, value]])


def test_delete_and_range_payloads() -> None:
    assert encode_delete(b"k") == packb([[2, b"k"]])
    assert encode_delete_range(b"a", b"b") == packb([[3, b"a", b"b"]])
    ops = [[OP_PUT, b"a", b"1"], [OP_DELETE, b"b"], [OP_DELETE_RANGE, b"c", b"d"]]
    assert encode(ops) == packb(ops)
    assert encode(tuple(tuple(o) for o in ops)) == packb(ops)


def test_decode_reads_what_msgpack_writes() -> None:
    ops = [[1, b"a", b"1"], [2, b"b"], [3, b"", END_OF_KEYS], [1, b"x" * 511, b""]]
    assert decode(packb(ops), lsn=7) == ops
    assert decode(packb([])) == []


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"\xc1", "not msgpack"),                          # reserved byte
        (b"\x91", "not msgpack"),                          # truncated
        (packb([[1, b"a", b"b"]]) + b"\x00", "not msgpack"),  # trailing data
        (packb({"a": 1}), "top level"),
        (packb(5), "top level"),
        (packb(b"bytes"), "top level"),
        (packb([5]), "op 0"),
        (packb([[]]), "op 0"),
        (packb([[4, b"a"]]), "code 4"),
        (packb([[1, b"a"]]), "2 fields"),
        (packb([[1, b"a", b"b", b"c"]]), "4 fields"),
        (packb([[2, b"a", b"b"]]), "3 fields"),
        (packb([[True, b"a", b"b"]]), "code True"),
        (packb([[1.0, b"a", b"b"]]), "code 1.0"),
        (packb([[1, "a", b"b"]]), "non-bin"),
        (packb([[1, b"a", "b"]]), "non-bin"),
        (packb([[1, b"a", None]]), "non-bin"),
        (packb([[2, "a"]]), "non-bin"),
        (packb([[3, b"a", "b"]]), "non-bin"),
        (packb([[1, b"", b"v"]]), "0-byte key"),
        (packb([[2, b""]]), "0-byte key"),
        (packb([[1, b"k" * 512, b"v"]]), "512-byte key"),
        (packb([[3, b"a", b"b" * 513]]), "bound over 512"),
        (packb([[1, b"a", b"b"], [9]]), "op 1"),
        (packb([[1, msgpack.ExtType(1, b"x"), b"b"]]), "non-bin"),
    ],
)
def test_decode_rejects_what_is_not_a_batch(payload: bytes, why: str) -> None:
    with pytest.raises(CorruptionError) as info:
        decode(payload, lsn=42)
    err = info.value
    assert err.lsn == 42
    assert "LSN 42" in str(err)
    assert why in str(err)
    assert "walkv repair" in str(err)


# -- argument checks ----------------------------------------------------------

@pytest.mark.parametrize("bad", ["text", 5, None, 1.5, [b"a"], object()])
def test_keys_and_values_must_be_bytes(bad: object) -> None:
    with pytest.raises(TypeError, match="key must be bytes"):
        check_key(bad)
    with pytest.raises(TypeError, match="value must be bytes"):
        check_value(bad, 100)
    with pytest.raises(TypeError, match="start must be bytes"):
        check_bound(bad, "start")


def test_str_key_error_says_to_encode() -> None:
    with pytest.raises(TypeError, match=r"encode"):
        check_key("abc")


def test_bytes_like_are_converted() -> None:
    assert check_key(bytearray(b"ab")) == b"ab"
    assert type(check_key(bytearray(b"ab"))) is bytes
    assert check_key(memoryview(b"xab")[1:]) == b"ab"
    assert check_value(memoryview(b"v"), 10) == b"v"


def test_key_limits() -> None:
    assert check_key(b"k" * MAX_KEY_BYTES) == b"k" * MAX_KEY_BYTES
    with pytest.raises(RecordTooLargeError) as info:
        check_key(b"k" * (MAX_KEY_BYTES + 1))
    assert "512 bytes" in str(info.value) and "511" in str(info.value)
    assert "LMDB" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="empty"):
        check_key(b"")


def test_value_limit_names_the_limit() -> None:
    assert check_value(b"v" * 10, 10) == b"v" * 10
    with pytest.raises(RecordTooLargeError, match="the limit is 10 bytes"):
        check_value(b"v" * 11, 10)


def test_bound_limit() -> None:
    assert check_bound(END_OF_KEYS, "end") == END_OF_KEYS
    with pytest.raises(ValueError, match="at most 512"):
        check_bound(b"x" * 513, "end")


def test_end_of_keys_sorts_after_every_key() -> None:
    assert b"\xff" * MAX_KEY_BYTES < END_OF_KEYS
    assert b"\xff" * 510 + b"\xfe" < END_OF_KEYS


# -- WriteBatch -----------------------------------------------------------------

class Sink:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def __call__(self, payload: bytes, ops: list) -> int:
        assert packb(ops) == payload
        assert decode(payload) == [list(op) for op in ops], "the ops travel with their payload"
        self.payloads.append(payload)
        return 100 + len(self.payloads)


def test_batch_commits_once_on_success() -> None:
    sink = Sink()
    with WriteBatch(sink, 1000, 1 << 20) as b:
        b.put(b"a", b"1")
        b.delete(b"b")
        b.delete_range(b"c", None)
        b.delete_range(None, b"z")
        assert len(b) == 4
    assert b.lsn == 101
    assert sink.payloads == [packb([[1, b"a", b"1"], [2, b"b"], [3, b"c", END_OF_KEYS],
                                    [3, b"", b"z"]])]
    assert len(b) == 0
    with pytest.raises(ClosedError):
        b.put(b"x", b"y")


def test_batch_writes_nothing_when_the_block_raises() -> None:
    sink = Sink()
    with pytest.raises(RuntimeError):
        with WriteBatch(sink, 1000, 1 << 20) as b:
            b.put(b"a", b"1")
            raise RuntimeError("boom")
    assert sink.payloads == []
    assert b.lsn is None


def test_puts_only_batch() -> None:
    sink = Sink()
    with WriteBatch(sink, 1000, 1 << 20) as b:
        for i in range(10):
            b.put(b"%d" % i, b"v")
    assert len(sink.payloads) == 1


def test_empty_batch_writes_nothing() -> None:
    sink = Sink()
    with WriteBatch(sink, 1000, 1 << 20) as b:
        pass
    assert sink.payloads == [] and b.lsn is None


def test_bad_argument_in_batch_raises_at_the_call_and_aborts() -> None:
    sink = Sink()
    with pytest.raises(TypeError):
        with WriteBatch(sink, 1000, 1 << 20) as b:
            b.put(b"a", b"1")
            b.put("b", b"2")
    assert sink.payloads == []


def test_batch_over_the_record_limit() -> None:
    sink = Sink()
    with pytest.raises(RecordTooLargeError, match="4096"):
        with WriteBatch(sink, 1000, 4096) as b:
            for i in range(60):
                b.put(b"%03d" % i, b"v" * 100)
    assert sink.payloads == []
    with pytest.raises(ClosedError):
        b.put(b"x", b"y")
    with WriteBatch(sink, 1000, 4096) as b:
        for i in range(30):
            b.put(b"%03d" % i, b"v" * 100)
    assert len(sink.payloads) == 1 and len(sink.payloads[0]) <= 4096


# -- round trip ---------------------------------------------------------------

keys = st.binary(min_size=1, max_size=MAX_KEY_BYTES)
bounds = st.binary(min_size=0, max_size=MAX_KEY_BYTES + 1)
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just(OP_PUT), keys, st.binary(max_size=300)).map(list),
        st.tuples(st.just(OP_DELETE), keys).map(list),
        st.tuples(st.just(OP_DELETE_RANGE), bounds, bounds).map(list),
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(ops_strategy)
def test_round_trip(ops: list[list]) -> None:
    assert decode(encode(ops)) == ops


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decode_never_raises_anything_but_corruption(payload: bytes) -> None:
    try:
        ops = decode(payload, lsn=1)
    except CorruptionError:
        return
    assert isinstance(ops, list)
    assert encode(ops) == packb(ops)


def test_module_documents_the_format() -> None:
    # From the source: a module mypyc compiled keeps no docstring at run time.
    with open(os.path.join(os.path.dirname(batch.__file__ or ""), "codec.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    for needle in ("[1, key, value]", "[2, key]", "[3, start, end]", "511"):
        assert needle in doc


def test_update_adds_puts_in_bulk() -> None:
    sink = Sink()
    with WriteBatch(sink, 10, 1 << 20) as b:
        b.update({b"a": b"1", b"b": b"2"})
        b.update([(b"c", b"3")])
        b.update(iter([]))
        b.update([(bytearray(b"d"), memoryview(b"4"))])
    assert sink.payloads == [packb([[1, b"a", b"1"], [1, b"b", b"2"], [1, b"c", b"3"],
                                    [1, b"d", b"4"]])]


@pytest.mark.parametrize("pairs, error", [
    ([(b"a", b"1"), ("b", b"2")], TypeError),
    ([(b"a", b"1"), (b"b", 2)], TypeError),
    ([(b"", b"1")], ValueError),
    ([(b"k" * 512, b"1")], RecordTooLargeError),
    ([(b"k", b"v" * 11)], RecordTooLargeError),
    ([(b"k",)], ValueError),
])
def test_update_checks_like_put(pairs, error) -> None:
    sink = Sink()
    with pytest.raises(error):
        with WriteBatch(sink, 10, 1 << 20) as b:
            b.update(pairs)
    assert sink.payloads == []


def test_an_update_refused_adds_none_of_its_pairs() -> None:
    """The batch goes on as it was: the pairs before the refused one are not half-added."""
    sink = Sink()
    with WriteBatch(sink, 10, 1 << 20) as b:
        b.put(b"a", b"1")
        with pytest.raises(TypeError):
            b.update([(b"b", b"2"), (b"c", 3)])
        assert len(b) == 1
    assert sink.payloads == [packb([[1, b"a", b"1"]])]


_OPS = st.one_of(
    st.tuples(st.just(OP_PUT), st.binary(min_size=1, max_size=40), st.binary(max_size=300)),
    st.tuples(st.just(OP_DELETE), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just(OP_DELETE_RANGE), st.binary(max_size=40), st.just(END_OF_KEYS)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_OPS, max_size=40), st.sampled_from([0, 15, 16, 65535, 65536]))
def test_batch_bytes_is_the_encoded_length(ops: list, filler: int) -> None:
    """A batch sized from its parts (the Spark writer's check) is exactly as
    long as the encoder makes it, across msgpack's array header sizes (1, 3
    and 5 bytes) and string header sizes."""
    ops = ops + [(OP_DELETE, b"k")] * filler
    payload = encode(ops)
    assert batch.batch_bytes(len(ops), sum(map(batch.op_bytes, ops))) == len(payload) == len(packb(ops))
    assert batch.ops_bytes(payload, len(ops)) == sum(map(batch.op_bytes, ops))
    halves = encode(ops[: len(ops) // 2]), encode(ops[len(ops) // 2:])
    parts = batch.ops_bytes(halves[0], len(ops) // 2) + batch.ops_bytes(halves[1], len(ops) - len(ops) // 2)
    assert batch.batch_bytes(len(ops), parts) == len(payload)


def test_batch_bytes_of_large_values() -> None:
    for n in (0xFF, 0x100, 0xFFFF, 0x10000, 1 << 20):
        op = (OP_PUT, b"key", b"v" * n)
        assert batch.batch_bytes(1, batch.op_bytes(op)) == len(encode([op]))
