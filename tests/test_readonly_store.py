"""A store opened with ``readonly=True`` (kvstore/store/readonly.py): what it
reads from the files its writer publishes in place of asking a log, and each
writer-only call refused with the store's name and who does it instead."""

from __future__ import annotations

import pytest

import kvstore
import wal


def test_a_read_only_store_answers_from_the_files_and_refuses_the_writers_calls(tmp_path) -> None:
    path = str(tmp_path / "s")
    with kvstore.open(path, sync="none") as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
        history = db.history
    db = kvstore.open(path, readonly=True)
    try:
        assert (db.last_lsn, db.durable_lsn, db.applied_lsn, db.sync()) == (5, 5, 5, 5)
        assert db.history == history and db.failure is None and db.get(b"k4") == b"v"
        assert "log" not in db.stats() and db.stats()["durable_lsn"] == 5
        db.wait_for_snapshots(0)  # none to wait for
        refusals = [
            (kvstore.SnapshotError, "snapshots are taken by its writer", db.snapshot),
            (kvstore.ArchiveError, "its writer archives it", db.flush_archive),
            (kvstore.ReadOnlyError, "its writer starts timelines", db.start_timeline),
            (kvstore.ReadOnlyError, "writes nothing to refuse", lambda: db.following.refuse_writes(None)),
            (kvstore.ReadOnlyError, "its writer follows its leader", lambda: db.following.append_replicated([])),
            (kvstore.ReadOnlyError, "its writer discards entries", lambda: db.following.discard_after(1, wal.timeline.ROOT)),
            (kvstore.ReadOnlyError, "writes are refused", lambda: db.put(b"k", b"w")),
            (kvstore.ReadOnlyError, "writes are refused", lambda: db.keyspace("ks").delete(b"k")),
            (kvstore.ReadOnlyError, "writes are refused", db.batch),
        ]
        for error, words, call in refusals:
            with pytest.raises(error, match=f"^the store {path} .*{words}"):
                call()
        assert db.last_lsn == 5
    finally:
        db.close()
    assert db.applied_lsn == 5  # closed: what it last read
    with pytest.raises(kvstore.ClosedError, match=f"^the store {path} is closed$"):
        db.sync()
    with pytest.raises(kvstore.ClosedError, match=f"^the store {path} is closed$"):
        db.put(b"k", b"w")
