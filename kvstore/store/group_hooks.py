"""What a store does with each group its log writes: the log's hooks.

:class:`wal.Log` calls them on the group's leader, once per group, so they
are on every write's path and are compiled with the core (wal/compiled.py),
a subclass of :class:`wal.hooks.LogHooks` that the log calls directly:

- ``prepare`` runs before the group is written. It decides the group's
  conditional writes in log order and writes the decisions into the log
  (:mod:`kvstore.entry.conditions`, which also computes the writes the
  writer decides, reading the expiry of their keys), then what expiry decides in log order
  (:mod:`kvstore.store.expiring`: leases, TTL puts). A group of plain writes,
  the common one, costs a look at its first op.
- ``stage`` (``sync="always"`` only) runs before the group is written. For
  a bulk group (:meth:`kvstore.state.State.stage`: one that goes to LMDB in
  one write transaction anyway) it returns the work the log runs while it
  writes and fsyncs the group: the group written into an LMDB transaction that
  is committed only once the fsync returned
  (:class:`kvstore.state.staged.StagedApply`); for any other group, and for
  every group of a store with synchronous replicas, None.
- ``commit`` runs after the group is written (and fsynced, with
  ``sync="always"``) and before any of its appenders is released. With
  synchronous replicas (:mod:`kvstore.store.replication`) it first waits
  until enough of them hold the group (a read never sees a write no replica
  holds; a failure there fails the log). It applies
  the group to the state machine (so every read after the write returns sees
  it; a staged group is applied by then, and applying is idempotent), wakes
  the store's watchers and pokes the automatic snapshots.

The log is opened before the state machine it replays into exists, so the
hooks are made first and :meth:`GroupHooks.bind` gives them the store's parts;
the log calls neither before then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, final

from kvstore.entry.conditions import Read, ReadMeta, decide_group
from kvstore.state import Ops, State
from kvstore.state.staged import StagedApply
from wal.group import Group
from wal.hooks import LogHooks
from wal.segment import Payload

if TYPE_CHECKING:  # (interpreted classes: the hooks call them, never the other way)
    from kvstore.store.expiring import Expiring
    from kvstore.store.replication import SyncReplicas
    from kvstore.store.writer import StoreWriter
    from kvstore.watch.hub import WatchHub


@final
class GroupHooks(LogHooks):
    """The hooks of one store's log (``wal.open(hooks=...)``)."""

    def __init__(self, hub: WatchHub) -> None:
        self._hub = hub
        self._watchers: set[Any] = hub.watchers  # the hub's own set (changed in place), read in C
        self._state: State | None = None
        self._expiring: Expiring | None = None
        self._auto_snapshot_writer: StoreWriter | None = None  # told after each group: it takes automatic snapshots
        self._read: Read | None = None  # state.read, bound once (a bound method is made at each look-up)
        self.replicas: SyncReplicas | None = None  # what each group waits for before it is applied
        self._read_meta: ReadMeta | None = None  # a key's expiry, for the writes the writer decides

    def bind(self, state: State, expiring: Expiring, writer: StoreWriter | None) -> None:
        """The store's parts, once it has opened them."""
        self._state = state
        self._expiring = expiring
        # (automatic snapshots are set up at open, before this: StoreWriter.take_snapshots_every)
        self._auto_snapshot_writer = writer if writer is not None and writer.auto is not None else None
        self._read = state.read
        self._read_meta = expiring.key_meta

    def prepare(self, group: Group) -> list[Payload] | None:
        """The payloads to log instead of the group's own (decisions written
        in), or None to log them as they are."""
        read, expiring = self._read, self._expiring
        assert read is not None and expiring is not None, "the log wrote before the store was bound"
        contexts = group.contexts
        out = decide_group(group.payloads, contexts, read, self._read_meta)
        for context in contexts:
            if type(context) is not list:  # an Outcome: a lease or a TTL the writer decides
                expiry = expiring.decide(group.payloads if out is None else out, contexts)
                return out if expiry is None else expiry
        return out

    def stage(self, group: Group) -> StagedApply | None:
        """The work to do while the log writes and fsyncs the group, or None (module docstring)."""
        state = self._state
        assert state is not None, "the log wrote before the store was bound"
        if self.replicas is not None:  # published only after the replicas confirmed: in commit
            return None
        return state.stage(group.first_lsn, cast("list[Ops]", group.contexts), group.payloads)

    def commit(self, group: Group) -> None:
        """Apply the written group and tell whoever waits for writes. This
        store is its log's one appender, and passes every entry's operations
        along as its context."""
        state = self._state
        assert state is not None, "the log committed before the store was bound"
        replicas = self.replicas
        if replicas is not None:
            replicas.wait(group.last_lsn)
        state.apply(group.first_lsn, cast("list[Ops]", group.contexts), group.payloads)
        # Looks before calls: each is a call into interpreted code, worth
        # making only while somebody watches, or automatic snapshots are on.
        if self._watchers:
            self._hub.committed()
        writer = self._auto_snapshot_writer
        if writer is not None:
            writer.committed()
