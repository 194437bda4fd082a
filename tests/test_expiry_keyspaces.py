"""TTLs and leases in keyspaces (issue 25, both halves joined): the edges the
model (tests/test_expiry_model.py) reaches only by chance: a drop of a
keyspace takes its keys' expiry metadata with it, one lease's revoke and
expiry delete keys of several keyspaces in one entry, and what the log
holds says which keyspace each expired key was in."""

from __future__ import annotations

import shutil

import kvstore
from kvstore.entry.codec import decode
from kvstore.watch.log_tail import LogTail

START_US = 1_700_000_000_000_000


def open_store(path, clock):
    return kvstore.open(str(path), sync="none", clock=clock, sweep_interval=None)


def entries(db, first: int) -> list[list]:
    """The ops of every entry from ``first`` on, as logged."""
    db.sync()
    tail = LogTail(f"{db.path}/wal", first)
    try:
        return [decode(e.payload, e.lsn) for e in tail.read(db.last_lsn)]
    finally:
        tail.close()


def test_drop_keyspace_drops_its_expiry_metadata(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock) as db:
        users = db.keyspace("users")
        lease = db.grant(10)
        users.put(b"a", b"1", ttl=1)
        users.put(b"b", b"2", lease=lease)
        db.put(b"a", b"3", lease=lease)
        assert db.stats()["expiring_keys"] == 3
        db.drop_keyspace("users")
        assert db.stats()["expiring_keys"] == 1 and users.ttl(b"a") is None
        users.put(b"a", b"again")  # a plain put into the dropped keyspace: no expiry left over
        clock.advance(20)
        first = db.last_lsn + 1
        assert db.sweep_expired() == 1  # the default keyspace's key under the lease; nothing of users'
        assert users.get(b"a") == b"again" and db.get(b"a") is None
        assert [op for ops in entries(db, first) for op in ops] == [[13, lease.id], [14, b"a"]]


def test_a_lease_holds_keys_of_several_keyspaces(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    with open_store(tmp_path / "s", clock) as db:
        lease = db.grant(5)
        db.keyspace("users").put(b"u", b"1", lease=lease)
        db.keyspace("orders").put(b"o", b"2", lease=lease)
        db.put(b"d", b"3", lease=lease)
        with db.batch() as b:  # one batch, two keyspaces, both under the lease
            b.put(b"u2", b"4", lease=lease, keyspace="users")
            b.put(b"d2", b"5", lease=lease)
        assert db.keyspace("users").ttl(b"u") == 5.0
        first = db.last_lsn + 1
        db.revoke(lease)
        (ops,) = entries(db, first)
        assert ops[0] == [13, lease.id]
        listed, space = [], ""
        for op in ops[1:]:
            if op[0] == 16:
                space = op[1]
            else:
                assert op[0] == 2
                listed.append((space, op[1]))
        assert [op for op in ops if op[0] == 16] == [[16, "orders"], [16, "users"]]  # grouped by keyspace
        assert sorted(listed) == [("", b"d"), ("", b"d2"), ("orders", b"o"), ("users", b"u"), ("users", b"u2")]
        assert db.keyspaces() == [] and len(db) == 0
        db.sync()
        with db.watch(from_lsn=first, timeout=0.01, keyspace=None) as w:
            assert sorted((c.keyspace, c.op, c.key) for c in w) == [
                ("", "delete", b"d"), ("", "delete", b"d2"), ("orders", "delete", b"o"),
                ("users", "delete", b"u"), ("users", "delete", b"u2")]


def test_expiry_in_keyspaces_survives_snapshot_rebuild_and_replay(tmp_path) -> None:
    clock = kvstore.ManualClock(START_US)
    path = tmp_path / "s"
    with open_store(path, clock) as db:
        users = db.keyspace("users")
        lease = db.grant(30)
        users.put(b"t", b"1", ttl=10)
        users.put(b"l", b"2", lease=lease)
        db.put(b"t", b"3", ttl=20)
        db.snapshot()
        users.put(b"t2", b"4", ttl=10)  # after the snapshot: replayed
    shutil.rmtree(path / "lmdb")
    with open_store(path, clock) as db:
        assert db.rebuilt is not None
        users = db.keyspace("users")
        assert (users.ttl(b"t"), users.ttl(b"t2"), users.ttl(b"l"), db.ttl(b"t")) == (10.0, 10.0, 30.0, 20.0)
        clock.advance(10)
        assert users.get(b"t") is None and users.get(b"t2") is None and dict(users.scan()) == {b"l": b"2"}
        assert len(users) == 1 and db.get(b"t") == b"3"
        first = db.last_lsn + 1
        assert db.sweep_expired() == 2
        db.sync()  # a watcher shows durable entries only
        with db.watch(from_lsn=first, timeout=0.01, keyspace="users") as w:
            assert sorted((c.op, c.key) for c in w) == [("expire", b"t"), ("expire", b"t2")]
        db.revoke(lease)
        assert db.keyspaces() == [] and db.stats()["expiring_keys"] == 1
