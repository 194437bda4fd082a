"""Reads at an exact LSN (kvstore/state/exact_reads.py, ``KVStore.read_at``):
the protocol on its own (which tries it accepts, that it gives up on a
stuck applying thread), then a real store with a writer thread applying
all along, through the overlay, through LMDB commits, in a keyspace, and
a bulk batch, the server's GET over HTTP, and a read-only open beside a
writer process: every read's value is the log's at exactly the LSN it
says.

Reading ``applied_lsn`` and then the value (what the server did before)
fails these checks: a group applied between the two gives a value newer
than its LSN. Measured on that code: 12,082 of 60,000 reads beside LMDB
commits, 2 of 60,000 through the overlay, 162 of 2,000 GETs."""

from __future__ import annotations

import bisect
import os
import subprocess
import sys
import threading

import pytest

import kvstore
from kvstore.state import exact_reads
from kvstore.state.exact_reads import read_at_lsn
from wal.errors import WalkvError

READS = 60_000
MIN_WRITES = 20  # writes the reads must have run beside


def test_a_read_with_no_group_applied_meanwhile_is_taken_at_once():
    calls = []
    assert read_at_lsn(lambda: calls.append(1) or "v", lambda: 7, lambda: 7, "p") == ("v", 7)
    assert calls == [1]


def test_a_read_that_a_group_may_have_reached_runs_again_at_the_newer_lsn():
    applied = iter([7, 8])
    applying = iter([8, 8])  # a group up to 8 began (and may be visible) while the first try read
    values = iter(["old-or-new", "new"])
    assert read_at_lsn(lambda: next(values), lambda: next(applied), lambda: next(applying), "p") == ("new", 8)


def test_a_read_that_never_finds_the_state_still_gives_up_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(exact_reads, "SPINS", 3)
    monkeypatch.setattr(exact_reads, "MAX_SECONDS", 0.01)
    with pytest.raises(WalkvError, match=r"at /s/lmdb found writes past LSN 7 being applied .* stuck"):
        read_at_lsn(lambda: None, lambda: 7, lambda: 8, "/s/lmdb")


def _through(x):
    """A Python call between the LSN and the value, as the server's handler
    makes: a point where the reading thread lets the applying one run."""
    return x


def _check_reads(write_one, read_one, count: int = READS) -> None:
    """Writes (``write_one(i)`` returns ``(lsn, value)``) from one thread
    while this one reads ``count`` times (``read_one()`` returns ``(value,
    lsn)``); every read's value must be the last write's at or below its LSN."""
    written: dict[int, bytes] = {}
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            lsn, value = write_one(i)
            written[lsn] = value

    reads = []
    t = threading.Thread(target=writer)
    t.start()
    try:
        # as many reads as asked, and at least MIN_WRITES writes beside them however slowly
        # the writer runs (a loaded machine); a writer that died ends the reads
        while (len(reads) < count or len(written) < MIN_WRITES) and t.is_alive():
            reads.append(read_one())
    finally:
        stop.set()
        t.join()
    _assert_at_their_lsns(written, reads)


def _read_at(db, read):
    """``db.read_at`` of ``read`` through a Python call (:func:`_through`)."""
    return lambda: db.read_at(lambda: _through(read()))


def _assert_at_their_lsns(written: dict[int, bytes], reads: list[tuple[bytes | None, int]]) -> None:
    """Every ``(value, lsn)`` read is the value of the last write
    (``written``: LSN -> value) at or below its LSN."""
    assert len(written) >= MIN_WRITES, "the writer hardly ran (or died): nothing was checked"
    lsns = sorted(written)
    wrong = []
    for value, lsn in reads:
        at = bisect.bisect_right(lsns, lsn)
        expected = written[lsns[at - 1]] if at else None
        if value != expected:
            wrong.append((lsn, value, expected))
    assert not wrong, f"{len(wrong)} of {len(reads)} reads answered a value not the log's at their LSN: {wrong[:5]}"


@pytest.mark.parametrize("overlay", [True, False], ids=["overlay", "lmdb-commits"])
def test_a_get_is_the_logs_value_at_the_lsn_it_says(tmp_path, overlay):
    with kvstore.open(tmp_path / "s", sync="none", overlay=overlay) as db:
        def put(i: int) -> tuple[int, bytes]:
            value = b"v%d" % i
            return db.put(b"k", value), value
        _check_reads(put, _read_at(db, lambda: db.get(b"k")))


def test_a_keyspace_get_is_the_logs_value_at_the_lsn_it_says(tmp_path):
    with kvstore.open(tmp_path / "s", sync="none") as db:
        space = db.keyspace("users")

        def put(i: int) -> tuple[int, bytes]:
            value = b"v%d" % i
            return space.put(b"k", value), value
        _check_reads(put, _read_at(db, lambda: space.get(b"k")))


def test_a_get_beside_bulk_batches_committed_while_the_log_syncs_is_at_its_lsn(tmp_path):
    """Batches of 5,000 puts are staged (kvstore/state/staged.py): written
    into LMDB while the log writes and fsyncs them, made visible by the commit after."""
    with kvstore.open(tmp_path / "s", sync="always") as db:
        def batch(i: int) -> tuple[int, bytes]:
            value = b"v%d" % i
            with db.batch() as b:
                for n in range(5000):
                    b.put(b"k" if n == 4999 else b"filler%d" % n, value)
            return db.applied_lsn, value  # (one writer: the batch's own LSN)
        _check_reads(batch, _read_at(db, lambda: db.get(b"k")))


def test_the_servers_get_answers_the_logs_value_at_its_walkv_lsn(tmp_path):
    """The same check over HTTP: GETs of ``walkv serve`` (in a thread, on
    its own event loop) while a thread of the same process writes the store
    directly, each group committed to LMDB (overlay off)."""
    httpx = pytest.importorskip("httpx")
    from tests.served import ServerThread

    with kvstore.open(tmp_path / "s", sync="none", overlay=False) as db:
        def put(i: int) -> tuple[int, bytes]:
            value = b"v%d" % i
            return db.put(b"k", value), value

        server = ServerThread(db)
        try:
            with httpx.Client(base_url=server.url) as http:
                def get() -> tuple[bytes | None, int]:
                    resp = http.get("/v1/kv/k")
                    return resp.content if resp.status_code == 200 else None, int(resp.headers["Walkv-Lsn"])
                _check_reads(put, get, 2000)
        finally:
            server.stop()


def test_a_read_only_open_reads_at_the_lsn_its_writer_process_had_written_to_lmdb(tmp_path):
    """A read-only open beside a writer in another process
    (tests/replica_writer.py: batch i sets ``a`` to i, entry i of a new
    store): every read through ``read_at`` is the writer's LMDB as of the
    LSN it says, whose ``a`` is that LSN."""
    path = str(tmp_path / "s")
    writer = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "replica_writer.py"), path,
                               "1500"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        reads = []
        with kvstore.open(path, readonly=True) as db:
            while writer.poll() is None or len(reads) < 100:
                reads.append(db.read_at(lambda: db.get(b"a")))
        out = writer.stdout.read()
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == 0 and "done 1500" in out
    wrong = [(value, lsn) for value, lsn in reads if value != (b"%d" % lsn if lsn else None)]
    assert not wrong, f"{len(wrong)} of {len(reads)} reads are not the writer's state at their LSN: {wrong[:5]}"
    assert len({lsn for _, lsn in reads}) > 3, "the reads never saw the writer move: nothing was checked"
