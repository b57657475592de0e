"""The transform as assets: a stream's `curated` zone and an asset per collection table.

One multi-asset per stream, so a run is one Spark session that folds every new batch. Its
specs are the stream's `curated` asset (the fold itself: every run materializes it, quiet
ones too, so its freshness and automation speak for the whole stream) and, per collection the
state store knows when the definitions load (`orchestration.discovery`), that collection's
`changes` and `current` tables. A run reports the tables it changed and only those; a
collection newer than the loaded definitions is reported too, as a materialization of its key,
so the Catalog lists it at once, and it becomes a full asset (graph, checks) when the code
location reloads (the `collections_listed` check says when one is due).
"""

from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import dagster as dg

from jobs.catalog import schema_drift, stream_table, tables
from jobs.curated_zone import DATABASE_EVENTS
from jobs.transform import TransformResult, transform
from orchestration.assets import progress_log
from orchestration.collection_checks import table_check_results, table_check_specs
from orchestration.keys import TableName, TableNames, keys, pool, table_names
from orchestration.metadata import collection_metadata, curated_metadata, explained
from orchestration.resources import (
    LakeResource,
    MongoResource,
    SparkResource,
    StateStoreResource,
)
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.object_path import LakePath


def on_new_raw_batches() -> dg.AutomationCondition:
    """Requested when a dependency's data version changed since the transform was last
    requested or ran (raw_changes: a new committed batch; a replay window)."""
    return dg.AutomationCondition.any_deps_match(
        dg.AutomationCondition.data_version_changed()
    ).with_label("a new raw batch")


def on_freshness_warned() -> dg.AutomationCondition:
    """Once the freshness policy warns, one run (a quiet stream's starts no Spark and confirms
    the tables are whole)."""
    return dg.AutomationCondition.freshness_warned().with_label("freshness warned")


def _unless_running(condition: dg.AutomationCondition) -> dg.AutomationCondition:
    return (
        condition
        & ~dg.AutomationCondition.in_progress()
        & ~dg.AutomationCondition.any_deps_in_progress()
    )


def transform_condition() -> dg.AutomationCondition:
    """The condition of `curated`: on a new batch or a freshness warning, each once."""
    either = on_new_raw_batches().since_last_handled() | on_freshness_warned().since_last_handled()
    return _unless_running(either).with_label("on new raw batches")


def changes_condition() -> dg.AutomationCondition:
    """A collection's `changes`: requested with `curated` on a new batch, so the run selects
    the stream's tables and their checks run after it."""
    return _unless_running(on_new_raw_batches().since_last_handled()).with_label(
        "on new raw batches"
    )


def current_condition() -> dg.AutomationCondition:
    """A collection's `current`: requested whenever its `changes` is."""
    requested = dg.AutomationCondition.any_deps_match(dg.AutomationCondition.will_be_requested())
    return requested.with_label("with its changes")


def curated_freshness(stream: StreamConfig) -> dg.FreshnessPolicy:
    """The stream's tables should have been folded within the lag check's error threshold
    (warn) and twice that (fail): the same budget the `lag` check gives the raw zone."""
    error = timedelta(seconds=stream.checks.lag_error_seconds)
    return dg.FreshnessPolicy.time_window(fail_window=2 * error, warn_window=error)


def stream_tables(stream: StreamConfig, known: Sequence[TableName]) -> list[TableName]:
    """The stream's collection tables as assets: those its runs made, and for a collection
    stream its one collection's from the start (`current` only when the stream keeps one)."""
    names = set(known)
    if stream.scope == "collection" and stream.database and stream.collection:
        names.add((stream.database, stream.collection, "changes"))
        names.add((stream.database, stream.collection, "current"))
    if not stream.current_table:
        names = {n for n in names if n[2] != "current"}
    return sorted(names)


def table_specs(stream: StreamConfig, named: Mapping[TableName, TableNames]) -> list[dg.AssetSpec]:
    """The tables' specs, each keyed by its Dagster name (`transform_asset` gives them their
    real keys after Dagster has named their outputs from these)."""
    k = keys(stream)
    specs = []
    for (db, coll, kind), names in named.items():
        upstream = (
            [_by_name(named[(db, coll, "changes")])]
            if kind == "current"
            else [k["raw_changes"], k["replay"]]
        )
        specs.append(
            dg.AssetSpec(
                _by_name(names),
                deps=upstream,
                group_name=stream.name,
                kinds={"delta"},
                skippable=True,
                automation_condition=current_condition()
                if kind == "current"
                else changes_condition(),
                description=f"{db}.{coll}: "
                + (
                    "its live documents, one row each (Delta Lake, MERGEd by each run)."
                    if kind == "current"
                    else "its change log, one row per event, partitioned by date (Delta Lake)."
                ),
            )
        )
    return specs


