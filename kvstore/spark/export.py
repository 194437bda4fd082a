"""``walkv export``: a Spark job that writes a store's snapshot, changes and state as Parquet.

Output layout (``OUT`` is a local path or any URI Spark and pyarrow know)::

    OUT/snapshot/            the newest snapshot: key, value, lsn
    OUT/changes/             the log after it: key, value, end_key, _change_type,
                             _commit_version, _commit_timestamp, _op_index
    OUT/state/               the store's contents at the export's end LSN: key, value, lsn
    OUT/_walkv_export.json   what was exported: store, LSNs, row counts, time
    OUT/_checkpoints/changes the streaming checkpoint (``incremental=True`` only)

Consistency: one plan fixes the snapshot and the end LSN (the durable LSN when
the export starts), and every table is read against it, so ``state`` equals
``snapshot`` with ``changes`` applied.

``incremental=True`` exports the changes with a streaming query
(``Trigger.AvailableNow``) whose checkpoint lives under ``OUT``: each run
appends only the LSNs the previous runs did not export (the first run starts
after the newest snapshot). ``snapshot`` is rewritten only when a newer
snapshot exists, and ``state`` (not append-only) is rewritten each run. If
retention deleted log segments between two runs, the run fails with
:class:`~wal.errors.LogGapError` naming the missing LSNs; export
again without ``incremental`` (or into a new ``OUT``) to start over.

Columns are those of the ``walkv`` data source (:mod:`kvstore.spark.arrow`);
keys and values stay binary unless ``key_format``/``value_format`` say
``"string"``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

from kvstore.spark.archive import open_files
from kvstore.spark.arrow import BINARY, CHANGES, SNAPSHOT, STATE, TABLES
from kvstore.spark.files import normalize_location
from kvstore.spark.options import parse
from kvstore.spark.partitions import plan
from kvstore.spark.source import register, spark_schema
from wal.errors import LogGapError, WalkvError
from wal.progress import Progress

log = logging.getLogger("walkv.export")

META_NAME = "_walkv_export.json"
CHECKPOINTS = "_checkpoints"


def _tables(table: str) -> list[str]:
    t = str(table).strip().lower()
    if t == "all":
        return [SNAPSHOT, CHANGES, STATE]
    if t not in TABLES:
        raise ValueError(f"table must be one of snapshot, changes, state or all, not {table!r}")
    return [t]


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _out_fs(out: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if "://" in out:
        filesystem, root = pafs.FileSystem.from_uri(out)
        return filesystem, str(root)
    return pafs.LocalFileSystem(), out


def _read_meta(out: str) -> dict[str, Any]:
    fs, root = _out_fs(out)
    try:
        with fs.open_input_stream(_join(root, META_NAME)) as f:
            meta: dict[str, Any] = json.loads(f.read().decode("utf-8"))
            return meta
    except (OSError, ValueError):  # none yet, or unreadable: start over
        return {}


def _write_meta(out: str, meta: dict[str, Any]) -> None:
    fs, root = _out_fs(out)
    fs.create_dir(root, recursive=True)
    tmp = _join(root, META_NAME + ".tmp")
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps(meta, indent=2, sort_keys=True).encode("utf-8"))
    fs.move(tmp, _join(root, META_NAME))


def _count_rows(path: str) -> int:
    """Rows of a Parquet directory, from the files' footers (no Spark job)."""
    import pyarrow.dataset as pads

    fs, root = _out_fs(path)
    return int(pads.dataset(root, format="parquet", filesystem=fs).count_rows())


