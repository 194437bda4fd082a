"""kvstore/state/lmdb_ops.py's put_run: a run of puts, appended (MDB_APPEND)
when its keys ascend past the database's last key, put otherwise; either
way LMDB ends up as a dict the same puts leave."""

from __future__ import annotations

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.state.lmdb_ops import APPEND_RUN, put_run

keys = st.binary(min_size=1, max_size=4)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    """(keys already in the database, keys of one run): often a long
    ascending run, placed after, before or among the existing keys, with a
    duplicate or an out-of-order key now and then."""
    existing = draw(st.lists(keys, max_size=20))
    n = draw(st.sampled_from([2, APPEND_RUN - 1, APPEND_RUN, APPEND_RUN + 7]))
    start = draw(st.sampled_from([b"", b"\x00", b"\xff\xff\xff\xff\xff"]))
    run = [start + i.to_bytes(3, "big") for i in range(n)]
    spoil = draw(st.sampled_from(["none", "duplicate", "swap", "repeat-last-existing"]))
    if spoil == "duplicate":
        i = draw(st.integers(1, n - 1))
        run[i] = run[i - 1]
    elif spoil == "swap":
        i = draw(st.integers(1, n - 1))
        run[i - 1], run[i] = run[i], run[i - 1]
    elif spoil == "repeat-last-existing" and existing:
        run[0] = max(existing)
    return existing, run


@settings(max_examples=60, deadline=None)
@given(runs())
def test_put_run_leaves_what_a_dict_does(tmp_path_factory, case: tuple[list[bytes], list[bytes]]) -> None:
    existing, run = case
    env = lmdb.open(str(tmp_path_factory.mktemp("env")), map_size=64 << 20, sync=False)
    try:
        model = {k: b"old" for k in existing}
        with env.begin(write=True) as txn:
            for k in existing:
                txn.put(k, b"old")
        ops = [(1, k, b"v%d" % i) for i, k in enumerate(run)]
        with env.begin(write=True) as txn:
            put_run(txn, ops)
        for _, k, v in ops:
            model[k] = v
        with env.begin() as txn:
            assert dict(txn.cursor()) == model
    finally:
        env.close()
