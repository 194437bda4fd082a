"""snapshot.copy: a snapshot's chunks copied byte for byte under another
store's name. Round trips with sections and bookkeeping (hypothesis); a
chunk that changed since its snapshot was opened is corruption and nothing
is committed; a snapshot already at the LSN is refused. And
Snapshot.verify_checksums, the whole-file check a rebuild or restore makes
before loading: a flipped byte, a truncated or an extended chunk."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from wal.errors import CorruptionError, Damage, SnapshotError

maps = st.dictionaries(st.binary(max_size=12), st.binary(max_size=200), max_size=60)
names = st.text(st.characters(codec="utf-8", min_codepoint=33), min_size=1, max_size=20)


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(default=maps, sections=st.dictionaries(names, maps, max_size=3), chunk_bytes=st.integers(1, 2048),
       data=st.data())
def test_a_copy_reads_as_its_source_under_the_new_store_id(tmp_path_factory, default, sections, chunk_bytes, data):
    bookkeeping = data.draw(st.sets(st.sampled_from(sorted(sections))) if sections else st.just(set()))
    src_parent, dst_parent = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dst")
    info = snapshot.write(src_parent, 12, sorted(default.items()),
                          sections={n: sorted(m.items()) for n, m in sections.items()},
                          bookkeeping=bookkeeping, chunk_bytes=chunk_bytes, record_bytes=128, store_id="old")
    source = snapshot.open(info.path)
    copied = snapshot.copy(source, dst_parent, store_id="new")
    assert (copied.lsn, copied.count, copied.bytes, copied.chunks) == (info.lsn, info.count, info.bytes, info.chunks)
    assert copied.store_id == "new" and copied.path == os.path.join(dst_parent, os.path.basename(info.path))
    snap = snapshot.open(copied.path)
    snap.verify()
    assert snap.store_id == "new"
    assert list(snap.items()) == sorted(default.items())
    assert snap.section_names() == sorted(sections)
    for name, pairs in sections.items():
        assert list(snap.section_items(name)) == sorted(pairs.items())
    assert snap.manifest.bookkeeping == source.manifest.bookkeeping
    assert snap.all_chunks == source.all_chunks


@pytest.fixture
def source(tmp_path):
    info = snapshot.write(tmp_path / "src", 7, [(b"%05d" % i, b"v" * 50) for i in range(2000)],
                          chunk_bytes=16 << 10, store_id="old")
    return snapshot.open(info.path)


def test_a_chunk_changed_since_it_was_opened_is_corruption_and_nothing_is_committed(tmp_path, source):
    victim = source.all_chunks[-1]
    path = os.path.join(source.path, victim.name)
    with open(path, "r+b") as f:  # same size, one byte flipped: only the CRC can tell
        f.seek(victim.bytes // 2)
        byte = f.read(1)
        f.seek(victim.bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    dst = tmp_path / "dst"
    with pytest.raises(CorruptionError) as err:
        snapshot.copy(source, dst, store_id="new")
    assert err.value.kind == Damage.CHECKSUM and victim.name in str(err.value)
    assert snapshot.list_snapshots(dst) == [] and os.listdir(dst) == []  # no leftover either


def test_a_snapshot_already_at_the_lsn_is_refused(tmp_path, source):
    dst = tmp_path / "dst"
    snapshot.copy(source, dst, store_id="new")
    with pytest.raises(SnapshotError, match="already exists"):
        snapshot.copy(source, dst, store_id="other")
    assert [s.store_id for s in snapshot.list_snapshots(dst)] == ["new"]


def _flip_middle(path: str) -> None:
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage, kind", [
    (_flip_middle, Damage.CHECKSUM),
    (lambda path: os.truncate(path, os.path.getsize(path) - 1), Damage.FRAMING),
    (lambda path: open(path, "ab").write(b"x"), Damage.TOO_LARGE),
], ids=["flipped", "truncated", "extended"])
def test_verify_checksums_finds_a_damaged_chunk_file(tmp_path, damage, kind):
    info = snapshot.write(tmp_path / "s", 7, [(b"%05d" % i, b"v" * 50) for i in range(2000)], chunk_bytes=16 << 10)
    snap = snapshot.open(info.path)
    snap.verify_checksums()  # whole: no error
    victim = snap.all_chunks[1]
    damage(os.path.join(info.path, victim.name))  # after the open: its checks of the sizes passed
    with pytest.raises(CorruptionError) as err:
        snap.verify_checksums()
    assert err.value.kind == kind and victim.name in str(err.value)
