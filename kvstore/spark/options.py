"""The options of the ``walkv`` Spark data source, parsed and checked.

No pyspark here, so planning and reading can be tested without a session.

========================  ===========================================================
option                    meaning (names are case-insensitive, as Spark's are)
========================  ===========================================================
``path``                  the store: a local path or a URI (``load(path)`` sets it)
``table``                 ``changes`` (default; the only table a stream reads),
                          ``snapshot`` or ``state``
``keyFormat``             ``binary`` (default) or ``string`` (UTF-8, validated)
``keyspace``              the keyspace read (:mod:`kvstore.store.keyspace`): a
                          name, ``""`` (default: the default keyspace, all a
                          store made before keyspaces holds) or ``*``: every
                          keyspace, in every table and format (Debezium's
                          events name it in ``source.keyspace``). Each row
                          names its own in the ``keyspace`` column; a filter on
                          it prunes snapshot sections. A stream keeps the
                          default too (a checkpointed query must not begin to
                          deliver other rows after an upgrade); it logs a
                          warning naming the keyspaces it leaves out when the
                          newest snapshot holds others
``valueFormat``           ``binary`` (default) or ``string``
``snapshotLsn``           use the snapshot at exactly this LSN (default: the newest
                          valid one, or the newest at or before ``endingLsn``);
                          ``0`` means no snapshot (the log from LSN 1)
``startingLsn``           ``changes``: first LSN to read, inclusive: a number,
                          ``earliest`` (the oldest LSN the log still holds) or
                          ``latest`` (nothing yet). Batch default: the LSN after
                          the snapshot (below: which LSNs a batch read covers).
                          Stream default: ``earliest``
``endingLsn``             batch ``changes``/``state``: last LSN, inclusive (default:
                          the durable LSN when the query is planned). Past the
                          durable LSN is an error. ``state`` at an ``endingLsn`` is
                          the store as it was at that LSN (point in time)
``startingTimestamp``     instead of ``startingLsn``: the first LSN committed at or
                          after this time (ISO 8601, naive = UTC, or epoch
                          milliseconds as Kafka's option takes them)
``endingTimestamp``       batch, instead of ``endingLsn``: the last LSN committed at
                          or before this time
``maxRecordsPerTrigger``  stream: at most this many log records (committed
                          batches, i.e. LSNs) per micro-batch, as Kafka's
                          ``maxOffsetsPerTrigger``; a micro-batch has one row per
                          operation. ``maxRecordsPerBatch`` is the older name
``maxBytesPerTrigger``    stream: at most about this many bytes of log entries per
                          micro-batch (``64m``, ``1g`` or a number), as Delta's;
                          an entry larger than the cap is a micro-batch alone
``failOnDataLoss``        ``true`` (default): LSNs a read needs that retention
                          deleted are a ``LogGapError`` naming them; ``false``:
                          skip to the oldest LSN the log holds, with a warning
                          naming the skipped range
``startingFrom``          stream: ``log`` (default) or ``snapshot``: the first
                          micro-batch holds the newest snapshot's rows (as
                          ``upsert`` rows at the snapshot's LSN, ``_op_index``
                          -1, the snapshot's time; ``insert`` rows with
                          ``changeVocabulary=delta``), then the log after it.
                          Also for batch reads with ``format=debezium`` (``r``
                          events) or ``changeVocabulary=delta``
``format``                ``changes``: ``delta`` (default: Delta's change data
                          feed columns) or ``debezium`` (Debezium-shaped change
                          events, :mod:`kvstore.spark.debezium`)
``changeVocabulary``      ``changes``, ``format=delta``: the values of
                          ``_change_type``. ``walkv`` (default): ``upsert``,
                          ``delete``, ``delete_range``, one row per operation as
                          logged. ``delta``: Delta Lake's ``insert``,
                          ``update_preimage``/``update_postimage`` and ``delete``
                          with exact pre-images, batch or stream: a put of a key
                          that did not exist is ``insert``, of one that did an
                          ``update_preimage`` row (the old value) and an
                          ``update_postimage`` row (the new); a delete of a key
                          that existed is ``delete`` with the value it deleted (of
                          one that did not: no row); a range delete is one
                          ``delete`` per key it deleted. See
                          :mod:`kvstore.spark.delta_cdf`
``maxPartitionBytes``     split log segments larger than this (``64m``, ``1m`` or a
                          number of bytes; default 32 MiB) at sparse-index points,
                          the active segment too (up to the durable LSN)
``minPartitions``         ``changes``: at least about this many partitions, as
                          Kafka's option: the LSN range is cut into pieces of
                          ``1/minPartitions`` of its bytes when that is smaller
                          than ``maxPartitionBytes``. Default: the session's
                          default parallelism (its executors' cores, taken by
                          :func:`~kvstore.spark.register`), for a range of at
                          least 1 MiB a piece, so a long tail, batch or
                          micro-batch, uses every executor
``rowsPerBatch``          rows per Arrow record batch a task yields (default 65536)
========================  ===========================================================

Which LSNs a batch read of ``changes`` covers: by default ``S+1 .. E``, where
``S`` is the LSN of the snapshot the read is planned with (the newest, the
newest at or before ``endingLsn``, or ``snapshotLsn``'s; 0 without one) and
``E`` the durable LSN when the query is planned (or ``endingLsn``). So
``snapshot`` + ``changes`` = ``state``, and right after a snapshot a batch
read of ``changes`` has 0 rows. ``startingLsn=earliest`` reads every LSN the
log still holds (Kafka's batch default), a number or ``startingTimestamp``
starts there. A stream starts at ``earliest``.

Why the batch default is not ``earliest``: ``earliest`` is wherever retention
last cut the log, by whole segments, so usually some way into the history the
oldest kept snapshot covers; and the formats with pre-images
(``format=debezium``, ``changeVocabulary=delta``) cannot start there: they
rebuild each key's previous value from a snapshot at or before the LSN before
the first one read, and a trimmed log usually has none (a ``LogGapError``).
After the newest snapshot is the one range every format reads exactly, on
every store. Delta's change data feed asks for a starting version rather than
pick one; walkv picks this one and says so.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.entry.codec import check_keyspace
from kvstore.spark.arrow import ALL_KEYSPACES, BINARY, CHANGES, FORMATS, STRING, TABLES

EARLIEST = "earliest"
LATEST = "latest"

DEFAULT_MAX_PARTITION_BYTES = 32 << 20
DEFAULT_MIN_PIECE_BYTES = 1 << 20
"""The smallest piece a read is cut into to use every executor when
``minPartitions`` is not given (a task costs more than reading 1 MiB)."""
DEFAULT_ROWS_PER_BATCH = 65536

KNOWN = {
    "path": "path",
    "table": "table",
    "keyformat": "keyFormat",
    "keyspace": "keyspace",
    "valueformat": "valueFormat",
    "snapshotlsn": "snapshotLsn",
    "startinglsn": "startingLsn",
    "endinglsn": "endingLsn",
    "maxrecordsperbatch": "maxRecordsPerTrigger",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
    "maxbytespertrigger": "maxBytesPerTrigger",
    "startingtimestamp": "startingTimestamp",
    "endingtimestamp": "endingTimestamp",
    "failondataloss": "failOnDataLoss",
    "startingfrom": "startingFrom",
    "maxpartitionbytes": "maxPartitionBytes",
    "minpartitions": "minPartitions",
    "rowsperbatch": "rowsPerBatch",
    "format": "format",
    "changevocabulary": "changeVocabulary",
}

DELTA = "delta"
DEBEZIUM = "debezium"
WALKV = "walkv"
VOCABULARIES = (WALKV, DELTA)


@dataclass(frozen=True)
class Options:
    path: str
    table: str = CHANGES
    key_format: str = BINARY
    value_format: str = BINARY
    snapshot_lsn: int | None = None
    starting_lsn: int | str | None = None
    ending_lsn: int | None = None
    max_records_per_batch: int | None = None
    max_bytes_per_trigger: int | None = None
    starting_timestamp_us: int | None = None
    ending_timestamp_us: int | None = None
    fail_on_data_loss: bool = True
    starting_from_snapshot: bool = False
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    min_partitions: int | None = None
    """``minPartitions`` when given; else :attr:`parallelism` applies."""
    parallelism: int = 1
    """The session's default parallelism, given by the registered source."""
    rows_per_batch: int = DEFAULT_ROWS_PER_BATCH
    debezium: bool = False
    vocabulary: str = WALKV
    keyspace: str = ""
    """The keyspace read ("": the default one; ``*``: every keyspace)."""

    @property
    def keyspaces(self) -> frozenset[str] | None:
        """The keyspaces the read keeps (None: every one)."""
        return None if self.keyspace == ALL_KEYSPACES else frozenset([self.keyspace])

    def log_split(self) -> tuple[int, int, int]:
        """``(max_bytes, min_pieces, min_piece_bytes)`` for
        :meth:`~kvstore.spark.files.StoreFiles.plan_log` of a ``changes`` read."""
        if self.min_partitions is not None:
            return self.max_partition_bytes, self.min_partitions, 1
        return self.max_partition_bytes, self.parallelism, DEFAULT_MIN_PIECE_BYTES

    @property
    def needs_images(self) -> bool:
        """Rows that need each key's previous value (:mod:`kvstore.spark.images`)."""
        return self.debezium or self.vocabulary == DELTA


