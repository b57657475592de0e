"""Dagster orchestration with Dagster's test APIs, against real mongod, Spark and SQLite."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
import warnings
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from jobs.capture import replay
from orchestration.definitions import build_definitions
from orchestration.resources import build_resources
from tests.helpers.lake_reading import committed_table
from tidemark.config import TidemarkConfig
from tidemark.errors import ReplayRefused
from tidemark.tokens import datetime_to_ts

# The run tags a single-run backfill of a partition range carries.
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


@pytest.fixture
def setup(mongod, spark, tmp_path, db_name):
    def make(**stream_fields):
        config = TidemarkConfig.model_validate(
            {
                "streams": [
                    {
                        "name": "orders",
                        "database": db_name,
                        "collection": "orders",
                        "max_await_time_ms": 300,
                        **stream_fields,
                    }
                ]
            }
        )
        resources = build_resources(
            mongodb_uri=mongod.uri,
            state_url=f"sqlite:///{tmp_path / 'state.db'}",
            lake_root=str(tmp_path / "lake"),
            spark_master="local[2]",
        )
        return config, build_definitions(config, resources), resources

    return make


def _materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }


def test_definitions_load_without_deprecation_or_supersession_warnings(monkeypatch, tmp_path):
    config = tmp_path / "streams.yaml"
    config.write_text(
        "streams:\n  - {name: a, database: d, collection: c}\n"
        "  - {name: b, database: d, current_table: false, full_document: default}\n"
    )
    monkeypatch.setenv("TIDEMARK_CONFIG", str(config))
    sys.modules.pop("orchestration.definitions", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module("orchestration.definitions")
        dg.Definitions.validate_loadable(module.defs)
        # Resolving the jobs is where Dagster warns about their selections, so inside the catch.
        jobs = {job.name for job in module.defs.resolve_all_job_defs()}
    names = {type(w.message).__name__ for w in caught} | {w.category.__name__ for w in caught}
    assert not names & {"DeprecationWarning", "SupersessionWarning"}, [
        str(w.message) for w in caught
    ]
    graph = module.defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        "a/raw_changes",
        "a/replay",
        "a/curated",
        "a/d/c.changes",  # a collection stream's tables are assets before any run
        "a/d/c.current",
        "b/raw_changes",
        "b/replay",
        "b/curated",  # a database stream's get theirs as its runs make them
    }
    assert jobs - {"__ASSET_JOB"} == {
        f"{stream}_{job}" for stream in "ab" for job in ("drain", "sync", "replay", "resnapshot")
    } | {"a_compact", "tidemark_gc"}  # b has no current table to compact
    assert [s.name for s in module.defs.sensors or []] == [
        "a_compaction_sensor",
        "tidemark_automation",
    ]
    gc = module.defs.resolve_schedule_def("tidemark_gc_schedule")
    assert gc.default_status == dg.DefaultScheduleStatus.STOPPED  # VACUUM is turned on by hand
    for stream in "ab":
        schedule = module.defs.resolve_schedule_def(f"{stream}_schedule")
        assert schedule.job_name == f"{stream}_drain"  # the transform follows by automation
        assert schedule.cron_schedule == "*/5 * * * *"
        assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    # The code location reads every connection setting from the environment, at run time
    # (unset on the resources; tests/test_dagster_entry_points.py runs jobs that way).
    resources = module.defs.resources
    assert set(resources) == {"mongo", "state", "lake", "spark"}
    settings = [
        resources["mongo"].uri,
        resources["state"].url,
        resources["lake"].root,
        resources["spark"].master,
        resources["spark"].remote,
    ]
    assert settings == [None] * 5


def test_a_scheduled_run_materializes_the_whole_group(setup, client, db_name):
    defs = setup()[1]
    schedule = defs.resolve_schedule_def("orders_schedule")
    job = defs.resolve_job_def("orders_sync")
    instance = dg.DagsterInstance.ephemeral()

    tick = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
    (request,) = tick.run_requests
    first = job.execute_in_process(instance=instance, tags=request.tags)  # starts the stream
    assert first.success

    client[db_name]["orders"].insert_many([{"_id": i, "v": i} for i in range(40)])
    client[db_name]["orders"].delete_many({"_id": {"$lt": 10}})
    run = job.execute_in_process(instance=instance, tags=request.tags)
    assert run.success
    assert _materialized(run) == {
        "orders/raw_changes",
        "orders/curated",
        f"orders/{db_name}/orders.changes",
        f"orders/{db_name}/orders.current",
    }
    checks = _checks(run)
    assert checks == {
        "lag": True,
        "oplog_headroom": True,
        "no_uncommitted_files": True,
        "watched_namespace_exists": True,
        "collections_listed": True,
        "row_count_matches_source": True,
        "freshness": True,
        "schema_drift": True,
    }
    headroom = next(
        e.asset_check_evaluation_data
        for e in run.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == "oplog_headroom"
    )
    assert "the oplog is young" in (headroom.description or "")  # a minutes-old test mongod
    raw = next(
        e
        for e in run.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["orders", "raw_changes"])
    )
    metadata = raw.materialization.metadata
    assert metadata["events"].value == 50 and metadata["events_insert"].value == 40
    assert metadata["events_delete"].value == 10 and "lag_seconds" in metadata
    current = next(
        e
        for e in run.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["orders", db_name, "orders.current"])
    )
    assert current.materialization.metadata["dagster/row_count"].value == 30


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


@pytest.mark.slow
def test_compaction_runs_when_the_deltas_grow_and_a_quiet_run_starts_no_spark(
    setup, client, db_name, monkeypatch
):
    _, defs, resources = setup(compaction={"delta_ratio": 0.5})
    sync = defs.resolve_job_def("orders_sync")
    sensor = defs.resolve_sensor_def("orders_compaction_sensor")
    instance = dg.DagsterInstance.ephemeral()
    coll = client[db_name]["orders"]
    assert sync.execute_in_process(instance=instance).success  # starts the stream
    coll.insert_many([{"_id": i, "v": 0} for i in range(20)])
    assert sync.execute_in_process(instance=instance).success  # run 1: the first load

    def requests() -> list[str | None]:
        state = {"state": resources["state"]}
        with dg.build_sensor_context(instance=instance, resources=state) as context:
            return [r.run_key for r in sensor.evaluate_tick(context).run_requests or []]

    assert requests() == []
    coll.update_many({"_id": {"$lt": 6}}, {"$set": {"v": 1}})
    assert sync.execute_in_process(instance=instance).success  # run 2: a merge of 6 rows
    assert requests() == []  # 6 delta rows < 0.5 x 20
    coll.update_many({"_id": {"$gte": 14}}, {"$set": {"v": 2}})
    assert sync.execute_in_process(instance=instance).success  # run 3: 12 rows >= 10
    assert requests() == ["v3"]

    compaction = defs.resolve_job_def("orders_compact").execute_in_process(instance=instance)
    assert compaction.success
    observed = {
        e.event_specific_data.asset_observation.asset_key.to_user_string(): {
            k: v.value for k, v in e.event_specific_data.asset_observation.metadata.items()
        }
        for e in compaction.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    }
    assert set(observed) == {"orders/curated", f"orders/{db_name}/orders.current"}
    assert observed["orders/curated"]["deltas_compacted"] == 2
    curated = observed["orders/curated"]
    assert curated["tidemark_run"] == 4 and curated["rows"] == 20
    assert observed[f"orders/{db_name}/orders.current"]["dagster/row_count"] == 20
    assert requests() == []  # nothing merged since
    table = resources["lake"].path / "curated" / "orders" / db_name / "orders" / "current"
    history = resources["spark"].session().sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert "OPTIMIZE" in {h.operation for h in history}, history  # Delta's own compaction

    def no_spark(self):
        raise AssertionError("a run with no new batches asked for Spark")

    monkeypatch.setattr(type(resources["spark"]), "session", no_spark)
    quiet = sync.execute_in_process(instance=instance)  # nothing was written since
    assert quiet.success
    (curated,) = [
        m
        for m in quiet.get_asset_materialization_events()
        if m.asset_key.to_user_string() == "orders/curated"
    ]
    assert curated.materialization.metadata["changes_added"].value == 0


def test_backfill_of_two_partitions_yields_exactly_their_events_and_folds_them(
    setup, client, raw_client, db_name
):
    start_of_partitions = _minute(datetime.now(UTC)) - timedelta(hours=1)
    _, defs, resources = setup(replay={"cron": "* * * * *", "start": start_of_partitions})
    # Write through two whole minutes (and a little on both sides).
    first_window = _minute(datetime.now(UTC)) + timedelta(minutes=1)
    end = first_window + timedelta(minutes=2)
    coll = client[db_name]["orders"]
    n = 0
    while datetime.now(UTC) < end + timedelta(seconds=2):
        coll.insert_one({"_id": n, "at": datetime.now(UTC)})
        coll.update_one({"_id": n}, {"$set": {"seen": True}})
        n += 1
        time.sleep(0.25)

    keys = [(first_window + timedelta(minutes=i)).strftime("%Y-%m-%d-%H:%M") for i in range(2)]
    job = defs.resolve_job_def("orders_replay")
    instance = dg.DagsterInstance.ephemeral()
    requested = _automation_ticks(defs, instance)
    assert requested() == set()  # nothing drained or replayed yet
    tags = {ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]}
    run = job.execute_in_process(instance=instance, tags=tags)  # the range, in one run
    assert run.success

    store = resources["state"].store()
    lake = resources["lake"].path
    replayed = committed_table(store, lake, "orders")
    # The reference: a plain watch() from the first window's start, cut at the last one's end.
    reference = []
    with raw_client[db_name]["orders"].watch(
        start_at_operation_time=datetime_to_ts(first_window), max_await_time_ms=300
    ) as stream:
        while (event := stream.try_next()) is not None:
            if event["clusterTime"] >= datetime_to_ts(end):
                break
            reference.append(event["_id"]["_data"])
    assert replayed.column("event_id").to_pylist() == reference
    assert len(reference) > 400  # two writes every 0.25 s for two minutes
    times = replayed.column("cluster_time").to_pylist()
    assert min(times) >= first_window and max(times) < end
    (batch,) = store.batches("orders")
    assert batch.source == "replay" and store.checkpoint("orders").token is None

    # The replayed window is folded by the automation, into the collection's tables.
    changes_key = dg.AssetKey(["orders", db_name, "orders.changes"])
    assert {CURATED, changes_key} <= requested()
    sync = defs.resolve_job_def("orders_sync")
    folded = sync.execute_in_process(instance=instance)
    assert folded.success
    (logged,) = [e for e in folded.get_asset_materialization_events() if e.asset_key == changes_key]
    assert logged.materialization.metadata["dagster/row_count"].value == replayed.num_rows
    changes_count = (
        resources["spark"]
        .session()
        .read.format("delta")
        .load(str(lake / "curated" / "orders" / db_name / "orders" / "changes"))
        .count()
    )
    assert changes_count == replayed.num_rows

    # The same backfill again adds nothing to the change log.
    assert job.execute_in_process(instance=instance, tags=tags).success
    again = sync.execute_in_process(instance=instance)
    changes = next(
        e
        for e in again.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["orders", "curated"])
    )
    assert changes.materialization.metadata["changes_added"].value == 0
    assert changes.materialization.metadata["duplicates_skipped"].value == replayed.num_rows


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    return failure.step_failure_data.user_failure_data.description or ""


def test_refused_windows_give_the_clear_message(setup):
    start_of_partitions = _minute(datetime.now(UTC)) - timedelta(days=2)
    config, defs, resources = setup(replay={"cron": "* * * * *", "start": start_of_partitions})
    job = defs.resolve_job_def("orders_replay")
    instance = dg.DagsterInstance.ephemeral()

    old_key = start_of_partitions.strftime("%Y-%m-%d-%H:%M")
    result = job.execute_in_process(instance=instance, partition_key=old_key, raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert "starts before the oplog's first entry" in message and "snapshot" in message

    # Dagster lists only closed windows as partitions; Tidemark refuses an open one itself too.
    now = datetime.now(UTC)
    with pytest.raises(ReplayRefused, match="is not closed yet"):
        replay(
            config.streams[0],
            resources["mongo"].raw_client(),
            resources["state"].store(),
            resources["lake"].path,
            _minute(now),
            _minute(now) + timedelta(minutes=1),
        )
    assert resources["state"].store().batches("orders") == []


def test_a_resnapshot_job_reports_snapshot_progress(setup, client, db_name):
    defs = setup(snapshot_chunk_size=40)[1]
    instance = dg.DagsterInstance.ephemeral()
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(100)])
    run = defs.resolve_job_def("orders_resnapshot").execute_in_process(instance=instance)
    assert run.success
    raw = next(
        e
        for e in run.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["orders", "raw_changes"])
    )
    metadata = {k: v.value for k, v in raw.materialization.metadata.items()}
    assert metadata["snapshot_status"] == "done" and metadata["snapshot_documents"] == 100
    assert metadata["snapshot_chunks"] == 3 and metadata["snapshot_bytes"] > 0
    # The same progress figures as the CLI's, in the run's log: each phase and the end.
    logged = [e.message for e in instance.all_logs(run.run_id) if e.dagster_event is None]
    copied = [m for m in logged if m.startswith("orders snapshot (copy): 100 / ~100 documents")]
    assert copied and " in " in copied[-1], logged  # the last report: "... in <duration>"
    folded = [m.split(")")[0] for m in logged if m.startswith("orders transform (")]
    assert folded == [
        "orders transform (" + p for p in ("change log", "current", "commit", "commit")
    ]
    current = next(
        e
        for e in run.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["orders", db_name, "orders.current"])
    )
    assert current.materialization.metadata["dagster/row_count"].value == 100


def _metadata_of(result: dg.ExecuteInProcessResult, name: str) -> dict:
    (event,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key.path[-1].rpartition(".")[2] == name
    ]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_the_catalog_shows_columns_rows_and_location_of_each_table(setup, client, db_name):
    _, defs, resources = setup()
    sync = defs.resolve_job_def("orders_sync")
    instance = dg.DagsterInstance.ephemeral()
    assert sync.execute_in_process(instance=instance).success  # starts the stream
    client[db_name]["orders"].insert_many(
        [{"_id": i, "name": f"n{i}", "qty": i, "price": i / 2} for i in range(12)]
    )
    run = sync.execute_in_process(instance=instance)
    assert run.success
    lake = resources["lake"].path

    current = _metadata_of(run, "current")
    columns = {c.name: c.type for c in current["dagster/column_schema"].columns}
    assert {"name": "string", "qty": "bigint", "price": "double"}.items() <= columns.items()
    assert columns["_tm_residual"] == "string" and columns["_tm_cluster_time"] == "timestamp"
    assert "_tm_document" not in columns  # the exact document is one join away
    assert current["dagster/row_count"] == 12 and current["delta_version"] == 1
    table = lake / "curated" / "orders" / db_name / "orders" / "current"
    assert current["dagster/uri"] == table.as_uri() and current["format"] == "delta"
    assert current["dagster/table_name"] == f"delta.`{table}`" and current["tidemark_run"] == 1
    curated = _metadata_of(run, "curated")
    assert curated["collections"] == 1 and f"`{table}`" in curated["tables"]
    assert curated["live_documents"] == 12 and curated["tables_changed"] == 2

    changes = _metadata_of(run, "changes")
    change_columns = {c.name for c in changes["dagster/column_schema"].columns}
    assert {"event_id", "operation_type", "full_document", "date"} <= change_columns
    assert changes["dagster/row_count"] == 12
    assert _metadata_of(run, "raw_changes")["dagster/uri"] == (lake / "raw" / "orders").as_uri()
    # Durations are rounded for the UI, not 676432.7453120095.
    assert _metadata_of(run, "raw_changes")["oplog_headroom_seconds"] == round(
        _metadata_of(run, "raw_changes")["oplog_headroom_seconds"], 1
    )

    quiet = sync.execute_in_process(instance=instance)  # nothing new: no table changed
    assert quiet.success
    assert _materialized(quiet) == {"orders/raw_changes", "orders/curated"}
    again = _metadata_of(quiet, "curated")
    assert again["written_as"] == "nothing new" and again["changes_added"] == 0
    assert again["live_documents"] == 12 and again["tables_changed"] == 0


CURATED = dg.AssetKey(["orders", "curated"])


def _automation_ticks(defs: dg.Definitions, instance: dg.DagsterInstance):
    """One evaluation of the automation conditions per call, each from the previous one's
    cursor (as the sensor ticks); returns which of the transform's assets it requested."""
    cursor = None

    def requested() -> set[dg.AssetKey]:
        nonlocal cursor
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        cursor = result.cursor
        graph = defs.resolve_asset_graph()
        return {k for k in graph.get_all_asset_keys() if result.get_num_requested(k)}

    return requested


