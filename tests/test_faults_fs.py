"""The fault-injection file system itself (tests/faultfs.py): each fault does
exactly what it says, so the suites built on it prove what they claim."""

from __future__ import annotations

import errno
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faultfs import SECTOR, FaultFS, SimulatedCrash, file_mode
from wal.fs import OS_FS


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def make(fs: FaultFS, path, data: bytes, *, sync=True, dir_sync=True) -> None:
    f = fs.open(str(path), create=True)
    f.pwrite(data, 0)
    if sync:
        f.sync()
    f.close()
    if dir_sync:
        fs.fsync_dir(os.path.dirname(str(path)))


# -- power loss: data --------------------------------------------------------------


def test_unsynced_write_is_dropped_synced_write_kept(tmp_path):
    fs = FaultFS()
    p = tmp_path / "a"
    make(fs, p, b"hello")
    f = fs.open(str(p))
    f.pwrite(b"HE", 0)
    f.sync()
    f.pwrite(b"XXXXXXXX", 3)  # overwrites and extends, never synced
    assert read(p) == b"HElXXXXXXXX"
    fs.power_loss()
    assert read(p) == b"HEllo"


def test_truncate_and_preallocate_are_undone(tmp_path):
    fs = FaultFS()
    p = tmp_path / "a"
    make(fs, p, b"0123456789")
    f = fs.open(str(p))
    f.truncate(4)
    f.preallocate(4, 100)
    f.write_zeros(0, 2)
    f.pwrite(b"zz", 50)
    assert os.path.getsize(p) == 104
    fs.power_loss()
    assert read(p) == b"0123456789"
    g = fs.open(str(p))
    g.truncate(20)  # growth is undone too
    fs.power_loss()
    assert read(p) == b"0123456789"


def test_file_existing_before_tracking_counts_as_durable(tmp_path):
    p = tmp_path / "old"
    p.write_bytes(b"before")
    fs = FaultFS()
    f = fs.open(str(p))
    f.pwrite(b"after!", 0)
    fs.power_loss()
    assert read(p) == b"before"


def test_untracked_files_survive(tmp_path):
    fs = FaultFS()
    (tmp_path / "lmdb").write_bytes(b"not ours")
    make(fs, tmp_path / "x", b"1", dir_sync=False)
    fs.power_loss()
    assert read(tmp_path / "lmdb") == b"not ours"
    assert not (tmp_path / "x").exists()


# -- power loss: names ----------------------------------------------------------------


def test_created_file_needs_a_directory_fsync(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "synced", b"data")
    make(fs, tmp_path / "nofilesync", b"data", sync=False)
    make(fs, tmp_path / "nodirsync", b"data", dir_sync=False)
    fs.power_loss()
    assert sorted(os.listdir(tmp_path)) == ["nofilesync", "synced"]
    assert read(tmp_path / "synced") == b"data"
    assert read(tmp_path / "nofilesync") == b""  # the name made it, the data did not


def test_rename_reverted_without_directory_fsync(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "old", b"OLD")
    make(fs, tmp_path / "tmp", b"NEW")
    fs.rename(str(tmp_path / "tmp"), str(tmp_path / "old"))
    assert read(tmp_path / "old") == b"NEW"
    fs.power_loss()
    assert read(tmp_path / "old") == b"OLD"
    assert read(tmp_path / "tmp") == b"NEW"
    fs.rename(str(tmp_path / "tmp"), str(tmp_path / "old"))
    fs.fsync_dir(str(tmp_path))
    fs.power_loss()
    assert os.listdir(tmp_path) == ["old"] and read(tmp_path / "old") == b"NEW"


def test_renamed_file_keeps_unsynced_state_rules(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "a", b"synced")
    f = fs.open(str(tmp_path / "a"))
    f.pwrite(b"UNSYNC", 0)
    fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))
    fs.fsync_dir(str(tmp_path))
    fs.power_loss()
    assert os.listdir(tmp_path) == ["b"] and read(tmp_path / "b") == b"synced"


def test_cross_directory_rename_needs_both_fsyncs(tmp_path):
    fs = FaultFS()
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    make(fs, tmp_path / "d1" / "f", b"x")
    fs.rename(str(tmp_path / "d1" / "f"), str(tmp_path / "d2" / "f"))
    fs.fsync_dir(str(tmp_path / "d2"))
    fs.power_loss()
    assert os.listdir(tmp_path / "d1") == ["f"] and os.listdir(tmp_path / "d2") == []
    fs.rename(str(tmp_path / "d1" / "f"), str(tmp_path / "d2" / "f"))
    fs.fsync_dir(str(tmp_path / "d2"))
    fs.fsync_dir(str(tmp_path / "d1"))
    fs.power_loss()
    assert os.listdir(tmp_path / "d1") == [] and read(tmp_path / "d2" / "f") == b"x"


