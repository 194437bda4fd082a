"""The archive wired into the store: ``kvstore.open(path, archive=...)``,
``flush_archive``, ``stats()["archive"]``, a clean close, local retention
bounded by the archive (in-process and a sidecar's ``STORE/ARCHIVED``),
``kvstore.restore`` from an archive and to a time, a writer killed with
SIGKILL while archiving, credentials never shown, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import kvstore
from kvstore.archive import ArchiveReader
from kvstore.archive.marker import read_archived
from kvstore.cli.main import main
from kvstore.store.metrics import prometheus_text
from tests.s3server import SECRET
from wal.errors import ArchiveError, ArchiveLagError

pytest.importorskip("pyarrow")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(db: kvstore.KVStore, start: int, n: int) -> None:
    for i in range(start, start + n):
        db.put(b"k%05d" % (i % 500), b"value-%d" % i * 30)


def state(path: str) -> dict[bytes, bytes]:
    with kvstore.open(path, readonly=True) as db:
        return dict(db.scan())


def first_lsn(db: kvstore.KVStore) -> int:
    return int(db.stats()["log"]["first_lsn"])


def test_open_with_archive_flush_stats_close_and_restore(tmp_path):
    arch = str(tmp_path / "arch")
    db = kvstore.open(str(tmp_path / "s"), segment_bytes=64 << 10, archive=arch, archive_interval=60)
    fill(db, 0, 700)
    assert db.flush_archive(timeout=30) == 700  # long interval: flush itself wakes the thread
    st = db.stats()["archive"]
    assert st["archived_lsn"] == 700 and st["lag_lsns"] == 0 and st["errors"] == 0 and st["uri"] == arch
    assert "walkv_archived_lsn{" in prometheus_text(db.stats())
    fill(db, 700, 300)
    mid = time.time()
    time.sleep(0.002)
    fill(db, 1000, 300)
    expected = dict(db.scan())
    db.close()  # ships everything durable: nothing was flushed since LSN 700
    assert ArchiveReader(arch).last_lsn == 1300
    info = kvstore.restore(arch, tmp_path / "r")  # a local directory holding ARCHIVE
    assert info.lsn == 1300 and state(info.path) == expected
    at = kvstore.restore((tmp_path / "arch").as_uri(), tmp_path / "t", to_time=mid)
    local = kvstore.restore(str(tmp_path / "s"), tmp_path / "lt", to_time=mid)
    assert at.lsn == local.lsn == 1000 and state(at.path) == state(local.path)


def test_flush_archive_without_archive_and_async(tmp_path):
    with kvstore.open(str(tmp_path / "plain")) as db:
        db.put(b"a", b"1")
        with pytest.raises(ArchiveError, match="without archive="):
            db.flush_archive()
        assert "archive" not in db.stats()

    async def go() -> int:
        async with kvstore.open_async(str(tmp_path / "s"), archive=str(tmp_path / "arch")) as adb:
            for i in range(50):
                await adb.put(b"k%d" % i, b"v")
            return await adb.flush_archive(timeout=30)

    assert asyncio.run(go()) == 50


def test_local_retention_keeps_what_the_archive_lacks(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"not a directory")  # the archive cannot be written under a file: it is "down"
    arch = str(blocker / "arch")
    db = kvstore.open(str(tmp_path / "s"), segment_bytes=64 << 10, archive=arch, archive_interval=0.05)
    fill(db, 0, 2000)
    db.snapshot(keep=1)
    assert first_lsn(db) == 1  # the snapshot covers every segment, but the archive holds none
    with pytest.raises(ArchiveLagError):
        db.flush_archive(timeout=0.3)
    st = db.stats()["archive"]
    assert st["errors"] >= 1 and st["last_error"] and st["archived_lsn"] == 0 and st["lag_lsns"] == 2000
    blocker.unlink()  # the object store is back
    assert db.flush_archive(timeout=30) == 2000
    fill(db, 2000, 10)
    db.snapshot(keep=1)
    assert first_lsn(db) > 1  # now retention trims what the archive holds
    db.close()
    r = ArchiveReader(arch)
    assert [e.lsn for e in r.read_entries()] == list(range(1, 2011))


def test_sidecar_publishes_archived_lsn_that_bounds_the_writer(tmp_path):
    store, arch = str(tmp_path / "s"), str(tmp_path / "arch")
    db = kvstore.open(store, segment_bytes=64 << 10)
    fill(db, 0, 500)
    assert main(["-q", "archive", store, arch, "--once"]) == 0  # another process in real life
    assert read_archived(store) == 500
    fill(db, 500, 1500)
    db.snapshot(keep=1)
    segs = db.stats()["log"]
    assert segs["first_lsn"] <= 501  # segments above the sidecar's LSN stay
    assert main(["-q", "archive", store, arch, "--once"]) == 0
    assert read_archived(store) == 2000
    fill(db, 2000, 10)
    db.snapshot(keep=1)
    assert first_lsn(db) > 501
    db.close()


CHILD = """
import os, sys, kvstore
db = kvstore.open(sys.argv[1], segment_bytes=64 << 10, archive=sys.argv[2], archive_interval=0.02)
os.write(1, b"ready\\n")
i = 0
while True:
    db.put(b"k%06d" % i, b"v%d" % i * 40)
    os.write(1, b"%d\\n" % i)
    i += 1
"""


@pytest.mark.crash
def test_writer_killed_while_archiving_resumes_without_duplicates(tmp_path):
    store, arch = str(tmp_path / "s"), str(tmp_path / "arch")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", CHILD, store, arch], stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    acked = []
    while len(acked) < 3000:
        acked.append(int(p.stdout.readline()))
    deadline = time.monotonic() + 30
    while not os.path.isdir(os.path.join(arch, "wal")) or len(os.listdir(os.path.join(arch, "wal"))) < 3:
        assert time.monotonic() < deadline, "the child never archived"
        acked.append(int(p.stdout.readline()))
    os.kill(p.pid, signal.SIGKILL)  # in the middle of archiving: it ships every 20 ms
    rest = p.stdout.read()
    p.wait()
    acked += [int(x) for x in rest.split()]
    with kvstore.open(store, archive=arch) as db:  # takes over the dead writer's lease, resumes
        last = db.flush_archive(timeout=30)
        assert last == db.durable_lsn >= len(acked)
        db.put(b"after", b"restart")
    lsns = [e.lsn for e in ArchiveReader(arch).read_entries()]
    assert lsns == list(range(1, last + 2))  # no duplicate, no gap
    restored = state(kvstore.restore(arch, tmp_path / "r").path)
    assert all(restored[b"k%06d" % i] == b"v%d" % i * 40 for i in acked)
    assert restored[b"after"] == b"restart"


def test_credentials_never_shown(s3server, tmp_path, caplog):
    uri = s3server.uri("creds").replace(f":{SECRET}@", ":WrongSecret123@")  # refused: 403 on every request
    assert "WrongSecret123" in uri
    caplog.set_level(logging.DEBUG)
    db = kvstore.open(str(tmp_path / "s"), archive=uri, archive_interval=0.05)
    try:
        db.put(b"a", b"1")
        with pytest.raises(ArchiveLagError) as err:
            db.flush_archive(timeout=1.0)
        st = db.stats()
        assert st["archive"]["errors"] >= 1 and st["archive"]["last_error"]
        shown = [str(err.value), repr(st), caplog.text, prometheus_text(st)]
    finally:
        db.close()
    shown.append(caplog.text)
    for text in shown:
        assert "WrongSecret123" not in text
