"""A batch of puts says so (kvstore.entry.codec.PlainPuts), and only such a
batch: the state machine applies it without looking at its ops, so one that
held anything else would be applied wrongly."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
from kvstore.entry.codec import OP_PUT, PlainPuts
from kvstore.store.write_batch import WriteBatch

keys = st.binary(min_size=1, max_size=3)
values = st.binary(max_size=3)
keyspace_args = st.sampled_from([None, "", "ks"])
actions = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, values, keyspace_args),
    st.tuples(st.just("update"), st.lists(st.tuples(keys, values), max_size=3), keyspace_args),
    st.tuples(st.just("delete"), keys, keyspace_args),
    st.tuples(st.just("delete_range"), keys, keys, keyspace_args),
), max_size=12)


def _run(b: WriteBatch, steps: list) -> None:
    for step in steps:
        if step[0] == "put":
            b.put(step[1], step[2], keyspace=step[3])
        elif step[0] == "update":
            b.update(step[1], keyspace=step[2])
        elif step[0] == "delete":
            b.delete(step[1], keyspace=step[2])
        else:
            b.delete_range(step[1], step[2], keyspace=step[3])


def _plain(steps: list, own_keyspace: str) -> bool:
    """Do ``steps`` make puts only, all in the default keyspace (the
    batch's own, ``own_keyspace``, where a step names none)?"""
    for s in steps:
        if s[0] == "update" and not s[1]:
            continue  # adds nothing
        keyspace = own_keyspace if s[-1] is None else s[-1]
        if s[0] not in ("put", "update") or keyspace != "":
            return False
    return True


@given(actions, st.sampled_from(["", "ks"]))
def test_only_a_batch_of_puts_in_the_default_keyspace_is_plain(steps: list, own_keyspace: str) -> None:
    committed: list = []
    b = WriteBatch(lambda payload, ops: committed.append((payload, ops)) or 1, 1 << 20, 1 << 24, own_keyspace)
    _run(b, steps)
    b.commit()
    if not committed:
        assert len(b) == 0
        return
    payload, ops = committed[0]
    plain = _plain(steps, own_keyspace)
    assert (type(ops) is PlainPuts) == plain
    if plain:
        assert all(len(op) == 3 and op[0] == OP_PUT for op in ops)
    assert payload == msgpack.packb(list(ops), use_bin_type=True)  # the same bytes as any list of them


@settings(max_examples=40, deadline=None)
@given(actions)
def test_a_batch_applies_as_its_ops_say(tmp_path_factory, steps: list) -> None:
    # what the store holds after the batch, against a model of the ops (plain or not)
    path = str(tmp_path_factory.mktemp("s"))
    model: dict[str, dict[bytes, bytes]] = {"": {}, "ks": {}}
    for step in steps:
        ks = step[-1] or ""
        if step[0] == "put":
            model[ks][step[1]] = step[2]
        elif step[0] == "update":
            model[ks].update(step[1])
        elif step[0] == "delete":
            model[ks].pop(step[1], None)
        else:
            for k in [k for k in model[ks] if step[1] <= k < step[2]]:
                del model[ks][k]
    with kvstore.open(path) as db:
        with db.batch() as b:
            _run(b, steps)
        assert dict(db.scan()) == model[""]
        assert dict(db.keyspace("ks").scan()) == model["ks"]


def test_a_bulk_batch_of_puts_is_counted_and_applied(tmp_path) -> None:
    # over the state machine's bulk size (staged while the log syncs it), the path the marker skips
    pairs = [(b"%06d" % i, b"v%d" % i) for i in range(5000)]
    with kvstore.open(str(tmp_path / "s")) as db:
        with db.batch() as b:
            for k, v in reversed(pairs):  # (descending: not appended)
                b.put(k, v)
        assert db._state.puts == 5000
        assert list(db.scan()) == pairs
