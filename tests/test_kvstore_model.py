"""A model-based test of kvstore: random puts, deletes, range deletes and
batches, clean reopens, process crashes (with entries the log made durable
but LMDB never applied) and machine crashes (LMDB damaged or stale, boot id
changed), checked against a dict after every step."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvstore
from kvstore.entry.codec import END_OF_KEYS, encode
from tests.test_kvstore import abandon, append_raw, fake_machine_crash

SEGMENT = 4096
keys = st.binary(min_size=1, max_size=2)
values = st.one_of(st.binary(max_size=8), st.binary(min_size=500, max_size=3000))
bounds = st.one_of(st.none(), st.binary(max_size=2))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, values),
        st.tuples(st.just("delete"), keys),
        st.tuples(st.just("range"), bounds, bounds),
    ),
    min_size=1, max_size=8,
)


def apply_model(model: dict[bytes, bytes], op: tuple) -> None:
    if op[0] == "put":
        model[op[1]] = op[2]
    elif op[0] == "delete":
        model.pop(op[1], None)
    else:
        lo = op[1] or b""
        hi = END_OF_KEYS if op[2] is None else op[2]
        for k in [k for k in model if lo <= k < hi]:
            del model[k]


def as_wire(op: tuple) -> list:
    if op[0] == "put":
        return [1, op[1], op[2]]
    if op[0] == "delete":
        return [2, op[1]]
    return [3, op[1] or b"", END_OF_KEYS if op[2] is None else op[2]]


class KVModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="kvmodel-")
        self.path = os.path.join(self.dir, "store")
        self.model: dict[bytes, bytes] = {}
        self.lsn = 0
        self.stale: bytes | None = None
        self.db = self._open()

    def _open(self) -> kvstore.KVStore:
        return kvstore.open(self.path, sync="none", segment_bytes=SEGMENT, map_size=1 << 20)

    def teardown(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes ------------------------------------------------------------

    @rule(key=keys, value=values)
    def put(self, key: bytes, value: bytes) -> None:
        self.lsn += 1
        assert self.db.put(key, value) == self.lsn
        self.model[key] = value

    @rule(key=keys)
    def delete(self, key: bytes) -> None:
        self.lsn += 1
        assert self.db.delete(key) == self.lsn
        self.model.pop(key, None)

    @rule(start=bounds, end=bounds)
    def delete_range(self, start: bytes | None, end: bytes | None) -> None:
        self.lsn += 1
        assert self.db.delete_range(start, end) == self.lsn
        apply_model(self.model, ("range", start, end))

    @rule(batch=ops, fail=st.booleans())
    def batch(self, batch: list[tuple], fail: bool) -> None:
        try:
            with self.db.batch() as b:
                for op in batch:
                    if op[0] == "put":
                        b.put(op[1], op[2])
                    elif op[0] == "delete":
                        b.delete(op[1])
                    else:
                        b.delete_range(op[1], op[2])
                if fail:
                    raise KeyError("abort this batch")
        except KeyError:
            assert fail
            return
        self.lsn += 1
        assert b.lsn == self.lsn
        for op in batch:
            apply_model(self.model, op)

    # -- restarts -------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = self._open()
        assert self.db.rebuilt is None and self.db.replayed == 0

    @rule(unapplied=st.lists(ops, max_size=4))
    def process_crash(self, unapplied: list[list[tuple]]) -> None:
        """The process dies: LMDB is left as it was (not flushed, no clean
        close); the log may hold entries durable but never applied."""
        abandon(self.db)
        if unapplied:
            append_raw(self.path, [encode(as_wire(op) for op in b) for b in unapplied],
                       segment_bytes=SEGMENT)
            for b in unapplied:
                for op in b:
                    apply_model(self.model, op)
            self.lsn += len(unapplied)
        self.db = self._open()
        assert self.db.rebuilt is None, self.db.rebuilt
        assert self.db.replayed == len(unapplied)

    @rule()
    def keep_a_stale_copy(self) -> None:
        with open(os.path.join(self.path, "lmdb", "data.mdb"), "rb") as f:
            self.stale = f.read()

    @rule(damage=st.sampled_from(["garbage", "truncate", "zero", "none", "stale"]),
          seed=st.integers(0, 1000))
    def machine_crash(self, damage: str, seed: int) -> None:
        """The machine dies: the boot id changes, and LMDB (never fsynced)
        may be damaged or an older version of itself."""
        if damage == "stale" and self.stale is None:
            damage = "garbage"
        abandon(self.db)
        fake_machine_crash(self.path, damage, stale=self.stale, seed=seed)
        self.db = self._open()
        assert self.db.rebuilt is not None

    @rule(pairs=st.lists(st.tuples(keys, values), min_size=1, max_size=5), data=st.data())
    def puts_then_gets(self, pairs: list[tuple[bytes, bytes]], data) -> None:
        """Gets right after puts, before anything flushes the overlay (the
        invariant's scan does): some keys from the overlay, some from LMDB,
        some absent, one by one and with get_many."""
        for k, v in pairs:
            self.db.put(k, v)
            self.lsn += 1
            apply_model(self.model, ("put", k, v))
        probes = data.draw(st.lists(keys, max_size=6)) + [k for k, _ in pairs]
        for k in probes:
            assert self.db.get(k) == self.model.get(k)
        assert self.db.get_many(probes) == [self.model.get(k) for k in probes]

    # -- checks -----------------------------------------------------------------

    @invariant()
    def equals_the_model(self) -> None:
        assert dict(self.db.scan()) == self.model
        assert len(self.db) == len(self.model)
        assert self.db.last_lsn == self.db.applied_lsn == self.lsn

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def gets_and_scans(self, data) -> None:
        k = data.draw(st.sampled_from(sorted(self.model)))
        assert self.db.get(k) == self.model[k]
        assert self.db[k] == self.model[k]
        lo = data.draw(bounds)
        hi = data.draw(bounds)
        rev = data.draw(st.booleans())
        want = sorted(k for k in self.model if (lo is None or k >= lo) and (hi is None or k < hi))
        if rev:
            want.reverse()
        assert [k for k, _ in self.db.scan(lo, hi, reverse=rev)] == want


KVModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("WALKV_MODEL_EXAMPLES", "40")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestKVModel = KVModel.TestCase


@pytest.mark.soak
def test_model_soak(soak_seconds: float) -> None:
    """Many more examples, for --soak runs."""
    import time

    from hypothesis.stateful import run_state_machine_as_test

    end = time.monotonic() + soak_seconds
    while time.monotonic() < end:
        run_state_machine_as_test(KVModel, settings=settings(
            max_examples=50, stateful_step_count=60, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
