"""The state machine's LMDB commits (kvstore/state/commits.py) on a real LMDB
environment: each commit makes its LSN applied in LMDB in the same
transaction, and is counted; a commit LMDB refuses is kept, raised again by
every later apply, and leaves LMDB's applied LSN and contents where they were."""

from __future__ import annotations

import os

import pytest

from kvstore.entry.codec import OP_DELETE_RANGE, OP_PUT
from kvstore.state import State, StateOptions
from wal.errors import LogFailedError

TOO_LONG = b"k" * 600  # over LMDB's 511-byte key limit: LMDB refuses it (BadValsizeError)


def state_at(tmp_path, *, overlay: bool) -> State:
    s = State(os.path.join(str(tmp_path), "lmdb"), StateOptions(overlay=overlay))
    s.initialize("ab12", complete=True)
    return s


def test_a_write_through_commits_its_lsn_with_its_writes_and_is_counted(tmp_path):
    s = state_at(tmp_path, overlay=True)
    s.apply(1, [[(OP_PUT, b"a", b"1")]])  # into the overlay: LMDB has not moved
    assert (s.applied_lsn, s.commits.applied_lsn, s.commits.count, s.read_meta_applied()) == (1, 0, 0, 0)
    # a group of two entries with a range delete: through to LMDB, after the overlay's a, in one transaction
    s.apply(2, [[(OP_PUT, b"b", b"2")], [(OP_DELETE_RANGE, b"x", b"y"), (OP_PUT, b"d", b"4")]])
    assert (s.applied_lsn, s.commits.applied_lsn, s.commits.count, s.read_meta_applied()) == (3, 3, 1, 3)
    assert s.lmdb.read(lambda txn: txn.get(b"a", db=s.lmdb.data_db)) == b"1"
    assert 0 < s.commits.max_seconds <= s.commits.seconds
    stats = s.stats()
    assert (stats["lmdb_commits"], stats["lmdb_applied_lsn"]) == (1, 3)
    assert stats["apply_avg_us"] == pytest.approx(s.commits.seconds * 1e6)
    s.close()
    s = State(os.path.join(str(tmp_path), "lmdb"))
    assert (s.applied_lsn, s.commits.applied_lsn, s.get(b"d")) == (3, 3, b"4")
    s.close()


def test_a_refused_commit_is_kept_and_raised_by_every_later_apply(tmp_path):
    s = state_at(tmp_path, overlay=False)
    s.apply(1, [[(OP_PUT, b"a", b"1")]])
    assert (s.commits.applied_lsn, s.commits.count) == (1, 1)
    with pytest.raises(LogFailedError, match=r"applying LSNs up to 2 to LMDB \(.*lmdb\) failed") as failed:
        s.apply(2, [[(OP_PUT, TOO_LONG, b"2")]])
    assert s.commits.failure is failed.value
    with pytest.raises(LogFailedError) as again:
        s.apply(3, [[(OP_PUT, b"c", b"3")]])
    assert again.value is failed.value
    # nothing of LSN 2 or 3 reached LMDB, nor was counted
    assert (s.applied_lsn, s.commits.applied_lsn, s.commits.count, s.read_meta_applied()) == (1, 1, 1, 1)
    assert s.get(b"c") is None
    s.close()  # (does not raise: the failure was raised already)
    s = State(os.path.join(str(tmp_path), "lmdb"))
    assert (s.applied_lsn, s.commits.failure, s.get(b"a")) == (1, None, b"1")
    s.close()


def test_a_refused_overlay_flush_is_kept_and_leaves_lmdb_at_its_applied_lsn(tmp_path):
    s = state_at(tmp_path, overlay=True)
    s.apply(1, [[(OP_PUT, b"a", b"1")]])
    s.apply(2, [[(OP_PUT, TOO_LONG, b"2")]])  # both in the overlay, applied in memory
    assert s.applied_lsn == 2
    with pytest.raises(LogFailedError, match=r"applying LSNs up to 2 to LMDB") as failed:
        s.flush()
    with pytest.raises(LogFailedError) as again:
        s.apply(3, [[(OP_PUT, b"c", b"3")]])
    assert again.value is failed.value is s.commits.failure
    assert (s.commits.applied_lsn, s.commits.count, s.read_meta_applied()) == (0, 0, 0)
    s.close()
