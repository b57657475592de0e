"""Tidemark's metrics in Prometheus' terms, computed afresh on every scrape (as mongodb_exporter
does): the state store's counts and times, and MongoDB's lag and oplog headroom through
`stream_status`. No HTTP here (`resources.metrics_http` serves it) and no Dagster.

A scrape with MongoDB unreachable still returns the state store's metrics, with
`tidemark_up{component="mongodb"} 0`; one with the state store down returns
`tidemark_up{component="state_store"} 0`. Labels hold stream, namespace, database, collection
and table names only: never a URI, so never a credential.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pymongo import MongoClient

from jobs.ops.status import StreamStatus, stream_status
from state import StateStore
from state.leases import parse_lease_name
from tidemark.config import StreamConfig

log = logging.getLogger("tidemark.metrics")


def _seconds(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    # SQLite hands back naive datetimes; the store writes UTC.
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class TidemarkCollector(Collector):
    """A prometheus_client collector over the configured streams. `client` is called on each
    scrape until it returns a client, so a MongoDB that is down at start-up is picked up when
    it comes back; a client whose server stops answering is dropped and asked for again."""

    def __init__(
        self,
        streams: Sequence[StreamConfig],
        store: StateStore,
        client: Callable[[], MongoClient] | None,
    ) -> None:
        self.streams = list(streams)
        self.store = store
        self._connect = client
        self._client: MongoClient | None = None

    def collect(self) -> Iterator[Metric]:
        up = _gauge("tidemark_up", "1 when the component answered this scrape.", ["component"])
        store_up = self._store_metrics()
        up.add_metric(["state_store"], 1.0 if store_up is not None else 0.0)
        statuses = self._source_statuses() if store_up is not None else None
        up.add_metric(["mongodb"], 1.0 if statuses is not None else 0.0)
        yield up
        info = _gauge(
            "tidemark_stream_info",
            "1 per configured stream, naming what it watches.",
            ["stream", "namespace"],
        )
        for stream in self.streams:
            info.add_metric([stream.name, stream.namespace], 1.0)
        yield info
        yield from store_up or []
        yield from _source_metrics(statuses or [])

    # -- the state store ---------------------------------------------------------------------

    def _store_metrics(self) -> list[Metric] | None:
        try:
            return [*self._drained(), *self._leases(), *self._transforms()]
        except Exception as exc:  # a scrape reports the store down rather than failing
            log.warning("metrics: the state store did not answer: %s", _first_line(exc))
            return None

    def _drained(self) -> Iterator[Metric]:
        names = {s.name for s in self.streams}
        labels = ["stream", "source"]
        batches = _counter(
            "tidemark_batches_committed",
            "Committed batches, by source (incremental: drains; snapshot; replay).",
            labels,
        )
        events = _counter("tidemark_events_drained", "Events in committed batches.", labels)
        size = _counter("tidemark_bytes_drained", "Bytes of committed raw files.", labels)
        for stream, source, count, n_events, n_bytes in self.store.batch_totals():
            if stream in names:
                batches.add_metric([stream, source], count)
                events.add_metric([stream, source], n_events)
                size.add_metric([stream, source], n_bytes)
        last = _gauge(
            "tidemark_last_batch_timestamp_seconds",
            "When the stream's newest batch was committed (Unix time).",
            ["stream"],
        )
        for stream in self.streams:
            newest = self.store.last_batch(stream.name)
            if newest is not None and newest.committed_at is not None:
                last.add_metric([stream.name], _seconds(newest.committed_at) or 0.0)
        yield from (batches, events, size, last)

    def _leases(self) -> Iterator[Metric]:
        labels = ["stream", "work"]
        running = _gauge(
            "tidemark_run_in_progress",
            "1 while a run holds the stream's lease for this work (capture: drain, snapshot, "
            "reset, gc).",
            labels,
        )
        duration = _gauge(
            "tidemark_last_run_duration_seconds",
            "How long the last finished run held the lease, from acquisition to release.",
            labels,
        )
        finished = _gauge(
            "tidemark_last_run_finish_timestamp_seconds",
            "When the last finished run released the lease (Unix time).",
            labels,
        )
        names = {s.name for s in self.streams}
        now = datetime.now(UTC).timestamp()
        for row in self.store.lease_rows():
            # The metrics' `work` label is the lease's kind: capture, replay or transform.
            parsed = parse_lease_name(str(row["stream"]))
            if parsed is None or parsed[0] not in names:
                continue
            stream, work = parsed
            acquired, expires = _seconds(row["acquired_at"]), _seconds(row["expires_at"])
            if row["owner"] is not None and expires is not None and expires > now:
                running.add_metric([stream, work], 1.0)
                continue
            running.add_metric([stream, work], 0.0)
            if row["owner"] is None and acquired is not None and expires is not None:
                # A released lease: its expiry is when it was given up (`leases.release`).
                duration.add_metric([stream, work], max(0.0, expires - acquired))
                finished.add_metric([stream, work], expires)
        yield from (running, duration, finished)

    def _transforms(self) -> Iterator[Metric]:
        runs_total = _counter("tidemark_transform_runs", "Committed transform runs.", ["stream"])
        folded = _counter(
            "tidemark_transform_events_folded", "Events folded by committed runs.", ["stream"]
        )
        last_run = _gauge("tidemark_transform_last_run", "The newest run's number.", ["stream"])
        last_finish = _gauge(
            "tidemark_transform_last_finish_timestamp_seconds",
            "When the newest transform run committed (Unix time).",
            ["stream"],
        )
        pending = _gauge(
            "tidemark_transform_pending_batches",
            "Committed batches no run has folded yet.",
            ["stream"],
        )
        table_labels = ["stream", "database", "collection", "table"]
        version = _gauge(
            "tidemark_table_delta_version",
            "The Delta version of each collection table, as the state store records it.",
            table_labels,
        )
        rows = _gauge(
            "tidemark_table_rows",
            "Live rows (current) or events (changes) of each collection table.",
            table_labels,
        )
        transform = self.store.transforms
        for stream in self.streams:
            runs = transform.runs(stream.name)
            runs_total.add_metric([stream.name], len(runs))
            folded.add_metric([stream.name], sum(r.events_folded for r in runs))
            if runs:
                last_run.add_metric([stream.name], runs[-1].run)
                last_finish.add_metric([stream.name], _seconds(runs[-1].created_at) or 0.0)
            pending.add_metric([stream.name], len(transform.untransformed_batches(stream.name)))
            for table in transform.tables(stream.name):
                labels = [stream.name, table.db, table.coll, table.kind]
                version.add_metric(labels, table.delta_version)
                rows.add_metric(labels, table.rows)
        yield from (runs_total, folded, last_run, last_finish, pending, version, rows)

    # -- MongoDB -----------------------------------------------------------------------------

    def _source_statuses(self) -> list[StreamStatus] | None:
        if self._connect is None:
            return None
        try:
            if self._client is None:
                self._client = self._connect()
            return [stream_status(s, self._client, self.store) for s in self.streams]
        except Exception as exc:  # pymongo's or Tidemark's: either way the source is down
            log.warning("metrics: MongoDB did not answer: %s", _first_line(exc))
            if self._client is not None:
                self._client.close()
            self._client = None
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _source_metrics(statuses: Sequence[StreamStatus]) -> Iterator[Metric]:
    lag = _gauge(
        "tidemark_stream_lag_seconds",
        "Cluster time now minus the stored position's cluster time.",
        ["stream"],
    )
    headroom = _gauge(
        "tidemark_stream_oplog_headroom_seconds",
        "Projected time until the stored position falls off the oplog.",
        ["stream"],
    )
    position = _gauge(
        "tidemark_stream_position_timestamp_seconds",
        "The cluster time of the stored position (Unix time).",
        ["stream"],
    )
    changed = _gauge(
        "tidemark_stream_definition_changed",
        "1 when the stream's definition changed since its checkpoint: it needs a reset.",
        ["stream"],
    )
    window = _gauge("tidemark_oplog_window_seconds", "Time the oplog spans now.")
    fill = _gauge("tidemark_oplog_fill_ratio", "Fraction of the oplog's maximum size in use.")
    for s in statuses:
        changed.add_metric([s.stream], 1.0 if s.definition_changed else 0.0)
        if s.lag_seconds is not None:
            lag.add_metric([s.stream], s.lag_seconds)
        if s.headroom_seconds is not None:
            headroom.add_metric([s.stream], s.headroom_seconds)
        if s.position_time is not None:
            position.add_metric([s.stream], _seconds(s.position_time) or 0.0)
    # One deployment serves every stream: its oplog is reported once.
    first = statuses[0] if statuses else None
    if first is not None and first.oplog_window_seconds is not None:
        window.add_metric([], first.oplog_window_seconds)
    if first is not None and first.oplog_fill is not None:
        fill.add_metric([], first.oplog_fill)
    yield from (lag, headroom, position, changed, window, fill)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
