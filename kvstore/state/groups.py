"""Staged groups in the state machine: parts waiting for their commit, and
each application's last committed version (op codes 20..22 of
:mod:`kvstore.entry.codec`, which says what a group is and why).

LMDB named database ``groups`` (beside ``data``; the layout:
:mod:`kvstore.state.machine`)::

    b"p" + len(group) (1 byte) + group + index (u32 big-endian)  ->  the part's ops (a msgpack batch)
    b"a" + app_id (UTF-8)                                         ->  last committed app_version (u64 big-endian)

Why each rule:

* Applying a part writes its ops here, not into any keyspace: a part
  changes nothing a reader sees. Its LSN is applied as any entry's, so
  recovery replays from after it and never needs the log to hold a part
  whose commit came later.
* Applying the commit reads its group's parts back from here, in index
  order (the key sorts them), applies each part's ops and then its own in
  ONE LMDB write transaction with the commit's LSN, and deletes the rows:
  the whole group becomes visible at once, at the commit's LSN, and memory
  is bounded by one part. A commit that does not find exactly
  ``part_count`` parts is corruption (LMDB or a snapshot lost them). The
  rows are the state machine's own, written from ops the log's decoder
  checked, and are read back unchecked, as LMDB's other contents are.
* An abort deletes its group's rows.
* The database rides in snapshots as the section ``groups``, bookkeeping
  (not counted as keys), so a store rebuilt from a snapshot taken between a
  group's parts and its commit still commits it, and still knows each
  application's version (a retried job stays applied once).
* Each group entry is applied in a write transaction of its own, after
  the overlay is written to LMDB (so LMDB's applied LSN never passes a
  write the overlay holds), never staged while the log syncs it
  (:meth:`kvstore.state.machine.State.stage`): a commit becomes visible
  only once the log holds it. The writes a group carries go through
  :mod:`kvstore.state.expiry` when they touch expiry, as any write's do.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import lmdb
import msgpack

from kvstore.entry.codec import (
    OP_GROUP_ABORT,
    OP_GROUP_COMMIT,
    OP_GROUP_PART,
    OP_KEYSPACE,
    OP_PUT_EXPIRING,
    pack_ops,
)
from kvstore.entry.groups import Commit, group_code
from kvstore.entry.limits import DEFAULT_KEYSPACE
from kvstore.state.commits import LmdbCommits
from kvstore.state.environment import Environment
from kvstore.state.expiry import Expiry
from kvstore.state.lmdb_ops import apply_ops
from kvstore.state.meta import K_APPLIED, pack_lsn
from wal.errors import CorruptionError, Damage

DB_NAME: Final = "groups"
"""The named database (and snapshot section) of staged groups."""
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_TO_DEFAULT: Final = (OP_KEYSPACE, DEFAULT_KEYSPACE)
_unpackb: Final = msgpack.unpackb

Ops = Sequence[Sequence[Any]]
ApplyOps = Callable[[lmdb.Transaction, Ops], None]
"""Applies writes (starting in the default keyspace) inside a write transaction."""
ApplyPlain = Callable[[int, Sequence[Ops]], None]
"""The state machine's apply of entries that are not a group's (first LSN, batches)."""
Count = Callable[[Ops], None]
"""The state machine's counters of the writes it applied (puts, deletes, range deletes)."""


def _prefix(group: bytes) -> bytes:
    return b"p" + bytes((len(group),)) + group


def _app_key(app_id: str) -> bytes:
    return b"a" + app_id.encode("utf-8")


