"""``walkv export``: a Spark job that writes a store's snapshot, changes and state as Parquet.

Output layout (``OUT`` is a local path or any URI Spark and pyarrow know)::

    OUT/snapshot/            the newest snapshot: key, value, lsn, keyspace
    OUT/changes/             the log after it: key, value, end_key, _change_type,
                             _commit_version, _commit_timestamp, _op_index, keyspace
    OUT/state/               the store's contents at the export's end LSN: key, value, lsn, keyspace
    OUT/state_merge/         (``merge=True``) what a MERGE needs instead of ``state/``:
                             key, value, lsn, keyspace, _deleted, _export_lsn
    OUT/_walkv_export.json   what was exported: store, keyspaces, LSNs, row counts, time
    OUT/_checkpoints/changes the streaming checkpoint (``incremental=True`` only)

Every keyspace is exported by default (``keyspace="*"``), each row naming its
own in the ``keyspace`` column; ``keyspace=NAME`` exports one. The summary
(:func:`describe`) and ``_walkv_export.json`` (``keyspace``, and per table
``keyspaces``: rows per keyspace) say which.

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

``merge=True`` writes ``state`` as the rows a ``MERGE INTO`` takes instead of
rewriting it: the keys changed since the previous run, with tombstones
(:mod:`kvstore.spark.merge`).

Columns are those of the ``walkv`` data source (:mod:`kvstore.spark.arrow`);
keys and values stay binary unless ``key_format``/``value_format`` say
``"string"``. ``_commit_timestamp`` is Parquet's ``TIMESTAMP_MICROS`` (an
INT64 of microseconds, adjusted to UTC), not INT96.
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
from kvstore.spark.arrow import ALL_KEYSPACES, BINARY, CHANGES, SNAPSHOT, STATE, TABLES
from kvstore.spark.files import normalize_location
from kvstore.spark.merge import EXPORT_LSN, merge_rows
from kvstore.spark.options import parse
from kvstore.spark.partitions import plan
from kvstore.spark.source import register, spark_schema
from wal.errors import LogGapError, WalkvError
from wal.progress import Progress

log = logging.getLogger("walkv.export")

META_NAME = "_walkv_export.json"
CHECKPOINTS = "_checkpoints"
STATE_MERGE = "state_merge"
TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"
"""Written as ``TIMESTAMP_MICROS`` (Parquet's INT64 timestamp, microseconds,
UTC), not Spark's default INT96, which Parquet deprecates."""


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


def _keyspace_counts(column: Any) -> dict[str, int]:
    """Rows per keyspace of a ``keyspace`` column (a pyarrow array)."""
    import pyarrow.compute as pc

    counts = pc.value_counts(column)
    return {str(ks): int(n) for ks, n in sorted(zip(counts.field("values").to_pylist(),
                                                      counts.field("counts").to_pylist()))}


