"""Loading a snapshot's contents into an environment being rebuilt: the
default keyspace's pairs, each named keyspace's (snapshot section
``ks:<name>``), the expiry metadata's sections (:mod:`kvstore.state.expiry`) and
the staged groups' (:mod:`kvstore.state.groups`),
in write transactions of a bounded number of pairs. What marks the load done
(``walkv.complete``) is :mod:`kvstore.state.meta`'s, written by the caller after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from itertools import islice

import lmdb

from kvstore.entry.codec import KEYSPACE_SECTION
from kvstore.entry.limits import DEFAULT_KEYSPACE
from kvstore.state.environment import Environment
from kvstore.state.expiry import DB_NAMES as EXPIRY_DBS
from kvstore.state.expiry import Expiry
from kvstore.state.groups import DB_NAME as GROUPS_DB
from kvstore.state.groups import Groups
from wal.errors import SnapshotError

Pairs = Iterable[tuple[bytes, bytes]]


def load_sections(env: Environment, expiry: Expiry, groups: Groups, pairs: Pairs, sections: Mapping[str, Pairs],
                  chunk: int) -> int:
    """Bulk-load ``pairs`` (sorted by key) into the default keyspace and each
    of ``sections`` (a snapshot's, ``"ks:<name>"`` or an expiry database's
    name -> pairs) where it belongs, ``chunk`` pairs per write transaction.
    Returns the number of keyspace pairs loaded. A section this version does
    not know is a :class:`~wal.errors.SnapshotError` (a newer walkv wrote it)."""
    runs: list[tuple[str, Pairs]] = [(DEFAULT_KEYSPACE, pairs)]
    metadata: list[tuple[str, Pairs]] = []
    for name, section in sorted(sections.items()):
        if name.startswith(KEYSPACE_SECTION):
            runs.append((name[len(KEYSPACE_SECTION):], section))
        elif name in EXPIRY_DBS or name == GROUPS_DB:
            metadata.append((name, section))
        else:
            raise SnapshotError(f"the snapshot holds a section {name!r} this walkv does not know "
                                f"(a newer walkv wrote it): use that walkv to restore it")
    n = 0
    for keyspace, run in runs:
        it = iter(run)
        while items := list(islice(it, chunk)):
            env.write(partial(_load_keyspace, env, keyspace, items))
            n += len(items)
    for name, section in metadata:
        rest = iter(section)
        while items := list(islice(rest, chunk)):
            env.write(partial(expiry.load, name=name, pairs=items) if name != GROUPS_DB
                      else partial(groups.load, pairs=items))
    return n


def _load_keyspace(env: Environment, keyspace: str, items: list[tuple[bytes, bytes]], txn: lmdb.Transaction) -> None:
    db = env.keyspace_db_in(txn, keyspace)
    txn.cursor(db=db).putmulti(items, dupdata=False, overwrite=True, append=False)