def test_unlink_reverted_to_synced_content(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "a", b"synced")
    f = fs.open(str(tmp_path / "a"))
    f.pwrite(b"dirty!", 0)
    f.close()
    fs.unlink(str(tmp_path / "a"))
    fs.power_loss()
    assert read(tmp_path / "a") == b"synced"
    fs.unlink(str(tmp_path / "a"))
    fs.fsync_dir(str(tmp_path))
    fs.power_loss()
    assert not (tmp_path / "a").exists()


def test_mkdir_not_fsynced_loses_the_whole_tree(tmp_path):
    fs = FaultFS()
    fs.mkdir(str(tmp_path / "d"))
    fs.mkdir(str(tmp_path / "d" / "e"))
    make(fs, tmp_path / "d" / "e" / "f", b"x")  # fsyncs d/e, not d nor tmp_path
    assert file_mode(tmp_path / "d") == 0o700 and file_mode(tmp_path / "d" / "e" / "f") == 0o600
    fs.power_loss()
    assert not (tmp_path / "d").exists()
    fs.makedirs(str(tmp_path / "d" / "e"))  # fsyncs the parent of each level it creates
    make(fs, tmp_path / "d" / "e" / "f", b"x")
    fs.power_loss()
    assert read(tmp_path / "d" / "e" / "f") == b"x"


def test_rmdir_reverted(tmp_path):
    fs = FaultFS()
    (tmp_path / "d").mkdir()
    fs.rmdir(str(tmp_path / "d"))
    fs.power_loss()
    assert (tmp_path / "d").is_dir()


def test_removed_tree_with_only_the_parent_fsynced(tmp_path):
    """Unlink files, rmdir their directory, fsync only the parent (the
    directory itself is gone): the whole removal is durable."""
    fs = FaultFS()
    fs.makedirs(str(tmp_path / "d"))
    fs.fsync_dir(str(tmp_path))
    make(fs, tmp_path / "d" / "f", b"x")
    make(fs, tmp_path / "d" / "g", b"y")
    fs.unlink(str(tmp_path / "d" / "f"))
    fs.unlink(str(tmp_path / "d" / "g"))
    fs.rmdir(str(tmp_path / "d"))
    fs.fsync_dir(str(tmp_path))
    fs.power_loss()
    assert os.listdir(tmp_path) == []
    # and without the parent fsync, all of it comes back
    fs.makedirs(str(tmp_path / "d"))
    fs.fsync_dir(str(tmp_path))
    make(fs, tmp_path / "d" / "f", b"x")
    fs.unlink(str(tmp_path / "d" / "f"))
    fs.rmdir(str(tmp_path / "d"))
    fs.power_loss()
    assert os.listdir(tmp_path / "d") == ["f"] and read(tmp_path / "d" / "f") == b"x"


def test_directory_rename_commit_protocol(tmp_path):
    """The snapshot writer's protocol: files in a temp dir, fsync it, rename
    the dir, fsync the parent. Crash before the parent fsync: no snapshot."""
    fs = FaultFS()
    tmp = tmp_path / "snap.tmp"
    fs.makedirs(str(tmp))
    fs.fsync_dir(str(tmp_path))
    make(fs, tmp / "chunk", b"chunk")
    make(fs, tmp / "MANIFEST", b"manifest")
    fs.rename(str(tmp), str(tmp_path / "snap"))
    fs.power_loss()
    assert os.listdir(tmp_path) == ["snap.tmp"]
    assert sorted(os.listdir(tmp)) == ["MANIFEST", "chunk"]
    fs.rename(str(tmp), str(tmp_path / "snap"))
    fs.fsync_dir(str(tmp_path))
    fs.power_loss()
    assert read(tmp_path / "snap" / "MANIFEST") == b"manifest"


def test_durable_dir_rename_moves_earlier_pending_ops(tmp_path):
    fs = FaultFS()
    fs.makedirs(str(tmp_path / "a"))
    fs.fsync_dir(str(tmp_path))
    make(fs, tmp_path / "a" / "f", b"x", dir_sync=False)  # pending in a
    fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))
    fs.fsync_dir(str(tmp_path))  # the rename is durable, f's name is not
    fs.power_loss()
    assert os.listdir(tmp_path) == ["b"] and os.listdir(tmp_path / "b") == []