def _rows_by_keyspace(path: str) -> dict[str, int]:
    """Rows per keyspace of a Parquet directory of a walkv table (its
    ``keyspace`` column only is read)."""
    import pyarrow.dataset as pads

    fs, root = _out_fs(path)
    return _keyspace_counts(pads.dataset(root, format="parquet", filesystem=fs).to_table(columns=["keyspace"])
                            .column("keyspace"))


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
    keyspace: str = ALL_KEYSPACES,
    merge: bool = False,
) -> dict[str, Any]:
    """Export ``store``'s ``table`` (snapshot, changes, state or all) of
    ``keyspace`` (default ``*``: every one) to Parquet under ``out``; see the
    module docstring. Returns what ``OUT/_walkv_export.json`` holds: the
    store, the keyspace option, the snapshot LSN, the end LSN, the first LSN
    the log holds and, per table, its path, LSN range and rows (in all and
    per keyspace) written by this run (:func:`describe` says it in words).

    Durability: Spark's Parquet commit protocol makes each table's files
    appear whole; the streaming checkpoint makes an incremental run append
    each LSN exactly once. ``progress(done, total)`` counts tables.
    """
    tables = _tables(table)
    location = normalize_location(store)
    out = normalize_location(out)
    files = open_files(location)
    # One plan for every table: the snapshot, and the end LSN (durable now).
    p = plan(files, parse({"path": location, "table": STATE, "keyspace": keyspace}))
    snap_lsn = p.snapshot.lsn if p.snapshot is not None else 0
    fmt = {"keyFormat": key_format, "valueFormat": value_format, "keyspace": keyspace}
    spark, owned = _session(master)
    register(spark)
    timestamps = spark.conf.get(TIMESTAMP_CONF, None)  # the session's own, put back after
    spark.conf.set(TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    t0 = time.time()
    previous = _read_meta(out) if incremental else {}
    meta: dict[str, Any] = {
        "store": location,
        "store_id": files.store_id(),
        "keyspace": keyspace,
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
                elif name == STATE and merge:
                    first = int(previous["end_lsn"]) + 1 if previous.get("tables", {}).get(STATE, {}).get(
                        "shape") == STATE_MERGE else None
                    info = _state_merge(spark, location, _join(out, STATE_MERGE), first, p.to_lsn, snap_lsn, fmt)
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
                    info = {"path": path, "rows": rows, "from_lsn": lo, "to_lsn": hi,
                            "keyspaces": _rows_by_keyspace(path) if rows else {}}
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
        elif timestamps is None:
            spark.conf.unset(TIMESTAMP_CONF)
        else:
            spark.conf.set(TIMESTAMP_CONF, timestamps)


def _keyspaces_said(info: dict[str, Any]) -> str:
    counts = info.get("keyspaces")
    if not counts:
        return ""
    return " (keyspaces: " + ", ".join(f"{ks or repr(ks)} {n}" for ks, n in counts.items()) + ")"


def describe(meta: dict[str, Any]) -> list[str]:
    """What :func:`export` returns, for people: which keyspaces, then one
    line per table: its rows (per keyspace) and the LSNs they cover.
    ``changes`` says that it is the log after the snapshot (a batch read's
    default range) and how to read the whole log."""
    snap, end = int(meta["snapshot_lsn"]), int(meta["end_lsn"])
    first = meta.get("log_first_lsn")
    whole = "startingLsn=earliest for the whole log" + (
        f": LSNs {first}..{end}" if first is not None and first <= end else ", which holds no entries")
    keyspace = meta.get("keyspace", "")
    lines = ["every keyspace (the keyspace column names each row's; --keyspace NAME for one)"
             if keyspace == ALL_KEYSPACES else f"keyspace {keyspace!r} only"]
    for name, info in meta["tables"].items():
        rows = int(info["rows"])
        per = _keyspaces_said(info)
        if name == SNAPSHOT:
            lines.append((f"snapshot: {rows} rows, at LSN {snap}" if snap else f"snapshot: {rows} rows (no snapshot)")
                         + per)
        elif name == STATE and info.get("shape") == STATE_MERGE:
            a, b = info.get("from_lsn"), info.get("to_lsn", end)
            what = "every key (the first run)" if a is None else f"the keys changed in LSNs {a}..{b}"
            lines.append(f"state: {rows} rows appended to {STATE_MERGE}/, {what}, at LSN {b}, "
                         f"{info.get('deleted', 0)} of them tombstones{per}")
        elif name == STATE:
            lines.append(f"state: {rows} rows, the store at LSN {info.get('to_lsn', end)}{per}")
        elif info.get("from_lsn") is None or info.get("to_lsn") is None:
            lines.append(f"changes: {rows} rows ({whole})")  # an incremental run that found nothing new
        else:
            a, b = int(info["from_lsn"]), int(info["to_lsn"])
            if a > b:
                why = f"no LSNs after the snapshot at LSN {snap} up to the durable LSN {b}" if snap else "no LSNs"
                lines.append(f"changes: {rows} rows: {why} ({whole})")
            else:
                after = f"after the snapshot at LSN {snap}" if snap else "no snapshot: the log from its start"
                lines.append(f"changes: {rows} rows, LSNs {a}..{b} ({after}; {whole}){per}")
    return lines


def _state_merge(spark: Any, location: str, path: str, first: int | None, end: int, snap_lsn: int,
                 fmt: dict[str, str]) -> dict[str, Any]:
    """Append to ``path`` the MERGE rows of LSNs ``first .. end`` (``first``
    None: every key at ``end``; :mod:`kvstore.spark.merge`); what was appended."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    info: dict[str, Any] = {"path": path, "shape": STATE_MERGE, "from_lsn": first, "to_lsn": end}
    if first is not None and first > end:
        return {**info, "rows": 0, "deleted": 0, "keyspaces": {}}
    merge_rows(spark, location, first, end, snap_lsn, fmt).write.mode(
        "overwrite" if first is None else "append").parquet(path)
    fs, root = _out_fs(path)
    run = pads.dataset(root, format="parquet", filesystem=fs).to_table(
        columns=["keyspace", "_deleted"], filter=pads.field(EXPORT_LSN) == end)
    return {**info, "rows": run.num_rows, "deleted": int(pc.sum(run.column("_deleted")).as_py() or 0),
            "keyspaces": _keyspace_counts(run.column("keyspace"))}


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
