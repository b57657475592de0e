"""The transform as assets: a stream's `curated` zone and an asset per collection table.

One multi-asset per stream, so a run is one Spark session that folds every new batch. Its
specs are the stream's `curated` asset (the fold itself: every run materializes it, quiet
ones too, so its freshness and automation speak for the whole stream) and, per collection the
state store knows when the definitions load (`orchestration.discovery`), that collection's
`changes` and `current` tables, as `orchestration.table_assets` describes them. A run reports
the tables it changed and only those; a collection newer than the loaded definitions is
reported too, as a materialization of its key, so the Catalog lists it at once, and it becomes a
full asset (graph, checks) when the code location reloads (the `collections_listed` check on
`curated` says when one is due).
"""

from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import dagster as dg

from jobs.catalog import schema_drift, stream_table, tables, tables_made
from jobs.curated_zone import DATABASE_EVENTS
from jobs.transform import TransformResult, transform
from orchestration.assets import progress_log
from orchestration.keys import keys, pool
from orchestration.metadata import curated_metadata, explained
from orchestration.resources import (
    LakeResource,
    MongoResource,
    SparkResource,
    StateStoreResource,
)
from orchestration.table_assets import (
    TableName,
    TableTranslator,
    check_results,
    on_new_raw_batches,
    unless_running,
)
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.object_path import LakePath


def on_freshness_warned() -> dg.AutomationCondition:
    """Once the freshness policy warns, one run (a quiet stream's starts no Spark and confirms
    the tables are whole)."""
    return dg.AutomationCondition.freshness_warned().with_label("freshness warned")


def transform_condition() -> dg.AutomationCondition:
    """The condition of `curated`: on a new batch or a freshness warning, each once."""
    either = on_new_raw_batches().since_last_handled() | on_freshness_warned().since_last_handled()
    return unless_running(either).with_label("on new raw batches")


def curated_freshness(stream: StreamConfig) -> dg.FreshnessPolicy:
    """The stream's tables should have been folded within the lag check's error threshold
    (warn) and twice that (fail): the same budget the `lag` check gives the raw zone."""
    error = timedelta(seconds=stream.checks.lag_error_seconds)
    return dg.FreshnessPolicy.time_window(fail_window=2 * error, warn_window=error)


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

    translator = TableTranslator(stream)
    named = {t: translator.names(t) for t in translator.tables(known)}
    by_key = {names.key: table for table, names in named.items()}

    @dg.multi_asset(
        specs=[curated_spec, *(translator.asset_spec(t) for t in named)],
        check_specs=[spec for t in named for spec in translator.check_specs(t)],
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
        yield from check_results(
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
        asset_key_replacements={names.by_name: names.key for names in named.values()}
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
    translator = TableTranslator(stream)
    reported = []
    for table in tables(store, lake_root, stream.name):
        db, coll = table.db or "", table.coll or ""
        if not db or (db, coll, table.table) not in changed:
            continue  # no database: the stream's own markers, no collection's table
        key = translator.key((db, coll or DATABASE_EVENTS, table.table))
        reported.append((key, translator.metadata(table, drift.get((db, coll)))))
    return reported


def collections_listed_check(
    stream: StreamConfig, listed: Sequence[TableName]
) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=keys(stream)["curated"], name="collections_listed", blocking=False)
    def collections_listed(state: StateStoreResource) -> dg.AssetCheckResult:
        """The collection tables the stream's runs made that the loaded definitions have no
        asset for: they are in the Catalog by their materializations already; a reload of the
        code location (Deployment > Reload, or a restart) gives them graph nodes and checks."""
        with explained():
            made = tables_made(state.store(), stream.name)
        missing = sorted(set(made) - set(listed))
        return dg.AssetCheckResult(
            passed=not missing,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "tables_listed": len(listed),
                "tables_not_listed": len(missing),
                "examples": dg.MetadataValue.json([".".join(m) for m in missing[:10]]),
            },
            description="reload the code location to list them" if missing else None,
        )

    return collections_listed
