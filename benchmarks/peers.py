"""The peers walkv is measured against, behind one small face.

Each key-value peer is opened on its own fresh directory, durable
(``sync=True``: every write is on disk when it returns) or not, and offers:

* ``writer()`` -> ``put(key, value)`` for the calling thread,
* ``reader()`` -> ``get(key)`` for the calling thread,
* ``write_batch(items)``: all of ``items`` in one atomic write,
* ``close()``.

Durability per peer, as configured here:

* LevelDB (plyvel): ``put(sync=True)`` / ``write_batch(sync=True)`` (fsync of
  its log); plain ``put()`` otherwise (survives a process crash).
* RocksDB (rocksdict, raw bytes mode): ``WriteOptions.sync`` likewise.
* LMDB (py-lmdb): one write transaction per put; ``sync=True`` is LMDB's
  default (fsync at commit), otherwise ``sync=False, metasync=False``.
* SQLite: WAL journal, ``synchronous=FULL`` when durable (the WAL is synced at
  every commit), ``NORMAL`` otherwise (synced only at checkpoints); autocommit,
  one connection per thread.
* ``PlainLog``: ``os.write`` of the payload to an O_APPEND file, then
  ``os.fdatasync``: the floor any durable log has to beat.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Callable, Iterable

Put = Callable[[bytes, bytes], object]
Get = Callable[[bytes], object]


class LevelDB:
    name = "leveldb"
    requires = ("plyvel",)

    def __init__(self, path: str, sync: bool, **options: object) -> None:
        import plyvel

        self.db = plyvel.DB(path, create_if_missing=True, **options)
        self.sync = sync

    def writer(self) -> Put:
        put = self.db.put
        if self.sync:
            return lambda k, v: put(k, v, sync=True)
        return put

    def reader(self) -> Get:
        return self.db.get

    def write_batch(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        with self.db.write_batch(sync=self.sync) as wb:
            for k, v in items:
                wb.put(k, v)

    def close(self) -> None:
        self.db.close()


class RocksDB:
    name = "rocksdb"
    requires = ("rocksdict",)

    def __init__(self, path: str, sync: bool) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        self.db = Rdict(path, Options(raw_mode=True))
        wo = WriteOptions()
        wo.sync = sync
        self.db.set_write_options(wo)

    def writer(self) -> Put:
        return self.db.put

    def reader(self) -> Get:
        return self.db.get

    def write_batch(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, v in items:
            wb.put(k, v)
        self.db.write(wb)

    def close(self) -> None:
        self.db.close()


class LMDB:
    name = "lmdb"
    requires = ("lmdb",)

    def __init__(self, path: str, sync: bool, map_size: int = 8 << 30) -> None:
        import lmdb

        self.env = lmdb.open(path, map_size=map_size, sync=sync, metasync=sync)
        self._txns: list[object] = []

    def writer(self) -> Put:
        begin = self.env.begin

        def put(k: bytes, v: bytes) -> None:
            with begin(write=True) as txn:
                txn.put(k, v)

        return put

    def reader(self) -> Get:
        """``get`` on one read transaction held for the reader's life (LMDB's
        cheapest read path: no transaction set-up per get)."""
        txn = self.env.begin()
        self._txns.append(txn)
        return txn.get

    def reader_txn_per_get(self) -> Get:
        begin = self.env.begin

        def get(k: bytes) -> object:
            with begin() as txn:
                return txn.get(k)

        return get

    def write_batch(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def close(self) -> None:
        for txn in self._txns:
            txn.abort()  # type: ignore[attr-defined]
        self.env.close()


class SQLite:
    name = "sqlite"
    requires = ("sqlite3",)

    def __init__(self, path: str, sync: bool) -> None:
        os.makedirs(path, exist_ok=True)
        self.file = os.path.join(path, "kv.sqlite")
        self.synchronous = "FULL" if sync else "NORMAL"
        self._cons: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        con = self._connect()
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.file, isolation_level=None, check_same_thread=False, timeout=600)
        con.execute(f"PRAGMA synchronous={self.synchronous}")
        with self._lock:
            self._cons.append(con)
        return con

    def writer(self) -> Put:
        execute = self._connect().execute
        sql = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"
        return lambda k, v: execute(sql, (k, v))

    def reader(self) -> Get:
        con = self._connect()
        sql = "SELECT v FROM kv WHERE k = ?"

        def get(k: bytes) -> object:
            row = con.execute(sql, (k,)).fetchone()
            return row[0] if row else None

        return get

    def write_batch(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        con = self._cons[0]
        con.execute("BEGIN")
        con.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", items)
        con.execute("COMMIT")

    def close(self) -> None:
        for con in self._cons:
            con.close()


KV_PEERS = {cls.name: cls for cls in (LevelDB, RocksDB, LMDB, SQLite)}


class PlainLog:
    """``os.write`` + ``os.fdatasync`` on an O_APPEND file, one payload each."""

    name = "plain"
    requires = ()

    def __init__(self, path: str) -> None:
        self.fd = os.open(os.path.join(path, "plain.log"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, payload: bytes) -> None:
        os.write(self.fd, payload)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def versions() -> dict[str, str | None]:
    """Versions of the peers' libraries (and the engines inside them)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("walkv", "plyvel", "rocksdict", "lmdb", "msgpack", "crcmod", "google-crc32c",
                 "pyspark", "pyarrow", "rich", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["sqlite"] = sqlite3.sqlite_version
    try:
        import plyvel

        out["leveldb"] = getattr(plyvel, "__leveldb_version__", None)
    except ImportError:
        out["leveldb"] = None
    try:
        import lmdb

        out["liblmdb"] = ".".join(map(str, lmdb.version()))
    except ImportError:
        out["liblmdb"] = None
    return out
