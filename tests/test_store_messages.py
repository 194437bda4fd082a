"""What the store says to a mistaken call: ``db.keyspace("")`` names no
keyspace (it said "cannot be dropped"); a TTL that is not a number is a
TypeError (it was a ValueError); a write on a closed store names the store,
as a read does (a put named its log)."""

from __future__ import annotations

import pytest

import kvstore


def test_keyspace_of_the_empty_name_says_the_default_keyspace_is_the_store(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        with pytest.raises(ValueError, match="names no keyspace: the default keyspace is the store itself") as exc:
            db.keyspace("").put(b"k", b"v")
        assert "dropped" not in str(exc.value)
        with pytest.raises(ValueError, match="cannot be dropped"):
            db.drop_keyspace("")


def test_a_ttl_that_is_not_a_number_is_a_type_error(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        for ttl in ("5", b"5", None.__class__):
            with pytest.raises(TypeError, match="ttl must be a number of seconds"):
                db.put(b"k", b"v", ttl=ttl)
        with pytest.raises(TypeError):
            db.grant("10")
        for ttl in (0, -1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="positive number of seconds"):
                db.put(b"k", b"v", ttl=ttl)
        assert db.get(b"k") is None


def test_a_write_on_a_closed_store_names_the_store(tmp_path):
    path = str(tmp_path / "s")
    db = kvstore.open(path)
    db.close()
    writes = [lambda: db.put(b"k", b"v"), lambda: db.put(b"k", b"v", ttl=5), lambda: db.delete(b"k"),
              lambda: db.delete_range(None, None), lambda: db.keyspace("users").put(b"k", b"v"),
              lambda: db.compare_and_set(b"k", None, b"v")]
    for write in [*writes, lambda: db.get(b"k")]:
        with pytest.raises(kvstore.ClosedError) as exc:
            write()
        assert str(exc.value) == f"the store {path} is closed"
