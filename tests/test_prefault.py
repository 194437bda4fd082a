"""kvstore/state/prefault.py: the map a bulk write fills is found and faulted in
ahead of it, without changing a byte of it."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

import kvstore
from kvstore.state import prefault
from kvstore.state.prefault import Prefault, map_address

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps, madvise: Linux")


def _rss_kib(address: int) -> int:
    """The resident KiB of the mapping that starts at ``address`` (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    start = f"{address:x}-"
    for i, line in enumerate(lines):
        if line.startswith(start):
            for field in lines[i + 1:]:
                if field.startswith("Rss:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping at {address:#x}")


def test_map_address_is_where_the_environment_maps_its_file(tmp_path):
    with kvstore.open(str(tmp_path / "s")) as db:
        db.put(b"k", b"v")
        env = db._state.lmdb
        data = os.path.join(env.path, "data.mdb")
        size = env.env.info()["map_size"]
        address = map_address(data, size)
        assert address is not None
        with open(data, "rb") as f:
            first = f.read(4096)  # LMDB's first meta page: its magic, the store's last txnid...
        assert ctypes.string_at(address, 4096) == first
        assert map_address(data, size * 4) is None  # no mapping of the file is that long
    assert map_address(str(tmp_path / "missing"), 4096) is None


def test_populating_faults_the_pages_in_and_changes_no_byte(tmp_path):
    # overlay=False: the put is in LMDB when it returns, and no flush of the overlay commits to
    # LMDB while the file is compared (on a loaded machine one did, between the two reads)
    with kvstore.open(str(tmp_path / "s"), overlay=False) as db:
        db.put(b"k", b"v")
        env = db._state.lmdb
        info = env.env.info()
        size = info["map_size"]
        data = os.path.join(env.path, "data.mdb")
        address = map_address(data, size)
        assert address is not None
        used = (info["last_pgno"] + 1) * 4096
        with open(data, "rb") as f:
            before = f.read(size)  # (the file, not the map: reading the map would fault it in)
        rss = _rss_kib(address)
        p = Prefault()
        p.start(address + used, size - used)
        p.wait()
        if not prefault._supported:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE")
        assert _rss_kib(address) - rss >= (size - used) // 1024 * 9 // 10  # (a page or so may be in already)
        with open(data, "rb") as f:
            assert f.read(size) == before
        assert db.get(b"k") == b"v"


def test_a_bulk_batch_that_grows_the_map_reads_back_whole(tmp_path):
    # make_room grows the map (8 -> 24+ MiB) and prefaults; the batch lands in those pages
    path = str(tmp_path / "s")
    pairs = [(i.to_bytes(8, "big"), os.urandom(100)) for i in range(60_000)]
    with kvstore.open(path) as db:
        with db.batch() as b:
            for k, v in pairs:
                b.put(k, v)
        assert db._state.lmdb.map_grows >= 1
    with kvstore.open(path) as db:
        assert list(db.scan()) == pairs


def _map_flags(path: str) -> set[str]:
    """The VmFlags of this process's mapping of ``path`` (/proc/self/smaps)."""
    flags: set[str] = set()
    with open("/proc/self/smaps") as f:
        ours = False
        for line in f:
            if "-" in line.split(" ", 1)[0] and not line.startswith("VmFlags"):
                ours = line.rstrip().endswith(path)
            elif ours and line.startswith("VmFlags:"):
                flags |= set(line.split()[1:])
    return flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's")
def test_a_snapshot_reads_the_map_ahead_and_gives_it_its_advice_back(tmp_path):
    """LMDB maps the store without readahead (``rr``: MADV_RANDOM); while a
    snapshot scans the map it is read ahead (``sr``: MADV_SEQUENTIAL,
    kvstore.state.prefault.SequentialScan), and after it random again."""
    seen: list[set[str]] = []
    with kvstore.open(tmp_path / "db", sync="none") as db:
        with db.batch() as b:
            for i in range(5000):
                b.put(b"k%06d" % i, os.urandom(100))
        data = os.path.realpath(tmp_path / "db" / "lmdb" / "data.mdb")
        before = _map_flags(data)
        if "rr" not in before:
            pytest.skip(f"this kernel shows no madvise flags in smaps ({sorted(before)})")
        db.snapshot(progress=lambda done, total: seen.append(_map_flags(data)), chunk_bytes=64 << 10)
        after = _map_flags(data)
    scanning, committed = seen[:-1], seen[-1]  # (the last report comes once the snapshot is committed)
    assert scanning and all("sr" in f and "rr" not in f for f in scanning), [sorted(f & {"sr", "rr"}) for f in seen]
    assert "rr" in committed and "sr" not in committed, committed
    assert "rr" in after and "sr" not in after, after
