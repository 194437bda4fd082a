"""kvstore: the API users open (KVStore), its recovery, and the asyncio front."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
import wal
from kvstore.entry.codec import MAX_KEY_BYTES
from kvstore.store import recovery
from kvstore.store.writer import StoreWriter
from tests.served import KINDS, open_store
from wal.errors import WalkvError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_BOOT = "00000000-0000-4000-8000-00000000dead"


# -- helpers (also used by test_kvstore_model.py) --------------------------------

def session_path(store: str) -> str:
    return os.path.join(store, "lmdb", recovery.SESSION_NAME)


def abandon(db: kvstore.KVStore) -> None:
    """Stop ``db`` as a crashed process would: the log's files and locks are
    let go without the clean-close record, and LMDB is not flushed (its
    writes stay in the page cache, as after a process crash)."""
    if db.closed:
        return
    db._closed = True
    writer = db._writer if isinstance(db._writer, StoreWriter) else None  # (a ReadOnly holds no lock)
    if writer is not None:
        try:
            writer.log.close()  # acknowledged entries are durable anyway
        except WalkvError:
            pass
    db._state.close(sync=False)
    if writer is not None:
        writer._lock.release()


def fake_machine_crash(store: str, damage: str = "garbage", stale: bytes | None = None,
                       seed: int = 0) -> None:
    """Make the closed store at ``store`` look like it was open when its
    machine crashed: the SESSION says "not clean" and names another boot, and
    LMDB's file is damaged (``garbage``: pages overwritten; ``truncate``: cut
    short; ``zero``: pages zeroed; ``stale``: replaced by an older copy; ``none``)."""
    path = session_path(store)
    with open(path) as f:
        rec = json.load(f)
    rec["boot_id"] = OTHER_BOOT
    rec["clean"] = False
    with open(path, "w") as f:
        json.dump(rec, f)
    data = os.path.join(store, "lmdb", "data.mdb")
    if damage == "none":
        return
    if damage == "stale":
        assert stale is not None
        with open(data, "wb") as f:
            f.write(stale)
        return
    size = os.path.getsize(data)
    if damage == "truncate":
        os.truncate(data, min(size, 4096 * (2 + seed % 5)))
        return
    import random

    rnd = random.Random(seed)
    with open(data, "r+b") as f:
        pages = max(1, min(size // 4096, 64))
        for page in rnd.sample(range(pages), k=min(pages, 6)):
            f.seek(page * 4096)
            f.write(bytes(4096) if damage == "zero" else rnd.randbytes(4096))


def log_digest(store: str) -> str:
    h = hashlib.sha256()
    wdir = os.path.join(store, "wal")
    for name in sorted(os.listdir(wdir)):
        if name.endswith(".wal"):
            with open(os.path.join(wdir, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def db(store, request):
    """The store; for tests marked :data:`API`, once embedded and once a
    client of a server of it (tests/served.py)."""
    with open_store(getattr(request, "param", "embedded"), store, segment_bytes=64 << 10) as d:
        yield d


API = pytest.mark.parametrize("db", KINDS, indirect=True)
"""The test is about the API: it runs against the embedded store and over HTTP."""


@API
# -- the basics -------------------------------------------------------------------

def test_put_get_delete_and_lsns(db) -> None:
    assert (db.last_lsn, db.durable_lsn, db.applied_lsn) == (0, 0, 0)
    assert db.put(b"a", b"1") == 1
    assert db.put(b"b", b"2") == 2
    assert db.get(b"a") == b"1"
    assert db.get(b"zz") is None
    assert db.get(b"zz", b"dflt") == b"dflt"
    assert db.delete(b"a") == 3
    assert db.get(b"a") is None
    assert db.delete(b"never-there") == 4  # logged anyway
    assert (db.last_lsn, db.durable_lsn, db.applied_lsn) == (4, 4, 4)

@API

def test_bytes_like_keys_and_values(db) -> None:
    db.put(bytearray(b"k"), memoryview(b"v"))
    assert db.get(b"k") == b"v" and db.get(bytearray(b"k")) == b"v"
    assert db.get(memoryview(b"k")) == b"v"

@API

def test_empty_value_is_a_value(db) -> None:
    db.put(b"k", b"")
    assert db.get(b"k") == b""
    assert b"k" in db
    assert db[b"k"] == b""

@API

def test_dict_face(db) -> None:
    db[b"x"] = b"1"
    db[b"y"] = b"2"
    assert db[b"x"] == b"1"
    assert b"x" in db and b"nope" not in db
    assert len(db) == 2
    assert list(db) == [b"x", b"y"]
    assert list(db.keys()) == [b"x", b"y"]
    assert list(db.items()) == [(b"x", b"1"), (b"y", b"2")]
    del db[b"x"]
    assert b"x" not in db and len(db) == 1
    with pytest.raises(KeyError):
        db[b"x"]
    with pytest.raises(KeyError):
        del db[b"x"]

@API

def test_lookups_of_keys_that_cannot_exist(db) -> None:
    assert db.get(b"") is None
    assert b"" not in db
    assert db.get(b"k" * 600) is None

@API

def test_values_up_to_large(db) -> None:
    big = os.urandom(3 << 20)
    db.put(b"big", big)
    assert db.get(b"big") == big

@API

def test_delete_range(db) -> None:
    for k in (b"a", b"b", b"ba", b"bz", b"c", b"d"):
        db.put(k, k)
    db.delete_range(b"b", b"c")
    assert list(db) == [b"a", b"c", b"d"]
    db.delete_range(b"c", None)
    assert list(db) == [b"a"]
    db.put(b"z", b"z")
    db.delete_range(None, b"b")
    assert list(db) == [b"z"]
    db.delete_range(b"q", b"a")  # empty range: nothing
    assert list(db) == [b"z"]
    db.delete_range(None, None)
    assert len(db) == 0


def test_reopen_keeps_everything(store) -> None:
    with kvstore.open(store) as d:
        for i in range(100):
            d.put(b"k%03d" % i, b"v%d" % i)
        d.delete(b"k050")
    with kvstore.open(store) as d:
        assert d.rebuilt is None and d.replayed == 0
        assert len(d) == 99
        assert d.get(b"k049") == b"v49" and d.get(b"k050") is None
        assert d.last_lsn == 101 == d.applied_lsn


# -- scan ---------------------------------------------------------------------------

KEYS = [b"a", b"ab", b"abc", b"abd", b"ac", b"b", b"b\x00", b"b\xff", b"b\xff\xff", b"c", b"\xff", b"\xff\xff"]


@pytest.fixture
def scandb(db):
    with db.batch() as b:
        for k in KEYS:
            b.put(k, k.upper())
    return db


def model_scan(start=None, stop=None, prefix=None, reverse=False):
    out = [k for k in sorted(KEYS)
           if (start is None or k >= start) and (stop is None or k < stop)
           and (prefix is None or k.startswith(prefix))]
    return out[::-1] if reverse else out


@API
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "start, stop, prefix",
    [
        (None, None, None), (b"ab", None, None), (None, b"b", None), (b"ab", b"b", None),
        (b"abc", b"abc", None), (b"b", b"a", None), (b"", b"\xff", None),
        (None, None, b"ab"), (None, None, b"b\xff"), (None, None, b"\xff"), (None, None, b"zz"),
        (b"abd", None, b"ab"), (None, b"abd", b"ab"), (b"a", b"b\x00", b"b"),
        (None, None, b""), (b"aa", b"abcd", None), (b"b\xff\xff\xff", None, None),
    ],
)
def test_scan_has_range_semantics(db, scandb, start, stop, prefix, reverse) -> None:
    got = [k for k, _ in scandb.scan(start, stop, prefix=prefix, reverse=reverse)]
    assert got == model_scan(start, stop, prefix, reverse)
    assert all(v == k.upper() for k, v in scandb.scan(start, stop, prefix=prefix, reverse=reverse))

@API

def test_scan_bounds_longer_than_any_key(db) -> None:
    keys = [b"m" * 511, b"m" * 510 + b"n", b"m" * 300]
    for k in keys:
        db.put(k, b"v")
    long = b"m" * 600
    assert [k for k, _ in db.scan(start=long)] == [b"m" * 510 + b"n"]
    assert [k for k, _ in db.scan(stop=long)] == [b"m" * 300, b"m" * 511]
    assert [k for k, _ in db.scan(stop=long, reverse=True)] == [b"m" * 511, b"m" * 300]
    assert [k for k, _ in db.scan(start=long, reverse=True)] == [b"m" * 510 + b"n"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=4), max_size=40),
       st.one_of(st.none(), st.binary(max_size=5)), st.one_of(st.none(), st.binary(max_size=5)),
       st.one_of(st.none(), st.binary(max_size=3)), st.booleans())
def test_scan_matches_a_sorted_model(tmp_path_factory, keys, start, stop, prefix, reverse) -> None:
    path = str(tmp_path_factory.mktemp("scan"))
    with kvstore.open(path, sync="none") as d:
        with d.batch() as b:
            for k in keys:
                b.put(k, k)
        want = sorted(k for k in set(keys)
                      if (start is None or k >= start) and (stop is None or k < stop)
                      and (prefix is None or k.startswith(prefix)))
        if reverse:
            want.reverse()
        assert [k for k, _ in d.scan(start, stop, prefix=prefix, reverse=reverse)] == want


def test_scan_is_a_snapshot_and_long_scans_chunk(db) -> None:
    with db.batch() as b:
        for i in range(5000):
            b.put(b"%05d" % i, b"x")
    it = db.scan()
    first = next(it)
    db.put(b"99999", b"new")       # after the snapshot: not seen
    db.delete(b"04000")             # not seen either
    rest = list(it)
    assert first == (b"00000", b"x")
    assert len(rest) == 4999 and rest[-1][0] == b"04999"
    assert db.get(b"99999") == b"new"


def test_read_view_is_one_lsn_and_releases_when_exhausted(store) -> None:
    with kvstore.open(store, sync="none", map_size=1 << 20) as d:
        for i in range(50):
            d.put(b"k%03d" % i, b"v")
        state = d._state
        with state.expiring_reads.read_view() as view:
            d.put(b"later", b"x")          # after the view: not in it
            assert (view.lsn, view.count) == (50, 50)
            assert state.lmdb.gate.active   # holds its place in the gate
            pairs = list(view.pairs())
            assert not state.lmdb.gate.active  # exhausted: released at once
            # the map can grow now (it could not while the view was open)
            with d.batch() as b:
                for i in range(3000):
                    b.put(b"big%05d" % i, b"x" * 1000)
            state.flush()  # the overlay's writes into LMDB
        assert pairs == [(b"k%03d" % i, b"v") for i in range(50)]
        assert d._state.lmdb.map_grows > 0
        view = state.expiring_reads.read_view()
        it = view.pairs()
        assert next(it) == (b"big00000", b"x" * 1000)
        it.close()                           # closed early: released too
        assert not state.lmdb.gate.active
        assert view.lsn == d.applied_lsn and view.count == 3051
        with state.expiring_reads.read_view() as view:      # never iterated: the with releases it
            pass
        assert not state.lmdb.gate.active
        assert list(view.pairs()) == []      # a closed view has no pairs
    with pytest.raises(kvstore.ClosedError):
        state.expiring_reads.read_view()


def test_write_of_bad_input_is_a_type_or_value_error(db) -> None:
    from kvstore.entry.codec import encode

    with pytest.raises(TypeError, match="payload must be bytes"):
        db.write("[[1, 'k', 'v']]")
    for bad in (b"\xc1", b"\x91\x92\x02\xa1k", b"\x90\x90"):
        with pytest.raises(ValueError, match="^not a walkv batch: ") as e:
            db.write(bad)
        assert not isinstance(e.value, kvstore.CorruptionError) and "repair" not in str(e.value)
    assert db.last_lsn == 0                  # nothing written
    lsn = db.write(bytearray(encode([[1, b"a", b"1"], [3, b"b", b"c"], [2, b"z"]])))
    assert (lsn, db.get(b"a"), db.applied_lsn) == (1, b"1", 1)


def test_closed_store_errors_name_the_path(store) -> None:
    d = kvstore.open(store, sync="none")
    d.put(b"k", b"v")
    d.close()
    for call in (lambda: d.get(b"k"), lambda: len(d), lambda: d._state.expiring_reads.read_view()):
        with pytest.raises(kvstore.ClosedError, match=f"the store {re.escape(d.path)} is closed"):
            call()


def test_lmdb_open_failures_that_are_not_damage_do_not_rebuild(store) -> None:
    with kvstore.open(store, sync="none") as d:
        d.put(b"k", b"v")
    with pytest.raises(kvstore.WalkvError, match="map_size") as e:
        kvstore.open(store, sync="none", map_size=1 << 62)  # ENOMEM: not damage
    assert not isinstance(e.value, kvstore.CorruptionError)
    with kvstore.open(store, sync="none") as d:  # LMDB kept, nothing replayed
        assert (d.get(b"k"), d.rebuilt, d.replayed) == (b"v", None, 0)

@API

def test_writes_inside_a_scan_loop(db) -> None:
    for i in range(300):
        db.put(b"k%03d" % i, b"old")
    for k, _ in db.scan():
        db.put(k, b"new")           # no deadlock, each write applied
    assert all(v == b"new" for _, v in db.scan())


def test_open_scans_do_not_stall_writers_and_idle_readers_are_swept(store, monkeypatch) -> None:
    from kvstore.state import environment

    monkeypatch.setattr(environment, "SWEEP_SECONDS", 0.0)  # sweep at every chance
    with kvstore.open(store, sync="none") as d:
        for i in range(100):
            d.put(b"k%03d" % i, b"v")
        held = d.scan()
        assert next(held) == (b"k000", b"v")       # a snapshot held open meanwhile
        got_one, release = threading.Event(), threading.Event()

        def idle() -> None:
            d.get(b"k001")  # caches a read transaction, then idles
            got_one.set()
            release.wait(60)

        idle_reader = threading.Thread(target=idle)
        idle_reader.start()
        assert got_one.wait(60)
        done = threading.Event()

        def writer() -> None:
            for i in range(300):
                d.put(b"w%03d" % i, b"x")
            done.set()

        d._state.lmdb.enter_read()  # as a long reader does (a snapshot's consistent view)
        try:
            t = threading.Thread(target=writer)
            t.start()
            assert done.wait(60), "writers stalled behind an open reader"
            t.join()
            d._state.flush()  # the overlay's writes committed to LMDB: then the sweep
        finally:
            d._state.lmdb.gate.exit()
        readers = [r for r in d._state.lmdb._reader_list() if r.ident == idle_reader.ident]
        assert len(readers) == 1 and readers[0].txn is None  # swept: pins no old pages
        release.set()
        idle_reader.join()
        assert len(list(held)) == 99              # the scan's snapshot: no w keys
        assert d.get(b"w299") == b"x"


@API
# -- batches ------------------------------------------------------------------------

def test_batch_is_one_atomic_lsn(db) -> None:
    db.put(b"b", b"old")
    with db.batch() as b:
        b.put(b"a", b"1")
        b.delete(b"b")
        b.put(b"c", b"3")
        b.delete(b"c")              # in order: c ends absent
        b.delete_range(b"x", b"y")
    assert b.lsn == 2 == db.last_lsn
    assert list(db.items()) == [(b"a", b"1")]

@API

def test_exception_in_batch_writes_nothing(db) -> None:
    db.put(b"keep", b"1")
    before = db.last_lsn
    with pytest.raises(ZeroDivisionError):
        with db.batch() as b:
            b.put(b"a", b"1")
            b.delete(b"keep")
            1 / 0
    assert db.last_lsn == before
    assert db.get(b"a") is None and db.get(b"keep") == b"1"

@API

def test_bad_input_in_batch_writes_nothing(db) -> None:
    with pytest.raises(kvstore.RecordTooLargeError, match="511"):
        with db.batch() as b:
            b.put(b"a", b"1")
            b.put(b"k" * 512, b"1")
    assert db.last_lsn == 0 and db.get(b"a") is None

@API

def test_large_batch(db) -> None:
    with db.batch() as b:
        for i in range(20000):
            b.put(b"%08d" % i, b"v" * 50)
    assert len(db) == 20000 and db.last_lsn == 1

@API

def test_update_is_one_atomic_batch(db) -> None:
    assert db.update({b"a": b"1", b"b": b"2"}) == 1
    assert db.update((b"k%d" % i, b"v") for i in range(1000)) == 2
    assert db.update([]) is None
    with pytest.raises(TypeError):
        db.update([(b"x", b"1"), ("y", b"2")])
    assert len(db) == 1002 and db.last_lsn == 2 and db.get(b"x") is None

@API

def test_empty_batch_logs_nothing(db) -> None:
    with db.batch() as b:
        pass
    assert b.lsn is None and db.last_lsn == 0


# -- bad input ----------------------------------------------------------------------

@API
@pytest.mark.parametrize("bad", ["str", 1, None, 2.5, [b"x"]])
def test_wrong_types_are_type_errors(db, bad) -> None:
    with pytest.raises(TypeError, match="must be bytes"):
        db.put(bad, b"v")
    with pytest.raises(TypeError, match="must be bytes"):
        db.put(b"k", bad)
    with pytest.raises(TypeError):
        db.get(bad)
    with pytest.raises(TypeError):
        db.delete(bad)
    if bad is not None:  # None is "unbounded" for ranges
        with pytest.raises(TypeError):
            db.scan(start=bad)
        with pytest.raises(TypeError):
            db.delete_range(bad, b"z")
    assert db.last_lsn == 0

@API

def test_oversize_key_names_the_limit_and_writes_nothing(db) -> None:
    with pytest.raises(kvstore.RecordTooLargeError) as info:
        db.put(b"k" * (MAX_KEY_BYTES + 1), b"v")
    msg = str(info.value)
    assert "511" in msg and "LMDB" in msg and "512" in msg
    with pytest.raises(ValueError):
        db.delete(b"k" * 1000)
    db.put(b"k" * MAX_KEY_BYTES, b"v")  # the limit itself is fine
    assert db.last_lsn == 1

@API

def test_empty_key_is_refused(db) -> None:
    with pytest.raises(ValueError, match="empty"):
        db.put(b"", b"v")
    with pytest.raises(ValueError, match="empty"):
        db[b""] = b"v"
    assert db.last_lsn == 0


def test_value_limit_option(store) -> None:
    with kvstore.open(store, max_value_bytes=1000) as d:
        d.put(b"k", b"v" * 1000)
        with pytest.raises(kvstore.RecordTooLargeError, match="1000 bytes"):
            d.put(b"k", b"v" * 1001)
        assert d.last_lsn == 1 and d.get(b"k") == b"v" * 1000


def test_value_limit_is_bounded_by_the_log_record(store) -> None:
    with kvstore.open(store, max_record_bytes=1 << 16) as d:
        assert d.max_value_bytes < 1 << 16
        with pytest.raises(kvstore.RecordTooLargeError):
            d.put(b"k", b"v" * (1 << 16))
        with pytest.raises(kvstore.RecordTooLargeError):
            with d.batch() as b:
                for i in range(100):
                    b.put(b"%d" % i, b"v" * 1000)
        assert d.last_lsn == 0


def test_closed_store(store) -> None:
    d = kvstore.open(store)
    d.put(b"a", b"1")
    d.close()
    d.close()  # idempotent
    for call in (lambda: d.put(b"a", b"1"), lambda: d.get(b"a"), lambda: d.delete(b"a"),
                 lambda: d.delete_range(b"a", b"b"), lambda: d.batch(), lambda: len(d),
                 lambda: b"a" in d, lambda: d[b"a"], lambda: d.scan(), lambda: d.stats(),
                 lambda: d.sync()):
        with pytest.raises(kvstore.ClosedError):
            call()


def test_second_writer_in_this_process_is_locked(store) -> None:
    with kvstore.open(store):
        with pytest.raises(kvstore.LockedError, match="open for writing"):
            kvstore.open(store)


def test_second_writer_in_another_process_is_locked(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")
        r = run_python(
            "import sys, kvstore\n"
            "try:\n    kvstore.open(sys.argv[1])\n"
            "except kvstore.LockedError as e:\n    print('LOCKED', e)\n", store)
        assert r.stdout.startswith("LOCKED"), r.stderr
        assert str(os.getpid()) in r.stdout
        d.put(b"b", b"2")  # the failed open disturbed nothing
    with kvstore.open(store) as d:
        assert d.get(b"a") == b"1" and d.get(b"b") == b"2"


READER = """
import sys, json, kvstore
db = kvstore.open(sys.argv[1], readonly=True)
out = {"a": (db.get(b"a") or b"").decode(), "n": len(db),
       "keys": [k.decode() for k, _ in db.scan()], "applied": db.applied_lsn}
