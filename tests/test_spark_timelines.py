"""The Spark stream across a fork of the store's history (issue 34): an
offset is an LSN on a timeline, and a checkpoint whose timeline the log
left at or before it fails with ForkedHistoryError, never reads the other
history's entries as its own; one behind the fork goes on."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from kvstore.spark.options import parse  # noqa: E402
from kvstore.spark.stream import HISTORY_KEY, WalkvStreamReader  # noqa: E402
from tests.test_archive_timelines import fill, fork  # noqa: E402
from tests.test_spark_unit import read_all, rows  # noqa: E402
from wal.errors import ForkedHistoryError  # noqa: E402


def stream(path):
    return WalkvStreamReader(parse({"path": path}, streaming=True))


def test_a_checkpoint_past_the_fork_is_refused_one_behind_it_goes_on(tmp_path):
    path = str(tmp_path / "store")
    fill(path)  # LSNs 1..100 on timeline 1
    s = stream(path)
    past = s.latestOffset(s.initialOffset(), None)
    assert past["lsn"] == 100 and past[HISTORY_KEY] == [[1, 1, 0]]
    behind = {**past, "lsn": 60}
    fork(path)  # LSN 70 on cut: timeline 2 from LSN 70, then 70..119
    s = stream(path)
    with pytest.raises(ForkedHistoryError) as e:
        s.latestOffset(past, None)
    assert e.value.fork_lsn == 69 and e.value.mine.timeline == 1 and e.value.theirs.timeline == 2
    with pytest.raises(ForkedHistoryError):
        s.partitions(past, {**past, "lsn": 119})
    old = {k: v for k, v in past.items() if k != HISTORY_KEY}  # a checkpoint written before timelines
    with pytest.raises(ForkedHistoryError):
        s.latestOffset(old, None)
    # Behind the fork: the new history's entries from LSN 61 on, and the offsets carry it.
    end = s.latestOffset(behind, None)
    assert end["lsn"] == 119 and [t for t, _f, _u in end[HISTORY_KEY]] == [1, 2]
    lsns = [lsn for (lsn,) in rows(read_all(s, s.partitions(behind, end)), ["_commit_version"])]
    assert lsns == list(range(61, 120))
