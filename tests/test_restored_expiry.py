"""A store made by restore or by promote is a store like any other: its
snapshot holds its keys' expiry (TTLs, leases) in every keyspace, so a
rebuild of its LMDB from that snapshot (a machine crash of its own) keeps
them. Restore at a snapshot's LSN copies the snapshot's files
(:func:`snapshot.copy`); restore past it and promote write the snapshot from
the state (:func:`kvstore.store.snapshots.write_view`). Before both took the
expiry sections, each of these lost every TTL: the rebuilt keys never
expired."""

from __future__ import annotations

import os
import shutil

import pytest

import kvstore
import snapshot

T0 = 1_800_000_000_000_000  # the manual clock's start, µs


def _write_expiring(db) -> int:
    """Keys with a TTL in the default keyspace and in a keyspace, one under
    a lease; return the lease's id."""
    db.put(b"ttl", b"1", ttl=100)
    db.keyspace("users").put(b"ks-ttl", b"2", ttl=200)
    lease = db.grant(300)
    db.put(b"leased", b"3", lease=lease)
    db.put(b"plain", b"4")
    return lease.id


def _expect_expiry(db, lease_id: int) -> None:
    assert db.ttl(b"ttl") == 100
    assert db.keyspace("users").ttl(b"ks-ttl") == 200
    assert db.ttl(b"leased") == 300
    assert db.lease(lease_id).ttl() == 300
    assert db.ttl(b"plain") is None


def _lose_lmdb_and_reopen(path: str, clock) -> kvstore.KVStore:
    shutil.rmtree(os.path.join(path, "lmdb"))
    db = kvstore.open(path, clock=clock, sweep_interval=None)
    assert db.rebuilt is not None  # rebuilt from its own snapshot
    return db


@pytest.mark.parametrize("after_snapshot", [False, True], ids=["at-the-snapshot", "past-the-snapshot"])
def test_a_restored_store_keeps_expiry_through_a_rebuild(tmp_path, after_snapshot):
    clock = kvstore.ManualClock(T0)
    src, target = str(tmp_path / "src"), str(tmp_path / "target")
    with kvstore.open(src, clock=clock, sweep_interval=None) as db:
        if after_snapshot:
            db.snapshot()
        lease_id = _write_expiring(db)
        if not after_snapshot:
            source_snapshot = db.snapshot()
    info = kvstore.restore(src, target)
    assert info.replayed == (5 if after_snapshot else 0)
    (restored,) = snapshot.list_snapshots(os.path.join(target, "snapshots"))
    if not after_snapshot:  # the source snapshot's chunks, byte for byte, named the target's
        for name in os.listdir(source_snapshot.path):
            if name.endswith(".wkc"):
                with open(os.path.join(source_snapshot.path, name), "rb") as a, \
                        open(os.path.join(restored.path, name), "rb") as b:
                    assert a.read() == b.read()
    with kvstore.open(target, clock=clock, sweep_interval=None) as db:
        assert restored.store_id == db.store_id != source_snapshot_id(src)
        _expect_expiry(db, lease_id)
    with _lose_lmdb_and_reopen(target, clock) as db:
        _expect_expiry(db, lease_id)
        clock.advance(150)
        assert db.get(b"ttl") is None and db.keyspace("users").get(b"ks-ttl") == b"2"


def source_snapshot_id(src: str) -> str | None:
    return snapshot.list_snapshots(os.path.join(src, "snapshots"))[-1].store_id


def test_a_promoted_replica_keeps_expiry_through_a_rebuild(tmp_path):
    clock = kvstore.ManualClock(T0)
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src, clock=clock, sweep_interval=None) as db:
        lease_id = _write_expiring(db)
    rep = kvstore.open_replica(src, rdir)
    with rep.promote(clock=clock, sweep_interval=None) as db:
        _expect_expiry(db, lease_id)
    with _lose_lmdb_and_reopen(rdir, clock) as db:
        _expect_expiry(db, lease_id)
