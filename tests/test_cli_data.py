"""What the ``walkv`` command line reads and writes as data: ``scan --json |
load`` copies any bytes (keys and values that are not UTF-8 go as hex under
``key_hex``/``value_hex``), and ``inspect`` refuses a file that is not a
segment or chunk (exit 4) instead of listing "0 records"."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore
from tests.test_cli import one_line_error, walkv

_dirs = itertools.count()

# Keys: arbitrary bytes and UTF-8 text (LMDB keys are 1..511 bytes); values: arbitrary bytes and text.
keys = st.one_of(st.binary(min_size=1, max_size=64), st.text(min_size=1, max_size=32).map(str.encode))
values = st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode))


def _fill(path: str, pairs: dict[bytes, bytes]) -> None:
    with kvstore.open(path) as db:
        db.update(pairs)


def test_the_binary_key_00ff_survives_scan_json_and_load(tmp_path):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pairs = {b"\x00\xff": b"\xfe\x00", b"text": "wörld".encode(), b"\xc3": b"half of \xc3\xa9"[:-1]}
    _fill(src, pairs)
    dump = walkv("scan", src, "--json")
    assert dump.returncode == 0, dump.stderr
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert rows == [{"key_hex": "00ff", "value_hex": "fe00"}, {"key": "text", "value": "wörld"},
                    {"key_hex": "c3", "value_hex": "68616c66206f6620c3"}]
    load = walkv("load", dst, "-", input=dump.stdout)
    assert load.returncode == 0, load.stderr
    with kvstore.open(dst) as db:
        assert dict(db.scan()) == pairs
        assert db.get(bytes.fromhex("005c786666")) is None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.dictionaries(keys, values, min_size=1, max_size=60))
def test_scan_json_then_load_is_lossless_for_any_bytes(tmp_path, pairs):
    n = next(_dirs)
    src, dst = str(tmp_path / f"src{n}"), str(tmp_path / f"dst{n}")
    _fill(src, pairs)
    dump = walkv("scan", src, "--json")
    assert dump.returncode == 0, dump.stderr
    load = walkv("load", dst, "-", "--format", "jsonl", input=dump.stdout)
    assert load.returncode == 0, load.stderr
    with kvstore.open(dst) as db:
        assert dict(db.scan()) == pairs
    keys_only = walkv("scan", src, "--json", "--keys-only")
    from kvstore.cli.kv import _json_field

    got = [_json_field(json.loads(line), "key", False, 1) for line in keys_only.stdout.splitlines()]
    assert got == sorted(pairs)


@settings(max_examples=500, deadline=None)
@given(key=keys, value=values, hex_mode=st.booleans())
def test_a_json_row_reads_back_to_the_same_bytes(key, value, hex_mode):
    from kvstore.cli.kv import _json_field, json_row

    row = json.loads(json_row(key, value, hex_mode))
    assert (_json_field(row, "key", hex_mode, 1), _json_field(row, "value", hex_mode, 1)) == (key, value)
    if not hex_mode:  # text stays text: only bytes that are not UTF-8 go as hex
        for name, data in (("key", key), ("value", value)):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                assert row == {**row, f"{name}_hex": data.hex()} and name not in row
            else:
                assert row[name] == text and f"{name}_hex" not in row


@pytest.mark.parametrize("line, says", [
    ('{"key": "a", "key_hex": "61", "value": "v"}', 'give the key once, as "key" or as "key_hex", not both'),
    ('{"key_hex": "zz", "value": "v"}', "key_hex is not valid hex"),
    ('{"key": "\\udcff", "value": "v"}', "key is not valid Unicode text (a lone surrogate)"),
    ('{"key": "a"}', 'no value: expected an object'),
    ('{"key": "a", "value_hex": 7}', "the value must be a JSON string"),
])
def test_load_refuses_a_json_line_it_cannot_read_exactly(tmp_path, line, says):
    proc = walkv("load", str(tmp_path / "s"), "-", "--format", "jsonl", input=line + "\n")
    assert proc.returncode == 1
    assert says in one_line_error(proc) and "line 1" in one_line_error(proc)


# -- inspect ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, content", [
    ("notes.txt", b"hello\n"),
    ("empty", b""),
    ("random.wal", bytes(range(256)) * 200),
    ("zeros.wal", bytes(70000)),
    ("fake.wkc", b"not a chunk\n"),
])
def test_inspect_refuses_a_file_that_is_not_a_segment(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    proc = walkv("inspect", str(path))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    line = one_line_error(proc)
    what = "snapshot chunk" if name.endswith(".wkc") else "log segment"
    assert f"not a walkv {what}" in line and str(path) in line and "inspect --raw" in line
    assert "0 records" not in proc.stdout


def test_inspect_still_lists_segments_chunks_and_broken_pieces(tmp_path):
    s = str(tmp_path / "s")
    with kvstore.open(s) as db:
        db.put(b"k", b"v")
        snap = db.snapshot()
    seg = os.path.join(s, "wal", sorted(os.listdir(os.path.join(s, "wal")))[0])
    proc = walkv("inspect", seg)
    assert proc.returncode == 0 and "1 records" in proc.stdout, proc.stderr
    chunk = os.path.join(snap.path, next(n for n in os.listdir(snap.path) if n.endswith(".wkc")))
    assert walkv("inspect", chunk).returncode == 0
    piece = tmp_path / "00000000000000000001.wal.broken"  # what repair keeps: bytes cut from a segment
    piece.write_bytes(b"\x01" * 100)
    proc = walkv("inspect", str(piece))
    assert proc.returncode in (0, 4) and "not a walkv" not in proc.stderr