try:
    db.put(b"x", b"y")
except kvstore.ReadOnlyError:
    out["refused"] = True
try:
    with db.batch() as b:
        b.put(b"x", b"y")
except kvstore.ReadOnlyError:
    out["batch_refused"] = True
db.close()
print(json.dumps(out))
"""


def test_readonly_beside_a_writer(store) -> None:
    with kvstore.open(store, map_size=1 << 20) as d:
        d.put(b"a", b"1")
        d.put(b"b", b"2")
        r = run_python(READER, store)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out == {"a": "1", "n": 2, "keys": ["a", "b"], "applied": 2,
                       "refused": True, "batch_refused": True}
        # the writer grows the map past the reader's; a new reader still works
        for i in range(200):
            d.put(b"big%03d" % i, os.urandom(20000))
        assert d.stats()["map_grows"] > 0
        r = run_python(READER, store)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["n"] == 202
        d.put(b"c", b"3")  # the writer is undisturbed
    with kvstore.open(store) as d:
        assert len(d) == 203


def test_readonly_sees_the_writers_progress_live(store) -> None:
    code = """
import sys, time, kvstore
db = kvstore.open(sys.argv[1], readonly=True)
print("ready", flush=True)
sys.stdin.readline()
print(db.get(b"late"), db.applied_lsn, flush=True)
"""
    with kvstore.open(store, overlay=False) as d:  # each write in LMDB before it returns
        d.put(b"early", b"1")
        p = subprocess.Popen([sys.executable, "-c", code, store], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert p.stdout.readline().strip() == "ready"
            d.put(b"late", b"2")
            out, _ = p.communicate("go\n", timeout=30)
        finally:
            p.kill()
        assert out.split() == ["b'2'", "2"]


def test_readonly_in_the_writers_process_is_refused_clearly(store) -> None:
    with kvstore.open(store):
        with pytest.raises(kvstore.WalkvError, match="already open in this process"):
            kvstore.open(store, readonly=True)


def test_readonly_of_nothing(tmp_path) -> None:
    with pytest.raises(kvstore.WalkvError, match="not a walkv store"):
        kvstore.open(str(tmp_path / "nope"), readonly=True)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(kvstore.WalkvError, match="read-write once"):
        kvstore.open(str(tmp_path / "empty"), readonly=True)


def test_readonly_refuses_a_store_whose_machine_crashed(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")
    fake_machine_crash(store, damage="none")
    with pytest.raises(kvstore.WalkvError, match="machine crashed"):
        kvstore.open(store, readonly=True)
    with kvstore.open(store) as d:  # read-write recovers it
        assert d.rebuilt is not None and d.get(b"a") == b"1"
    with kvstore.open(store, readonly=True) as r:
        assert r.get(b"a") == b"1"


def test_os_errors_at_open_are_walkv_errors(tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    with pytest.raises(kvstore.WalkvError, match="is a file, not a directory"):
        kvstore.open(str(afile / "store"))


def test_unknown_option(store) -> None:
    with pytest.raises(TypeError):
        kvstore.open(store, no_such_option=1)
    with pytest.raises(ValueError):
        kvstore.open(store, sync="sometimes")
    # a failed open leaves the store unlocked
    with kvstore.open(store) as d:
        d.put(b"a", b"1")


# -- LMDB's map grows by itself -------------------------------------------------------

def test_map_grows_automatically(store) -> None:
    with kvstore.open(store, map_size=1 << 20) as d:
        vals = {}
        for i in range(300):
            vals[b"k%04d" % i] = os.urandom(10000)
            d.put(b"k%04d" % i, vals[b"k%04d" % i])
        with d.batch() as b:   # one transaction bigger than the map
            for i in range(300, 600):
                vals[b"k%04d" % i] = os.urandom(10000)
                b.put(b"k%04d" % i, vals[b"k%04d" % i])
        st_ = d.stats()
        assert st_["map_grows"] >= 2
        assert st_["lmdb_map_bytes"] > 5 << 20
        assert dict(d.scan()) == vals
    with kvstore.open(store, map_size=1 << 20) as d:
        assert dict(d.scan()) == vals


def test_map_growth_with_concurrent_readers_and_scans(store) -> None:
    with kvstore.open(store, map_size=1 << 20) as d:
        for i in range(100):
            d.put(b"base%03d" % i, b"b")
        stop = threading.Event()
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                while not stop.is_set():
                    assert d.get(b"base050") == b"b"
                    n = sum(1 for _ in d.scan(prefix=b"base"))
                    assert n == 100
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        slow = d.scan(prefix=b"base")
        got = [next(slow)]
        for i in range(400):
            d.put(b"grow%04d" % i, os.urandom(8000))
            if i % 50 == 0:
                got.append(next(slow))
        got.extend(slow)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors
        assert d.stats()["map_grows"] >= 2
        assert [k for k, _ in got] == [b"base%03d" % i for i in range(100)]


# -- stats ----------------------------------------------------------------------------

def test_stats(db) -> None:
    db.put(b"a", b"1")
    db.put(b"b", b"2")
    db.delete(b"a")
    db.delete_range(b"x", b"y")
    db.get(b"b")
    db.get(b"b")
    s = db.stats()
    assert s["puts"] == 2 and s["deletes"] == 1 and s["delete_ranges"] == 1
    assert s["applied_groups"] == 4 and s["applied_entries"] == 4
    assert s["last_lsn"] == s["durable_lsn"] == s["applied_lsn"] == 4
    assert s["apply_avg_us"] > 0 and s["apply_max_us"] >= s["apply_avg_us"]
    assert s["lmdb_entries"] == 1 and s["lmdb_used_bytes"] > 0
    assert s["lmdb_map_bytes"] >= s["lmdb_used_bytes"]
    assert s["log"]["appends"] == 4 and s["log"]["fsyncs"] >= 4


def test_sync_modes(store) -> None:
    for mode in ("none", "batch", "always"):
        path = f"{store}-{mode}"
        with kvstore.open(path, sync=mode) as d:
            lsn = d.put(b"k", mode.encode())
            assert d.get(b"k") == mode.encode()  # visible at once in every mode
            assert d.sync() >= lsn
            assert d.durable_lsn >= lsn
        with kvstore.open(path) as d:
            assert d.get(b"k") == mode.encode()


def test_threads_share_the_store(store) -> None:
    with kvstore.open(store) as d:
        def work(t: int) -> None:
            for i in range(200):
                d.put(b"%d-%03d" % (t, i), b"%d" % i)
                assert d.get(b"%d-%03d" % (t, i)) == b"%d" % i  # read your write

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(d) == 1600 and d.last_lsn == 1600
        assert d.stats()["log"]["groups"] <= 1600


# -- recovery ---------------------------------------------------------------------------

def append_raw(store: str, payloads: list[bytes], segment_bytes: int = 64 << 10) -> None:
    """Append entries to the store's log directly, as if the store crashed
    after they were made durable and before LMDB applied them."""
    with wal.open(os.path.join(store, "wal"), segment_bytes=segment_bytes, sync="none") as lg:
        for p in payloads:
            lg.append(p)


def test_process_crash_replays_what_lmdb_missed(store) -> None:
    d = kvstore.open(store, segment_bytes=64 << 10, overlay=False)  # LMDB holds all 50 (test_overlay.py: with it)
    for i in range(50):
        d.put(b"k%02d" % i, b"v")
    abandon(d)  # no clean close; LMDB not flushed
    from tests.entries import encode_delete, encode_put
    append_raw(store, [encode_put(b"late%d" % i, b"L") for i in range(5)] + [encode_delete(b"k00")])
    with kvstore.open(store, segment_bytes=64 << 10) as d:
        assert d.rebuilt is None          # same boot: LMDB trusted
        assert d.replayed == 6
        assert d.get(b"late4") == b"L" and d.get(b"k00") is None and len(d) == 54
        assert d.applied_lsn == d.last_lsn == 56


@pytest.mark.parametrize("damage", ["garbage", "truncate", "zero", "none"])
def test_machine_crash_rebuilds_from_the_log(store, damage) -> None:
    model = {}
    with kvstore.open(store, segment_bytes=32 << 10) as d:
        for i in range(400):
            k, v = b"k%03d" % (i % 150), os.urandom(50)
            d.put(k, v)
            model[k] = v
        d.delete_range(b"k100", b"k120")
        for i in range(100, 120):
            model.pop(b"k%03d" % i, None)
    fake_machine_crash(store, damage)
    with kvstore.open(store, segment_bytes=32 << 10) as d:
        assert d.rebuilt is not None and "machine crashed" in d.rebuilt
        assert dict(d.scan()) == model
        assert d.applied_lsn == d.last_lsn == 401
    with kvstore.open(store) as d:
        assert d.rebuilt is None and dict(d.scan()) == model


def test_machine_crash_with_a_stale_lmdb_file(store) -> None:
    with kvstore.open(store) as d:
        for i in range(100):
            d.put(b"k%03d" % i, b"old")
    with open(os.path.join(store, "lmdb", "data.mdb"), "rb") as f:
        stale = f.read()
    with kvstore.open(store) as d:
        for i in range(100):
            d.put(b"k%03d" % i, b"new")
        d.delete(b"k000")
    fake_machine_crash(store, "stale", stale=stale)
    with kvstore.open(store) as d:
        assert d.rebuilt is not None
        assert d.get(b"k000") is None and d.get(b"k001") == b"new" and len(d) == 99


def test_damaged_lmdb_without_a_boot_change_is_rebuilt(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")
    with open(os.path.join(store, "lmdb", "data.mdb"), "r+b") as f:
        f.write(os.urandom(8192))  # both meta pages
    with kvstore.open(store) as d:
        assert d.rebuilt is not None and "LMDB" in d.rebuilt
        assert d.get(b"a") == b"1"


def test_missing_session_or_lmdb_is_rebuilt(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")
    os.unlink(session_path(store))
    with kvstore.open(store) as d:
        assert "SESSION" in (d.rebuilt or "") and d.get(b"a") == b"1"
    shutil.rmtree(os.path.join(store, "lmdb"))
    with kvstore.open(store) as d:
        assert d.rebuilt is not None and d.get(b"a") == b"1"


def test_lmdb_ahead_of_the_log_is_rebuilt(store) -> None:
    with kvstore.open(store) as d:
        for i in range(10):
            d.put(b"k%d" % i, b"v")
    with wal.open(os.path.join(store, "wal")) as lg:
        lg.truncate_after(6)  # e.g. a repair cut the log
    with kvstore.open(store) as d:
        assert "past the log's last LSN" in (d.rebuilt or "")
        assert sorted(d.keys()) == [b"k%d" % i for i in range(6)]


def test_lmdb_of_another_log_is_rebuilt(tmp_path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with kvstore.open(a) as d:
        d.put(b"from-a", b"1")
    with kvstore.open(b) as d:
        d.put(b"from-b", b"1")
    shutil.rmtree(os.path.join(b, "lmdb"))
    shutil.copytree(os.path.join(a, "lmdb"), os.path.join(b, "lmdb"))
    with kvstore.open(b) as d:
        assert d.rebuilt is not None and "another log" in d.rebuilt
        assert list(d.keys()) == [b"from-b"]


def test_interrupted_rebuild_is_redone(store, monkeypatch) -> None:
    with kvstore.open(store) as d:
        for i in range(20):
            d.put(b"k%02d" % i, b"v")
    fake_machine_crash(store, "garbage")
    calls = {"n": 0}
    real = recovery.State.apply

    def dying_apply(self, first_lsn, batches):
        calls["n"] += 1
        real(self, first_lsn, batches[:3])
        raise KeyboardInterrupt

    monkeypatch.setattr(recovery.State, "apply", dying_apply)
    with pytest.raises(KeyboardInterrupt):
        kvstore.open(store)
    monkeypatch.undo()
    assert calls["n"] == 1
    with kvstore.open(store) as d:
        assert len(d) == 20


def test_replay_reports_progress(store, monkeypatch) -> None:
    d = kvstore.open(store)
    abandon(d)
    from tests.entries import encode_put
    append_raw(store, [encode_put(b"k%05d" % i, b"v") for i in range(10000)])
    monkeypatch.setattr(recovery, "REPLAY_CHUNK_ENTRIES", 1000)
    seen = []
    with kvstore.open(store, progress=lambda done, total: seen.append((done, total))) as d:
        assert d.replayed == 10000 and len(d) == 10000
    assert seen[0] == (0, 10000) and seen[-1] == (10000, 10000)
    assert len(seen) >= 10
    assert [x for x, _ in seen] == sorted(x for x, _ in seen)


def test_corrupt_batch_in_the_replay_range(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")
    from tests.entries import encode_put
    append_raw(store, [encode_put(b"b", b"2"), b"\x92\x01\x02", encode_put(b"c", b"3")])
    digest = log_digest(store)
    for _ in range(2):
        with pytest.raises(kvstore.CorruptionError) as info:
            kvstore.open(store)
        msg = str(info.value)
        assert "LSN 3" in msg and "walkv repair" in msg and info.value.lsn == 3
    assert log_digest(store) == digest  # the log was not touched
    # and the store is not left locked
    with wal.open(os.path.join(store, "wal")) as lg:
        assert lg.last_lsn == 4


def test_corrupt_record_in_a_sealed_segment(store) -> None:
    with kvstore.open(store, segment_bytes=16 << 10) as d:
        d.put(b"first", b"1")
        abandon(d)
    from tests.entries import encode_put
    append_raw(store, [encode_put(b"k%04d" % i, os.urandom(200)) for i in range(300)],
               segment_bytes=16 << 10)
    wdir = os.path.join(store, "wal")
    segs = sorted(n for n in os.listdir(wdir) if n.endswith(".wal"))
    assert len(segs) >= 3
    victim = os.path.join(wdir, segs[1])
    with open(victim, "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    digest = log_digest(store)
    with pytest.raises(kvstore.CorruptionError) as info:
        kvstore.open(store, segment_bytes=16 << 10)
    msg = str(info.value)
    assert "walkv repair" in msg and segs[1] in msg
    assert log_digest(store) == digest


def test_snapshot_truncated_log_without_snapshot_is_a_clear_error(store) -> None:
    with kvstore.open(store, segment_bytes=16 << 10) as d:
        for i in range(300):
            d.put(b"k%04d" % i, os.urandom(200))
    with wal.open(os.path.join(store, "wal"), segment_bytes=16 << 10) as lg:
        assert lg.truncate_before(200) > 0
    # LMDB is intact: fine
    with kvstore.open(store, segment_bytes=16 << 10) as d:
        assert len(d) == 300
    fake_machine_crash(store, "garbage")
    with pytest.raises((kvstore.SnapshotError, kvstore.CorruptionError), match="snapshot"):
        kvstore.open(store, segment_bytes=16 << 10)


# -- asyncio -----------------------------------------------------------------------------

def test_async_api(store) -> None:
    async def main() -> None:
        async with kvstore.open_async(store) as adb:
            assert await adb.put(b"a", b"1") == 1
            assert await adb.get(b"a") == b"1"
            assert await adb.delete(b"a") == 2
            assert await adb.get(b"a") is None
            await adb.put(b"b", b"2")
            await adb.put(b"c", b"3")
            assert await adb.delete_range(b"b", b"c") == 5
            assert [k for k, _ in adb.scan()] == [b"c"]
            async with adb.batch() as b:
                b.put(b"x", b"1")
                b.delete(b"c")
            assert b.lsn == 6
            with pytest.raises(RuntimeError):
                async with adb.batch() as b:
                    b.put(b"never", b"1")
                    raise RuntimeError
            assert await adb.get(b"never") is None
            with pytest.raises(TypeError):
                await adb.put("k", b"v")
            with pytest.raises(kvstore.RecordTooLargeError):
                await adb.put(b"k" * 600, b"v")
            assert adb.last_lsn == 6 and await adb.count() == 1
            assert adb.stats()["async_pending"] == 0
        with pytest.raises(kvstore.ClosedError):
            await adb.put(b"a", b"1")
        adb2 = await kvstore.open_async(store)
        assert await adb2.get(b"x") == b"1"
        await adb2.close()

    asyncio.run(main())


def test_async_thousands_of_coroutines_share_fsyncs(store) -> None:
    threads_before = threading.active_count()  # (the session's: Spark's gateway, after a Spark test)

    async def main() -> None:
        async with kvstore.open_async(store) as adb:
            async def one(i: int) -> int:
                lsn = await adb.put(b"%05d" % i, b"v%d" % i)
                assert await adb.get(b"%05d" % i) == b"v%d" % i  # durable and applied
                return lsn

            lsns = await asyncio.gather(*(one(i) for i in range(2000)))
            assert sorted(lsns) == list(range(1, 2001))
            st_ = adb.stats()
            assert st_["log"]["fsyncs"] < 1000      # shared
            assert threading.active_count() - threads_before < 20  # not a thread each
            assert await adb.count() == 2000

    asyncio.run(main())
    with kvstore.open(store) as d:
        assert len(d) == 2000 and d.get(b"01999") == b"v1999"


def test_async_close_with_writes_in_flight(store) -> None:
    async def main() -> None:
        adb = await kvstore.open_async(store)
        futs = [adb.put(b"%04d" % i, b"v") for i in range(500)]
        await adb.close()
        done = [f for f in futs if f.done() and f.exception() is None]
        failed = [f for f in futs if f.done() and f.exception() is not None]
        assert len(done) + len(failed) == 500
        for f in failed:
            assert isinstance(f.exception(), kvstore.ClosedError)
        return len(done)

    n = asyncio.run(main())
    with kvstore.open(store) as d:
        assert len(d) >= n


def test_async_readonly(store) -> None:
    with kvstore.open(store) as d:
        d.put(b"a", b"1")

    async def main() -> None:
        async with kvstore.open_async(store, readonly=True) as adb:
            assert await adb.get(b"a") == b"1"
            with pytest.raises(kvstore.ReadOnlyError):
                await adb.put(b"b", b"2")

    asyncio.run(main())


def test_errors_are_reexported() -> None:
    for name in ("WalkvError", "CorruptionError", "LockedError", "ClosedError",
                 "LogFailedError", "RecordTooLargeError", "SnapshotError"):
        assert getattr(kvstore, name) is getattr(wal, name)
    assert issubclass(kvstore.ReadOnlyError, kvstore.WalkvError)
