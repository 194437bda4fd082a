"""A snapshot's count is of keys: the store's TTL bookkeeping (its ttl:/lease:
sections) is written beside the keys but not counted, in what snapshot()
returns, what a listing or an open snapshot says, and what archive-ls shows."""

from __future__ import annotations

import json

import kvstore
import snapshot
from kvstore import Archiver
from kvstore.cli.main import main


def test_ttl_records_are_not_counted_as_keys(tmp_path, capsys):
    path, loc = str(tmp_path / "store"), str(tmp_path / "archive")
    with kvstore.open(path) as db:
        db.update({b"k%03d" % i: b"v" for i in range(100)})
        for i in range(30):
            db.put(b"t%03d" % i, b"expires", ttl=3600)
        db.keyspace("users").put(b"u", b"1", ttl=3600)
        assert len(db) + len(db.keyspace("users")) == 131
        info = db.snapshot()
    assert info.count == 131
    snap = snapshot.open(info.path)
    assert snap.count == 131 and snap.pairs > 131  # the bookkeeping is there, uncounted
    assert [s.count for s in snapshot.list_snapshots(str(tmp_path / "store" / "snapshots"))] == [131]
    a = Archiver(path, loc)
    a.ship_once()
    a.stop()
    assert main(["archive-ls", loc, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["count"] for s in listed["snapshots"]] == [131]
