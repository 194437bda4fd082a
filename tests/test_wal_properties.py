"""Random operation sequences against a model (hypothesis).

The model is a dict {lsn: payload} plus the first LSN still held. Operations:
append, append_batch, large (segment-rolling) appends, reopen, crash image
(open a copy of the files of the open log, as a killed process leaves them),
truncate_before and truncate_after. After each step the log must read back
exactly the model, from its first LSN and over a random range.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal
from wal.errors import LogGapError
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
