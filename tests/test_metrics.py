"""`tidemark metrics`: scraped over real HTTP, parsed with prometheus_client's own parser, and
held against a real state store (SQLite) and, for lag and headroom, a real mongod."""

from __future__ import annotations

import logging
import shutil
import socket
import urllib.request
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.capture import drain
from jobs.ops import stream_status
from jobs.ops.metrics import TidemarkCollector
from resources.metrics_http import MetricsServer, exposition
from resources.mongo import connect
from state import (
    BatchRecord,
    CuratedTable,
    FileEntry,
    StateStore,
    TransformRun,
)
from state.schema import utc_now
from tidemark.cli import main
from tidemark.config import StreamConfig
from tidemark.errors import MetricsServerError

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(server: MetricsServer) -> str:
    with urllib.request.urlopen(server.url, timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(stream: str, batch_id: str, source: str, events: int, size: int) -> BatchRecord:
    return BatchRecord(
        id=batch_id,
        stream=stream,
        source=source,  # type: ignore[arg-type]
        event_count=events,
        bytes=size,
        files=[FileEntry(f"raw/{stream}/{batch_id}.parquet", events, size)],
    )


def _history(store: StateStore, stream: StreamConfig) -> None:
    """Three drain batches and a replay batch; two transform runs making three table versions;
    every lease released (so its last holding has a duration)."""
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    for i, (events, size) in enumerate([(3, 300), (5, 500), (7, 700)]):
        store.commit_batch(
            lease, None, _batch(stream.name, f"d{i}", "incremental", events, size), None
        )
    store.release_lease(lease)
    replay = store.acquire_lease(stream.name, "replay", timedelta(minutes=5))
    store.commit_batch(replay, None, _batch(stream.name, "r0", "replay", 11, 1100), None)
    store.release_lease(replay)
    runs = store.transforms
    transform = store.acquire_lease(stream.name, "transform", timedelta(minutes=5))

    def table(run: int, coll: str, kind: str, version: int, rows: int) -> CuratedTable:
        path = f"curated/{stream.name}/shop/{coll}/{kind}"
        return CuratedTable(stream.name, run, "shop", coll, kind, path, version, rows, "{}")  # type: ignore[arg-type]

    def run(number: int, folded: int) -> TransformRun:
        return TransformRun(stream.name, number, "curated", 0, "{}", folded, folded, utc_now())

    runs.commit(
        transform, stream.name, None, run(1, 8), ["d0", "d1"], [table(1, "a", "current", 0, 4)]
    )
    runs.commit(
        transform,
        stream.name,
        1,
        run(2, 7),
        ["d2"],
        [table(2, "a", "current", 1, 6), table(2, "a", "changes", 1, 15)],
    )
    store.release_lease(transform)


def _stream(name: str = "orders") -> StreamConfig:
    return StreamConfig(name=name, database="shop", collection="orders")


@pytest.mark.fast
def test_a_scrape_reports_the_state_store_and_a_down_source_without_credentials(tmp_path, caplog):
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    orders, quiet = _stream(), _stream("quiet")
    _history(store, orders)
    held = store.acquire_lease(orders.name, "transform", timedelta(minutes=5))  # under way
    uri = f"mongodb://tm:hunter2@127.0.0.1:{_closed_port()}/?replicaSet=rs0"
    collector = TidemarkCollector(
        [orders, quiet], store, lambda: connect(uri, timeout_ms=300, raw=True)
    )
    server = MetricsServer(collector, "127.0.0.1", 0)
    try:
        with caplog.at_level(logging.WARNING, logger="tidemark.metrics"):
            text = _scrape(server)
    finally:
        server.close()
        collector.close()
    samples = _samples(text)
    v = lambda name, **labels: _value(samples, name, **labels)  # noqa: E731
    assert v("tidemark_up", component="state_store") == 1
    assert v("tidemark_up", component="mongodb") == 0  # unreachable, yet not a 500
    assert v("tidemark_stream_info", stream="orders", namespace="shop.orders") == 1
    assert v("tidemark_batches_committed_total", stream="orders", source="incremental") == 3
    assert v("tidemark_events_drained_total", stream="orders", source="incremental") == 15
    assert v("tidemark_bytes_drained_total", stream="orders", source="incremental") == 1500
    assert v("tidemark_events_drained_total", stream="orders", source="replay") == 11
    assert v("tidemark_events_drained_total", stream="quiet", source="incremental") is None
    newest = store.last_batch("orders")
    assert newest is not None and newest.committed_at is not None
    assert v("tidemark_last_batch_timestamp_seconds", stream="orders") == pytest.approx(
        newest.committed_at.timestamp()
    )
    assert v("tidemark_transform_runs_total", stream="orders") == 2
    assert v("tidemark_transform_events_folded_total", stream="orders") == 15
    assert v("tidemark_transform_last_run", stream="orders") == 2
    assert v("tidemark_transform_pending_batches", stream="orders") == 1  # the replay batch
    assert v("tidemark_transform_runs_total", stream="quiet") == 0
    table = {"stream": "orders", "database": "shop", "collection": "a"}
    assert v("tidemark_table_delta_version", **table, table="current") == 1
    assert v("tidemark_table_rows", **table, table="current") == 6
    assert v("tidemark_table_rows", **table, table="changes") == 15
    # Lease times: capture and replay finished, the transform is under way again.
    assert v("tidemark_run_in_progress", stream="orders", work="capture") == 0
    assert v("tidemark_run_in_progress", stream="orders", work="transform") == 1
    leases = {row["stream"]: row for row in store.lease_rows()}
    capture = leases["orders"]
    assert v("tidemark_last_run_duration_seconds", stream="orders", work="capture") == (
        pytest.approx((capture["expires_at"] - capture["acquired_at"]).total_seconds(), abs=1e-3)
    )
    assert v("tidemark_last_run_finish_timestamp_seconds", stream="orders", work="replay")
    assert v("tidemark_last_run_duration_seconds", stream="orders", work="transform") is None
    assert v("tidemark_stream_lag_seconds", stream="orders") is None
    assert "hunter2" not in text and "hunter2" not in caplog.text
    assert "MongoDB did not answer" in caplog.text
    store.release_lease(held)
    store.close()


@pytest.mark.fast
def test_a_state_store_that_fails_is_reported_down_not_a_500(tmp_path):
    home = tmp_path / "gone"
    home.mkdir()
    store = StateStore(f"sqlite:///{home / 'state.db'}")
    store.engine.dispose()
    shutil.rmtree(home)  # SQLite cannot open the file again: every query fails
    server = MetricsServer(TidemarkCollector([_stream()], store, None), "127.0.0.1", 0)
    try:
        samples = _samples(_scrape(server))
    finally:
        server.close()
    assert _value(samples, "tidemark_up", component="state_store") == 0
    assert _value(samples, "tidemark_up", component="mongodb") == 0
    assert _value(samples, "tidemark_transform_runs_total", stream="orders") is None


@pytest.mark.fast
def test_the_cli_prints_one_exposition_and_refuses_a_taken_port(tmp_path, monkeypatch, capsys):
    config = tmp_path / "streams.yaml"
    config.write_text("streams:\n  - {name: orders, database: shop, collection: orders}\n")
    state_url = f"sqlite:///{tmp_path / 'state.db'}"
    store = StateStore(state_url)
    _history(store, _stream())
    store.close()
    monkeypatch.setenv("TIDEMARK_CONFIG", str(config))
    monkeypatch.setenv("TIDEMARK_STATE_URL", state_url)
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MONGODB_URI", f"mongodb://127.0.0.1:{_closed_port()}/?replicaSet=rs0")
    assert main(["metrics"]) == 0
    samples = _samples(capsys.readouterr().out)
    assert (
        _value(samples, "tidemark_events_drained_total", stream="orders", source="incremental")
        == 15
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["metrics", "serve", "--port", str(port)]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    with pytest.raises(MetricsServerError):
        MetricsServer(TidemarkCollector([], StateStore(state_url), None), "256.0.0.1", 0)


def test_lag_and_headroom_come_from_the_real_source(client, raw_client, make_stream, tmp_path):
    """Against the session's mongod: the gauges equal `stream_status`'s, and the drained events
    are the ones written."""
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    stream = make_stream()
    lake = tmp_path / "lake"
    drain(stream, raw_client, store, lake)  # a new stream starts now
    client[stream.database][stream.collection].insert_many([{"n": i} for i in range(4)])
    assert drain(stream, raw_client, store, lake).events == 4
    collector = TidemarkCollector([stream], store, lambda: raw_client)
    samples = _samples(exposition(collector))
    status = stream_status(stream, raw_client, store)
    assert _value(samples, "tidemark_up", component="mongodb") == 1
    assert (
        _value(samples, "tidemark_events_drained_total", stream="orders", source="incremental") == 4
    )
    lag = _value(samples, "tidemark_stream_lag_seconds", stream="orders")
    headroom = _value(samples, "tidemark_stream_oplog_headroom_seconds", stream="orders")
    assert lag is not None and status.lag_seconds is not None and lag >= 0
    # A second apart at most: the cluster's clock moves between the two reads.
    assert abs(lag - status.lag_seconds) <= 1
    assert headroom is not None and status.headroom_seconds is not None
    assert abs(headroom - status.headroom_seconds) <= 2
    assert status.position_time is not None
    assert _value(samples, "tidemark_stream_position_timestamp_seconds", stream="orders") == (
        status.position_time.timestamp()
    )
    assert _value(samples, "tidemark_oplog_window_seconds") is not None
    assert _value(samples, "tidemark_oplog_fill_ratio") == pytest.approx(status.oplog_fill, rel=0.5)
    assert _value(samples, "tidemark_stream_definition_changed", stream="orders") == 0
    store.close()
