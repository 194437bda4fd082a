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