def test_keep_dir_ops_keeps_a_prefix(tmp_path):
    fs = FaultFS()
    for name in "abc":
        make(fs, tmp_path / name, name.encode(), dir_sync=False)
    assert [k for k, *_ in fs.pending_ops()] == ["create"] * 3
    fs.power_loss(keep_dir_ops=2)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


# -- torn writes ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 511, 512, 513, 1500, 2000])
def test_tear_last_write_at_any_byte(tmp_path, n):
    fs = FaultFS()
    p = tmp_path / "a"
    make(fs, p, bytes(4096))
    f = fs.open(str(p))
    f.pwrite(b"A" * 100, 0)  # an earlier unsynced write: dropped
    f.pwrite(b"B" * 2000, 300)
    fs.power_loss(tear_bytes=n)
    expect = bytearray(4096)
    expect[300 : 300 + min(n, 2000)] = b"B" * min(n, 2000)
    assert read(p) == bytes(expect)


def test_tear_last_write_by_sectors(tmp_path):
    fs = FaultFS()
    p = tmp_path / "a"
    make(fs, p, bytes(4096))
    f = fs.open(str(p))
    f.pwrite(b"B" * 2000, 300)  # sectors: [300,512) [512,1024) [1024,1536) [1536,2048) [2048,2300)
    fs.power_loss(tear_sectors={1, 4})
    data = read(p)
    assert data[512:1024] == b"B" * 512 and data[2048:2300] == b"B" * 252
    assert data.count(b"B") == 512 + 252


def test_random_sector_versions(tmp_path):
    """With ``rng`` each sector is one version from its history: durable,
    after the first write, or after the second; never a mix inside a sector."""
    fs = FaultFS()
    p = tmp_path / "a"
    make(fs, p, bytes(8192))
    f = fs.open(str(p))
    f.pwrite(b"C" * 8192, 0)
    f.pwrite(b"D" * 8192, 0)
    fs.power_loss(rng=random.Random(5))
    data = read(p)
    sectors = [data[i : i + SECTOR] for i in range(0, 8192, SECTOR)]
    assert set(sectors) == {bytes(SECTOR), b"C" * SECTOR, b"D" * SECTOR}


# -- injected errors ----------------------------------------------------------------------


def test_fail_nth_write_once(tmp_path):
    fs = FaultFS()
    f = fs.open(str(tmp_path / "a"), create=True)
    fs.fail("write", 2)
    f.pwrite(b"1", 0)
    with pytest.raises(OSError) as e:
        f.pwrite(b"2", 1)
    assert e.value.errno == errno.EIO
    f.pwrite(b"3", 1)
    assert read(tmp_path / "a") == b"13"


def test_fail_persistent(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "a", b"x")
    fs.fail("rename", 1, persistent=True)
    for _ in range(3):
        with pytest.raises(OSError):
            fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))
    assert os.listdir(tmp_path) == ["a"]
    fs.fail("unlink", 1, err=errno.EROFS)
    with pytest.raises(OSError) as e:
        fs.unlink(str(tmp_path / "a"))
    assert e.value.errno == errno.EROFS


def test_failed_sync_makes_nothing_durable(tmp_path):
    fs = FaultFS()
    make(fs, tmp_path / "a", b"old")
    f = fs.open(str(tmp_path / "a"))
    f.pwrite(b"new", 0)
    fs.fail("sync")
    with pytest.raises(OSError):
        f.sync()
    fs.power_loss()
    assert read(tmp_path / "a") == b"old"


def test_enospc_writes_what_fits(tmp_path):
    fs = FaultFS()
    f = fs.open(str(tmp_path / "a"), create=True)
    fs.space_left = 10
    f.pwrite(b"123456", 0)
    with pytest.raises(OSError) as e:
        f.pwrite(b"abcdef", 6)
    assert e.value.errno == errno.ENOSPC
    assert read(tmp_path / "a") == b"123456abcd"
    with pytest.raises(OSError):
        f.pwrite(b"z", 10)
    fs.space_left = None
    f.pwrite(b"z", 10)


# -- crash points ----------------------------------------------------------------------------


