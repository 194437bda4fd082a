"""The state machine's bookkeeping and base load (kvstore/state/meta.py,
kvstore/state/base_load.py) and its keyspaces' handles
(kvstore/state/keyspace_dbs.py), on a real LMDB environment: what a reopen
finds, what is refused, that a write transaction that does not commit
leaves no keyspace handle behind, and that opening a keyspace's handle
beside another thread's write transaction waits for it instead of freezing
the process, while a keyspace never written is told absent at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kvstore.state import State
from kvstore.state.meta import K_FORMAT
from wal.errors import SnapshotError, WalkvError


def state_at(tmp_path, **kw) -> State:
    return State(os.path.join(str(tmp_path), "lmdb"), **kw)


def test_the_bookkeeping_survives_a_reopen(tmp_path):
    s = state_at(tmp_path)
    assert not s.initialized and s.applied_lsn == 0 and s.store_id is None
    s.initialize("ab12", 5, complete=False)
    s.close()
    s = state_at(tmp_path)
    assert (s.initialized, s.store_id, s.applied_lsn, s.commits.applied_lsn, s.complete) == (True, "ab12", 5, 5, False)
    assert s.read_meta_applied() == 5
    s.close()


def test_another_format_is_refused_naming_the_environment(tmp_path):
    s = state_at(tmp_path)
    s.initialize("ab12", complete=True)
    main = s.lmdb.main_db
    s.lmdb.write(lambda txn: txn.put(K_FORMAT, b"2", db=main))
    s.close()
    with pytest.raises(WalkvError, match=r"lmdb: LMDB state format b'2' is not this walkv's"):
        state_at(tmp_path)


def test_a_base_load_fills_every_keyspace_and_marks_the_environment_complete(tmp_path):
    s = state_at(tmp_path)
    s.initialize("ab12", complete=False)
    pairs = [(b"k%03d" % i, b"v%d" % i) for i in range(25)]
    n = s.load_base(iter(pairs), 40, chunk=7, sections={"ks:users": [(b"u1", b"x"), (b"u2", b"y")]})
    assert n == 27
    assert (s.applied_lsn, s.complete) == (40, True)
    assert s.expiring_reads.count() == 25 and s.get(b"k007") == b"v7"
    assert s.expiring_reads.keyspaces() == ["users"] and s.expiring_reads.get_many_in("users", [b"u2", b"u3"]) == [b"y", None]
    s.close()
    s = state_at(tmp_path)
    assert (s.applied_lsn, s.complete, s.expiring_reads.count_in("users")) == (40, True, 2)
    s.close()


def test_a_section_this_walkv_does_not_know_is_refused(tmp_path):
    s = state_at(tmp_path)
    s.initialize("ab12", complete=False)
    with pytest.raises(SnapshotError, match="section 'vectors:idx' this walkv does not know"):
        s.load_base(iter([]), 3, sections={"vectors:idx": [(b"a", b"b")]})
    assert not s.complete
    s.close()


def test_a_keyspace_created_by_a_write_that_does_not_commit_is_forgotten(tmp_path):
    s = state_at(tmp_path)
    env = s.lmdb

    def create_then_fail(txn):
        txn.put(b"k", b"v", db=env.keyspace_db_in(txn, "orders"))
        assert env.keyspace_db("orders") is None  # not there for readers until it commits
        raise RuntimeError("the write fails")

    with pytest.raises(RuntimeError):
        env.write(create_then_fail)
    assert env.keyspace_db("orders") is None and s.expiring_reads.keyspaces() == []
    epoch = env.keyspace_epoch
    env.write(lambda txn: txn.put(b"k", b"v", db=env.keyspace_db_in(txn, "orders")))
    assert env.keyspace_epoch > epoch
    assert s.expiring_reads.keyspaces() == ["orders"] and s.expiring_reads.get_in("orders", b"k") == b"v"
    s.close()


# In a child, so that the old deadlock (one thread waiting for LMDB's writer lock while holding the GIL, the
# writer waiting for the GIL) fails the test at the timeout instead of freezing the suite.
_OPEN_BESIDE_A_WRITE = textwrap.dedent("""
    import sys, threading, time
    from kvstore.state import State
    s = State(sys.argv[1])
    s.initialize("ab12", 0, complete=True)
    env = s.lmdb
    s.lmdb.write(lambda txn: txn.put(b"k", b"v", db=env.keyspace_db_in(txn, "orders")))
    s.close()
    s = State(sys.argv[1])  # reopened: no keyspace handle is open yet
    env = s.lmdb
    in_txn = threading.Event()
    checked = threading.Event()

    def write(txn):
        in_txn.set()
        checked.wait(20)  # (until the absent keyspace was checked; on code that waits for this write, 20 s)
        time.sleep(0.3)  # (needs the GIL back to return: the main thread must not hold it while it waits)
        for i in range(1000):  # py-lmdb lets go of the GIL around each key
            txn.put(b"x%d" % i, b"y")

    writer = threading.Thread(target=env.write, args=(write,))
    writer.start()
    in_txn.wait()
    absent = env.keyspace_db("never-written") is None
    alive = writer.is_alive()  # (a keyspace never written: told at once, the write still on)
    checked.set()
    print(alive, absent, flush=True)
    print(env.keyspace_db("orders") is not None, s.expiring_reads.get_in("orders", b"k"), flush=True)
    writer.join()
    print(s.get(b"x999"))
    s.close()
""")


def test_a_keyspace_handle_opened_beside_another_threads_write_waits_for_it(tmp_path):
    try:
        ran = subprocess.run([sys.executable, "-c", _OPEN_BESIDE_A_WRITE, os.path.join(str(tmp_path), "lmdb")],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("opening a keyspace's handle beside another thread's write transaction froze the process")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n")[:3] == ["True True", "True b'v'", "b'y'"]
