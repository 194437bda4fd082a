"""An object store that refuses or never answers (there is no network here
but loopback: a closed port and a listening socket that never answers, on
127.0.0.1): every command ends in bounded time with one ArchiveUnavailableError
line naming the archive, what failed or timed out and what to do; the
archiver retries it; ``db.close()`` gives its last round
``archive_close_timeout`` seconds and says what was not shipped. And a file
where an archive or a replica directory would be is walkv's error, not
"[Errno 20] Not a directory"."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

import kvstore
from kvstore import Archiver
from tests.test_cli import one_line_error, walkv
from wal.errors import ArchiveError, ReplicaError

pytest.importorskip("pyarrow")


def _uri(port: int, prefix: str = "x", extra: str = "") -> str:
    return f"s3://bucket/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1{extra}"


@pytest.fixture
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connections are refused


@pytest.fixture
def silent_port():
    """A server that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_archive_ls_of_a_closed_port_fails_at_once_in_one_line(closed_port):
    uri = _uri(closed_port)
    t0 = time.monotonic()
    proc = walkv("archive-ls", uri, timeout=60)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert line.startswith(f"walkv: error: the archive {uri} cannot be reached: reading ARCHIVE failed")
    assert "check that its object store is up and reachable" in line
    assert time.monotonic() - t0 < 30


def test_archive_ls_of_a_server_that_never_answers_times_out_in_one_line(silent_port):
    uri = _uri(silent_port)
    t0 = time.monotonic()
    proc = walkv("archive-ls", uri, timeout=90)  # pyarrow's own defaults: 100 s per attempt
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert line.startswith(f"walkv: error: the archive {uri} did not answer in time: reading ARCHIVE timed out "
                           "(requests are given 5 s each, tried 2 times")
    assert "give it longer with timeout=SECONDS in the URI" in line
    assert elapsed < 40, elapsed


@pytest.mark.parametrize("cmd", [["archive-verify", "{uri}"], ["archive", "{store}", "{uri}", "--once"],
                                 ["restore", "{uri}", "{tmp}/restored"], ["replica", "{uri}", "{tmp}/replica"],
                                 ["verify", "{uri}"]])
def test_every_archive_command_is_bounded(tmp_path, silent_port, cmd):
    store = str(tmp_path / "store")
    with kvstore.open(store) as db:
        db.put(b"k", b"v")
    uri = _uri(silent_port, extra="&timeout=1")
    t0 = time.monotonic()
    proc = walkv(*[c.format(uri=uri, store=store, tmp=tmp_path) for c in cmd], timeout=60)
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc)
    assert "did not answer in time" in line and "requests are given 1 s each" in line
    assert time.monotonic() - t0 < 30


def test_the_reader_raises_archive_unavailable_naming_the_archive(silent_port, closed_port):
    from kvstore import ArchiveReader, ArchiveUnavailableError

    with pytest.raises(ArchiveUnavailableError) as e:
        ArchiveReader(_uri(silent_port, extra="&timeout=0.5"))
    assert e.value.timed_out and e.value.uri == _uri(silent_port, extra="&timeout=0.5")
    with pytest.raises(ArchiveUnavailableError) as e:
        ArchiveReader(_uri(closed_port))
    assert not e.value.timed_out
    with pytest.raises(ValueError, match="timeout='soon'"):
        ArchiveReader(_uri(closed_port, extra="&timeout=soon"))


def test_close_with_an_archive_that_never_answers_is_bounded_and_says_what_was_not_shipped(
        tmp_path, silent_port, caplog):
    caplog.set_level(logging.WARNING, logger="walkv")
    db = kvstore.open(str(tmp_path / "s"), archive=_uri(silent_port), archive_interval=0.05,
                      archive_close_timeout=1.0)
    for i in range(3):
        db.put(b"k%d" % i, b"v")
    time.sleep(0.2)  # the archiver is in a request that will not be answered
    t0 = time.monotonic()
    db.close()
    assert time.monotonic() - t0 < 3
    lines = [r.getMessage() for r in caplog.records if "closed" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "at LSN 0 of 3 durable: LSNs 1..3 were not shipped" in lines[0]
    assert "did not answer within archive_close_timeout=1 s" in lines[0]
    with kvstore.open(str(tmp_path / "s")) as again:  # the store itself closed cleanly
        assert again.get(b"k2") == b"v"


def test_close_with_a_refusing_archive_is_bounded_too(tmp_path, closed_port, caplog):
    caplog.set_level(logging.WARNING, logger="walkv")
    db = kvstore.open(str(tmp_path / "s"), archive=_uri(closed_port), archive_interval=0.05)
    db.put(b"k", b"v")
    t0 = time.monotonic()
    db.close()
    assert time.monotonic() - t0 < 6  # the default archive_close_timeout is 5 s
    assert any("LSN 1 was not shipped" in r.getMessage() and "cannot be reached" in r.getMessage()
               for r in caplog.records)


def test_the_archiver_retries_an_unreachable_archive(tmp_path, closed_port):
    store = str(tmp_path / "s")
    with kvstore.open(store) as db:
        db.put(b"k", b"v")
    a = Archiver(store, _uri(closed_port), interval=0.05, max_backoff=0.1)
    a.start()
    try:
        deadline = time.monotonic() + 30
        while a.stats()["errors"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.stats()["errors"] >= 3 and a.failed is None  # retried, not stopped for good
        assert "ArchiveUnavailableError" in a.stats()["last_error"]
    finally:
        assert a.stop(timeout=5)


# -- a file where a directory would be -------------------------------------------------------


_IN_THE_WAY = {
    "archive": ("no archive can be at {location}: {says}, not a directory; an archive is a directory (made when "
                "a store is first archived to it) or an object store URI: give another location",
                [["archive-verify", "{location}"], ["archive-ls", "{location}"],
                 ["archive", "{store}", "{location}", "--once"]], ArchiveError),
    "replica": ("no replica can be at {location}: {says}, not a directory; a replica needs a directory of its own "
                "(made if missing): give another path", [["replica", "{store}", "{location}"]], ReplicaError),
}


@pytest.mark.parametrize("kind", sorted(_IN_THE_WAY))
def test_a_file_where_an_archive_or_replica_would_be(tmp_path, kind):
    store = str(tmp_path / "store")
    with kvstore.open(store) as db:
        db.put(b"k", b"v")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    message, commands, error = _IN_THE_WAY[kind]
    for location, says in ((a_file, "it is a file"), (a_file / "sub", f"{a_file} is a file")):
        expected = message.format(location=location, says=says)
        for cmd in commands:
            proc = walkv(*[c.format(location=location, store=store) for c in cmd])
            assert proc.returncode == 1
            assert one_line_error(proc) == f"walkv: error: {expected}", cmd
        with pytest.raises(error) as e:
            if kind == "archive":
                kvstore.ArchiveReader(str(location))
            else:
                kvstore.open_replica(store, str(location))
        assert str(e.value) == expected
    assert a_file.read_text() == "keep me"
