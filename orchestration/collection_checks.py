"""Checks of each collection table, evaluated per stream in one step each (200 collections
are 200 results of one op, not 200 ops):

- `row_count_matches_source` (MongoDB): a `current` table's rows against the collection's
  documents that the stream's pipeline lets through;
- `freshness` and `schema_drift` (state store only): how long the oldest raw batch not folded
  yet has waited, and whether the newest run that changed the table added or changed columns;
- `collections_listed` on `curated`: the collections the state store knows that the loaded
  definitions do not (a reload of the code location gives them their assets).
"""

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import dagster as dg

from jobs.catalog import fold_lag, schema_drift, table_names, tables
from jobs.ops import source_count
from orchestration.keys import TableName, keys, table_key
from orchestration.metadata import explained, schema_changes_md
from orchestration.resources import LakeResource, MongoResource, StateStoreResource
from orchestration.transform_assets import stream_tables
from tidemark.config import StreamConfig


def collection_checks(
    stream: StreamConfig, known: Sequence[TableName] = ()
) -> list[dg.AssetChecksDefinition]:
    listed = stream_tables(stream, known)
    current = [(db, coll) for db, coll, kind in listed if kind == "current"]
    checks = [_collections_listed(stream, listed)]
    if current:
        checks += [_row_counts(stream, current), _freshness_and_drift(stream, current)]
    return checks


def _spec(stream: StreamConfig, db: str, coll: str, name: str, about: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        name, asset=table_key(stream.name, db, coll, "current"), description=about
    )


def _row_counts(stream: StreamConfig, current: list[tuple[str, str]]) -> dg.AssetChecksDefinition:
    about = (
        "Rows in the newest `current` version against the collection's documents that the "
        "stream's pipeline lets through (a difference is expected while writes continue after "
        "the run's token)."
    )

    @dg.multi_asset_check(
        specs=[_spec(stream, db, coll, "row_count_matches_source", about) for db, coll in current],
        name=f"{stream.name}_row_counts",
        can_subset=True,
    )
    def row_counts(
        context: dg.AssetCheckExecutionContext,
        mongo: MongoResource,
        state: StateStoreResource,
        lake: LakeResource,
    ) -> Iterator[dg.AssetCheckResult]:
        with explained():
            store = state.store()
            checkpoint = store.checkpoint(stream.name)
            expected = source_count(
                mongo.client(), stream, checkpoint.source if checkpoint else None
            )
            rows = {
                (t.db, t.coll): t.rows
                for t in tables(store, lake.path, stream.name)
                if t.table == "current"
            }
        for check in context.selected_asset_check_keys:
            db, coll = check.asset_key.path[1], check.asset_key.path[2]
            have = rows.get((db, coll), 0)
            want = expected.by_collection.get(f"{db}.{coll}", 0)
            yield dg.AssetCheckResult(
                check_name=check.name,
                asset_key=check.asset_key,
                passed=have == want,
                severity=dg.AssetCheckSeverity.WARN,
                metadata={
                    "current_rows": have,
                    "source_documents": want,
                    "difference": have - want,
                    "counted_by": expected.how,
                },
            )

    return row_counts


def _freshness_and_drift(
    stream: StreamConfig, current: list[tuple[str, str]]
) -> dg.AssetChecksDefinition:
    limits = stream.checks
    fresh = (
        "Seconds the oldest committed raw batch has waited to be folded (0: the table holds "
        "everything the raw zone has), against the stream's lag thresholds."
    )
    drift = "Whether the newest run that changed the table added columns or changed a type."
    specs = [_spec(stream, db, coll, "freshness", fresh) for db, coll in current]
    specs += [_spec(stream, db, coll, "schema_drift", drift) for db, coll in current]

    @dg.multi_asset_check(specs=specs, name=f"{stream.name}_table_state", can_subset=True)
    def table_state(
        context: dg.AssetCheckExecutionContext, state: StateStoreResource
    ) -> Iterator[dg.AssetCheckResult]:
        with explained():
            store = state.store()
            lag = fold_lag(store, stream.name)
            drifts = {(d.db, d.coll): d for d in schema_drift(store, stream.name)}
        waited = lag.seconds(datetime.now(UTC))
        for check in context.selected_asset_check_keys:
            db, coll = check.asset_key.path[1], check.asset_key.path[2]
            if check.name == "freshness":
                yield dg.AssetCheckResult(
                    check_name=check.name,
                    asset_key=check.asset_key,
                    passed=waited <= limits.lag_warn_seconds,
                    severity=dg.AssetCheckSeverity.ERROR
                    if waited > limits.lag_error_seconds
                    else dg.AssetCheckSeverity.WARN,
                    metadata={
                        "unfolded_batches": lag.batches,
                        "waited_seconds": round(waited, 1),
                        "warn_above": limits.lag_warn_seconds,
                        "error_above": limits.lag_error_seconds,
                    },
                )
                continue
            found = drifts.get((db, coll))
            metadata: dict[str, object] = {
                "fields_added": len(found.added) if found else 0,
                "fields_changed": len(found.changed) if found else 0,
                "tidemark_run": found.run if found else 0,
            }
            if found is not None and found.drifted:
                metadata["schema_changes"] = schema_changes_md(found)
            yield dg.AssetCheckResult(
                check_name=check.name,
                asset_key=check.asset_key,
                passed=found is None or not found.drifted,
                severity=dg.AssetCheckSeverity.WARN,
                metadata=metadata,
                description=None if found is None else f"as of Tidemark run {found.run}",
            )

    return table_state


def _collections_listed(stream: StreamConfig, listed: list[TableName]) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=keys(stream)["curated"], name="collections_listed", blocking=False)
    def collections_listed(state: StateStoreResource) -> dg.AssetCheckResult:
        """The collection tables the stream's runs made that the loaded definitions have no
        asset for: they are in the Catalog by their materializations already; a reload of the
        code location (Deployment > Reload, or a restart) gives them graph nodes and checks."""
        with explained():
            made = table_names(state.store(), stream.name)
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
