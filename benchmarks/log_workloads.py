"""Issue 2 workloads: the log (``wal.open``) against LevelDB and a plain
append+fdatasync loop, 100-byte payloads.

* ``log.append.durable.{1,8,32}t``: appends/s with ``sync="always"`` from 1, 8
  and 32 threads for a fixed time, vs plyvel ``put(sync=True)`` from as many
  threads (16-byte key + the same 100-byte value) and vs ``os.write`` +
  ``os.fdatasync`` from one thread. Targets: 1 thread >= 1x the plain loop,
  8 threads >= 1x LevelDB.
* ``log.append.nosync.1t``: ``sync="none"`` appends of N pre-built payloads vs
  plyvel ``put()`` of N pre-built items: >= 0.7x (issue 21's bar).
* ``log.read``: opening a log of N entries and reading it all back (CRC
  checked), in a fresh process, vs LevelDB reopening a database whose N puts
  are all still in its log (``write_buffer_size`` 1 GiB, so nothing was
  flushed to tables): the reopen replays the log into a memtable (and writes
  it out as a level-0 table, as LevelDB always does after recovery). Records/s,
  >= 0.5x; peak RSS of both children reported.
* ``log.memory``: reading a 1 GiB log (16 MiB in --quick) in a fresh
  process: peak RSS (wait4's ru_maxrss of the child, interpreter included)
  under 100 MB.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks import data
from benchmarks.harness import Config, Contender, Context, Limit, Measurement, Target, Workload
from benchmarks.peers import LevelDB, PlainLog
from benchmarks.timing import counted, counted_puts, in_child, in_child_on_copy, threaded, threaded_puts

WAL = ("wal:open",)
BATCH = 1000  # entries per append_batch when filling a log (untimed)
ENTRY_OVERHEAD = 7 + 16  # record header + "<QQ" (lsn, timestamp) per entry
LEVELDB_BIG_BUFFER = 1 << 30  # keep every put in LevelDB's log, none in tables


# ---- walkv ---------------------------------------------------------------

def _walkv_durable(threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        import wal

        log = wal.open(ctx.fresh_dir("wal"), sync="always")
        try:
            p = data.payload()
            append = log.append
            m = threaded(threads, seconds, lambda i: lambda n: append(p))
            m.extra.update(_stats(log))
            return m
        finally:
            log.close()

    return run


def _stats(log: Any) -> dict[str, Any]:
    try:
        s = log.stats()
    except Exception:
        return {}
    return {"walkv_stats": {k: v for k, v in s.items() if isinstance(v, (int, float, str))}}


def _walkv_nosync(n: int):
    def run(ctx: Context) -> Measurement:
        import wal

        payloads = data.payloads(n)
        log = wal.open(ctx.fresh_dir("wal"), sync="none")
        try:
            def block() -> int:
                append = log.append
                for p in payloads:
                    append(p)
                return len(payloads)

            return counted(block)
        finally:
            log.close()

    return run


def fill_log(directory: str, entries: int, sync: str = "none") -> None:
    """Write ``entries`` 100-byte payloads with append_batch (untimed set-up)."""
    import wal

    with wal.open(directory, sync=sync) as log:
        batch = data.payloads(BATCH)
        done = 0
        while done < entries:
            k = min(BATCH, entries - done)
            log.append_batch(batch if k == BATCH else batch[:k])
            done += k


def child_read_walkv(directory: str) -> dict[str, Any]:
    """In a fresh process: open the log and read every entry (CRC checked)."""
    import wal

    t0 = time.perf_counter()
    n = 0
    nbytes = 0
    with wal.open(directory, sync="none") as log:
        for _lsn, payload in log.read():
            n += 1
            nbytes += len(payload)
    return {"ops": n, "seconds": time.perf_counter() - t0, "payload_bytes": nbytes}


def _walkv_read_prepare(entries: int):
    def prepare(ctx: Context) -> str:
        d = os.path.join(ctx.directory, "log")
        fill_log(d, entries)
        return d

    return prepare


def _walkv_read(ctx: Context) -> Measurement:
    m = in_child("benchmarks.log_workloads:child_read_walkv", directory=ctx.state)
    m.extra["log_bytes"] = _dir_bytes(ctx.state)
    return m


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ---- peers ---------------------------------------------------------------

def _leveldb_durable(threads: int, seconds: float):
    def run(ctx: Context) -> Measurement:
        db = LevelDB(ctx.fresh_dir("leveldb"), sync=True)
        try:
            return threaded_puts(db.writer(), threads, seconds, data.payload())
        finally:
            db.close()

    return run


def _plain_durable(seconds: float):
    def run(ctx: Context) -> Measurement:
        log = PlainLog(ctx.fresh_dir("plain"))
        try:
            p = data.payload()
            append = log.append
            return threaded(1, seconds, lambda i: lambda n: append(p))
        finally:
            log.close()

    return run


def _leveldb_nosync(n: int):
    def run(ctx: Context) -> Measurement:
        items = data.items(n)
        db = LevelDB(ctx.fresh_dir("leveldb"), sync=False)
        try:
            return counted_puts(db.db.put, items)
        finally:
            db.close()

    return run


def _leveldb_replay_prepare(entries: int, shuffled: bool = False):
    """A LevelDB whose log holds ``entries`` puts (keys in order, or in
    :func:`benchmarks.data.shuffled` order), none in tables yet."""
    def prepare(ctx: Context) -> str:
        d = os.path.join(ctx.directory, "template")
        db = LevelDB(d, sync=False, write_buffer_size=LEVELDB_BIG_BUFFER)
        try:
            put = db.db.put
            for i in data.shuffled(entries) if shuffled else range(entries):
                put(data.key(i), data.value(i))
        finally:
            db.close()
        return d

    return prepare


def _leveldb_replay(ctx: Context) -> Measurement:
    return in_child_on_copy(ctx, "leveldb", "benchmarks.log_workloads:child_reopen_leveldb",
                            write_buffer_size=LEVELDB_BIG_BUFFER)


def child_reopen_leveldb(path: str, write_buffer_size: int) -> dict[str, Any]:
    """In a fresh process: time LevelDB's open (log replay), then count the
    records it recovered (untimed) so the rate is of records really replayed."""
    import plyvel

    t0 = time.perf_counter()
    db = plyvel.DB(path, write_buffer_size=write_buffer_size)
    seconds = time.perf_counter() - t0
    n = sum(1 for _ in db.iterator(include_value=False))
    db.close()
    return {"ops": n, "seconds": seconds}


# ---- the workloads -------------------------------------------------------

def workloads(cfg: Config) -> list[Workload]:
    secs = cfg.seconds(full=5.0, quick=0.5)
    nosync_n = cfg.size(full=500_000, quick=20_000)
    read_n = cfg.size(full=1_000_000, quick=20_000)
    mem_bytes = cfg.size(full=1 << 30, quick=16 << 20)
    mem_entries = mem_bytes // (data.VALUE_BYTES + ENTRY_OVERHEAD)
    out = []
    for threads in (1, 8, 32):
        targets = [Target("plain", 1.0)] if threads == 1 else []
        if threads == 8:
            targets.append(Target(f"leveldb-{threads}t", 1.0))
        out.append(Workload(
            name=f"log.append.durable.{threads}t", issue=2, unit="appends/s",
            title=f"durable appends (sync=always), {threads} thread(s), 100-byte payloads",
            requires=WAL, targets=targets, params={"threads": threads, "seconds": secs},
            contenders=[
                Contender("walkv", _walkv_durable(threads, secs), label=f"walkv append x{threads}"),
                Contender(f"leveldb-{threads}t", _leveldb_durable(threads, secs),
                          requires=LevelDB.requires, label=f"LevelDB put(sync=True) x{threads}"),
                Contender("plain", _plain_durable(secs), label="write+fdatasync loop x1"),
            ]))
    out.append(Workload(
        name="log.append.nosync.1t", issue=21, unit="appends/s",
        title="non-durable appends (sync=none), 1 thread, 100-byte payloads",
        requires=WAL, targets=[Target("leveldb", 0.7)], params={"entries": nosync_n},
        contenders=[
            Contender("walkv", _walkv_nosync(nosync_n), label="walkv append sync=none"),
            Contender("leveldb", _leveldb_nosync(nosync_n), requires=LevelDB.requires,
                      label="LevelDB put()"),
        ]))
    out.append(Workload(
        name="log.read", issue=2, unit="records/s",
        title="open + read the whole log (CRC checked) vs LevelDB reopen replay",
        requires=WAL, targets=[Target("leveldb-replay", 0.5)], params={"entries": read_n},
        contenders=[
            Contender("walkv", _walkv_read, prepare=_walkv_read_prepare(read_n),
                      label="walkv open+read"),
            Contender("leveldb-replay", _leveldb_replay, prepare=_leveldb_replay_prepare(read_n),
                      requires=LevelDB.requires, label="LevelDB reopen replay"),
        ]))
    out.append(Workload(
        name="log.memory", issue=2, unit="records/s",
        title=f"peak RSS reading a {mem_bytes >> 20} MiB log in a fresh process",
        requires=WAL, limits=[Limit("rss_mb", 100.0)], repeats=1,
        params={"log_bytes": mem_bytes, "entries": mem_entries},
        contenders=[Contender("walkv", _walkv_read, prepare=_walkv_read_prepare(mem_entries),
                              label="walkv open+read")]))
    return out
