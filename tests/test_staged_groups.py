"""Staged groups (issue 38): an atomic write over several log entries. A model
in which a group is one atomic batch, held against the store, a rebuild from
the log, and a watch; writers SIGKILLed between parts and commit; a
snapshot between them; a replica; idempotency by app id; retention."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore
import wal
from kvstore import Archiver, ArchiveReader
from kvstore.entry import decode
from kvstore.entry.codec import (
    OP_DELETE,
    OP_GROUP_ABORT,
    OP_GROUP_COMMIT,
    OP_GROUP_PART,
    OP_PUT,
    encode,
    pack_ops,
    with_head,
)
from kvstore.entry.groups import Commit, commit_of, entry_runs, group_code
from tests.test_spark_helpers import apply as apply_model
from wal.errors import CorruptionError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
op = st.one_of(st.tuples(st.just(1), keys, st.binary(min_size=1, max_size=8)).map(list),
               st.tuples(st.just(2), keys).map(list),
               st.tuples(st.just(3), keys, keys).map(list))
part = st.lists(op, min_size=1, max_size=4)
step = st.one_of(
    st.tuples(st.just("batch"), part),
    st.tuples(st.just("group"), st.lists(part, min_size=0, max_size=4), st.lists(op, max_size=2)),
    st.tuples(st.just("orphan"), st.lists(part, min_size=1, max_size=3)),
    st.tuples(st.just("aborted"), st.lists(part, min_size=1, max_size=3)),
)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(op, max_size=20), st.integers(0, 2**32 - 1))
def test_a_part_made_of_an_encoded_batch_is_the_part_of_its_ops(ops, index):
    head = [OP_GROUP_PART, b"g" * 16, index]
    payload = with_head(head, encode(ops))
    assert payload == encode([head, *ops]) and decode(payload, 9) == [head, *ops]


@pytest.mark.parametrize("ops", [
    [[1, b"k", b"v"], [OP_GROUP_PART, b"g", 0]],               # a group's head stands first
    [[OP_GROUP_PART, b"g", 0], [4, b"k", b"v"]],               # no condition in a group
    [[OP_GROUP_PART, b"g", 0], [11, 1, 5, 9]],                 # nor a lease
    [[OP_GROUP_ABORT, b"g"], [1, b"k", b"v"]],                 # an abort stands alone
    [[OP_GROUP_COMMIT, b"g", 0, 0, "", 0]],                    # LSNs start at 1
    [[OP_GROUP_COMMIT, b"g", 3, 1, "", -1]],                   # versions are >= 0
    [[OP_GROUP_PART, b"", 0]],                                 # a group has a name
    [[OP_GROUP_PART, "g", 0]],                                 # ... of bytes
])
def test_a_malformed_group_entry_is_corruption(ops):
    with pytest.raises(CorruptionError, match="LSN 7"):
        decode(pack_ops(ops), 7)


def shown(ops) -> int:
    """How many changes a watch shows for ``ops`` (an empty range deletes nothing: none)."""
    return sum(1 for o in ops if not (o[0] == 3 and o[1] >= o[2]))


def write_parts(db, parts) -> bytes:
    """Append a group's parts only (a writer that dies before its commit)."""
    group = os.urandom(16)
    for i, p in enumerate(parts):
        entry = [[OP_GROUP_PART, group, i], *p]
        db._writes.append(pack_ops(entry), entry)
    return group


def replay(watched) -> dict[bytes, bytes]:
    """The state a watch from LSN 1 implies, one change at a time."""
    out: dict[bytes, bytes] = {}
    for c in watched:
        if c.op == "upsert":
            out[c.key] = c.value
        elif c.op == "delete":
            out.pop(c.key, None)
        elif c.op == "delete_range":
            for k in [k for k in out if c.key <= k and (c.end_key is None or k < c.end_key)]:
                del out[k]
    return out


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=8))
def test_groups_are_atomic_batches_to_the_store_a_rebuild_and_a_watch(tmp_path_factory, steps):
    path = str(tmp_path_factory.mktemp("g") / "s")
    model: dict[bytes, bytes] = {}
    change_lsns: dict[int, int] = {}  # LSN -> changes the model expects there (groups at their commit)
    db = kvstore.open(path, max_record_bytes=4096)
    try:
        for s in steps:
            if s[0] == "batch":
                payload = pack_ops(s[1])
                lsn = db.write(payload)
                apply_model(model, s[1])
                change_lsns[lsn] = shown(s[1])
            elif s[0] == "group":
                lsn = db.write_group(iter(s[1]), s[2])
                for p in [*s[1], s[2]]:
                    apply_model(model, p)
                change_lsns[lsn] = sum(map(shown, s[1])) + shown(s[2])
            elif s[0] == "aborted":
                group = write_parts(db, s[1])
                entry = [[OP_GROUP_ABORT, group]]
                db._writes.append(pack_ops(entry), entry)
            else:  # a writer that stops between parts and commit: the next open aborts the group
                write_parts(db, s[1])
                db.close()
                db = kvstore.open(path, max_record_bytes=4096)
                last = db.last_lsn
                assert group_code(decode(_payload(db, last), last)) == OP_GROUP_ABORT
            assert dict(db.scan()) == model
        watched = list(db.watch(from_lsn=1, timeout=0.05))
        assert replay(watched) == model
        seen: dict[int, int] = {}
        for c in watched:
            seen[c.lsn] = seen.get(c.lsn, 0) + 1
        assert seen == {lsn: n for lsn, n in change_lsns.items() if n}
    finally:
        db.close()
    shutil.rmtree(os.path.join(path, "lmdb"))  # rebuilt from the log alone
    with kvstore.open(path) as db:
        assert dict(db.scan()) == model