def _int(name: str, text: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {text!r}") from None
    if value < minimum:
        raise ValueError(f"option {name} must be at least {minimum}, not {value}")
    return value


_SIZES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}


def _bytes(name: str, text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(text).lower())
    if m is None or m.group(2) not in _SIZES or int(m.group(1)) < 1:
        raise ValueError(f"option {name} must be a positive number of bytes (like 67108864, 64m or 1g), not {text!r}")
    return int(m.group(1)) * _SIZES[m.group(2)]


def _bool(name: str, text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {text!r}")
    return value == "true"


def timestamp_us(name: str, text: str) -> int:
    """A time option as microseconds since the epoch: epoch milliseconds
    (digits, as Kafka's ``startingTimestamp``) or ISO 8601 (naive: UTC)."""
    value = str(text).strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"option {name} must be a time (ISO 8601 like 2026-01-31T12:00:00Z, or epoch "
                         f"milliseconds), not {text!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return (t - _EPOCH) // datetime.timedelta(microseconds=1)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _format(name: str, text: str) -> str:
    value = str(text).strip().lower()
    if value in ("utf8", "utf-8", "str"):
        value = STRING
    if value not in FORMATS:
        raise ValueError(f"option {name} must be 'binary' or 'string', not {text!r}")
    return value


def parse(options: Mapping[str, str], *, streaming: bool | None = False, parallelism: int = 1) -> Options:
    """Check the data source's options; ``ValueError`` names the bad one.
    ``parallelism``: the session's default parallelism (``minPartitions``'s default).

    ``streaming=None`` (Spark asks for the schema before it says whether the
    read is a stream) skips the checks that depend on it."""
    raw: dict[str, str] = {}
    for key, value in dict(options).items():
        canon = KNOWN.get(str(key).lower())
        if canon is None:
            raise ValueError(
                f"unknown option {key!r} for the walkv data source; known options: {', '.join(sorted(KNOWN.values()))}"
            )
        raw[canon] = value
    path = raw.get("path")
    if not path:
        raise ValueError("give the store's path: spark.read.format('walkv').load('/path/to/store')")
    table = str(raw.get("table", CHANGES)).strip().lower()
    if table not in TABLES:
        raise ValueError(f"option table must be one of {', '.join(TABLES)}, not {raw['table']!r}")
    if streaming is True and table != CHANGES:
        raise ValueError(f"a stream reads table=changes only (not {table!r}); use spark.read for {table}")
    snapshot_lsn = _int("snapshotLsn", raw["snapshotLsn"], 0) if "snapshotLsn" in raw else None
    starting: int | str | None = None
    if "startingLsn" in raw:
        text = str(raw["startingLsn"]).strip().lower()
        starting = text if text in (EARLIEST, LATEST) else _int("startingLsn", text, 1)
    if starting is not None and table != CHANGES:
        raise ValueError(f"option startingLsn applies to table=changes, not {table}")
    ending = _int("endingLsn", raw["endingLsn"], 0) if "endingLsn" in raw else None
    if ending is not None and streaming is True:
        raise ValueError("option endingLsn is for batch reads; a stream ends when it is stopped")
    if ending is not None and table == "snapshot":
        raise ValueError("option endingLsn applies to table=changes or state; use snapshotLsn for a snapshot")
    if isinstance(starting, int) and ending is not None and ending < starting - 1:
        raise ValueError(f"endingLsn {ending} is before startingLsn {starting}")
    if snapshot_lsn is not None and ending is not None and snapshot_lsn > ending:
        raise ValueError(f"snapshotLsn {snapshot_lsn} is after endingLsn {ending}")
    starting_ts = timestamp_us("startingTimestamp", raw["startingTimestamp"]) if "startingTimestamp" in raw else None
    ending_ts = timestamp_us("endingTimestamp", raw["endingTimestamp"]) if "endingTimestamp" in raw else None
    if starting_ts is not None and starting is not None:
        raise ValueError("give startingLsn or startingTimestamp, not both")
    if ending_ts is not None and ending is not None:
        raise ValueError("give endingLsn or endingTimestamp, not both")
    if starting_ts is not None and table != CHANGES:
        raise ValueError(f"option startingTimestamp applies to table=changes, not {table}")
    if ending_ts is not None and (streaming is True or table == "snapshot"):
        raise ValueError("option endingTimestamp is for batch reads of table=changes or state")
    fmt = str(raw.get("format", DELTA)).strip().lower()
    if fmt not in (DELTA, DEBEZIUM):
        raise ValueError(f"option format must be '{DELTA}' or '{DEBEZIUM}', not {raw['format']!r}")
    if fmt == DEBEZIUM and table != CHANGES:
        raise ValueError(f"option format=debezium applies to table=changes, not {table}")
    vocabulary = str(raw.get("changeVocabulary", WALKV)).strip().lower()
    if vocabulary not in VOCABULARIES:
        raise ValueError(f"option changeVocabulary must be '{WALKV}' or '{DELTA}', not {raw['changeVocabulary']!r}")
    if vocabulary == DELTA and (table != CHANGES or fmt == DEBEZIUM):
        raise ValueError("option changeVocabulary=delta applies to table=changes in format=delta (Debezium's "
                         f"events have their own op codes), not table={table}, format={fmt}")
    for name in ("maxRecordsPerTrigger", "maxBytesPerTrigger", "startingFrom"):
        if name == "startingFrom" and (fmt == DEBEZIUM or vocabulary == DELTA):
            continue  # a batch read with pre-images may begin with the snapshot's rows
        if name in raw and streaming is False:
            raise ValueError(f"option {name} is for streams (spark.readStream)")
    max_records = _int("maxRecordsPerTrigger", raw["maxRecordsPerTrigger"], 1) if "maxRecordsPerTrigger" in raw else None
    max_bytes = _bytes("maxBytesPerTrigger", raw["maxBytesPerTrigger"]) if "maxBytesPerTrigger" in raw else None
    starting_from = str(raw.get("startingFrom", "log")).strip().lower()
    if starting_from not in ("log", "snapshot"):
        raise ValueError(f"option startingFrom must be 'log' or 'snapshot', not {raw['startingFrom']!r}")
    if starting_from == "snapshot" and (starting is not None or starting_ts is not None):
        raise ValueError("startingFrom=snapshot starts at the newest snapshot; leave startingLsn/startingTimestamp out")
    keyspace = str(raw.get("keyspace", ""))
    if keyspace != ALL_KEYSPACES:
        check_keyspace(keyspace)  # ValueError naming what is wrong
    return Options(
        path=str(path),
        table=table,
        key_format=_format("keyFormat", raw.get("keyFormat", BINARY)),
        value_format=_format("valueFormat", raw.get("valueFormat", BINARY)),
        snapshot_lsn=snapshot_lsn,
        starting_lsn=starting,
        ending_lsn=ending,
        max_records_per_batch=max_records,
        max_bytes_per_trigger=max_bytes,
        starting_timestamp_us=starting_ts,
        ending_timestamp_us=ending_ts,
        fail_on_data_loss=_bool("failOnDataLoss", raw.get("failOnDataLoss", "true")),
        starting_from_snapshot=starting_from == "snapshot",
        max_partition_bytes=_bytes("maxPartitionBytes", raw.get("maxPartitionBytes", str(DEFAULT_MAX_PARTITION_BYTES))),
        min_partitions=_int("minPartitions", raw["minPartitions"], 1) if "minPartitions" in raw else None,
        parallelism=max(1, int(parallelism)),
        rows_per_batch=_int("rowsPerBatch", raw.get("rowsPerBatch", str(DEFAULT_ROWS_PER_BATCH)), 1),
        debezium=fmt == DEBEZIUM,
        vocabulary=vocabulary,
        keyspace=keyspace,
    )
