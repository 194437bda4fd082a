"""``walkv inspect`` on a segment that holds every op code of the entry format
(:data:`kvstore.entry.codec.OP_NAMES`, the one full list): each is listed by
its name and none is mislabelled, so a new op code cannot be forgotten by
inspect; ``--limit`` counts entries, not the segment's header; ``--raw``
honours ``--from-lsn``."""

from __future__ import annotations

import json
import os

import pytest

import kvstore
from kvstore.cli.entry_text import OP_TEXT
from kvstore.entry import codec
from kvstore.store.clock import ManualClock
from tests.test_cli import walkv
from wal.errors import LeaseNotFoundError
from wal.segment import list_segments


def test_op_names_is_the_full_list_of_op_codes():
    codes = {v for k, v in vars(codec).items() if k.startswith("OP_") and isinstance(v, int)}
    assert set(codec.OP_NAMES) == codes
    assert len(set(codec.OP_NAMES.values())) == len(codes)
    assert set(OP_TEXT) == codes  # inspect has a line for each


def _every_op(path: str) -> str:
    """A store whose one segment holds every op code; its segment's path."""
    clock = ManualClock()
    with kvstore.open(path, clock=clock, sweep_interval=None) as db:
        db.delete_range(b"a", None)                                   # delete_range (unbounded end)
        db.put(b"plain", b"1")                                        # put
        db.delete(b"gone")                                            # delete
        db.put(b"short", b"lived", ttl=5)                             # put_expiring
        lease = db.grant(60)                                          # grant
        db.put(b"leased", b"v", lease=lease)                          # put_leased
        lease.keepalive()                                             # keepalive
        db.revoke(lease)                                              # revoke
        with pytest.raises(LeaseNotFoundError):
            db.put(b"late", b"v", lease=lease)                        # failed + require_lease
        with db.transaction() as t:                                   # require_*: conditions that hold
            t.require(b"plain", equals=b"1")
            t.require(b"nobody", absent=True)
            t.require(b"plain", present=True)
            t.put(b"plain", b"2")
        assert t.succeeded
        assert not db.compare_and_set(b"plain", b"wrong", b"3")       # failed + require_equals
        db.keyspace("users").put(b"u1", b"x")                         # keyspace
        db.drop_keyspace("users")                                     # drop_keyspace
        db.write_group(iter([[[1, b"g", b"1"]]]), [[2, b"g"]])        # group_part, group_commit

        def parts_then_failure():
            yield [[1, b"lost", b"1"]]
            raise RuntimeError("the job failed")
        with pytest.raises(RuntimeError):
            db.write_group(parts_then_failure())                      # group_abort
        clock.advance(10)
        assert db.sweep_expired() == 1                                # expire
    return list_segments(os.path.join(path, "wal"))[0].path


def test_inspect_lists_every_op_code_by_name(tmp_path):
    seg = _every_op(str(tmp_path / "s"))
    proc = walkv("inspect", seg, "--json", "--ops")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(ln) for ln in proc.stdout.splitlines()][1:]
    assert all("problem" not in r for r in rows), rows
    seen = {op["op"] for r in rows for op in r["ops"]}
    assert seen == set(codec.OP_NAMES.values())
    by_summary = [r["summary"] for r in rows]
    ttl = next(s for s in by_summary if s.startswith("put short"))
    assert "expires" in ttl and "require" not in ttl  # a TTL put was shown as "require session:1 present"
    assert "put u1 = x (1 B) (keyspace users)" in by_summary
    assert "drop keyspace users" in by_summary
    assert "delete_range [a, (end of keys))" in by_summary
    assert any(s.startswith("failed: condition") for s in by_summary)
    assert any(s.startswith("expire short") for s in by_summary)
    text = walkv("inspect", seg, "--ops")
    assert text.returncode == 0, text.stderr
    assert "grant lease" in text.stdout and "revoke lease" in text.stdout


def _ten_puts(path: str) -> str:
    """A store of LSNs 1..10; its segment's path."""
    with kvstore.open(path) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v")
    return list_segments(os.path.join(path, "wal"))[0].path


def test_inspect_limit_counts_entries_not_the_header(tmp_path):
    seg = _ten_puts(str(tmp_path / "s"))
    rows = [json.loads(ln) for ln in walkv("inspect", seg, "--json", "--limit", "3").stdout.splitlines()]
    assert rows[0]["offset"] == 0 and "header" in rows[0]
    assert [r["lsn"] for r in rows[1:]] == [1, 2, 3]
    rows = [json.loads(ln) for ln in walkv("inspect", seg, "--json", "--limit", "2", "--from-lsn", "5")
            .stdout.splitlines()]
    assert [r.get("lsn") for r in rows] == [None, 5, 6]


def test_inspect_raw_honours_from_lsn(tmp_path):
    seg = _ten_puts(str(tmp_path / "s"))
    records = [json.loads(ln) for ln in walkv("inspect", seg, "--json").stdout.splitlines()]
    at = {r["lsn"]: r["offset"] for r in records if "lsn" in r}
    proc = walkv("inspect", seg, "--raw", "--json", "--from-lsn", "7")
    assert proc.returncode == 0, proc.stderr
    offsets = [json.loads(ln)["offset"] for ln in proc.stdout.splitlines()]
    assert offsets == [0, at[7], at[8], at[9], at[10]]  # the header, then LSN 7 on
    proc = walkv("inspect", seg, "--raw", "--json", "--from-lsn", "7", "--limit", "2")
    assert [json.loads(ln)["offset"] for ln in proc.stdout.splitlines()] == [0, at[7], at[8]]
    assert walkv("inspect", seg, "--raw", "--from-lsn", "99").stdout.splitlines()[-1] == "1 fragments"


@pytest.mark.parametrize("args", [["--limit", "-1"]])
def test_inspect_negative_limit_is_a_usage_error(tmp_path, args):
    proc = walkv("inspect", str(tmp_path / "x.wal"), *args)
    assert proc.returncode == 2 and "--limit" in proc.stderr
