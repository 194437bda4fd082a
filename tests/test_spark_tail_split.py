"""The log tail in parallel: the active segment (no index file yet) split at
points probed from block boundaries up to the durable LSN, as sealed
segments are split at their index's; ``maxPartitionBytes`` in sizes like
``1m``; ``minPartitions`` (Kafka's) and its default, the session's
parallelism, for batch reads and micro-batches alike."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import kvstore  # noqa: E402
from kvstore.spark.options import parse  # noqa: E402
from kvstore.spark.partitions import LogPartition  # noqa: E402
from kvstore.spark.source import WalkvReader  # noqa: E402
from kvstore.spark.stream import WalkvStreamReader  # noqa: E402
from tests.test_spark_unit import read_all, rows, ship  # noqa: E402

N = 3000  # ~1 KiB entries: ~3 MiB, all in the active segment


@pytest.fixture(scope="module")
def tail(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tail-split") / "store")
    with kvstore.open(path, segment_bytes=64 << 20) as db:
        for i in range(N):
            db.put(b"k%05d" % i, b"%05d" % i * 200)
    return path


def batch_reader(path, parallelism=1, **options):
    return ship(WalkvReader(parse({"path": path, **{k: str(v) for k, v in options.items()}},
                                  parallelism=parallelism)))


def check_cover(r, parts, first=1, last=N):
    """Every LSN first..last read once, in order, from contiguous pieces of one segment."""
    assert all(isinstance(p, LogPartition) for p in parts)
    assert len({p.piece.path for p in parts}) == 1  # the active segment only
    assert [p.piece.from_lsn for p in parts][0] == first and parts[-1].piece.to_lsn == last
    for a, b in zip(parts, parts[1:]):
        assert b.piece.from_lsn == a.piece.to_lsn + 1 and b.piece.start_offset > a.piece.start_offset
    got = [lsn for (lsn,) in rows(read_all(r, parts), ["_commit_version"])]
    assert got == list(range(first, last + 1))


def test_active_segment_splits_by_max_partition_bytes(tail):
    r = batch_reader(tail, table="changes", maxPartitionBytes="1m")
    parts = r.partitions()
    assert len(parts) >= 3, [p.piece for p in parts]
    check_cover(r, parts)
    assert len(batch_reader(tail, table="changes").partitions()) == 1  # 32 MiB by default: one piece


def test_min_partitions_and_the_default_parallelism(tail):
    r = batch_reader(tail, table="changes", minPartitions=8)
    parts = r.partitions()
    assert len(parts) >= 7
    check_cover(r, parts)
    r = batch_reader(tail, parallelism=2, table="changes")
    assert len(r.partitions()) >= 2
    check_cover(r, r.partitions())
    # A range inside the tail is split too, and starts where it should.
    r = batch_reader(tail, table="changes", minPartitions=4, startingLsn=1001, endingLsn=2500)
    check_cover(r, r.partitions(), 1001, 2500)
    assert len(r.partitions()) >= 2


def test_a_micro_batch_of_the_tail_uses_every_executor(tail):
    s = WalkvStreamReader(parse({"path": tail}, streaming=True, parallelism=2))
    parts = s.partitions({"lsn": 0}, {"lsn": N})
    assert len(parts) >= 2
    check_cover(s, parts)


def test_a_stream_of_one_keyspace_says_what_it_leaves_out(tmp_path, caplog):
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        db.put(b"a", b"1")
        db.keyspace("orders").put(b"o", b"2")
        db.snapshot()
    with caplog.at_level(logging.WARNING, logger="walkv.spark"):
        WalkvStreamReader(parse({"path": path}, streaming=True))
    assert "reads keyspace '' only" in caplog.text and "'orders'" in caplog.text and "keyspace=*" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="walkv.spark"):
        WalkvStreamReader(parse({"path": path, "keyspace": "*"}, streaming=True))
    assert caplog.text == ""


@pytest.mark.spark
def test_a_session_reads_the_tail_with_every_core(walkv_spark, tail):
    df = walkv_spark.read.format("walkv").load(tail)
    assert df.rdd.getNumPartitions() >= 2  # local[2]: both cores (main: 1)
    assert df.count() == N

