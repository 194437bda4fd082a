"""The keyspaces' named databases of one LMDB environment
(:class:`KeyspaceDbs`): keyspace ``name`` is the named database ``ks:<name>``
(the default keyspace is ``data``; why named databases: :mod:`kvstore.store.keyspace`).

A handle is opened once and kept: LMDB shares a handle with every transaction
begun after it was opened, and opening one must be serialized. One created by a
write transaction exists only once that transaction commits, so until then it is
not handed to readers, and it is forgotten if the transaction does not commit
(:meth:`KeyspaceDbs.forget_created`). :attr:`KeyspaceDbs.epoch` counts the handles
added, so that a reader that lists keyspaces can tell whether one appeared while
it read.

A handle that is not open yet is opened while no write transaction is in
progress (:meth:`KeyspaceDbs.write_begins` to :meth:`KeyspaceDbs.write_ended`),
and no write transaction begins while one is being opened. The reason:
py-lmdb's ``open_db`` without a transaction begins a write transaction of its
own while it holds the GIL, so if another thread held LMDB's writer lock, the
two would wait for each other for ever: the opener for the writer lock, the
writer (py-lmdb lets go of the GIL around each key it writes) for the GIL. A
RESP client's first command in a database not written yet (SELECT 2, then a
pipeline of SETs) froze the whole server while an overlay flush ran.
Waiting here lets go of the GIL. A keyspace whose database is not in LMDB
(never written) is told apart first, by a read transaction, which waits for
no writer: reading it answers at once, even beside a write transaction.
"""

from __future__ import annotations

import threading

import lmdb

from kvstore.state.lmdb_ops import read_error

KEYSPACE_PREFIX = b"ks:"
"""Keyspace ``name`` is the named database ``ks:<name>`` (the default
keyspace is ``data``)."""


class KeyspaceDbs:
    """The handles of one environment's keyspace databases (see the module
    docstring); ``main_db`` lists them, ``data_db`` is the default keyspace's."""

    def __init__(self, env: lmdb.Environment, main_db: lmdb._Database, data_db: lmdb._Database, path: str) -> None:
        self.env = env
        self.main_db = main_db
        self.data_db = data_db
        self.path = path
        self._handles: dict[str, lmdb._Database] = {}
        self._lock = threading.Lock()
        self._no_write = threading.Condition(self._lock)  # notified when a write transaction ends
        self._writer: int | None = None  # the thread whose write transaction is in progress
        self._created: list[str] = []  # opened in the write transaction in progress
        self.epoch = 0  # bumped whenever a handle is added

    def get(self, name: str) -> lmdb._Database | None:
        """The handle of keyspace ``name``'s database ("": ``data``), opened
        on first use; None when it does not exist (never written)."""
        if not name:
            return self.data_db
        db = self._handles.get(name)
        if db is not None and not self._created:
            return db
        if not self._in_lmdb(name):
            return None  # (never written, as of now: nothing to open, and no reason to wait for a writer)
        with self._lock:
            while True:
                if name in self._created:
                    return None  # created by the write transaction in progress: not there yet
                known = self._handles.get(name)
                if known is not None:
                    return known
                if self._writer is None or self._writer == threading.get_ident():
                    break  # (the writer's own thread: py-lmdb refuses its second write transaction)
                self._no_write.wait()  # (module docstring: never open_db beside a write transaction)
            try:
                opened = self.env.open_db(KEYSPACE_PREFIX + name.encode("ascii"), create=False)
            except lmdb.NotFoundError:
                return None
            except lmdb.Error as exc:
                raise read_error(exc, self.path) from None
            self._handles[name] = opened
            self.epoch += 1
            return opened

    def _in_lmdb(self, name: str) -> bool:
        """Whether keyspace ``name``'s database is in LMDB now: its record in
        the main database, looked up in a read transaction of its own (which
        needs no writer lock, unlike ``open_db``)."""
        try:
            with self.env.begin() as txn:
                return txn.get(KEYSPACE_PREFIX + name.encode("ascii"), db=self.main_db) is not None
        except lmdb.Error as exc:
            raise read_error(exc, self.path) from None

    def get_in(self, txn: lmdb.Transaction, name: str) -> lmdb._Database:
        """In the write transaction ``txn``: keyspace ``name``'s database,
        created if need be (forgotten again if ``txn`` does not commit)."""
        if not name:
            return self.data_db
        db = self._handles.get(name)
        if db is not None:
            return db
        with self._lock:
            db = self.env.open_db(KEYSPACE_PREFIX + name.encode("ascii"), txn=txn, create=True)
            self._handles[name] = db
            self._created.append(name)
            self.epoch += 1
        return db

    def names(self, txn: lmdb.Transaction) -> list[str]:
        """The keyspaces with a database in ``txn``'s snapshot, sorted (empty
        ones too: a dropped keyspace keeps its emptied database)."""
        cur = txn.cursor(db=self.main_db)
        names = []
        if cur.set_range(KEYSPACE_PREFIX):
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(KEYSPACE_PREFIX):  # type: ignore[union-attr]  # bytes: no buffers=True
                    break
                names.append(key[len(KEYSPACE_PREFIX):].decode("ascii"))  # type: ignore[union-attr]
        return names

    def forget_created(self) -> None:
        """The write transaction did not commit: the handles it opened die with it."""
        with self._lock:
            for name in self._created:
                self._handles.pop(name, None)

    def write_begins(self) -> None:
        """This thread is about to begin a write transaction: from now until
        :meth:`write_ended`, handles are opened by it alone (module docstring).
        Waits while another thread opens one."""
        with self._lock:
            self._writer = threading.get_ident()

    def write_ended(self) -> None:
        """The write transaction committed or was aborted (after :meth:`forget_created`),
        or never began."""
        with self._lock:
            self._created.clear()
            self._writer = None
            self._no_write.notify_all()
