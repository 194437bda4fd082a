"""Random operation sequences against a model (hypothesis).

The model is a dict {lsn: payload} plus the first LSN still held. Operations:
append, append_batch, large (segment-rolling) appends, reopen, crash image
(open a copy of the files of the open log, as a killed process leaves them),
truncate_before and truncate_after. After each step the log must read back
exactly the model, from its first LSN and over a random range.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal
from wal.errors import LogFailedError, LogGapError
from wal.fs import File, FileSystem
from wal.record_reader import RecordReader
from wal.segment import index_path, list_segments

SEGMENT_BYTES = 4096
# More examples by hand: WALKV_PROPERTY_EXAMPLES=1000 pytest tests/test_wal_properties.py
EXAMPLES = int(os.environ.get("WALKV_PROPERTY_EXAMPLES", "30"))

OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 700)),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 400), min_size=1, max_size=8)),
    st.tuples(st.just("big"), st.integers(3000, 40000)),
    st.tuples(st.just("reopen"), st.none()),
    st.tuples(st.just("crash_image"), st.none()),
    st.tuples(st.just("truncate_before"), st.floats(0, 1.3)),
    st.tuples(st.just("truncate_after"), st.floats(0, 1)),
)


def payload(n: int, size: int) -> bytes:
    head = b"%06d|" % n
    return (head * (size // len(head) + 1))[:size]


def check(log: wal.Log, model: dict[int, bytes], first: int, sync: str, data) -> None:
    last = max(model) if model else first - 1
    assert (log.first_lsn, log.last_lsn) == (first, last)
    expect = [(k, model[k]) for k in range(first, last + 1)]
    assert list(log.read(first, durable_only=False)) == expect
    if sync == "always":
        assert log.durable_lsn == last
        assert list(log.read(first)) == expect
    else:
        durable = log.durable_lsn
        assert first - 1 <= durable <= last
        assert list(log.read(first)) == expect[: durable - first + 1]
    lo = data.draw(st.integers(first, last + 2), label="lo")
    hi = data.draw(st.integers(lo - 1, last + 2), label="hi")
    assert list(log.read(lo, hi, durable_only=False)) == [(k, model[k]) for k in range(lo, min(hi, last) + 1)]
    if first > 1:
        with pytest.raises(LogGapError):
            list(log.read(first - 1))


@settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=20), sync=st.sampled_from(["always", "none", "batch"]),
       data=st.data())
def test_log_matches_model(ops, sync, data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "log"
        opts = dict(segment_bytes=SEGMENT_BYTES, sync=sync, sync_interval=5)
        log = wal.open(d, **opts)
        model: dict[int, bytes] = {}
        first = 1
        counter = 0
        try:
            for op, arg in ops:
                last = max(model) if model else first - 1
                if op in ("append", "big"):
                    counter += 1
                    p = payload(counter, arg)
                    assert log.append(p) == last + 1
                    model[last + 1] = p
                elif op == "batch":
                    ps = []
                    for size in arg:
                        counter += 1
                        ps.append(payload(counter, size))
                    assert log.append_batch(ps) == (last + 1, last + len(ps))
                    for k, p in enumerate(ps):
                        model[last + 1 + k] = p
                elif op == "reopen":
                    log.close()
                    log = wal.open(d, **opts)
                elif op == "crash_image":
                    image = Path(tmp) / "image"
                    shutil.copytree(d, image, ignore=shutil.ignore_patterns("LOCK"))
                    with wal.open(image, segment_bytes=SEGMENT_BYTES) as copy:
                        # Everything written reached the page cache: a killed
                        # process loses none of it, whatever the sync mode.
                        assert copy.first_lsn == first
                        assert list(copy.read(first)) == [(k, model[k]) for k in range(first, last + 1)]
                    shutil.rmtree(image)
                elif op == "truncate_before":
                    target = first + int(arg * (last - first + 1))
                    before = log.first_lsn
                    log.truncate_before(target)
                    new_first = log.first_lsn
                    assert before <= new_first <= max(before, target)
                    assert new_first <= last + 1
                    assert len(list_segments(str(d))) >= 1
                    for k in range(first, new_first):
                        del model[k]
                    first = new_first
                elif op == "truncate_after":
                    k = first - 1 + int(arg * (last - first + 1))
                    log.truncate_after(k)
                    for lsn in range(k + 1, last + 1):
                        del model[lsn]
                check(log, model, first, sync, data)
            log.close()
            log = wal.open(d, segment_bytes=SEGMENT_BYTES)
            check(log, model, first, "always", data)
            assert wal.verify(str(d)) == []
        finally:
            log.close()


@settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.one_of(st.integers(0, 3000), st.integers(20000, 80000)), min_size=2, max_size=25),
       cut=st.floats(0, 1),
       zeroed=st.booleans(), data=st.data())
def test_torn_active_segment_opens_to_a_prefix(sizes, cut, zeroed, data) -> None:
    """Cut the active segment of a crash image at any offset (zeroing or
    truncating from there): open keeps exactly the entries whose records end
    before the cut, and appends go on after them."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "log"
        model = {}
        with wal.open(d, segment_bytes=65536, sync="none") as log:
            for n, size in enumerate(sizes, 1):
                model[log.append(payload(n, size))] = payload(n, size)
        seg = list_segments(str(d))[-1].path
        os.unlink(index_path(seg))
        raw = Path(seg).read_bytes()
        ends = []
        with open(seg, "rb") as fh:
            reader = RecordReader(fh, zeros_end=True)
            for off, p in reader.records():
                if off:
                    ends.append((int.from_bytes(p[:8], "little"), reader.end_offset))
        data_end = ends[-1][1] if ends else len(raw.rstrip(b"\0"))
        with open(seg, "rb") as fh:
            reader = RecordReader(fh, zeros_end=True)
            next(reader.records())
            header_end = reader.end_offset
        o = header_end + int(cut * (data_end - header_end))
        Path(seg).write_bytes(raw[:o] + bytes(len(raw) - o) if zeroed else raw[:o])
        first_in_seg = list_segments(str(d))[-1].first_lsn
        kept = max([lsn for lsn, end in ends if end <= o], default=first_in_seg - 1)
        with wal.open(d) as log:
            assert log.last_lsn == kept
            assert list(log.read()) == [(k, model[k]) for k in range(1, kept + 1)]
            assert log.append(b"on") == kept + 1
        with wal.open(d) as log:
            assert list(log.read(max(1, kept))) == [(k, model[k]) for k in range(max(1, kept), kept + 1)] + [
                (kept + 1, b"on")]