class Groups:
    """The staged groups of one state machine (module docstring): the
    ``groups`` database of its environment ``env``, applied through its
    ``commits`` and ``expiry``; ``apply_plain`` applies the entries between
    group entries; ``count`` counts the writes a commit applies.
    ``readonly``: opened beside a writer in another process, where a missing
    database means no group was ever staged."""

    def __init__(self, env: Environment, expiry: Expiry, commits: LmdbCommits, apply_plain: ApplyPlain,
                 count: Count, *, readonly: bool) -> None:
        self.env = env
        self.expiry = expiry
        self.commits = commits
        self.apply_plain = apply_plain
        self.count = count
        try:
            self.db: Any = env.env.open_db(DB_NAME.encode(), create=not readonly)
        except lmdb.NotFoundError:
            self.db = None

    @staticmethod
    def any_in(batches: Sequence[Ops]) -> bool:
        """Whether one of ``batches`` is a group's entry."""
        return any(group_code(ops) is not None for ops in batches)

    def apply(self, first_lsn: int, batches: Sequence[Ops]) -> None:
        """Apply entries ``first_lsn, ...``, some of them a group's: each
        group entry in a write transaction of its own (:meth:`write`), the
        runs of other entries between them through ``apply_plain``."""
        plain = None  # the index of the first entry of a run of plain ones
        for i, ops in enumerate(batches):
            if group_code(ops) is None:
                plain = i if plain is None else plain
                continue
            if plain is not None:
                self.apply_plain(first_lsn + plain, batches[plain:i])
                plain = None
            self._apply_one(first_lsn + i, ops)
        if plain is not None:
            self.apply_plain(first_lsn + plain, batches[plain:])

    def _apply_one(self, lsn: int, ops: Ops) -> None:
        commits, env, expiry = self.commits, self.env, self.expiry
        commits.flush()  # the overlay's writes first (only this thread adds to it)
        through_expiry = False

        def apply(txn: lmdb.Transaction, run: Ops) -> None:
            nonlocal through_expiry
            self.count(run)
            if expiry.keys or any(op[0] == OP_PUT_EXPIRING for op in run):
                through_expiry = True
                expiry.apply(txn, run, env.keyspace_db_in)
            else:
                apply_ops(txn, run, env.keyspace_db_in)

        def write(txn: lmdb.Transaction) -> None:
            self.write(txn, lsn, ops, apply)
            txn.put(K_APPLIED, pack_lsn(lsn), True, True, False, env.main_db)
            commits.publishing(lsn)
        commits.run(write, lsn)
        commits.written_through(lsn, through_expiry)

    # -- applying (in the state machine's write transactions) --------------

    def write(self, txn: lmdb.Transaction, lsn: int, ops: Ops, apply: ApplyOps) -> None:
        """Apply one group entry (``ops``, decoded, at LSN ``lsn``) in
        ``txn``: stash a part, commit or abort a group (module docstring);
        ``apply`` applies a run of writes to the keyspaces."""
        code = group_code(ops)
        head = ops[0]
        if code == OP_GROUP_PART:
            txn.put(_prefix(head[1]) + _U32.pack(head[2]), pack_ops(list(ops[1:])), db=self.db)
        elif code == OP_GROUP_ABORT:
            self._delete(txn, head[1])
        elif code == OP_GROUP_COMMIT:
            commit = Commit(*head[1:])
            count = 0
            for part in self._parts(txn, commit.group, lsn):
                apply(txn, [_TO_DEFAULT, *part])
                count += 1
            if count != commit.part_count:
                raise CorruptionError(
                    f"the staged group committed at LSN {lsn} has {commit.part_count} part(s); the state "
                    f"machine holds {count} of them", kind=Damage.LMDB, lsn=lsn,
                    hint="reopen the store with LMDB rebuilt from the log (delete STORE/lmdb)")
            apply(txn, [_TO_DEFAULT, *ops[1:]])
            self._delete(txn, commit.group)
            if commit.app_id:
                txn.put(_app_key(commit.app_id), _U64.pack(commit.app_version), db=self.db)

    def _parts(self, txn: lmdb.Transaction, group: bytes, lsn: int) -> Iterator[Ops]:
        """The ops of each part of ``group``, in index order (one decoded at a time)."""
        prefix = _prefix(group)
        cur = txn.cursor(db=self.db)
        if not cur.set_range(prefix):
            return
        expected = 0
        for key, value in cur:
            if not bytes(key).startswith(prefix):
                return
            if _U32.unpack_from(key, len(prefix))[0] != expected:
                raise CorruptionError(f"the staged group committed at LSN {lsn} lacks its part {expected}",
                                      kind=Damage.LMDB, lsn=lsn,
                                      hint="reopen the store with LMDB rebuilt from the log (delete STORE/lmdb)")
            expected += 1
            yield _unpackb(value, raw=False, use_list=True)

    def _delete(self, txn: lmdb.Transaction, group: bytes) -> None:
        prefix = _prefix(group)
        cur = txn.cursor(db=self.db)
        while cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
            cur.delete()

    # -- reading ---------------------------------------------------------------

    def app_version(self, txn: lmdb.Transaction, app_id: str) -> int | None:
        """The last version application ``app_id`` committed, or None."""
        if self.db is None:
            return None
        raw = txn.get(_app_key(app_id), db=self.db)
        return None if raw is None else int(_U64.unpack(raw)[0])

    def open_groups(self, txn: lmdb.Transaction) -> list[tuple[bytes, int]]:
        """``(group, parts)`` of every group with parts and no commit or abort yet."""
        if self.db is None:
            return []
        found: dict[bytes, int] = {}
        cur = txn.cursor(db=self.db)
        if cur.set_range(b"p"):
            for key in cur.iternext(keys=True, values=False):
                if key[:1] != b"p":
                    break
                group = bytes(key[2:2 + key[1]])
                found[group] = found.get(group, 0) + 1
        return list(found.items())

    # -- snapshots -------------------------------------------------------------

    def sections(self, txn: lmdb.Transaction) -> dict[str, Any]:
        """``{"groups": db}`` when it holds anything in ``txn``: a snapshot's bookkeeping section."""
        if self.db is None or not txn.stat(self.db)["entries"]:
            return {}
        return {DB_NAME: self.db}

    def load(self, txn: lmdb.Transaction, pairs: list[tuple[bytes, bytes]]) -> None:
        """Bulk-load a snapshot section's pairs."""
        txn.cursor(db=self.db).putmulti(pairs, dupdata=False, overwrite=True, append=False)


__all__ = ["DB_NAME", "Groups"]
