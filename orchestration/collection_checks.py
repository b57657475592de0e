"""Checks of each collection table, evaluated by the stream's transform step itself (check
specs of its multi-asset: a separate check op would be skipped whenever one of the tables it
covers was not changed by the run, and 200 collections would be 600 ops):

- `row_count_matches_source` (MongoDB): a `current` table's rows against the collection's
  documents that the stream's pipeline lets through;
- `freshness` and `schema_drift` (state store only): how long the oldest raw batch not folded
  yet has waited, and whether the newest run that changed the table added or changed columns.

And one op of its own: `collections_listed` on `curated`, the collections the state store knows
that the loaded definitions do not (a reload of the code location gives them their assets).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg
from pymongo import MongoClient

from jobs.catalog import fold_lag, schema_drift, table_names, tables
from jobs.ops import source_count
from orchestration.keys import TableName, keys
from orchestration.metadata import explained, schema_changes_md
from orchestration.resources import StateStoreResource
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.errors import TidemarkError
from tidemark.object_path import LakePath

ROW_COUNT = "row_count_matches_source"
FRESHNESS = "freshness"
SCHEMA_DRIFT = "schema_drift"
ABOUT = {
    ROW_COUNT: "Rows in the newest `current` version against the collection's documents that "
    "the stream's pipeline lets through (a difference is expected while writes continue after "
    "the run's token).",
    FRESHNESS: "Seconds the oldest committed raw batch has waited to be folded (0: the table "
    "holds everything the raw zone has), against the stream's lag thresholds.",
    SCHEMA_DRIFT: "Whether the newest run that changed the table added columns or changed a type.",
}


def table_check_specs(current: Sequence[dg.AssetKey]) -> list[dg.AssetCheckSpec]:
    """The checks of each collection's `current` table (by the keys its spec has)."""
    return [
        dg.AssetCheckSpec(n, asset=key, description=a) for key in current for n, a in ABOUT.items()
    ]


def table_check_results(
    selected: Sequence[dg.AssetCheckKey],
    stream: StreamConfig,
    tables_by_key: Mapping[dg.AssetKey, TableName],
    store: StateStore,
    lake_root: LakePath,
    mongo: Callable[[], MongoClient],
) -> Iterator[dg.AssetCheckResult]:
    """The `selected` checks' results, as the tables are now (`tables_by_key`: the table each
    checked key stands for). MongoDB is reached (`mongo`) only for a row count: the fold
    itself never needs it."""
    if not selected:
        return
    rows = {
        (t.db, t.coll): t.rows
        for t in tables(store, lake_root, stream.name)
        if t.table == "current"
    }
    lag = fold_lag(store, stream.name)
    drifts = {(d.db, d.coll): d for d in schema_drift(store, stream.name)}
    counted = (
        _source_counts(mongo, store, stream) if any(c.name == ROW_COUNT for c in selected) else None
    )
    waited = lag.seconds(datetime.now(UTC))
    limits = stream.checks
    for check in selected:
        db, coll, _ = tables_by_key.get(check.asset_key, ("", "", ""))
        base = {"check_name": check.name, "asset_key": check.asset_key}
        if check.name == ROW_COUNT:
            yield _row_count(base, rows.get((db, coll), 0), f"{db}.{coll}", counted)
        elif check.name == FRESHNESS:
            yield dg.AssetCheckResult(
                **base,
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
        else:
            found = drifts.get((db, coll))
            metadata: dict[str, object] = {
                "fields_added": len(found.added) if found else 0,
                "fields_changed": len(found.changed) if found else 0,
                "tidemark_run": found.run if found else 0,
            }
            if found is not None and found.drifted:
                metadata["schema_changes"] = schema_changes_md(found)
            yield dg.AssetCheckResult(
                **base,
                passed=found is None or not found.drifted,
                severity=dg.AssetCheckSeverity.WARN,
                metadata=metadata,
                description=None if found is None else f"as of Tidemark run {found.run}",
            )


def _source_counts(
    mongo: Callable[[], MongoClient], store: StateStore, stream: StreamConfig
) -> tuple[dict[str, int], str] | TidemarkError:
    """Documents per collection, or why they could not be counted, MongoDB unreachable
    included (a check result says so: the run's tables are committed by then, so the step
    does not fail on it)."""
    try:
        checkpoint = store.checkpoint(stream.name)
        expected = source_count(mongo(), stream, checkpoint.source if checkpoint else None)
    except TidemarkError as exc:
        return exc
    return expected.by_collection, expected.how


def _row_count(
    base: dict, have: int, name: str, counted: tuple[dict[str, int], str] | TidemarkError | None
) -> dg.AssetCheckResult:
    if not isinstance(counted, tuple):
        return dg.AssetCheckResult(
            **base,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"current_rows": have},
            description=f"the source could not be counted: {counted}",
        )
    by_collection, how = counted
    want = by_collection.get(name, 0)
    return dg.AssetCheckResult(
        **base,
        passed=have == want,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "current_rows": have,
            "source_documents": want,
            "difference": have - want,
            "counted_by": how,
        },
    )


def collections_listed_check(
    stream: StreamConfig, listed: Sequence[TableName]
) -> dg.AssetChecksDefinition:
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
