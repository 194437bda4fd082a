"""A model-based test of keyspaces: hypothesis drives puts, deletes, range
deletes, batches and transactions spanning keyspaces, drops, reopens after a
crash (replay), rebuilds from the log alone and rebuilds from a snapshot
plus the log; after every step each keyspace equals the model (a dict of
keyspace -> dict) through get, get_many, scan, len, views and
``keyspaces()``."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import kvstore
from kvstore.entry.codec import END_OF_KEYS
from tests.test_kvstore import abandon

SEGMENT = 4096
KEYSPACES = ["", "a", "b.c"]
keyspaces = st.sampled_from(KEYSPACES)
keys = st.binary(min_size=1, max_size=2)
values = st.binary(max_size=6)
bounds = st.none() | st.binary(max_size=2)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keyspaces, keys, values),
        st.tuples(st.just("delete"), keyspaces, keys),
        st.tuples(st.just("range"), keyspaces, bounds, bounds),
    ),
    min_size=1, max_size=6,
)
conditions = st.lists(st.tuples(keyspaces, keys, st.none() | values), max_size=3)

Model = dict[str, dict[bytes, bytes]]


def apply_model(model: Model, op: tuple) -> None:
    kind, ks = op[0], op[1]
    m = model.setdefault(ks, {})
    if kind == "put":
        m[op[2]] = op[3]
    elif kind == "delete":
        m.pop(op[2], None)
    else:
        lo = op[2] or b""
        hi = END_OF_KEYS if op[3] is None else op[3]
        for k in [k for k in m if lo <= k < hi]:
            del m[k]


class KeyspaceModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ksmodel-")
        self.path = os.path.join(self.dir, "store")
        self.model: Model = {ks: {} for ks in KEYSPACES}
        self.lsn = 0
        self.db = self._open()

    def _open(self) -> kvstore.KVStore:
        return kvstore.open(self.path, sync="none", segment_bytes=SEGMENT, map_size=1 << 20)

    def _space(self, ks: str):
        return self.db if not ks else self.db.keyspace(ks)

    def teardown(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes --------------------------------------------------------------

    @rule(ks=keyspaces, key=keys, value=values)
    def put(self, ks: str, key: bytes, value: bytes) -> None:
        self.lsn += 1
        assert self._space(ks).put(key, value) == self.lsn
        apply_model(self.model, ("put", ks, key, value))

    @rule(ks=keyspaces, key=keys)
    def delete(self, ks: str, key: bytes) -> None:
        self.lsn += 1
        assert self._space(ks).delete(key) == self.lsn
        apply_model(self.model, ("delete", ks, key))

    @rule(ks=keyspaces, start=bounds, end=bounds)
    def delete_range(self, ks: str, start: bytes | None, end: bytes | None) -> None:
        self.lsn += 1
        assert self._space(ks).delete_range(start, end) == self.lsn
        apply_model(self.model, ("range", ks, start, end))

    @rule(batch=ops, own=keyspaces)
    def batch(self, batch: list[tuple], own: str) -> None:
        """A batch spanning keyspaces, from the store or from a keyspace's
        handle (``own``: where writes without ``keyspace=`` go)."""
        with self._space(own).batch() as b:
            for i, op in enumerate(batch):
                ks = None if i % 2 and op[1] == own else op[1]  # sometimes left to the batch's own
                if op[0] == "put":
                    b.put(op[2], op[3], keyspace=ks)
                elif op[0] == "delete":
                    b.delete(op[2], keyspace=ks)
                else:
                    b.delete_range(op[2], op[3], keyspace=ks)
        self.lsn += 1
        assert b.lsn == self.lsn
        for op in batch:
            apply_model(self.model, op)

    @rule(conds=conditions, writes=ops)
    def transaction(self, conds: list[tuple], writes: list[tuple]) -> None:
        """Conditions in several keyspaces, decided in log order: applied
        only if each holds in its own keyspace."""
        with self.db.transaction() as t:
            for ks, key, expected in conds:
                if expected is None:
                    t.require(key, absent=True, keyspace=ks)
                else:
                    t.require(key, equals=expected, keyspace=ks)
            for op in writes:
                if op[0] == "put":
                    t.put(op[2], op[3], keyspace=op[1])
                elif op[0] == "delete":
                    t.delete(op[2], keyspace=op[1])
                else:
                    t.delete_range(op[2], op[3], keyspace=op[1])
        holds = [self.model[ks].get(key) == expected for ks, key, expected in conds]
        self.lsn += 1
        assert t.lsn == self.lsn
        assert t.succeeded == all(holds)
        if all(holds):
            for op in writes:
                apply_model(self.model, op)
        else:
            failed = conds[holds.index(False)]
            assert t.failed_condition is not None
            assert (t.failed_condition.keyspace, t.failed_condition.key) == failed[:2]

    @rule(ks=st.sampled_from(KEYSPACES[1:]), key=keys, expected=st.none() | values, new=values)
    def compare_and_set(self, ks: str, key: bytes, expected: bytes | None, new: bytes) -> None:
        self.lsn += 1
        ok = self.db.keyspace(ks).compare_and_set(key, expected, new)
        assert ok == (self.model[ks].get(key) == expected)
        if ok:
            self.model[ks][key] = new

    @rule(ks=st.sampled_from(KEYSPACES[1:]))
    def drop(self, ks: str) -> None:
        self.lsn += 1
        assert self.db.drop_keyspace(ks) == self.lsn
        self.model[ks] = {}

    # -- restarts ---------------------------------------------------------------

    @rule()
    def crash_and_replay(self) -> None:
        abandon(self.db)
        self.db = self._open()
        assert self.db.rebuilt is None

    @rule()
    def rebuild_from_the_log(self) -> None:
        """LMDB gone: rebuilt from the newest snapshot (if any) and the log."""
        self.db.close()
        shutil.rmtree(os.path.join(self.path, "lmdb"))
        self.db = self._open()
        assert self.db.rebuilt is not None or self.lsn == 0  # (an empty log: a fresh store)

    @rule()
    def rebuild_from_a_snapshot(self) -> None:
        """A snapshot (every keyspace a section), then LMDB gone: rebuilt
        from the snapshot, the log after it replayed."""
        info = self.db.snapshot()
        assert info.lsn == self.lsn
        self.db.close()
        shutil.rmtree(os.path.join(self.path, "lmdb"))
        self.db = self._open()
        assert (self.db.rebuilt is not None or self.lsn == 0) and self.db.replayed == 0

    # -- checks -------------------------------------------------------------------

    @invariant()
    def equals_the_model(self) -> None:
        for ks in KEYSPACES:
            space, want = self._space(ks), self.model[ks]
            assert dict(space.scan()) == want, ks
            assert len(space) == len(want)
            probe = sorted(want)[:3] + [b"\x00\x00"]
            assert space.get_many(probe) == [want.get(k) for k in probe]
            assert [space.get(k) for k in probe] == [want.get(k) for k in probe]
            assert [k for k, _ in space.scan(reverse=True)] == sorted(want, reverse=True)
        with self.db.keyspace("a").view() as v:
            assert dict(v.scan()) == self.model["a"] and len(v) == len(self.model["a"])
        assert self.db.keyspaces() == sorted(ks for ks in KEYSPACES[1:] if self.model[ks])
        assert self.db.last_lsn == self.db.applied_lsn == self.lsn


KeyspaceModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("WALKV_MODEL_EXAMPLES", "25")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestKeyspaceModel = KeyspaceModel.TestCase
