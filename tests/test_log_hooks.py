"""wal/hooks.py: a log's hooks as an object (a LogHooks subclass) or as callables."""

from __future__ import annotations

import pytest

import wal
from wal.group import Group
from wal.hooks import Staged
from wal.segment import Payload


class Recording(wal.LogHooks):
    """A Python subclass, as a user writes one: upper-cases what it prepares
    and records every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def prepare(self, group: Group) -> list[Payload] | None:
        self.calls.append(("prepare", group.first_lsn))
        return [p.upper() for p in group.payloads if type(p) is bytes]

    def stage(self, group: Group) -> Staged | None:
        self.calls.append(("stage", group.first_lsn))
        return None

    def commit(self, group: Group) -> None:
        self.calls.append(("commit", group.last_lsn))


@pytest.mark.parametrize("sync", ["always", "none"])
def test_a_python_subclass_of_loghooks_is_called_per_group_in_order(tmp_path, sync) -> None:
    hooks = Recording()
    with wal.open(tmp_path / "log", sync=sync, hooks=hooks) as log:
        assert log.append(b"one") == 1
        assert log.append_batch([b"two", b"three"]) == (2, 3)
        assert [p for _, p in log.read(durable_only=False)] == [b"ONE", b"TWO", b"THREE"]  # what prepare returned is logged
    staged = [("stage", 1)] if sync == "always" else []
    staged2 = [("stage", 2)] if sync == "always" else []
    # stage only when there is an fsync to overlap; commit after the group is written
    assert hooks.calls == [("prepare", 1), *staged, ("commit", 1), ("prepare", 2), *staged2, ("commit", 3)]


def test_the_base_loghooks_does_nothing(tmp_path) -> None:
    with wal.open(tmp_path / "log", hooks=wal.LogHooks()) as log:
        log.append(b"x")
        assert [p for _, p in log.read()] == [b"x"]


def test_hooks_and_hook_callables_are_refused_together(tmp_path) -> None:
    with pytest.raises(ValueError, match="either as hooks= or as on_prepare="):
        wal.open(tmp_path / "log", hooks=wal.LogHooks(), on_commit=lambda g: None)


class _Work:
    """A Staged that records its calls into ``calls``."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def run(self) -> None:
        self.calls.append("run")

    def publish(self) -> None:
        self.calls.append("publish")

    def abort(self) -> None:
        self.calls.append("abort")


class _Staging(wal.LogHooks):
    """Stages every group, and notes what the log's files held at that moment."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.calls: list[str] = []
        self.on_disk_at_stage: list[bytes] = []

    def stage(self, group: Group) -> Staged | None:
        self.on_disk_at_stage.append(_segment_bytes(self.log_dir))
        self.calls.append("stage")
        return _Work(self.calls)

    def commit(self, group: Group) -> None:
        self.calls.append("commit")


def _segment_bytes(log_dir: str) -> bytes:
    import glob
    import os

    out = b""
    for name in sorted(glob.glob(os.path.join(log_dir, "*.wal"))):
        with open(name, "rb") as f:
            out += f.read()
    return out


def test_stage_comes_before_the_group_is_written_and_its_work_after(tmp_path) -> None:
    """``stage`` is asked before the group reaches the file, its work runs
    while it is written and synced, and is published once it is durable,
    before ``commit``."""
    log_dir = str(tmp_path / "log")
    hooks = _Staging(log_dir)
    with wal.open(log_dir, sync="always", hooks=hooks) as log:
        log.append(b"first-payload")
        log.append(b"second-payload")
        assert b"first-payload" in _segment_bytes(log_dir)
    assert b"first-payload" not in hooks.on_disk_at_stage[0]
    assert b"second-payload" not in hooks.on_disk_at_stage[1] and b"first-payload" in hooks.on_disk_at_stage[1]
    assert hooks.calls == ["stage", "run", "publish", "commit"] * 2


def test_a_failed_write_aborts_the_staged_work(tmp_path) -> None:
    from tests.faultfs import FaultFS, close_quietly

    fs = FaultFS()
    hooks = _Staging(str(tmp_path / "log"))
    log = wal.open(tmp_path / "log", sync="always", hooks=hooks, fs=fs)
    try:
        log.append(b"ok")
        fs.fail("write")
        with pytest.raises(wal.LogFailedError):
            log.append(b"lost")
    finally:
        close_quietly(log)
    assert hooks.calls == ["stage", "run", "publish", "commit", "stage", "run", "abort"]


def test_ctrl_c_while_the_leader_waits_for_the_write_is_raised_once_it_is_done(tmp_path, ctrl_c) -> None:
    """A KeyboardInterrupt in the main thread while it waits for the helper
    that writes and syncs a staged group is kept until the helper is done:
    the group is then written and synced, and the log's failure says so
    (not that it was never written, with the helper still writing)."""
    import os
    import signal
    import threading
    import time

    from tests.test_wal_properties import HeldSyncFS

    fs = HeldSyncFS()
    hooks = _Staging(str(tmp_path / "log"))
    log = wal.open(tmp_path / "log", sync="always", hooks=hooks, fs=fs)
    try:
        log.append(b"first")
        fs.hold = 1  # the next fsync (the staged group's, on the helper) waits

        helpers: list[threading.Thread] = []

        def interrupt() -> None:
            assert fs.entered.wait(30)
            helpers.extend(th for th in threading.enumerate() if th.name == "walkv-write")
            time.sleep(0.1)  # the main thread asleep in its join, past staged.run()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            fs.release.set()

        t = threading.Thread(target=interrupt)
        t.start()
        with pytest.raises(wal.LogFailedError, match=r"KeyboardInterrupt.*LSN 2 is written to the OS"):
            log.append(b"second")  # (an interrupt inside a group's write fails the log, as it always has)
        done_at_raise = [h.is_alive() for h in helpers]
        t.join(30)
        assert done_at_raise == [False], "the helper outlived the raise"
        assert log._writer.written[0] == 2 and fs.release.is_set()  # written, and its held fsync let go
    finally:
        fs.release.set()
        try:
            log.close()
        except wal.WalkvError:
            pass
    assert hooks.calls[-3:] == ["stage", "run", "abort"]