def _session(master: str) -> tuple[Any, bool]:
    """The active SparkSession, or a new one on ``master`` (then we stop it)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    spark = (
        SparkSession.builder.master(master).appName("walkv-export")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


_GAP = re.compile(r"LogGapError: (LSNs (\d+)\.\.(\d+) .*)")


def _as_walkv_error(exc: BaseException, what: str) -> WalkvError:
    """A Spark failure as walkv's own error. Spark returns an executor's
    exception as its traceback's text only, so a LogGapError is recognised
    by its type name there and rebuilt with the LSNs it names; anything else
    becomes a WalkvError quoting the last line that names an error."""
    text = str(exc)
    gap = _GAP.search(text)
    if gap is not None:
        return LogGapError(gap.group(1).strip(), first_missing=int(gap.group(2)), last_missing=int(gap.group(3)))
    why = next(
        (ln.strip() for ln in reversed(text.splitlines()) if "Error" in ln and ":" in ln),
        text.strip().splitlines()[0] if text.strip() else type(exc).__name__,
    )
    return WalkvError(f"{what} failed: {why}")


def export(
    store: str,
    out: str,
    master: str = "local[*]",
    table: str = "all",
    incremental: bool = False,
    progress: Progress | None = None,
    *,
    key_format: str = BINARY,
    value_format: str = BINARY,
) -> dict[str, Any]:
    """Export ``store``'s ``table`` (snapshot, changes, state or all) to
    Parquet under ``out``; see the module docstring. Returns what
    ``OUT/_walkv_export.json`` holds: the store, the snapshot LSN, the end LSN,
    the first LSN the log holds and, per table, its path, LSN range and rows
    written by this run (:func:`describe` says it in words).

    Durability: Spark's Parquet commit protocol makes each table's files
    appear whole; the streaming checkpoint makes an incremental run append
    each LSN exactly once. ``progress(done, total)`` counts tables.
    """
    tables = _tables(table)
    location = normalize_location(store)
    out = normalize_location(out)
    files = open_files(location)
    # One plan for every table: the snapshot, and the end LSN (durable now).
    p = plan(files, parse({"path": location, "table": STATE}))
    snap_lsn = p.snapshot.lsn if p.snapshot is not None else 0
    fmt = {"keyFormat": key_format, "valueFormat": value_format}
    spark, owned = _session(master)
    register(spark)
    t0 = time.time()
    previous = _read_meta(out) if incremental else {}
    meta: dict[str, Any] = {
        "store": location,
        "store_id": files.store_id(),
        "snapshot_lsn": snap_lsn,
        "end_lsn": p.to_lsn,
        "log_first_lsn": files.first_held(p.durable_lsn),
        "incremental": bool(incremental),
        "tables": dict(previous.get("tables", {})) if incremental else {},
    }
    done = 0
    if progress is not None:
        progress(0, len(tables))
    try:
        for name in tables:
            path = _join(out, name)
            log.info("exporting %s of %s to %s", name, location, path)
            try:
                if name == CHANGES and incremental:
                    info = _changes_incremental(spark, location, out, path, snap_lsn, fmt)
                    prev = meta["tables"].get(CHANGES, {})
                    info["rows_total"] = int(prev.get("rows_total", 0)) + info["rows"]
                    if prev.get("from_lsn") is not None:
                        info["from_lsn"] = prev["from_lsn"]
                elif name == SNAPSHOT and incremental and previous.get("snapshot_lsn") == snap_lsn \
                        and SNAPSHOT in previous.get("tables", {}):
                    info = dict(previous["tables"][SNAPSHOT], rows=0, unchanged=True)
                else:
                    df = spark.read.format("walkv").options(**fmt).option("table", name)
                    # (A snapshot may be ahead of the durable LSN when the store
                    # syncs lazily: then the tail is empty and no end is given.)
                    if name == SNAPSHOT:
                        df = df.option("snapshotLsn", snap_lsn)
                    elif name == CHANGES:
                        df = df.option("startingLsn", p.from_lsn).option("endingLsn", p.to_lsn)
                    else:
                        df = df.option("snapshotLsn", snap_lsn)
                        if p.to_lsn >= snap_lsn:
                            df = df.option("endingLsn", p.to_lsn)
                    if name == CHANGES and p.to_lsn < p.from_lsn:
                        frame = spark.createDataFrame([], spark_schema(CHANGES, key_format, value_format))
                    else:
                        frame = df.load(location)
                    frame.write.mode("overwrite").parquet(path)
                    rows = _count_rows(path)
                    # snapshot: the snapshot's LSN; changes: the LSNs exported;
                    # state: the snapshot plus the log from from_lsn to to_lsn.
                    lo = snap_lsn if name == SNAPSHOT else p.from_lsn
                    hi = snap_lsn if name == SNAPSHOT else p.to_lsn
                    info = {"path": path, "rows": rows, "from_lsn": lo, "to_lsn": hi}
            except WalkvError:
                raise
            except Exception as exc:  # Spark's (py4j, captured) errors become walkv's
                raise _as_walkv_error(exc, f"exporting {name} of {location} to {path}") from exc
            meta["tables"][name] = info
            done += 1
            if progress is not None:
                progress(done, len(tables))
        meta["seconds"] = round(time.time() - t0, 3)
        meta["exported_at_us"] = time.time_ns() // 1000
        _write_meta(out, meta)
        return meta
    finally:
        if owned:
            spark.stop()


def describe(meta: dict[str, Any]) -> list[str]:
    """What :func:`export` returns, one line per table for people: its rows
    and the LSNs they cover. ``changes`` says that it is the log after the
    snapshot (a batch read's default range) and how to read the whole log."""
    snap, end = int(meta["snapshot_lsn"]), int(meta["end_lsn"])
    first = meta.get("log_first_lsn")
    whole = "startingLsn=earliest for the whole log" + (
        f": LSNs {first}..{end}" if first is not None and first <= end else ", which holds no entries")
    lines = []
    for name, info in meta["tables"].items():
        rows = int(info["rows"])
        if name == SNAPSHOT:
            lines.append(f"snapshot: {rows} rows, at LSN {snap}" if snap else f"snapshot: {rows} rows (no snapshot)")
        elif name == STATE:
            lines.append(f"state: {rows} rows, the store at LSN {info.get('to_lsn', end)}")
        elif info.get("from_lsn") is None or info.get("to_lsn") is None:
            lines.append(f"changes: {rows} rows ({whole})")  # an incremental run that found nothing new
        else:
            a, b = int(info["from_lsn"]), int(info["to_lsn"])
            if a > b:
                why = f"no LSNs after the snapshot at LSN {snap} up to the durable LSN {b}" if snap else "no LSNs"
                lines.append(f"changes: {rows} rows: {why} ({whole})")
            else:
                after = f"after the snapshot at LSN {snap}" if snap else "no snapshot: the log from its start"
                lines.append(f"changes: {rows} rows, LSNs {a}..{b} ({after}; {whole})")
    return lines


def _changes_incremental(spark: Any, location: str, out: str, path: str, snap_lsn: int, fmt: dict[str, str]) -> dict[str, Any]:
    checkpoint = _join(out, CHECKPOINTS, CHANGES)
    reader = spark.readStream.format("walkv").options(**fmt).option("startingLsn", snap_lsn + 1)
    query = (
        reader.load(location).writeStream.format("parquet").option("path", path)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    exc = query.exception()
    if exc is not None:
        raise _as_walkv_error(exc, f"exporting changes of {location} to {path}")
    progress = query.recentProgress or []
    rows = sum(int(pr.get("numInputRows", 0)) for pr in progress)
    start = end = None
    for pr in progress:
        for src in pr.get("sources", []):
            so, eo = src.get("startOffset"), src.get("endOffset")
            so = json.loads(so) if isinstance(so, str) else so
            eo = json.loads(eo) if isinstance(eo, str) else eo
            if so and start is None and pr.get("numInputRows", 0):
                start = int(so["lsn"]) + 1
            if eo:
                end = int(eo["lsn"])
    return {"path": path, "rows": rows, "from_lsn": start, "to_lsn": end, "checkpoint": checkpoint}
