"""kvstore.spark.columnar: snapshot chunks decoded to Arrow arrays in bulk.

The bulk reading must give exactly the rows of the row-by-row reader
(:func:`snapshot.read_chunk`), with the same types, and find every damage
the row reader finds, naming the file and the record's offset."""

from __future__ import annotations

import io

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import snapshot  # noqa: E402
from kvstore.spark import arrow as sa  # noqa: E402
from kvstore.spark import columnar  # noqa: E402
from snapshot.chunk import ChunkInfo, encode_header  # noqa: E402
from tests.test_snapshot_damage import _chunk, _frame  # noqa: E402
from tests.test_spark_unit import read_all, reader  # noqa: E402
from wal.crc import crc32c  # noqa: E402
from wal.errors import CorruptionError  # noqa: E402


@pytest.fixture(params=["numpy", "pyarrow"])
def backend(request, monkeypatch):
    """Both ways of cutting the element headers off: numpy, and pyarrow alone."""
    if request.param == "pyarrow":
        monkeypatch.setattr(columnar, "_np", None)
    elif columnar._np is None:
        pytest.skip("numpy is not installed")
    return request.param


def arrays(data: bytes, info: ChunkInfo, rows: int = 1 << 16, max_bytes: int = 64 << 20):
    out = list(columnar.read_chunk_arrays(io.BytesIO(data), info, "c.wkc", rows, max_bytes))
    for k, v in out:
        assert k.type == pa.binary() and v.type == pa.binary()
        assert k.null_count == 0 and v.null_count == 0
        assert len(k) == len(v)
    return out


def pairs(out) -> list[tuple[bytes, bytes]]:
    return [(k, v) for ks, vs in out for k, v in zip(ks.to_pylist(), vs.to_pylist())]


def chunk_of(records: list[tuple[list[bytes], list[bytes]]]) -> tuple[bytes, ChunkInfo]:
    payloads = [msgpack.packb([k, v], use_bin_type=True) for k, v in records]
    data = _frame([encode_header(0, 1)] + payloads)
    n = sum(len(k) for k, _ in records)
    info = ChunkInfo(0, "chunk.wkc", 1, records[0][0][0], records[-1][0][-1], len(records), n, len(data),
                     crc32c(data))
    return data, info


def fixed_records(nrec: int, per: int, klen: int, vlen: int, start: int = 0):
    recs = []
    i = start
    for _ in range(nrec):
        ks = [i.to_bytes(klen, "big") for i in range(i, i + per)]
        vs = [bytes([(j * 7) % 256]) * vlen for j in range(i, i + per)]
        recs.append((ks, vs))
        i += per
    return recs


# -- the same rows as the row reader -------------------------------------------


@pytest.mark.parametrize("klen,vlen", [(16, 100), (1, 1), (8, 255), (8, 256), (3, 70000)])
def test_fixed_width_records_read_in_bulk(backend, klen, vlen, monkeypatch):
    recs = fixed_records(5, 40 if vlen < 70000 else 2, klen, vlen)
    data, info = chunk_of(recs)
    rows_path = []
    monkeypatch.setattr(columnar, "_rows_run", _spy(columnar._rows_run, rows_path))
    out = arrays(data, info, rows=50)
    assert pairs(out) == list(snapshot.read_chunk(io.BytesIO(data), info))
    assert rows_path == []  # all of it in bulk
    assert all(len(k) >= 50 or k is out[-1][0] for k, _ in out)  # batches of about `rows`


def _spy(fn, calls):
    def spy(run, records):
        calls.append(len(run))
        return fn(run, records)
    return spy


