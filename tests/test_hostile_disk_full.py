"""A store on a real, small file system (a 24 MiB tmpfs, mounted for the
test; skipped when mounting is refused): how full the disk may get must not
depend on LMDB's growth step, a fresh store must open, and freeing a little
space must be enough to reopen and replay."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import kvstore
from kvstore.state import overlay
from wal.errors import DiskFullError, LogFailedError

MIB = 1 << 20


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 24 MiB tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_fresh_store_opens_on_a_24_mib_file_system(small_fs):
    path = os.path.join(small_fs, "store")
    with kvstore.open(path) as db:
        db.put(b"k", b"v")
        assert db.stats()["lmdb_map_bytes"] <= 8 * MIB
    with kvstore.open(path) as db:
        assert db.get(b"k") == b"v"


def test_writes_until_full_fail_once_clearly_and_2_mib_freed_is_enough_to_reopen(small_fs):
    filler = os.path.join(small_fs, "filler")
    with open(filler, "wb") as f:
        f.write(b"\1" * (2 * MIB))
    path = os.path.join(small_fs, "store")
    db = kvstore.open(path)
    acked = 0
    with pytest.raises(LogFailedError) as err:
        for i in range(100_000):
            db.put(b"k%08d" % i, os.urandom(2000))
            acked = i + 1
    assert isinstance(err.value, DiskFullError)
    assert _free(small_fs) < 2 * MIB  # the disk filled up, whatever LMDB's growth step
    message = str(err.value)
    failed = acked + 1
    assert f"failed at LSN {failed}" in message
    # the log's write or LMDB's apply may be the one to meet the full disk
    assert re.search(rf"LSNs up to {acked} (were acknowledged and )?are durable", message), message
    # One account of LSN `failed`, not "durable" in one sentence and "not acknowledged ... may not be there" in another.
    assert f"LSN {failed} and later were not acknowledged" not in message
    assert "every acknowledged write is in the log" not in message.lower()
    with pytest.raises(DiskFullError) as again:
        db.put(b"more", b"x")
    assert str(again.value) == message
    db.close()

    os.unlink(filler)  # free 2 MiB
    with kvstore.open(path) as db:
        # what LMDB lacked: the failed entry and what the overlay held (at most MAX_BYTES of values)
        assert db.replayed <= overlay.MAX_BYTES // 2000 + 2
        for i in range(acked):
            assert db.get(b"k%08d" % i) is not None, i
        assert len(db) in (acked, acked + 1)
        assert _free(small_fs) >= MIB // 2  # replaying took small steps of the map, not a doubling
