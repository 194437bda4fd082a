"""Prometheus metrics of a store, in Prometheus' text exposition format.

``prometheus_text(db.stats())`` in the writing process gives everything:
LSNs (last, durable, applied, archived), the archive's lag and errors, the
log's appends, groups, fsyncs, fsync latency (p50/p99 over the last 4096)
and group sizes, and each durable subscription's lag and whether it was
invalidated (label ``subscription``). ``walkv stats --prometheus STORE`` gives what another
process can read from the files (LSNs; the archived LSN a sidecar publishes;
for a replica's directory, its applied LSN, its source's durable LSN and the
lag): fsync counters live in the writing process only.

Written by hand (the format is a few lines per metric), so it needs no
``prometheus-client``; serve the text from any HTTP handler at ``/metrics``.
Every sample carries the label ``store="<path>"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# (name, type, help, where in the stats: key under the top level or "log"/"archive")
_METRICS: tuple[tuple[str, str, str, str, str], ...] = (
    ("walkv_last_lsn", "gauge", "Last LSN written to the log.", "", "last_lsn"),
    ("walkv_durable_lsn", "gauge", "Last LSN known to be on disk (fsynced).", "", "durable_lsn"),
    ("walkv_applied_lsn", "gauge", "Last LSN applied (what the store's reads see).", "", "applied_lsn"),
    ("walkv_archived_lsn", "gauge", "Every durable entry up to this LSN is in the archive.", "archive",
     "archived_lsn"),
    ("walkv_archive_lag_lsns", "gauge", "Durable entries not yet in the archive.", "archive", "lag_lsns"),
    ("walkv_replica_source_durable_lsn", "gauge", "A replica's source's durable LSN (walkv stats REPLICA).",
     "replica", "source_durable_lsn"),
    ("walkv_replica_lag_lsns", "gauge", "Durable entries of its source a replica has not applied.", "replica",
     "lag_lsns"),
    ("walkv_archive_lag_seconds", "gauge", "Age of the oldest durable entry not yet in the archive.", "archive",
     "lag_seconds"),
    ("walkv_archive_errors_total", "counter", "Failed archive rounds (retried with backoff).", "archive", "errors"),
    ("walkv_archive_uploads_total", "counter", "Objects uploaded to the archive.", "archive", "uploads"),
    ("walkv_archive_uploaded_bytes_total", "counter", "Bytes uploaded to the archive.", "archive", "bytes"),
    ("walkv_log_appends_total", "counter", "Log entries appended.", "log", "appends"),
    ("walkv_log_bytes_total", "counter", "Log bytes appended.", "log", "bytes"),
    ("walkv_log_groups_total", "counter", "Commit groups written (group commit).", "log", "groups"),
    ("walkv_log_fsyncs_total", "counter", "fsyncs of the log.", "log", "fsyncs"),
    ("walkv_log_group_size_avg", "gauge", "Average entries per commit group.", "log", "avg_group"),
    ("walkv_log_group_size_max", "gauge", "Largest commit group.", "log", "max_group"),
    ("walkv_expiring_keys", "gauge", "Keys with a TTL or a lease.", "", "expiring_keys"),
    ("walkv_expired_swept_total", "counter", "Expired keys the sweeper deleted (this process).", "",
     "expired_swept"),
)
_SUBSCRIPTION_METRICS = (
    ("walkv_subscription_lag_lsns", "Durable LSNs a subscription has not acknowledged.", "lag_lsns"),
    ("walkv_subscription_lag_bytes", "Log bytes retention keeps for a subscription.", "lag_bytes"),
)
_LATENCY = ("walkv_log_fsync_seconds", "fsync latency of the log over the last 4096 fsyncs.",
            (("0.5", "fsync_p50_ms"), ("0.99", "fsync_p99_ms")))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return repr(float(value)) if isinstance(value, float) else str(value)


def _lines(stats: Mapping[str, Any]) -> Iterator[str]:
    labels = f'{{store="{_label(str(stats.get("path", "")))}"}}'
    for name, kind, text, section, key in _METRICS:
        source = stats.get(section) if section else stats
        value = _number(source.get(key)) if isinstance(source, Mapping) else None
        if value is None:
            continue
        yield f"# HELP {name} {text}"
        yield f"# TYPE {name} {kind}"
        yield f"{name}{labels} {value}"
    log = stats.get("log")
    if isinstance(log, Mapping) and log.get("fsyncs"):
        name, text, quantiles = _LATENCY
        yield f"# HELP {name} {text}"
        yield f"# TYPE {name} summary"
        for q, key in quantiles:
            yield f'{name}{labels[:-1]},quantile="{q}"}} {float(log[key]) / 1e3!r}'
        yield f"{name}_count{labels} {log['fsyncs']}"
    subs = [s for s in stats.get("subscriptions") or () if isinstance(s, Mapping)]
    if subs:
        for name, text, key in _SUBSCRIPTION_METRICS:
            yield f"# HELP {name} {text}"
            yield f"# TYPE {name} gauge"
            for sub in subs:
                yield f'{name}{labels[:-1]},subscription="{_label(str(sub["name"]))}"}} {int(sub[key])}'
        name = "walkv_subscription_invalidated"
        yield f"# HELP {name} 1 when retention gave up on a subscription (past max_retained_bytes)."
        yield f"# TYPE {name} gauge"
        for sub in subs:
            yield f'{name}{labels[:-1]},subscription="{_label(str(sub["name"]))}"}} {int(bool(sub["invalidated"]))}'


def prometheus_text(stats: Mapping[str, Any]) -> str:
    """The metrics in ``stats`` (:meth:`kvstore.KVStore.stats`, or what
    ``walkv stats --json`` prints) in Prometheus' text format; metrics the
    stats lack are left out."""
    return "".join(line + "\n" for line in _lines(stats))


__all__ = ["prometheus_text"]