def test_high_bytes_order_unsigned(backend):
    """Keys compare as unsigned bytes (0x7f < 0x80), as the writer sorted them."""
    ks = [bytes([b, 0]) for b in (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)]
    data, info = chunk_of([(ks, [b"v" * 4] * len(ks))])
    assert pairs(arrays(data, info)) == [(k, b"vvvv") for k in ks]


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(
    st.one_of(
        st.tuples(st.just("fixed"), st.integers(1, 30), st.integers(1, 20), st.integers(0, 300)),
        st.tuples(st.just("mixed"), st.lists(st.binary(min_size=0, max_size=12), min_size=1, max_size=20,
                                             unique=True), st.integers(0, 0), st.integers(0, 0)),
    ),
    min_size=1, max_size=8,
), st.integers(1, 70))
def test_any_mix_of_records_reads_as_the_row_reader(backend, specs, rows):
    """Runs of fixed-width records, records of mixed sizes and empty keys or
    values, in any order: the same pairs, in the same order, typed binary.
    (The fixture only picks the backend: nothing to reset between inputs.)"""
    recs = []
    base = 0
    for kind, a, b, c in specs:
        if kind == "fixed":
            per, vlen = a, c
            if vlen == 0:
                vlen = 1
            ks = [(base + i).to_bytes(4, "big") + bytes(b) for i in range(per)]
            recs.append((ks, [bytes([i % 256]) * vlen for i in range(per)]))
            base += per
        else:
            suffixes = sorted(a)
            ks = [base.to_bytes(4, "big") + s for s in suffixes]
            recs.append((ks, [s * 2 for s in suffixes]))
            base += 1
    data, info = chunk_of(recs)
    expect = list(snapshot.read_chunk(io.BytesIO(data), info))
    assert pairs(arrays(data, info, rows=rows)) == expect


# -- damage: found, with the file and the record's offset -----------------------


def test_crafted_damage_same_error_as_row_reader(backend):
    from tests.test_snapshot_damage import test_crafted_chunk_contents as row_cases

    for mark in row_cases.pytestmark:
        if mark.name != "parametrize":
            continue
        for records, kw, match in mark.args[1]:
            data, info = _chunk(records, **kw)
            with pytest.raises(CorruptionError, match=match) as e:
                arrays(data, info)
            assert e.value.path == "c.wkc"
            with pytest.raises(CorruptionError) as row:
                list(snapshot.read_chunk(io.BytesIO(data), info, path="c.wkc"))
            assert (e.value.reason, e.value.offset) == (row.value.reason, row.value.offset)


def _bin8(b: bytes) -> bytes:
    return b"\xc4" + bytes([len(b)]) + b


def _raw_record(keys: list[bytes], values: list[bytes], key_head=_bin8, value_head=_bin8) -> bytes:
    return (b"\x92" + bytes([0x90 | len(keys)]) + b"".join(map(key_head, keys))
            + bytes([0x90 | len(values)]) + b"".join(map(value_head, values)))


def _raw_chunk(payloads: list[bytes], first: bytes, last: bytes, pairs: int) -> tuple[bytes, ChunkInfo]:
    data = _frame([encode_header(0, 1)] + payloads)
    return data, ChunkInfo(0, "chunk.wkc", 1, first, last, len(payloads), pairs, len(data), crc32c(data))


def _both_fail(data: bytes, info: ChunkInfo, match: str) -> CorruptionError:
    with pytest.raises(CorruptionError, match=match) as e:
        arrays(data, info)
    with pytest.raises(CorruptionError) as row:
        list(snapshot.read_chunk(io.BytesIO(data), info, path="c.wkc"))
    assert (e.value.path, e.value.reason, e.value.offset) == ("c.wkc", row.value.reason, row.value.offset)
    return e.value


def test_fixed_width_record_with_keys_out_of_order(backend):
    good = _raw_record([b"aa", b"ab"], [b"11", b"22"])
    bad = _raw_record([b"ba", b"bc", b"bb"], [b"11", b"22", b"33"])
    data, info = _raw_chunk([good, bad], b"aa", b"bb", 5)
    err = _both_fail(data, info, "inside a data record are not strictly increasing")
    assert err.offset > 0  # the second record's, not the file's


def test_fixed_width_record_with_a_str_element(backend):
    """A row whose header is msgpack str of the same width: not bytes."""
    def str8(b: bytes) -> bytes:
        return b"\xd9" + bytes([len(b)]) + b

    rec = (b"\x92\x92" + _bin8(b"ka") + _bin8(b"kb") + b"\x92" + _bin8(b"v1") + str8(b"v2"))
    data, info = _raw_chunk([rec], b"ka", b"kb", 2)
    _both_fail(data, info, "not bytes")


def test_first_damage_reported_first(backend):
    """Records are checked a batch at a time, but the first damage in the
    file is the one reported, as by the row reader: here the first record's
    first key differs from the manifest's and the second record's checksum
    is wrong."""
    one = _raw_record([b"ab", b"ac"], [b"11", b"22"])
    two = _raw_record([b"ba", b"bb"], [b"33", b"44"])
    data, info = _raw_chunk([one, two], b"aa", b"bb", 4)
    damaged = bytearray(data)
    damaged[len(data) - 1] ^= 1  # the last byte of the second record
    err = _both_fail(bytes(damaged), info, "first key differs")
    assert err.offset > 0