def _by_name(names: TableNames) -> dg.AssetKey:
    """A key whose Python identifier (what Dagster names an output and its checks' outputs
    after) is the table's Dagster name."""
    return dg.AssetKey([names.name])


def transform_asset(stream: StreamConfig, known: Sequence[TableName] = ()) -> dg.AssetsDefinition:
    k = keys(stream)
    curated_spec = dg.AssetSpec(
        k["curated"],
        deps=[k["raw_changes"], k["replay"]],
        group_name=stream.name,
        kinds={"spark", "delta"},
        skippable=True,
        description="The stream's curated zone: the Spark step that folds committed raw batches "
        "into each collection's Delta tables (one asset per table). Every run materializes it.",
        freshness_policy=curated_freshness(stream),
        automation_condition=transform_condition(),
    )

    named = {t: table_names(stream.name, *t) for t in stream_tables(stream, known)}
    by_key = {names.key: table for table, names in named.items()}

    @dg.multi_asset(
        specs=[curated_spec, *table_specs(stream, named)],
        check_specs=table_check_specs(
            [_by_name(names) for (_, _, kind), names in named.items() if kind == "current"]
        ),
        name=f"{stream.name}_transform",
        pool=pool(stream),
        can_subset=True,
    )
    def spark_transform(
        context: dg.AssetExecutionContext,
        state: StateStoreResource,
        lake: LakeResource,
        spark: SparkResource,
        mongo: MongoResource,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        """Folds the committed raw batches into the collections' Delta tables in one Spark
        step (a quiet stream starts no Spark), then checks the tables selected with it. With
        checks alone selected (the UI's "Execute checks"), it only checks."""
        selected = context.selected_asset_keys
        store = state.store()
        if selected:
            yield from _fold(context, stream, store, lake.path, spark)
        yield from table_check_results(
            sorted(context.selected_asset_check_keys, key=lambda c: c.to_user_string()),
            stream,
            by_key,
            store,
            lake.path,
            mongo.client,
        )

    # Dagster names outputs after their keys and allows only ^[A-Za-z0-9_]+$ there, while a
    # key's parts may hold any text: the specs were keyed by the tables' names, and now get
    # their real keys (outputs and checks keep the names they were given).
    return spark_transform.with_attributes(
        asset_key_replacements={_by_name(names): names.key for names in named.values()}
    )


def _fold(
    context: dg.AssetExecutionContext,
    stream: StreamConfig,
    store: StateStore,
    lake_root: LakePath,
    spark: SparkResource,
) -> Iterator[dg.MaterializeResult]:
    k = keys(stream)
    with explained():
        result = transform(spark.session, store, lake_root, stream, progress=progress_log(context))
        reported = _changed_tables(store, lake_root, stream, result)
        summary = stream_table(store, lake_root, stream.name, "current")
    selected = context.selected_asset_keys
    for key, metadata in reported:
        if key in selected:
            yield dg.MaterializeResult(asset_key=key, metadata=metadata)
        else:  # unselected, or newer than the loaded definitions
            context.log_event(dg.AssetMaterialization(asset_key=key, metadata=metadata))
    if k["curated"] in selected:
        metadata = curated_metadata(result, summary, lake_root / "curated" / stream.name)
        yield dg.MaterializeResult(asset_key=k["curated"], metadata=metadata)


def _changed_tables(
    store: StateStore, lake_root: LakePath, stream: StreamConfig, result: TransformResult
) -> list[tuple[dg.AssetKey, dict[str, Any]]]:
    """Each table the run changed, as its asset key and its metadata as it is now."""
    changed = {(t.db, t.coll, t.kind) for t in result.tables}
    if not changed:
        return []
    drift = {(d.db, d.coll): d for d in schema_drift(store, stream.name) if d.run == result.run}
    reported = []
    for table in tables(store, lake_root, stream.name):
        db, coll = table.db or "", table.coll or ""
        if not db or (db, coll, table.table) not in changed:
            continue  # no database: the stream's own markers, no collection's table
        key = table_names(stream.name, db, coll or DATABASE_EVENTS, table.table).key
        reported.append((key, collection_metadata(table, drift.get((db, coll)))))
    return reported
