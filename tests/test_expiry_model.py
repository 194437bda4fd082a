"""A model-based test of expiry (TTLs and leases, kvstore/store/expiring.py)
in keyspaces (kvstore/store/keyspace.py): hypothesis drives, in the default
keyspace and two named ones, puts with TTLs, puts under leases (one lease may
hold keys of several keyspaces), keep-alives, revokes, plain writes, range
deletes, drops of keyspaces, compare-and-set, batches spanning keyspaces, a
manual clock moving forward and back, sweeps, reopens (replay), snapshots and
rebuilds from a snapshot plus the log; after every step every keyspace
equals a model of what every read should show at the model's time, and the
log (read as a watcher of every keyspace reads it) equals the model's raw
state (expired keys not swept yet included)."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import kvstore
from kvstore.entry.codec import END_OF_KEYS
from kvstore.store.keyspace import Keyspace

START_US = 1_700_000_000_000_000
KEYS = [b"a", b"b", b"c", b"d", b"e"]
SPACES = ["", "users", "orders"]
keys = st.sampled_from(KEYS)
spaces = st.sampled_from(SPACES)
named_spaces = st.sampled_from(SPACES[1:])
spaced_keys = st.tuples(spaces, keys)
SK = tuple[str, bytes]
values = st.binary(min_size=0, max_size=4)
ttls = st.sampled_from([0.5, 1.0, 2.0, 5.0])
steps = st.sampled_from([0.25, 0.5, 1.0, 3.0])


class ExpiryModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="expirymodel-")
        self.path = os.path.join(self.dir, "store")
        self.clock = kvstore.ManualClock(START_US)
        self.high = START_US  # the store's time: the clock's largest reading since it opened
        # (keyspace, key) -> what LMDB holds (expired keys not swept included)
        self.values: dict[SK, bytes] = {}
        self.meta: dict[SK, tuple[str, int]] = {}  # -> ("ttl", at_us) | ("lease", lease id)
        self.leases: dict[int, tuple[int, int]] = {}  # lease id -> (ttl_us, at_us), until revoked or swept
        self.handles: list[kvstore.Lease] = []
        self.snapshots = 0
        self.steps = 0
        self.db = self._open()

    def _open(self) -> kvstore.KVStore:
        return kvstore.open(self.path, sync="none", segment_bytes=4096, map_size=1 << 20,
                            clock=self.clock, sweep_interval=None)

    def space(self, name: str) -> kvstore.KVStore | Keyspace:
        """The handle of keyspace ``name`` ("": the store itself)."""
        return self.db.keyspace(name) if name else self.db

    def teardown(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ---------------------------------------------------------------

    def now(self) -> int:
        self.high = max(self.high, self.clock.now_us())
        return self.high

    def at_of(self, key: SK) -> int | None:
        """The instant ``key`` expires at (None: never); 0 for a missing lease."""
        m = self.meta.get(key)
        if m is None:
            return None
        if m[0] == "ttl":
            return m[1]
        return self.leases[m[1]][1] if m[1] in self.leases else 0

    def visible(self) -> dict[SK, bytes]:
        now = self.now()
        out = {}
        for k, v in self.values.items():
            at = self.at_of(k)
            if at is None or at > now:
                out[k] = v
        return out

    def lease_alive(self, lease_id: int) -> bool:
        return lease_id in self.leases and self.leases[lease_id][1] > self.now()

    def drop(self, key: SK) -> None:
        self.values.pop(key, None)
        self.meta.pop(key, None)

    def set(self, key: SK, value: bytes, meta: tuple[str, int] | None) -> None:
        self.values[key] = value
        if meta is None:
            self.meta.pop(key, None)
        else:
            self.meta[key] = meta

    # -- writes ------------------------------------------------------------------

    @rule(key=spaced_keys, value=values)
    def put(self, key: SK, value: bytes) -> None:
        self.space(key[0]).put(key[1], value)
        self.set(key, value, None)

    @rule(key=spaced_keys, value=values, ttl=ttls)
    def put_ttl(self, key: SK, value: bytes, ttl: float) -> None:
        self.space(key[0]).put(key[1], value, ttl=ttl)
        self.set(key, value, ("ttl", self.now() + round(ttl * 1e6)))

    @rule(key=spaced_keys)
    def delete(self, key: SK) -> None:
        self.space(key[0]).delete(key[1])
        self.drop(key)

    @rule(space=spaces, start=st.sampled_from([None, b"b", b"c"]), end=st.sampled_from([None, b"c", b"e"]))
    def delete_range(self, space: str, start: bytes | None, end: bytes | None) -> None:
        self.space(space).delete_range(start, end)
        lo, hi = start or b"", END_OF_KEYS if end is None else end
        for sk in [sk for sk in self.values if sk[0] == space and lo <= sk[1] < hi]:
            self.drop(sk)

    @rule(space=named_spaces)
    def drop_keyspace(self, space: str) -> None:
        """Every key of the keyspace goes, with its TTL or its place in a lease."""
        self.db.drop_keyspace(space)
        for sk in [sk for sk in self.values if sk[0] == space]:
            self.drop(sk)

    @rule(ttl=ttls, attach=st.lists(spaced_keys, max_size=3, unique=True), value=values)
    def grant(self, ttl: float, attach: list[SK], value: bytes) -> None:
        """A new lease, with keys (of any keyspaces) put under it at once (the common use)."""
        lease = self.db.grant(ttl)
        ttl_us = round(ttl * 1e6)
        self.leases[lease.id] = (ttl_us, self.now() + ttl_us)
        self.handles.append(lease)
        for key in attach:
            self.space(key[0]).put(key[1], value, lease=lease)
            self.set(key, value, ("lease", lease.id))

    def _lease(self, data: st.DataObject) -> kvstore.Lease | None:
        return data.draw(st.sampled_from(self.handles)) if self.handles else None

    @rule(key=spaced_keys, value=values, data=st.data())
    def put_under_lease(self, key: SK, value: bytes, data: st.DataObject) -> None:
        lease = self._lease(data)
        if lease is None:
            return
        if self.lease_alive(lease.id):
            self.space(key[0]).put(key[1], value, lease=lease)
            self.set(key, value, ("lease", lease.id))
        else:
            try:
                self.space(key[0]).put(key[1], value, lease=lease)
            except kvstore.LeaseNotFoundError as exc:
                assert exc.lease_id == lease.id
            else:
                raise AssertionError("a put under a dead lease succeeded")

    @rule(data=st.data())
    def keepalive(self, data: st.DataObject) -> None:
        lease = self._lease(data)
        if lease is None:
            return
        if self.lease_alive(lease.id):
            assert lease.keepalive() == lease.granted_ttl
            ttl_us = self.leases[lease.id][0]
            self.leases[lease.id] = (ttl_us, self.now() + ttl_us)
        else:
            try:
                lease.keepalive()
            except kvstore.LeaseNotFoundError:
                pass
            else:
                raise AssertionError("a keep-alive of a dead lease succeeded")

    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        lease = self._lease(data)
        if lease is None:
            return
        if lease.id in self.leases:  # expired but not swept yet: revoked all the same
            self.db.revoke(lease)
            for k in [k for k, m in self.meta.items() if m == ("lease", lease.id)]:
                self.drop(k)
            del self.leases[lease.id]
        else:
            try:
                self.db.revoke(lease)
            except kvstore.LeaseNotFoundError:
                pass
            else:
                raise AssertionError("a revoke of a lease that is gone succeeded")

    @rule(key=spaced_keys, value=values)
    def create_if_absent(self, key: SK, value: bytes) -> None:
        """An expired key is absent to conditions too (decided in log order)."""
        absent = key not in self.visible()
        assert self.space(key[0]).compare_and_set(key[1], None, value) == absent
        if absent:
            self.set(key, value, None)

    @rule(data=st.data(), n=st.integers(1, 3))
    def batch(self, data: st.DataObject, n: int) -> None:
        """A batch of puts with and without expiry, across keyspaces: all of
        it applies, or none (a lease not alive at its place in the log)."""
        ops = [(data.draw(spaced_keys), data.draw(values), data.draw(st.sampled_from(["plain", "ttl", "lease"])))
               for _ in range(n)]
        lease = self._lease(data)
        ops = [(k, v, "plain" if kind == "lease" and lease is None else kind) for k, v, kind in ops]
        ok = all(kind != "lease" or self.lease_alive(lease.id) for _, _, kind in ops)  # type: ignore[union-attr]
        try:
            with self.db.batch() as b:
                for k, v, kind in ops:
                    b.put(k[1], v, keyspace=k[0],
                          **({"ttl": 1.0} if kind == "ttl" else {"lease": lease} if kind == "lease" else {}))
        except kvstore.LeaseNotFoundError:
            assert not ok
            return
        assert ok
        for k, v, kind in ops:
            self.set(k, v, None if kind == "plain" else ("ttl", self.now() + 1_000_000) if kind == "ttl"
                     else ("lease", lease.id))  # type: ignore[union-attr]

    # -- time and the sweeper --------------------------------------------------------

    @rule(seconds=steps)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=steps)
    def clock_back(self, seconds: float) -> None:
        """The clock steps back: the store's time stands still."""
        before = self.visible()
        self.clock.advance(-seconds)
        assert self.visible() == before

    @rule(max_keys=st.sampled_from([1, 2, None]))
    def sweep(self, max_keys: int | None) -> None:
        """One bounded sweep: as many keys as the model says, each one due,
        the earliest first; which of equal instants go is the store's, so
        they are read from the log (as a watcher reads them)."""
        before = self.visible()
        now = self.now()
        due = {k for k, (kind, at) in self.meta.items() if kind == "ttl" and at <= now}
        dead = sorted((at, lid) for lid, (_ttl, at) in self.leases.items() if at <= now)
        first = self.db.last_lsn + 1
        deleted = self.db.sweep_expired(max_keys)
        expired = [(c.keyspace, c.key) for c in self.changes(first) if c.op == "expire"]
        assert len(expired) == len(set(expired)) == deleted
        limit = max_keys or 1000
        want = min(len(due), limit)
        assert set(expired[:want]) <= due
        if len(due) > limit:  # the earliest instants first
            cut = max(self.meta[k][1] for k in expired[:want])
            assert all(self.meta[k][1] >= cut for k in due - set(expired[:want]))
        for _at, lid in dead:
            room = limit - want
            if room <= 0:
                break
            attached = {k for k, m in self.meta.items() if m == ("lease", lid)}
            gone = expired[want:want + min(room, len(attached))]
            assert set(gone) <= attached
            if len(attached) <= room:
                del self.leases[lid]
            want += len(gone)
        assert deleted == want
        for k in expired:
            self.drop(k)
        assert self.visible() == before  # a sweep changes no read

    def changes(self, first: int) -> list:
        """Every change the log holds from LSN ``first`` on, as a watcher reads them."""
        self.db.sync()
        with self.db.watch(from_lsn=first, timeout=0.01, keyspace=None) as w:
            return list(w)

    # -- restarts ------------------------------------------------------------------

    def _reopened(self) -> None:
        """The store's high-water mark starts again (from its first reading:
        the checks after each step read its time, so its readings are the
        model's), and the leases' handles follow the new store."""
        self.high = self.clock.now_us()
        self.handles = [kvstore.Lease(self.db, lease.id, round(lease.granted_ttl * 1e6)) for lease in self.handles]

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = self._open()
        self._reopened()
        assert self.db.rebuilt is None

    @rule()
    def snapshot(self) -> None:
        self.db.snapshot()
        self.snapshots += 1

    @rule()
    def rebuild(self) -> None:
        """LMDB lost: rebuilt from the newest snapshot (its expiry sections)
        plus the log after it."""
        self.db.close()
        shutil.rmtree(os.path.join(self.path, "lmdb"))
        self.db = self._open()
        self._reopened()
        assert self.db.rebuilt is not None or self.db.last_lsn == 0

    # -- checks ------------------------------------------------------------------------

    @invariant()
    def equals_the_model(self) -> None:
        visible = self.visible()
        now = self.now()
        assert self.db.keyspaces() == sorted({s for s, _k in self.values if s})  # swept or not
        for space in SPACES:
            want = {k: v for (s, k), v in visible.items() if s == space}
            db = self.space(space)
            assert dict(db.scan()) == want, space
            assert list(db.scan(reverse=True)) == sorted(want.items(), reverse=True)
            assert db.get_many(KEYS) == [want.get(k) for k in KEYS]
            assert len(db) == len(want)
            with db.view() as v:
                assert dict(v.scan()) == want
                assert [v.get(k) for k in KEYS] == [want.get(k) for k in KEYS]
            for k in KEYS:
                assert db.get(k) == want.get(k)
                at = self.at_of((space, k))
                expect = None if k not in want or at is None else (at - now) / 1e6
                assert db.ttl(k) == expect, (space, k, self.meta.get((space, k)))
        for lease in self.handles:
            alive = self.lease_alive(lease.id)
            assert (lease.ttl() is not None) == alive

    @invariant()
    def the_log_says_the_same(self) -> None:
        """What a watcher reads (upserts, deletes, range deletes, expires) makes
        the raw state: the log alone says which keys went, and when."""
        self.steps += 1
        if self.snapshots or self.steps % 4:  # retention cut the log; and a log read every 4th step
            return
        raw: dict[SK, bytes] = {}
        for c in self.changes(1):
            if c.op == "upsert":
                raw[(c.keyspace, c.key)] = c.value
            elif c.op in ("delete", "expire"):
                raw.pop((c.keyspace, c.key), None)
            else:
                assert c.op == "delete_range"  # a range delete, or a drop of a keyspace
                for sk in [sk for sk in raw if sk[0] == c.keyspace and c.key <= sk[1]
                           and (c.end_key is None or sk[1] < c.end_key)]:  # None: to the last key
                    del raw[sk]
        assert raw == self.values


ExpiryModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("WALKV_EXPIRY_EXAMPLES", "30")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestExpiryModel = ExpiryModel.TestCase