def test_the_transform_is_requested_only_after_a_drain_that_committed_a_new_batch(
    setup, client, db_name
):
    _, defs, _ = setup()
    drain = defs.resolve_job_def("orders_drain")
    instance = dg.DagsterInstance.ephemeral()
    requested = _automation_ticks(defs, instance)

    assert drain.execute_in_process(instance=instance).success  # takes the starting position
    requested()  # the first evaluation sees raw_changes' first data version
    assert drain.execute_in_process(instance=instance).success  # quiet: no new batch
    assert requested() == set()
    assert drain.execute_in_process(instance=instance).success
    assert requested() == set()

    client[db_name]["orders"].insert_many([{"_id": i} for i in range(5)])
    run = drain.execute_in_process(instance=instance)
    assert run.success
    assert _materialized(run) == {"orders/raw_changes"}  # the drain's run starts no Spark
    # One run of the multi-asset: the stream's fold and its tables (so their checks run).
    assert requested() == {
        CURATED,
        dg.AssetKey(["orders", db_name, "orders.changes"]),
        dg.AssetKey(["orders", db_name, "orders.current"]),
    }
    assert requested() == set()  # requested once, not at every tick

    assert drain.execute_in_process(instance=instance).success  # quiet again
    assert requested() == set()


def _freshness_daemon_tick(defs: dg.Definitions, instance: dg.DagsterInstance, at: datetime):
    """What `dagster dev`'s freshness daemon does once, at the time `at`: evaluate each
    asset's FreshnessPolicy and record a change of state (which `freshness_warned` reads)."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.test_utils import freeze_time
    from dagster._daemon.freshness import FreshnessDaemon

    async def tick() -> None:
        view = AssetGraphView.for_test(defs, instance)
        daemon = FreshnessDaemon()
        await asyncio.gather(
            *(daemon._evaluate_asset(view, node) for node in view.asset_graph.asset_nodes)
        )

    with freeze_time(at):
        asyncio.run(tick())


def test_a_quiet_stream_gets_a_transform_once_current_is_past_its_warn_window(
    setup, client, db_name
):
    config, defs, _ = setup()
    sync, drain = defs.resolve_job_def("orders_sync"), defs.resolve_job_def("orders_drain")
    instance = dg.DagsterInstance.ephemeral()
    requested = _automation_ticks(defs, instance)

    assert sync.execute_in_process(instance=instance).success  # current materialized
    requested()
    assert drain.execute_in_process(instance=instance).success  # quiet: no new batch
    _freshness_daemon_tick(defs, instance, datetime.now(UTC))  # fresh: PASS
    assert requested() == set()

    warn = timedelta(seconds=config.streams[0].checks.lag_error_seconds)
    _freshness_daemon_tick(defs, instance, datetime.now(UTC) + warn + timedelta(minutes=1))
    (record,) = instance.get_freshness_state_records([CURATED]).values()
    assert record.freshness_state.value == "WARN"  # the daemon's verdict, as the UI shows it
    assert requested() == {CURATED}  # a run that confirms the tables are whole, no new batch
    assert requested() == set()  # once, not at every tick


def test_gc_from_dagster_removes_orphans_and_vacuums_the_tables(setup, client, db_name):
    _, defs, resources = setup()
    sync = defs.resolve_job_def("orders_sync")
    instance = dg.DagsterInstance.ephemeral()
    assert sync.execute_in_process(instance=instance).success  # starts the stream
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(5)])
    assert sync.execute_in_process(instance=instance).success
    client[db_name]["orders"].delete_many({"_id": {"$lt": 3}})
    assert sync.execute_in_process(instance=instance).success  # leaves replaced files
    raw = resources["lake"].path / "raw" / "orders"
    orphan = raw / "date=2026-01-01" / "hour=00" / "crashed-run.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"left by a crashed run")

    run = defs.resolve_job_def("tidemark_gc").execute_in_process(
        instance=instance,
        run_config={"ops": {"collect_garbage": {"config": {"min_age_seconds": 0}}}},
    )
    assert run.success
    assert not orphan.exists()
    observed = {
        e.event_specific_data.asset_observation.asset_key.to_user_string(): {
            k: v.value for k, v in e.event_specific_data.asset_observation.metadata.items()
        }
        for e in run.all_events
        if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION
    }
    assert observed["orders/raw_changes"]["gc_files_removed"] == 1
    assert "vacuum_files_deleted" in observed["orders/curated"]
    # The tables still read whole after VACUUM.
    table = resources["lake"].path / "curated" / "orders" / db_name / "orders" / "current"
    session = resources["spark"].session()
    assert session.read.format("delta").load(str(table)).count() == 2
