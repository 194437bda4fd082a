"""After ``walkv repair --salvage --yes`` every command reads the store
(issue 33 item 9: ``walkv scan`` refused with "open it read-write once to
rebuild its state", and no command said how); a store whose state only a
read-write open can rebuild names the command that does it, and ``walkv
repair`` on its whole log does just that."""

from __future__ import annotations

import json
import os

import kvstore
from kvstore.store.repair import repair_store
from tests.test_cli import one_line_error, walkv
from tests.test_cli_files import _flip, _records, _store
from wal.segment import list_segments


def _damaged(path: str) -> tuple[str, int]:
    """A store of 400 puts with one bad record in a sealed segment: the store, the bad LSN."""
    s = _store(path)
    seg = list_segments(os.path.join(s, "wal"))[1].path
    rows = _records(seg)
    victim = rows[len(rows) // 2]
    _flip(seg, victim["offset"] + 30)
    return s, victim["lsn"]


def test_every_command_reads_the_store_after_a_salvage(tmp_path):
    s, bad = _damaged(str(tmp_path / "s"))
    fixed = walkv("repair", s, "--salvage", "--yes")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "every command reads the store now" in fixed.stdout
    scan = walkv("scan", s, "--keys-only")
    assert scan.returncode == 0, scan.stderr
    keys = scan.stdout.split()
    assert len(keys) == 399 and f"k{bad - 1:05d}" not in keys  # the one lost write
    assert walkv("get", s, "k00000").stdout == "AAAAAAAAAA" * 30 + "\n"
    stats = json.loads(walkv("stats", s, "--json").stdout)
    assert "state_error" not in stats and stats["applied_lsn"] == 400 and stats["keys"] == 399
    assert walkv("verify", s).returncode == 0
    assert walkv("keyspaces", s).returncode == 0
    assert walkv("put", s, "new", "x").returncode == 0


def test_a_state_marked_for_rebuild_names_the_command_and_repair_rebuilds_it(tmp_path):
    s, _bad = _damaged(str(tmp_path / "s"))
    repair_store(s, os.path.join(s, "wal"), salvage=True)  # the library's repair: LMDB marked, not rebuilt
    refused = walkv("scan", s)
    assert refused.returncode == 1
    assert f"`walkv repair {s}` does that" in one_line_error(refused)
    with_hint = walkv("stats", s)
    assert with_hint.returncode == 0 and f"walkv repair {s}" in with_hint.stdout
    whole = walkv("repair", s)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "nothing to cut" in whole.stdout and "rebuilt" in whole.stdout
    assert walkv("scan", s, "--count").stderr.strip() == "399 keys"
    again = walkv("repair", s)
    assert again.returncode == 0 and "the state" not in again.stdout


def test_a_store_never_opened_for_writing_names_repair(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.put(b"k", b"v")
    lmdb = os.path.join(str(tmp_path / "s"), "lmdb")
    for name in os.listdir(lmdb):
        os.unlink(os.path.join(lmdb, name))
    os.rmdir(lmdb)
    refused = walkv("get", str(tmp_path / "s"), "k")
    assert refused.returncode == 1 and "walkv repair" in one_line_error(refused)
    assert walkv("repair", str(tmp_path / "s")).returncode == 0
    assert walkv("get", str(tmp_path / "s"), "k").stdout == "v\n"