# -- the direct path of one writer, and appenders arriving while it writes ---------


class HeldSyncFS(FileSystem):
    """Real files whose ``hold``-th sync from now waits until released (and
    then fails with EIO when ``fail``), so appenders can be made to arrive
    while a writer is between its write and its fsync. Every sync is
    counted, with the events the test records beside them."""

    def __init__(self) -> None:
        self.syncs = 0
        self.hold: int | None = None
        self.fail = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.events: list[tuple[str, int, int]] = []  # (what, LSN, syncs done by then)
        self.lock = threading.Lock()

    def record(self, what: str, lsn: int) -> None:
        with self.lock:
            self.events.append((what, lsn, self.syncs))

    def open(self, path: str, **kw) -> File:  # type: ignore[override]
        f = super().open(path, **kw)
        return _HeldSyncFile(f.path, f.fd, self)


class _HeldSyncFile(File):
    def __init__(self, path: str, fd: int, fs: HeldSyncFS) -> None:
        super().__init__(path, fd)
        self._fs = fs

    def sync(self, *, full: bool = False) -> None:
        fs = self._fs
        if fs.hold is not None:
            fs.hold -= 1
            if fs.hold == 0:
                fs.hold = None
                fs.entered.set()
                assert fs.release.wait(30)
                if fs.fail:
                    raise OSError(errno.EIO, "injected fsync failure", self.path)
        super().sync(full=full)
        with fs.lock:
            fs.syncs += 1


