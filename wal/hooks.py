"""What the layer above does with each group the log writes: :class:`LogHooks`.

The log's leader calls its hooks once per group, on every write's path
(:mod:`wal.log_writer` says exactly when):

- ``prepare(group)``, just before the group is framed (the previous group is
  written and committed by then): the payloads to write instead (same number,
  same LSNs), or None to write them as they are. The layer above decides
  there what depends on the order of the log.
- ``stage(group)``, with ``sync="always"`` only, after ``prepare`` and before
  the group is written: a :class:`Staged`, work that runs while the group is
  written and fsynced (on another thread) and is published only once the
  fsync returned (aborted if the group fails), or None.
- ``commit(group)``, after the group is acknowledged (durable, with
  ``sync="always"``) and before any of its appenders returns. If it raises,
  the log fails.

The hooks are an object, not three callables, so that a compiled layer above
(the store's :class:`kvstore.store.group_hooks.GroupHooks`, a subclass) is
called directly, in C, rather than through Python's call protocol: twice per
write, that was a tenth of a non-durable put. :class:`CallableHooks` adapts
plain callables (``wal.open(on_commit=...)``); a Python subclass of
:class:`LogHooks` works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, final

from mypy_extensions import mypyc_attr

from wal.group import Group
from wal.segment import Payload

CommitHook = Callable[[Group], None]
PrepareHook = Callable[[Group], "list[Payload] | None"]


class Staged(Protocol):
    """Work the layer above does for one group while the log writes and syncs it (all
    three methods on the leader's thread, so a resource bound to a thread,
    an LMDB write transaction, may be begun in one and ended in another)."""

    def run(self) -> None:
        """Do the work, invisibly: the group is not durable yet."""

    def publish(self) -> None:
        """The group is durable: make the work visible."""

    def abort(self) -> None:
        """The group failed (its write, its fsync, or :meth:`run`): drop the work."""


StageHook = Callable[[Group], "Staged | None"]


@mypyc_attr(allow_interpreted_subclasses=True)
class LogHooks:
    """A log's hooks (module docstring). Each does nothing here: override
    the ones you need."""

    def prepare(self, group: Group) -> list[Payload] | None:
        return None

    def stage(self, group: Group) -> Staged | None:
        return None

    def commit(self, group: Group) -> None:
        return None


@final
class CallableHooks(LogHooks):
    """The hooks as callables, each optional (``None``: do nothing)."""

    def __init__(self, on_prepare: PrepareHook | None = None, on_stage: StageHook | None = None,
                 on_commit: CommitHook | None = None) -> None:
        self._on_prepare = on_prepare
        self._on_stage = on_stage
        self._on_commit = on_commit

    def prepare(self, group: Group) -> list[Payload] | None:
        return None if self._on_prepare is None else self._on_prepare(group)

    def stage(self, group: Group) -> Staged | None:
        return None if self._on_stage is None else self._on_stage(group)

    def commit(self, group: Group) -> None:
        if self._on_commit is not None:
            self._on_commit(group)
