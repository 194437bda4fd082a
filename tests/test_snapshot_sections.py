"""snapshot/: named sections beside the default one. Round trips (hypothesis),
manifests without sections stay version 2 and read as before, damage in a
section is found by verify, and a manifest's sections are checked as
untrusted input."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot.manifest import decode_manifest
from tests.test_snapshot_damage import _flip, _frame, _manifest_body, _mutate, _set
from wal.errors import CorruptionError

keys = st.binary(max_size=12)
values = st.binary(max_size=200)
section_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=100)
maps = st.dictionaries(keys, values, max_size=60)


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(default=maps, sections=st.dictionaries(section_names, maps, max_size=4),
       chunk_bytes=st.integers(1, 2048), bounds=st.tuples(st.none() | keys, st.none() | keys))
def test_sections_round_trip(tmp_path_factory, default, sections, chunk_bytes, bounds):
    parent = tmp_path_factory.mktemp("snaps")
    info = snapshot.write(parent, 9, sorted(default.items()),
                          sections={n: iter(sorted(m.items())) for n, m in sections.items()},
                          chunk_bytes=chunk_bytes, record_bytes=128)
    total = len(default) + sum(map(len, sections.values()))
    assert info.count == total
    snap = snapshot.open(info.path)
    snap.verify()
    assert snap.count == total
    assert list(snap.items()) == sorted(default.items())
    assert snap.section_names() == sorted(sections)
    start, stop = bounds
    for name, pairs in sections.items():
        assert list(snap.section_items(name)) == sorted(pairs.items())
        assert list(snap.section_items(name, start, stop)) == sorted(
            (k, v) for k, v in pairs.items() if (start is None or k >= start) and (stop is None or k < stop))
        assert all(c.section == name for c in snap.section_chunks(name))
    assert list(snap.section_items("")) == sorted(default.items())
    # Chunk files are distinct, numbered in file order across sections; each
    # chunk holds one section only.
    assert [c.index for c in snap.all_chunks] == list(range(len(snap.all_chunks)))
    assert snap.chunks == tuple(c for c in snap.all_chunks if c.section == "")
    assert sum(c.pairs for c in snap.all_chunks) == total
    assert _manifest_body(info.path)["version"] == (3 if sections else 2)


def test_a_snapshot_without_sections_is_written_as_before(tmp_path):
    """Version 2, no "sections" and no chunk "section": what walkv before
    sections writes and reads."""
    pairs = [(b"k%04d" % i, b"v" * 50) for i in range(200)]
    info = snapshot.write(tmp_path, 4, pairs, chunk_bytes=2048)
    body = _manifest_body(info.path)
    assert body["version"] == 2 and "sections" not in body
    assert set(body) == {"format", "version", "lsn", "store_id", "created_us", "count", "bytes",
                         "max_record_bytes", "chunks"}
    assert all(set(c) == {"name", "first_key", "last_key", "records", "pairs", "bytes", "crc32c"}
               for c in body["chunks"])
    snap = snapshot.open(info.path)
    assert snap.section_names() == [] and snap.all_chunks == snap.chunks and list(snap) == pairs


def test_old_manifests_ignore_a_section_key(tmp_path):
    """Below version 3 "section" is an unknown key (ignored, as every unknown
    key is): a version-2 manifest reads exactly as walkv before sections read it."""
    pairs = [(b"k%04d" % i, b"v" * 50) for i in range(200)]
    info = snapshot.write(tmp_path, 4, pairs, chunk_bytes=2048)
    _mutate(info.path, lambda body: body["chunks"][0].__setitem__("section", "ks:x"))
    snap = snapshot.open(info.path)
    assert snap.section_names() == [] and list(snap) == pairs


def test_an_empty_section_is_listed(tmp_path):
    info = snapshot.write(tmp_path, 1, [], sections={"b": [], "a": [(b"k", b"v")]})
    snap = snapshot.open(info.path)
    assert snap.section_names() == ["a", "b"]
    assert list(snap.section_items("b")) == [] and list(snap.section_items("a")) == [(b"k", b"v")]
    assert list(snap) == [] and snap.count == 1
    with pytest.raises(KeyError, match="no section 'c'"):
        snap.section_chunks("c")


def test_the_same_keys_in_two_sections(tmp_path):
    pairs = [(b"k%03d" % i, b"%d" % i) for i in range(100)]
    other = [(k, v + b"!") for k, v in pairs]
    info = snapshot.write(tmp_path, 2, pairs, sections={"x": other}, chunk_bytes=512)
    snap = snapshot.open(info.path)
    assert list(snap) == pairs and list(snap.section_items("x")) == other


@pytest.mark.parametrize("name", ["", "x" * 101, b"ks:x", 5])
def test_bad_section_names_are_refused_before_writing(tmp_path, name):
    with pytest.raises(ValueError, match="section name"):
        snapshot.write(tmp_path, 1, [], sections={name: []})
    assert os.listdir(tmp_path) == []


@pytest.fixture
def sectioned(tmp_path):
    pairs = [(b"key%05d" % i, b"value-%d" % i * 3) for i in range(400)]
    info = snapshot.write(tmp_path, 7, pairs[:100], sections={"a": pairs, "b": pairs[:50]},
                          chunk_bytes=2048, record_bytes=300)
    snap = snapshot.open(info.path)
    assert len(snap.section_chunks("a")) >= 3
    return snap


def test_damage_in_a_section_is_found_by_verify(sectioned):
    bad = sectioned.section_chunks("a")[1]
    path = os.path.join(sectioned.path, bad.name)
    _flip(path, bad.bytes // 2)
    assert len(list(sectioned.items())) == 100  # the default section is not read
    with pytest.raises(CorruptionError) as e:
        sectioned.verify()
    assert e.value.path == path
    with pytest.raises(CorruptionError):
        list(sectioned.section_items("a"))
    with pytest.raises(CorruptionError):
        snapshot.verify(sectioned.path)


def _section_of(i):
    return lambda body: body["chunks"][i].__setitem__("section", "zz")


@pytest.mark.parametrize(
    "fn,match",
    [
        (_section_of(0), "not one of the manifest's 'sections'"),
        (_set(["sections"], ["b", "a"]), "not sorted and distinct"),
        (_set(["sections"], ["a", "a", "b"]), "not sorted and distinct"),
        (_set(["sections"], ["", "a", "b"]), "1 to 100 characters"),
        (_set(["sections"], ["a", b"b"]), "is a str"),
        (_set(["sections"], "ab"), "not an array"),
        (lambda body: body.pop("sections"), "no 'sections'"),
        (lambda body: body["chunks"].reverse(), "comes after"),
        (lambda body: body["chunks"][-1].__setitem__("section", 7), "not one of"),
        # a chunk moved into the next section breaks that section's key order
        (lambda body: body["chunks"][-2].__setitem__("section", "b"), "overlaps|comes after"),
    ],
)
def test_manifest_sections_are_checked(sectioned, fn, match):
    _mutate(sectioned.path, fn)
    with pytest.raises(CorruptionError, match=match) as e:
        snapshot.open(sectioned.path)
    assert e.value.path == os.path.join(sectioned.path, "MANIFEST")


@settings(deadline=None, max_examples=200)
@given(sections=st.none() | st.lists(st.none() | st.integers() | st.text(max_size=3) | st.binary(max_size=2),
                                     max_size=3),
       chunk_sections=st.lists(st.none() | st.integers(0, 2) | st.text(max_size=3), min_size=2, max_size=2))
def test_any_sections_are_valid_or_corruption(sections, chunk_sections):
    chunk = {"name": "c0", "first_key": b"a", "last_key": b"b", "records": 1, "pairs": 2,
             "bytes": 100, "crc32c": 5}
    chunks = [chunk, dict(chunk, name="c1", first_key=b"c", last_key=b"d")]
    for c, s in zip(chunks, chunk_sections):
        if s is not None:
            c["section"] = s
    body = {"format": "walkv-snapshot", "version": 3, "lsn": 3, "store_id": None, "created_us": 1,
            "count": 4, "bytes": 200, "max_record_bytes": 1 << 20, "chunks": chunks}
    if sections is not None:
        body["sections"] = sections
    try:
        m = decode_manifest(_frame([msgpack.packb(body, use_bin_type=True)]), "M")
    except CorruptionError as e:
        assert e.path == "M"
    else:
        assert all(c.section == "" or c.section in m.sections for c in m.chunks)
        assert [c.section for c in m.chunks] == sorted(c.section for c in m.chunks)