def _wait_for_waiters(log: wal.Log, n: int) -> None:
    """Until ``n`` appenders wait behind the leader (they queued in turn)."""
    deadline = time.monotonic() + 30
    while len(log._gc._line.waiters) < n:
        assert time.monotonic() < deadline, "appenders did not queue"
        time.sleep(0.001)


@settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.integers(0, 3), arrivals=st.lists(st.integers(1, 4), max_size=4), fail=st.booleans(),
       batch=st.booleans())
def test_direct_path_with_appenders_arriving_mid_write(before, arrivals, fail, batch) -> None:
    """One writer appends alone (the direct path: no queue, no waiter), then
    its next append is held between its write and its fsync while appenders
    arrive one after another. Whatever the arrivals: every append returns only
    after an fsync that followed the framing of its entry (its group was
    prepared, synced, committed, then it returned); LSNs are handed out in
    the order the appenders came, with no gap; the arrivals are written as one
    group (group commit still batches); a failed fsync fails the held writer
    and every arrival, acknowledges none of them, and the log reopens to
    what was acknowledged plus a prefix of the rest."""
    fs = HeldSyncFS()
    d = tempfile.mkdtemp(prefix="direct-")
    try:
        log = wal.open(d, fs=fs, sync="always", segment_bytes=1 << 20,
                       on_prepare=lambda g: fs.record("prepare", g.first_lsn),
                       on_commit=lambda g: fs.record("commit", g.last_lsn))
        attempted: dict[int, bytes] = {}
        for i in range(before):
            p = payload(i, 50)
            lsn = log.append(p)
            fs.record("return", lsn)
            attempted[lsn] = p
        assert log.stats()["groups"] == before and log._gc._committer is None  # no committer thread
        results: dict[str, object] = {}

        def append(name: str, payloads: list[bytes]) -> None:
            try:
                if batch and len(payloads) > 1:
                    first, last = log.append_batch(payloads)
                else:
                    first = last = log.append(payloads[0])
                    for p in payloads[1:]:  # (arrivals of one payload each: size 1)
                        last = log.append(p)
                fs.record("return", last)
                results[name] = (first, last)
            except BaseException as e:  # noqa: BLE001
                results[name] = e

        fs.hold, fs.fail = 1, fail
        held = threading.Thread(target=append, args=("held", [payload(100, 60)]))
        held.start()
        assert fs.entered.wait(30)
        threads = []
        sizes = [n if batch else 1 for n in arrivals]
        for t, n in enumerate(sizes):
            th = threading.Thread(target=append, args=(f"a{t}", [payload(200 + 10 * t + j, 70) for j in range(n)]))
            th.start()
            threads.append(th)
            _wait_for_waiters(log, t + 1)  # so arrival order is queue order
        fs.release.set()
        for th in [held, *threads]:
            th.join(30)
            assert not th.is_alive(), "an appender was never woken"
        lsn = before + 1
        if fail:
            assert all(isinstance(results[k], LogFailedError) for k in results), results
            assert log.durable_lsn == before
        else:
            assert results["held"] == (lsn, lsn)
            attempted[lsn] = payload(100, 60)
            for t, n in enumerate(sizes):
                assert results[f"a{t}"] == (lsn + 1, lsn + n), (t, results)  # arrival order, no gap
                for j in range(n):
                    attempted[lsn + 1 + j] = payload(200 + 10 * t + j, 70)
                lsn += n
            assert log.stats()["groups"] == before + 1 + (1 if sizes else 0)  # the arrivals: one group
            assert log.durable_lsn == lsn
        # Each return came after its group was prepared, synced and committed.
        events = list(fs.events)
        for i, (what, lsn_, _) in enumerate(events):
            if what != "return":
                continue
            commit = next(j for j in range(i) if events[j][0] == "commit" and events[j][1] >= lsn_)
            prepare = max(j for j in range(commit) if events[j][0] == "prepare" and events[j][1] <= lsn_)
            assert events[commit][2] > events[prepare][2], f"LSN {lsn_} acknowledged without an fsync"
        log.close()
        with wal.open(d) as reopened:
            got = dict(reopened.read(1))
        acked = max((v[1] for v in results.values() if isinstance(v, tuple)), default=before)
        assert all(got.get(k) == attempted[k] for k in range(1, acked + 1))
        assert sorted(got) == list(range(1, len(got) + 1))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_leader_gathers_the_appenders_the_last_group_woke() -> None:
    """A group that woke several appenders makes the next leader wait for as
    many entries before it writes (wal/commit.py: gathering), so they share
    one fsync; the wait is bounded (here made long so the test needs no
    timing), and once a group woke nobody, a lone appender is direct again."""
    fs = HeldSyncFS()
    d = tempfile.mkdtemp(prefix="gather-")
    try:
        log = wal.open(d, fs=fs, sync="always", segment_bytes=1 << 20)
        gc = log._gc
        gc.gather_seconds = 30.0
        returned: list[str] = []

        def append(name: str) -> None:
            log.append(name.encode())
            returned.append(name)

        # A is held in its fsync; B, C, D queue behind it. B leads {B, C, D}: it wakes C and D.
        fs.hold = 1
        threads = [threading.Thread(target=append, args=("A",))]
        threads[0].start()
        assert fs.entered.wait(30)
        for i, name in enumerate("BCD"):
            threads.append(threading.Thread(target=append, args=(name,)))
            threads[-1].start()
            _wait_for_waiters(log, i + 1)
        fs.release.set()
        for th in threads:
            th.join(30)
        assert log.stats()["groups"] == 2 and gc._woken == 2

        # E leads next and gathers: it waits until F is queued too, then writes both as one group.
        e = threading.Thread(target=append, args=("E",))
        e.start()
        deadline = time.monotonic() + 30
        while gc._arrived is None:
            assert time.monotonic() < deadline, "E did not gather"
            time.sleep(0.001)
        assert "E" not in returned
        f = threading.Thread(target=append, args=("F",))
        f.start()
        for th in (e, f):
            th.join(30)
            assert not th.is_alive()
        assert log.stats()["groups"] == 3 and log.durable_lsn == 6
        assert gc._woken == 1  # {E, F} woke F only: the next lone append is direct
        gc.gather_seconds = 0.0
        assert log.append(b"G") == 7 and not gc._line.waiters and log.stats()["groups"] == 4
        log.close()
        with wal.open(d) as reopened:
            assert [p for _, p in reopened.read(1)] == [b"A", b"B", b"C", b"D", b"E", b"F", b"G"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_interrupted_wait_leaves_the_line(tmp_path: Path, ctrl_c: None) -> None:
    """Ctrl-C (KeyboardInterrupt) in the main thread while its append waits
    behind a leader's fsync, first in line, two appenders behind it: it
    leaves the line. The leadership it would have been handed goes to the
    next, the two behind it return, close() does not hang, and its entry,
    queued before the interrupt, is written with theirs."""
    fs = HeldSyncFS()
    with wal.open(tmp_path / "log", sync="always", fs=fs) as log:
        log.append(b"first")
        fs.hold = 1
        leader = threading.Thread(target=log.append, args=(b"leader",))
        leader.start()
        assert fs.entered.wait(30)

        def behind(n: int, payload: bytes) -> None:
            _wait_for_waiters(log, n)
            log.append(payload)

        def interrupt() -> None:
            _wait_for_waiters(log, 3)
            time.sleep(0.1)  # the main thread asleep in its wait, not on its way to it
            os.kill(os.getpid(), signal.SIGINT)

        others = [threading.Thread(target=behind, args=(1, b"second")),
                  threading.Thread(target=behind, args=(2, b"third")), threading.Thread(target=interrupt)]
        for t in others:
            t.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                log.append(b"interrupted")
            assert [w.lsn for w in log._gc._line.waiters] == [4, 5], "the interrupted appender left the line"
        finally:
            fs.release.set()
        for t in [leader, *others]:
            t.join(60)
            assert not t.is_alive(), "an appender behind the interrupted one was left waiting"
        assert log.durable_lsn == 5
    with wal.open(tmp_path / "log") as log:
        assert [p for _, p in log.read(1)] == [b"first", b"leader", b"interrupted", b"second", b"third"]