def test_lengths_that_add_up_like_fixed_width_are_read_row_by_row(backend):
    """Keys of lengths 2, 1 and 3 span what three of length 2 would: the
    layout fits, the bulk reading sees the second header differ and reads
    the record row by row."""
    rec = _raw_record([b"ab", b"b", b"cde"], [b"1", b"2", b"3"])
    assert columnar.layout(rec) is not None
    data, info = _raw_chunk([rec], b"ab", b"cde", 3)
    assert pairs(arrays(data, info)) == [(b"ab", b"1"), (b"b", b"2"), (b"cde", b"3")]


def test_damaged_bulk_records_in_a_real_snapshot(tmp_path, backend):
    """A bit flipped in a fixed-width record's bytes: CorruptionError naming
    the chunk file and the fragment's offset, as the row reader says."""
    items = [(i.to_bytes(16, "big"), bytes([i % 251]) * 100) for i in range(3000)]
    info = snapshot.write(tmp_path, 5, items, chunk_bytes=1 << 20, record_bytes=4096)
    snap = snapshot.open(info.path)
    c = snap.chunks[0]
    data = bytearray(open(snap.chunk_path(0), "rb").read())
    assert pairs(arrays(bytes(data), c)) == items
    data[20000] ^= 1
    _both_fail(bytes(data), c, "checksum")


def test_block_padding_flip_found_by_the_file_checksum(backend):
    """Bytes no fragment CRC covers (a block's zero padding) are covered by
    the whole-file CRC-32C, which the bulk reading checks at the chunk's end."""
    from wal.errors import Damage
    from wal.record import BLOCK_SIZE

    n = BLOCK_SIZE - 3 - 29 - 7 - 9
    data, info = _chunk([[[b"a"], [b"x" * n]], [[b"z"], [b"y"]]], pairs=2)
    pad = BLOCK_SIZE - 3
    assert data[pad:BLOCK_SIZE] == b"\x00\x00\x00"
    assert pairs(arrays(data, info)) == [(b"a", b"x" * n), (b"z", b"y")]
    damaged = data[:pad] + b"\x01" + data[pad + 1:]
    err = _both_fail(damaged, info, "checksum")
    assert err.kind is Damage.CHECKSUM and err.offset == 0


# -- through the data source's read() -------------------------------------------


def test_snapshot_table_types_and_rows_through_read(tmp_path, backend):
    import kvstore

    path = str(tmp_path / "store")
    db = kvstore.open(path)
    items = {i.to_bytes(16, "big"): bytes([97 + i % 26]) * 100 for i in range(2000)}
    items[b"\xff" * 16] = b""  # one empty value: that record is read row by row
    db.update(items)
    db.snapshot()
    db.close()
    for table in ("snapshot", "state"):
        t = read_all(reader(path, table=table))
        assert t.schema.field("key").type == pa.binary() and not t.schema.field("key").nullable
        assert t.schema.field("value").type == pa.binary() and not t.schema.field("value").nullable
        got = dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))
        assert got == items
    t = read_all(reader(path, table="snapshot", valueFormat="string"))
    assert t.schema.field("value").type == pa.string()
    assert dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist())) == {
        k: v.decode() for k, v in items.items()}


def test_constant_columns_come_from_the_heap_the_next_batch_reuses():
    """A batch's LSN and keyspace columns are allocated from malloc's heap
    (arrow.CONSTANTS_POOL), not from pyarrow's default pool, which hands
    freed pages back at once: each batch would fault in new pages."""
    pool = pa.system_memory_pool()
    before = pool.bytes_allocated()
    batch = sa.snapshot_batch([b"k%05d" % i for i in range(10_000)], [b"v"] * 10_000, 7, sa.BINARY, sa.BINARY,
                              lambda: "test", keyspace="users")
    assert pool.bytes_allocated() - before >= 8 * 10_000 + 4 * 10_000  # the LSNs and the keyspace offsets
    assert batch.column("lsn").to_pylist() == [7] * 10_000
    assert set(batch.column("keyspace").to_pylist()) == {"users"}