def test_crash_at_kth_boundary_before_and_after(tmp_path):
    fs = FaultFS()
    fs.log = []
    make(fs, tmp_path / "a", b"1")          # boundaries: sync, fsync_dir
    fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))  # rename
    fs.fsync_dir(str(tmp_path))               # fsync_dir
    assert [op for op, _ in fs.log] == ["sync", "fsync_dir", "rename", "fsync_dir"]
    assert fs.boundaries == 4

    fs.crash_at(1)
    with pytest.raises(SimulatedCrash):
        fs.rename(str(tmp_path / "b"), str(tmp_path / "c"))
    assert os.listdir(tmp_path) == ["b"]  # before: the op did not happen
    with pytest.raises(SimulatedCrash):
        fs.open(str(tmp_path / "b"))  # the machine is off
    fs.power_loss()

    fs.crash_at(1, after=True)
    with pytest.raises(SimulatedCrash):
        fs.rename(str(tmp_path / "b"), str(tmp_path / "c"))
    assert os.listdir(tmp_path) == ["c"]  # after: it happened, not yet durable
    fs.power_loss()
    assert os.listdir(tmp_path) == ["b"]


def test_handles_from_before_a_power_loss_are_dead(tmp_path):
    fs = FaultFS()
    f = fs.open(str(tmp_path / "a"), create=True)
    fs.power_loss()
    with pytest.raises(SimulatedCrash):
        f.pwrite(b"x", 0)
    f.close()


def test_simulated_crash_is_not_an_exception():
    assert not issubclass(SimulatedCrash, Exception)  # `except Exception` cannot swallow it


# -- a model check: random operations in one directory ------------------------------------------


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 3), st.integers(0, 3000), st.integers(1, 700)),
        st.tuples(st.just("sync"), st.integers(0, 3)),
        st.tuples(st.just("truncate"), st.integers(0, 3), st.integers(0, 3000)),
        st.tuples(st.just("rename"), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.just("unlink"), st.integers(0, 3)),
        st.tuples(st.just("fsync_dir")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, seed=st.integers(0, 2**32))
def test_power_loss_matches_a_model(tmp_path_factory, ops, seed):
    """Model: inodes with (current, durable) content; names with a current and
    a durable (last fsync_dir) mapping. After a power loss each durable name
    holds its inode's durable content, and nothing else exists."""
    d = tmp_path_factory.mktemp("model")
    fs = FaultFS()
    rnd = random.Random(seed)
    names = {}          # name -> inode id (current)
    durable_names = {}  # name -> inode id (at the last fsync_dir)
    durable = {}        # inode id -> bytes at its last sync
    handles = {}        # inode id -> FaultFile
    next_id = 0
    for op in ops:
        kind = op[0]
        if kind == "write":
            _, n, off, length = op
            name = f"f{n}"
            if name not in names:
                next_id += 1
                names[name] = next_id
                durable[next_id] = b""
                handles[next_id] = fs.open(str(d / name), create=True)
            handles[names[name]].pwrite(bytes([rnd.randrange(1, 256)]) * length, off)
        elif kind == "sync" and f"f{op[1]}" in names:
            i = names[f"f{op[1]}"]
            handles[i].sync()
            fd = handles[i].fd
            durable[i] = os.pread(fd, os.fstat(fd).st_size, 0)
        elif kind == "truncate" and f"f{op[1]}" in names:
            handles[names[f"f{op[1]}"]].truncate(op[2])
        elif kind == "rename" and f"f{op[1]}" in names:
            src, dst = f"f{op[1]}", f"f{op[2]}"
            if src != dst:
                fs.rename(str(d / src), str(d / dst))
                names[dst] = names.pop(src)
        elif kind == "unlink" and f"f{op[1]}" in names:
            fs.unlink(str(d / f"f{op[1]}"))
            del names[f"f{op[1]}"]
        elif kind == "fsync_dir":
            fs.fsync_dir(str(d))
            durable_names = dict(names)
    for h in handles.values():
        h.close()
    fs.power_loss()
    assert sorted(os.listdir(d)) == sorted(durable_names)
    for name, i in durable_names.items():
        assert read(d / name) == durable[i], name


# -- the real file seam: reserving space vs erasing it -------------------------------


def test_preallocate_reserves_zeros_and_write_zeros_erases(tmp_path):
    """The active segment grows by ``preallocate`` (reads as zeros, sets the
    size, never touches what is before ``offset``); a cut tail is erased by
    ``write_zeros``, which must overwrite data (an fallocate would keep it)."""
    p = str(tmp_path / "seg")
    f = OS_FS.open(p, create=True)
    try:
        f.pwrite(b"header", 0)
        f.preallocate(6, 1 << 16)
        assert f.size() == 6 + (1 << 16)
        assert f.pread(6, 0) == b"header"
        assert f.pread(1 << 16, 6) == bytes(1 << 16)
        f.pwrite(b"record", 100)
        f.write_zeros(100, 6)
        assert f.pread(6, 100) == bytes(6)
        assert f.size() == 6 + (1 << 16)
    finally:
        f.close()