def _payload(db, lsn: int) -> bytes:
    return dict(db._log.read(lsn, lsn))[lsn]


CHILD = textwrap.dedent("""
    import sys, kvstore
    path, stop = sys.argv[1], sys.argv[2]
    db = kvstore.open(path, max_record_bytes=1 << 16)
    def parts():
        for j in range(20):
            yield [[1, b"g%05d" % (j * 100 + i), b"v" * 100] for i in range(100)]
            if j == 19 and stop == "parts":
                print("parts", db.last_lsn, flush=True)
                sys.stdin.readline()
    lsn = db.write_group(parts(), [[1, b"done", b"1"]])
    print("commit", lsn, flush=True)
    sys.stdin.readline()
""")


@pytest.mark.crash
@pytest.mark.parametrize("stop", ["parts", "commit"])
def test_a_writer_killed_between_parts_and_commit_leaves_nothing_and_an_abort(tmp_path, stop):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        db.put(b"base", b"1")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", CHILD, path, stop], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    line = p.stdout.readline().split()
    assert line and line[0].decode() == stop, p.stderr.read().decode()[-2000:]
    at = int(line[1])
    p.send_signal(signal.SIGKILL)
    p.wait()
    with kvstore.open(path) as db:
        got = dict(db.scan())
        if stop == "parts":  # 20 durable parts, LSNs 2..21, then the abort the open wrote
            assert got == {b"base": b"1"} and at == 21
            assert db.last_lsn == 22 and group_code(decode(_payload(db, 22), 22)) == OP_GROUP_ABORT
            assert [c.lsn for c in db.watch(from_lsn=1, timeout=0.05)] == [1]
        else:
            assert len(got) == 2002 and got[b"done"] == b"1" and db.last_lsn == at == 22
            assert {c.lsn for c in db.watch(from_lsn=2, timeout=0.05)} == {22}


def test_a_snapshot_between_parts_and_commit_carries_the_parts(tmp_path):
    """A rebuild from a snapshot taken while a group is open commits it at
    the commit's LSN; the snapshot's count leaves the parts out."""
    path = str(tmp_path / "s")
    with kvstore.open(path, max_record_bytes=4096, sweep_interval=None) as db:
        db.put(b"base", b"1")

        def parts():
            for j in range(5):
                yield [[OP_PUT, b"k%02d" % (j * 10 + i), b"v" * 50] for i in range(10)]
            db.snapshot()  # parts 2..6 applied (held aside), the commit not yet written
        lsn = db.write_group(parts(), app_id="job", app_version=3)
        snaps = db.list_snapshots()
        assert snaps[-1].lsn == lsn - 1 and snaps[-1].count == 1
        want = dict(db.scan())
    assert len(want) == 51
    shutil.rmtree(os.path.join(path, "lmdb"))
    with kvstore.open(path) as db:
        assert dict(db.scan()) == want and db.committed_version("job") == 3
        assert db.write_group(iter([[[OP_PUT, b"again", b"x"]]]), app_id="job", app_version=3) is None
        assert db.get(b"again") is None


