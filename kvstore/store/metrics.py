"""Prometheus metrics of a store, in Prometheus' text exposition format.

``prometheus_text(db.stats())`` in the writing process gives everything:
LSNs (last, durable, applied, archived), the archive's lag and errors, the
log's appends, groups, fsyncs, fsync latency (p50/p99 over the last 4096)
and group sizes, each durable subscription's lag and whether it was
invalidated (label ``subscription``), and each synchronous replica's durable
LSN, lag and last report (label ``replica``). ``walkv stats --prometheus STORE`` gives what another
process can read from the files (LSNs; the archived LSN a sidecar publishes;
for a replica's directory, its applied LSN, its source's durable LSN and the
lag): fsync counters live in the writing process only.

Made with prometheus-client (the ``server`` or ``cli`` extra: ``pip install
walkv[server]``), which owns the exposition format; ``walkv serve`` answers
``GET /metrics`` with it, and any HTTP handler may serve it (content type
:data:`CONTENT_TYPE`). Every sample carries the label ``store="<path>"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from wal.errors import WalkvError

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
_REPLICA_METRICS = (
    ("walkv_sync_replica_durable_lsn", "The last LSN a synchronous replica reported durable.", "durable_lsn"),
    ("walkv_sync_replica_lag_lsns", "Entries a synchronous replica has not reported durable.", "lag_lsns"),
    ("walkv_sync_replica_seen_seconds", "Seconds since a synchronous replica's last report.", "seen_seconds_ago"),
)
_LATENCY = ("walkv_log_fsync_seconds", "fsync latency of the log over the last 4096 fsyncs.",
            (("0.5", "fsync_p50_ms"), ("0.99", "fsync_p99_ms")))


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of :func:`prometheus_text` (Prometheus' text format 0.0.4)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class _StatsCollector:
    """A prometheus-client collector of one ``stats()`` mapping."""

    def __init__(self, stats: Mapping[str, Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

        stats = self._stats
        store = str(stats.get("path", ""))
        for name, kind, text, section, key in _METRICS:
            source = stats.get(section) if section else stats
            value = _number(source.get(key)) if isinstance(source, Mapping) else None
            if value is None:
                continue
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=["store"])
            family.add_metric([store], value)
            yield family
        log = stats.get("log")
        if isinstance(log, Mapping) and log.get("fsyncs"):
            name, text, quantiles = _LATENCY
            summary = Metric(name, text, "summary")
            for q, key in quantiles:
                summary.add_sample(name, {"store": store, "quantile": q}, float(log[key]) / 1e3)
            summary.add_sample(name + "_count", {"store": store}, float(log["fsyncs"]))
            yield summary
        subs = [s for s in stats.get("subscriptions") or () if isinstance(s, Mapping)]
        if subs:
            for name, text, key in _SUBSCRIPTION_METRICS:
                gauge = GaugeMetricFamily(name, text, labels=["store", "subscription"])
                for sub in subs:
                    gauge.add_metric([store, str(sub["name"])], float(sub[key]))
                yield gauge
            gauge = GaugeMetricFamily("walkv_subscription_invalidated",
                                      "1 when retention gave up on a subscription (past max_retained_bytes).",
                                      labels=["store", "subscription"])
            for sub in subs:
                gauge.add_metric([store, str(sub["name"])], float(bool(sub["invalidated"])))
            yield gauge
        sync = stats.get("sync_replicas")
        replicas = [r for r in (sync.get("replicas") or ()) if isinstance(r, Mapping)] if isinstance(sync, Mapping) \
            else []
        if replicas:
            for name, text, key in _REPLICA_METRICS:
                gauge = GaugeMetricFamily(name, text, labels=["store", "replica"])
                for r in replicas:
                    gauge.add_metric([store, str(r["name"])], float(r[key]))
                yield gauge


def prometheus_text(stats: Mapping[str, Any]) -> str:
    """The metrics in ``stats`` (:meth:`kvstore.KVStore.stats`, or what
    ``walkv stats --json`` prints) in Prometheus' text format; metrics the
    stats lack are left out."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
    except ImportError as exc:
        raise WalkvError("Prometheus metrics need the prometheus-client package: "
                         "pip install 'walkv[cli]' (or 'walkv[server]')") from exc

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(stats))
    return generate_latest(registry).decode("utf-8")


__all__ = ["CONTENT_TYPE", "prometheus_text"]
