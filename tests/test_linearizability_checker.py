"""The cluster tests' linearizability checker (tests/linearizability.py) on
histories whose answer is known: Knossos-style hand-written ones, histories
generated from a real sequential execution with random overlaps (every one
must pass), the same with a stale read injected (every one must fail), and
small arbitrary histories against a brute-force search over every order."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.linearizability import CAS, FAIL, INFO, OK, READ, WRITE, History, Op, check, check_key, from_events


def lin(events, **kw) -> bool | None:
    return check(from_events(events), **kw).ok


# -- hand-written -----------------------------------------------------------------------------


def test_sequential_write_then_read():
    assert lin([("invoke", 1, WRITE, "x", 1, 0), ("ok", 1, WRITE, "x", None, 1),
                ("invoke", 2, READ, "x", None, 2), ("ok", 2, READ, "x", 1, 3)])


def test_read_of_the_initial_value_after_a_completed_write_is_not_linearizable():
    assert lin([("invoke", 1, WRITE, "x", 1, 0), ("ok", 1, WRITE, "x", None, 1),
                ("invoke", 2, READ, "x", None, 2), ("ok", 2, READ, "x", None, 3)]) is False


def test_a_read_concurrent_with_a_write_may_see_either():
    for seen in (None, 1):
        assert lin([("invoke", 1, WRITE, "x", 1, 0), ("invoke", 2, READ, "x", None, 1),
                    ("ok", 2, READ, "x", seen, 2), ("ok", 1, WRITE, "x", None, 3)])


def test_two_reads_disagree_on_the_order_of_two_concurrent_writes():
    # w1 || w2, then sequential reads: either order of the writes, but only one.
    base = [("invoke", 1, WRITE, "x", 1, 0), ("invoke", 2, WRITE, "x", 2, 0),
            ("ok", 1, WRITE, "x", None, 1), ("ok", 2, WRITE, "x", None, 1)]
    reads = lambda *vs: [e for i, v in enumerate(vs) for e in (("invoke", 3, READ, "x", None, 2 + 2 * i),
                                                                 ("ok", 3, READ, "x", v, 3 + 2 * i))]
    assert lin(base + reads(1, 1))
    assert lin(base + reads(2, 2))
    assert lin(base + reads(1, 2)) is False
    assert lin(base + reads(1, 2, 1)) is False


def test_a_read_may_not_see_a_write_invoked_after_it_completed():
    assert lin([("invoke", 2, READ, "x", None, 0), ("ok", 2, READ, "x", 1, 1),
                ("invoke", 1, WRITE, "x", 1, 2), ("ok", 1, WRITE, "x", None, 3)]) is False


def test_two_concurrent_cas_from_the_same_value_cannot_both_succeed():
    start = [("invoke", 0, WRITE, "x", 0, 0), ("ok", 0, WRITE, "x", None, 1)]
    both = [("invoke", 1, CAS, "x", (0, 1), 2), ("invoke", 2, CAS, "x", (0, 2), 2),
            ("ok", 1, CAS, "x", True, 3), ("ok", 2, CAS, "x", True, 3)]
    assert lin(start + both) is False
    one = both[:3] + [("ok", 2, CAS, "x", False, 3)]
    assert lin(start + one)
    assert lin(start + one + [("invoke", 3, READ, "x", None, 4), ("ok", 3, READ, "x", 1, 5)])
    assert lin(start + one + [("invoke", 3, READ, "x", None, 4), ("ok", 3, READ, "x", 2, 5)]) is False


def test_a_failed_cas_says_the_value_was_something_else():
    history = [("invoke", 0, WRITE, "x", 5, 0), ("ok", 0, WRITE, "x", None, 1),
               ("invoke", 1, CAS, "x", (5, 6), 2), ("ok", 1, CAS, "x", False, 3)]
    assert lin(history) is False  # the value was 5, nothing else could have been written
    concurrent = history + [("invoke", 2, WRITE, "x", 7, 1.5), ("ok", 2, WRITE, "x", None, 4)]
    concurrent.sort(key=lambda e: e[5])
    assert lin(concurrent)


def test_a_fail_did_not_happen():
    history = [("invoke", 1, WRITE, "x", 1, 0), ("fail", 1, WRITE, "x", None, 1),
               ("invoke", 2, READ, "x", None, 2), ("ok", 2, READ, "x", 1, 3)]
    assert lin(history) is False
    assert lin(history[:2] + [("invoke", 2, READ, "x", None, 2), ("ok", 2, READ, "x", None, 3)])


def test_an_unknown_write_may_take_effect_late_or_never():
    unknown = [("invoke", 1, WRITE, "x", 1, 0), ("info", 1, WRITE, "x", None, 1)]
    read = lambda v, t: [("invoke", 2, READ, "x", None, t), ("ok", 2, READ, "x", v, t + 1)]
    assert lin(unknown + read(None, 2) + read(None, 4))  # never
    assert lin(unknown + read(None, 2) + read(1, 4))  # late: after the first read
    assert lin(unknown + read(1, 2) + read(1, 4))
    assert lin(unknown + read(1, 2) + read(None, 4)) is False  # took effect, then undone?
    assert lin(unknown + read(2, 2)) is False  # nobody wrote 2


def test_an_invoke_never_completed_is_unknown():
    ops = from_events([("invoke", 1, WRITE, "x", 1, 0), ("invoke", 2, READ, "x", None, 5),
                       ("ok", 2, READ, "x", 1, 6)])
    assert {op.status for op in ops} == {INFO, OK}
    assert check(ops).ok


def test_unknown_cas_takes_effect_only_from_its_expected_value():
    start = [("invoke", 0, WRITE, "x", "a", 0), ("ok", 0, WRITE, "x", None, 1),
             ("invoke", 1, CAS, "x", ("a", "b"), 2), ("info", 1, CAS, "x", None, 3)]
    assert lin(start + [("invoke", 2, READ, "x", None, 4), ("ok", 2, READ, "x", "b", 5)])
    wrong = [("invoke", 0, WRITE, "x", "z", 0), ("ok", 0, WRITE, "x", None, 1)] + start[2:]
    assert lin(wrong + [("invoke", 2, READ, "x", None, 4), ("ok", 2, READ, "x", "b", 5)]) is False


def test_keys_are_independent_and_the_bad_one_is_named():
    history = [("invoke", 1, WRITE, "x", 1, 0), ("ok", 1, WRITE, "x", None, 1),
               ("invoke", 2, WRITE, "y", 1, 0), ("ok", 2, WRITE, "y", None, 1),
               ("invoke", 3, READ, "y", None, 2), ("ok", 3, READ, "y", 7, 3)]
    result = check(from_events(history))
    assert result.ok is False
    assert result.keys["x"].ok and result.keys["y"].ok is False
    assert result.keys["y"].culprit is not None and result.keys["y"].culprit.result == 7
    assert "NOT linearizable" in result.explain() and "'y'" in result.explain()


def test_initial_values():
    history = [("invoke", 1, READ, "x", None, 0), ("ok", 1, READ, "x", "seed", 1)]
    assert lin(history) is False
    assert lin(history, initial={"x": "seed"})


def test_events_must_pair():
    with pytest.raises(ValueError, match="without an invoke"):
        from_events([("ok", 1, READ, "x", 1, 0)])
    with pytest.raises(ValueError, match="twice"):
        from_events([("invoke", 1, READ, "x", None, 0), ("invoke", 1, READ, "x", None, 1)])


def test_the_search_bound_answers_unknown_not_a_guess():
    ops = [Op(i, WRITE, "x", i, None, 0.0, None, INFO) for i in range(12)]
    ops.append(Op("r", READ, "x", None, 999, 1.0, 2.0))  # nobody wrote 999: all subsets get tried
    assert check_key("x", ops).ok is False
    assert check_key("x", ops, max_configurations=50).ok is None
    assert check(ops, max_configurations=50).ok is None


def test_history_records_from_threads_on_one_clock():
    ticks = itertools.count()
    h = History(clock=lambda: float(next(ticks)))
    w = h.invoke("a", WRITE, "x", 1)
    r = h.invoke("b", READ, "x")
    r.ok(1, "node-1")
    w.info()
    h.invoke("c", CAS, "x", (1, 2)).fail()
    ops = h.ops()
    assert [op.status for op in ops] == [OK, INFO, FAIL]
    assert ops[0].meta == ("node-1",) and ops[0].invoked == 1.0 and ops[0].completed == 2.0
    assert check(ops).ok


# -- generated from a sequential execution ------------------------------------------------------

SPACING = 10.0


@st.composite
def executions(draw, keys: int = 2, min_ops: int = 1, max_ops: int = 40, max_overlap: float = 35.0) -> list[Op]:
    """A real sequential execution of random operations on ``keys``
    registers, op ``i`` taking effect at ``i * SPACING``, each stretched
    over a random interval around that point (so up to ~7 overlap). Some
    writes and cas's end unknown (having taken effect or not), some fail
    (not taken effect); new values are unique."""
    n = draw(st.integers(min_ops, max_ops))
    values: dict[int, object] = dict.fromkeys(range(keys))
    seen: dict[int, list[object]] = {k: [None] for k in range(keys)}
    fresh = itertools.count(1)
    ops = []
    for i in range(n):
        key = draw(st.integers(0, keys - 1))
        kind = draw(st.sampled_from((READ, WRITE, CAS)))
        status = OK if kind == READ else draw(st.sampled_from((OK,) * 6 + (INFO, FAIL)))
        happens = status == OK or (status == INFO and draw(st.booleans()))
        point = i * SPACING
        invoked = point - draw(st.floats(0.5, max_overlap))
        completed = None if status == INFO else point + draw(st.floats(0.5, max_overlap))
        result = value = None
        if kind == READ:
            result = values[key]
        elif kind == WRITE:
            value = f"v{next(fresh)}"
            if happens:
                values[key] = value
        else:
            expected = draw(st.sampled_from(seen[key][-3:]))
            value = (expected, f"v{next(fresh)}")
            result = values[key] == expected if status == OK else None
            if happens and values[key] == expected:
                values[key] = value[1]
        if kind != READ and happens:
            seen[key].append(values[key])
        ops.append(Op(i, kind, key, value, result, invoked, completed, status))
    return ops


def stale_read(ops: list[Op]) -> tuple[int, object] | None:
    """A read to break and the value it cannot have returned: a value
    written by a write W1 that completed before a write W2 of another value
    was invoked, W2 completing before the read was invoked (values are
    unique, so nothing else writes it back)."""
    def sets(op: Op) -> object:  # the value an op that surely took effect left, else a marker
        if op.status != OK:
            return _NOTHING
        if op.kind == WRITE:
            return op.value
        if op.kind == CAS and op.result:
            return op.value[1]
        return _NOTHING

    writes = [op for op in ops if sets(op) is not _NOTHING]
    for i, read in enumerate(ops):
        if read.kind != READ:
            continue
        for w1, w2 in itertools.permutations(writes, 2):
            if (w1.key == w2.key == read.key and w1.completed < w2.invoked and w2.completed < read.invoked
                    and sets(w1) != read.result and sets(w1) != sets(w2)):
                return i, sets(w1)
    return None


_NOTHING = object()


@settings(max_examples=200, deadline=None)
@given(executions())
def test_every_history_of_a_real_execution_is_linearizable(ops):
    result = check(ops)
    assert result.ok is True, result.explain()


@settings(max_examples=150, deadline=None)
@given(executions(min_ops=12))
def test_an_injected_stale_read_is_found(ops):
    found = stale_read(ops)
    assume(found is not None)
    i, value = found
    ops[i] = replace(ops[i], result=value)
    result = check(ops)
    assert result.ok is False, result.explain()
    assert ops[i].key in [k for k, r in result.keys.items() if r.ok is False]


@settings(max_examples=100, deadline=None)
@given(executions(min_ops=4), st.data())
def test_a_read_of_a_value_nobody_wrote_is_found(ops, data):
    reads = [i for i, op in enumerate(ops) if op.kind == READ]
    assume(reads)
    i = data.draw(st.sampled_from(reads))
    ops[i] = replace(ops[i], result="never-written")
    assert check(ops).ok is False


# -- against brute force on small arbitrary histories ---------------------------------------------


def brute_force(ops: list[Op], initial: object = None) -> bool:
    """Every order of every allowed subset, checked directly."""
    must = [op for op in ops if op.status == OK]
    maybe = [op for op in ops if op.status == INFO and op.kind != READ]
    from tests.linearizability import _step

    for r in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, r):
            chosen = must + list(extra)
            for order in itertools.permutations(chosen):
                end = lambda op: op.completed if op.completed is not None else float("inf")
                if any(end(a) < b.invoked for j, b in enumerate(order) for a in order[j + 1:]):
                    continue  # a completed before b was invoked, yet comes after it
                state = initial
                for op in order:
                    accepted, state = _step(state, op)
                    if not accepted:
                        break
                else:
                    return True
    return False


@st.composite
def arbitrary_histories(draw) -> list[Op]:
    n = draw(st.integers(1, 6))
    ops = []
    for i in range(n):
        kind = draw(st.sampled_from((READ, WRITE, CAS)))
        status = OK if kind == READ else draw(st.sampled_from((OK, OK, INFO, FAIL)))
        small = st.sampled_from((None, 1, 2))
        invoked = draw(st.integers(0, 12))
        completed = None if status == INFO else invoked + draw(st.integers(0, 6))
        value = draw(small) if kind == WRITE else (draw(small), draw(small)) if kind == CAS else None
        result = draw(small) if kind == READ else draw(st.booleans()) if kind == CAS and status == OK else None
        ops.append(Op(i, kind, "x", value, result, float(invoked), None if completed is None else completed + 0.5,
                      status))
    return ops


@settings(max_examples=500, deadline=None)
@given(arbitrary_histories())
def test_agrees_with_brute_force(ops):
    assert check(ops).ok == brute_force([op for op in ops if op.status != FAIL])


# -- the size the cluster tests produce -----------------------------------------------------------


def test_a_ci_sized_history_is_checked_within_the_bound():
    """Three registers, ~300 operations each, ~8 in flight, 10% unknown: the
    shape of a cluster test's history. The bound on configurations is what
    keeps it fast (no timing assertion: the count is deterministic)."""
    rng = random.Random(34)
    ops: list[Op] = []
    values = {k: None for k in range(3)}
    fresh = itertools.count()
    for i in range(900):
        key = rng.randrange(3)
        kind = rng.choice((READ, WRITE, CAS))
        status = OK if kind == READ else rng.choice((OK,) * 9 + (INFO,))
        point = i * SPACING
        invoked, completed = point - rng.uniform(0, 40), point + rng.uniform(0, 40)
        value = result = None
        if kind == READ:
            result = values[key]
        elif kind == WRITE:
            value = values[key] = f"v{next(fresh)}"
        else:
            expected = values[key] if rng.random() < 0.5 else f"v{rng.randrange(max(1, i))}"
            value = (expected, f"v{next(fresh)}")
            result = values[key] == expected
            if result:
                values[key] = value[1]
        ops.append(Op(i % 16, kind, key, value, result, invoked, None if status == INFO else completed, status))
    result = check(ops)
    assert result.ok is True, result.explain()
    assert result.ops == 900
    assert max(k.configurations for k in result.keys.values()) < 20 * 300