def test_idempotency_a_version_applies_once_a_higher_one_applies(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        assert db.write_group(iter([[[OP_PUT, b"a", b"1"]]]), app_id="j", app_version=5) is not None
        last = db.last_lsn
        assert db.write_group(iter([[[OP_PUT, b"a", b"2"]]]), app_id="j", app_version=5) is None
        assert db.write_group(iter([[[OP_PUT, b"a", b"2"]]]), app_id="j", app_version=4) is None
        assert db.last_lsn == last and db.get(b"a") == b"1"
        assert db.write_group(iter([[[OP_PUT, b"a", b"3"]]]), app_id="j", app_version=6) is not None
        assert db.get(b"a") == b"3" and db.committed_version("j") == 6 and db.committed_version("k") is None
        with pytest.raises(ValueError, match="db.write_group"):
            db.write(pack_ops([[OP_GROUP_ABORT, b"x"]]))


def test_the_state_counts_the_writes_a_commit_applies(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.put(b"gone", b"x")
        before = db.stats()
        db.write_group(iter([[[OP_PUT, b"a", b"1"], [OP_PUT, b"b", b"2"]], [[OP_DELETE, b"gone"]]]),
                       [[OP_PUT, b"c", b"3"]])
        after = db.stats()
        assert (after["puts"] - before["puts"], after["deletes"] - before["deletes"]) == (3, 1)


def test_a_replica_and_a_watch_see_a_group_whole_at_its_commit(tmp_path):
    src, rdir = str(tmp_path / "src"), str(tmp_path / "rep")
    with kvstore.open(src, max_record_bytes=4096, sweep_interval=None) as db:
        db.put(b"base", b"1")
        with kvstore.open_replica(src, rdir) as rep:
            rep.wait_for(1)
            seen_mid = []

            def parts():
                for j in range(6):
                    yield [[OP_PUT, b"k%02d" % (j * 10 + i), b"v" * 50] for i in range(10)]
                    rep.wait_for(db.last_lsn)
                    seen_mid.append(dict(rep.scan()))
            w = db.watch(from_lsn=2, timeout=0.2)
            lsn = db.write_group(parts(), [[2, b"base"]])
            rep.wait_for(lsn)
            assert all(s == {b"base": b"1"} for s in seen_mid)  # nothing of the group before its commit
            assert dict(rep.scan()) == dict(db.scan()) and len(db) == 60
            changes = list(w)
            assert {c.lsn for c in changes} == {lsn} and len(changes) == 61
            assert changes[-1].op == "delete" and changes[-1].key == b"base"


def _group_a_snapshot_splits(db) -> tuple[int, Commit]:
    """50 puts, then a group of 8 parts of 10 puts each over several small
    segments, with a snapshot taken after its last part, before its commit:
    the commit's LSN and head."""
    for i in range(50):
        db.put(b"pre%02d" % i, b"x" * 100)

    def parts():
        for j in range(8):
            yield [[OP_PUT, b"k%02d" % (j * 10 + i), b"v" * 30] for i in range(10)]
        db.snapshot()
    lsn = db.write_group(parts())
    commit = commit_of(decode(_payload(db, lsn), lsn))
    assert lsn is not None and commit is not None
    return lsn, commit


def test_retention_keeps_the_parts_of_a_group_a_snapshot_splits(tmp_path):
    """Retention cuts below the oldest snapshot; with a snapshot between a
    group's parts and its commit, it keeps the parts, so that a reader from
    the snapshot's LSN still reads the group back."""
    path = str(tmp_path / "s")
    with kvstore.open(path, max_record_bytes=4096, segment_bytes=4096, keep_snapshots=1,
                      sweep_interval=None) as db:
        lsn, commit = _group_a_snapshot_splits(db)
        first = wal.list_segments(os.path.join(path, "wal"))[0].first_lsn
        assert first <= commit.first_part_lsn  # the parts are still in the log
        assert first > 1  # and retention did cut below them
        changes = list(db.watch(from_lsn=lsn - 1, timeout=0.05))
        assert {c.lsn for c in changes} == {lsn} and len(changes) == 80


def test_archive_retention_keeps_the_parts_of_a_group_a_kept_snapshot_splits(tmp_path):
    """The archive keeps its log from its oldest kept snapshot; with that
    snapshot between a group's parts and its commit, it keeps the parts too
    (they lie in archive objects wholly before the snapshot), so that a
    reader of the archive's log after the snapshot reads the group whole."""
    path, loc = str(tmp_path / "s"), str(tmp_path / "arch")
    with kvstore.open(path, max_record_bytes=4096, segment_bytes=4096, sweep_interval=None) as db:
        lsn, commit = _group_a_snapshot_splits(db)
        Archiver(path, loc, keep_snapshots=1).ship_once()
    reader = ArchiveReader(loc)
    assert [s.lsn for s in reader.snapshots()] == [lsn - 1]  # the snapshot splits the group
    assert 1 < reader.first_lsn <= commit.first_part_lsn  # retention cut, below the parts

    def read_back(first, last):
        return ((e.lsn, decode(e.payload, e.lsn)) for e in reader.read_entries(first, last))
    (entry,) = reader.read_entries(lsn, lsn)
    runs = list(entry_runs(lsn, decode(entry.payload, lsn), read_back))
    assert sum(len(ops) for _, ops in runs) == 80


def test_spark_partitions_read_a_group_whole_wherever_the_planner_cuts(tmp_path):
    """Without a session: ``changes`` split into many partitions (the group's
    parts in other segments and partitions than its commit) shows every op
    of the group at the commit's LSN, numbered through the group; ``state``
    and ``changeVocabulary=delta`` read it whole too."""
    pytest.importorskip("pyspark")
    from tests.test_spark_unit import read_all, reader, rows

    path = str(tmp_path / "s")
    with kvstore.open(path, max_record_bytes=4096, segment_bytes=8192, sweep_interval=None) as db:
        db.put(b"k000", b"old")
        parts = [[[OP_PUT, b"k%03d" % (j * 20 + i), b"v" * 40] for i in range(20)] for j in range(10)]
        lsn = db.write_group(iter(parts), [[2, b"k199"]])
        db.put(b"after", b"1")
        want = dict(db.scan())
    segs = wal.list_segments(os.path.join(path, "wal"))
    assert any(2 < seg.first_lsn <= lsn for seg in segs)  # the group's parts span segments
    split = reader(path, startingLsn=1, maxPartitionBytes=4096)
    assert any(2 < p.piece.from_lsn <= lsn for p in split.partitions())  # a partition starts inside the group
    got = rows(read_all(split), ["_commit_version", "_op_index", "key", "_change_type"])
    group = [g for g in got if g[0] == lsn]
    assert [g[1] for g in group] == list(range(201)) and group[-1][2:] == (b"k199", "delete")
    assert [g[0] for g in got] == [1] + [lsn] * 201 + [lsn + 1]
    state = rows(read_all(reader(path, table="state", maxPartitionBytes=4096, snapshotLsn=0)), ["key", "value"])
    assert dict(state) == want
    delta = rows(read_all(reader(path, startingLsn=1, changeVocabulary="delta", maxPartitionBytes=4096)),
                 ["key", "_change_type", "_commit_version"])
    assert (b"k000", "update_preimage", lsn) in delta and (b"k199", "delete", lsn) in delta
    assert sum(1 for d in delta if d[2] == lsn and d[1] == "insert") == 199


def test_a_subscription_stopped_inside_a_group_resumes_with_the_rest_once(tmp_path):
    """A group's changes share its commit's LSN and are read a part at a
    time: a subscription acknowledged part way resumes after the changes it
    acknowledged, and retention keeps the parts it still needs."""
    with kvstore.open(str(tmp_path / "s"), max_record_bytes=4096, segment_bytes=4096, keep_snapshots=1,
                      sweep_interval=None) as db:
        db.subscribe("feed", from_lsn=1).close()
        lsn = db.write_group(iter([[[OP_PUT, b"k%02d" % (j * 10 + i), b"v" * 200] for i in range(10)]
                                   for j in range(3)]))
        with db.subscribe("feed", timeout=0.1) as sub:
            first = []
            for c in sub:
                first.append(c.key)
                sub.ack(c.lsn)
                if len(first) == 12:
                    break
        db.snapshot()  # retention keeps what "feed" has not acknowledged: the group's parts
        with db.subscribe("feed", timeout=0.1) as sub:
            rest = [c.key for c in sub]
        assert {c for c in first + rest} == {b"k%02d" % i for i in range(30)} and len(first + rest) == 30
        assert db.list_snapshots()[-1].lsn == lsn


def test_a_group_spans_keyspaces_each_part_starting_in_the_default_one(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path) as db:
        lsn = db.write_group(iter([[[16, "users"], [OP_PUT, b"u1", b"a"]], [[OP_PUT, b"d1", b"b"]]]),
                             [[16, "users"], [OP_PUT, b"u2", b"c"]])
        changes = list(db.watch(from_lsn=1, keyspace=None, timeout=0.05))
        assert [(c.lsn, c.keyspace, c.key) for c in changes] == [(lsn, "users", b"u1"), (lsn, "", b"d1"),
                                                                  (lsn, "users", b"u2")]
    shutil.rmtree(os.path.join(path, "lmdb"))
    with kvstore.open(path) as db:
        assert dict(db.keyspace("users").scan()) == {b"u1": b"a", b"u2": b"c"} and dict(db.scan()) == {b"d1": b"b"}


def test_a_write_between_a_groups_parts_aborts_the_group(tmp_path):
    """Readers read a group back from the LSNs before its commit, so its
    entries must be consecutive: a write that came between them (another
    thread's) aborts the group, and says so."""
    from wal.errors import WalkvError

    with kvstore.open(str(tmp_path / "s")) as db:
        def parts():
            yield [[OP_PUT, b"a", b"1"]]
            db.put(b"between", b"x")  # as another thread's write would
            yield [[OP_PUT, b"b", b"2"]]
        with pytest.raises(WalkvError, match="came between the parts"):
            db.write_group(parts())
        assert dict(db.scan()) == {b"between": b"x"}
        last = db.last_lsn
        assert group_code(decode(_payload(db, last), last)) == OP_GROUP_ABORT
        assert db._state.lmdb.read(db._state.groups.open_groups) == []
