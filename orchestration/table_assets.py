"""A collection's table as a Dagster asset: everything about it in one place.

`TableTranslator` says, for one stream, what each of its collection tables (a collection's
`changes` or `current`) is in Dagster: its key and name, its spec (deps, description, group,
kinds, automation), its metadata when a run changed it, and its checks and their results. The
stream's transform step (`orchestration.transform_assets`) builds one multi-asset from these
and yields one result per table; `orchestration.discovery` says which tables exist when the
definitions load. Dagster's own integrations work the same way (dagster-dlt's translator).

**Names.** A table has two forms, both made by `table_names` and nowhere else:

- its **key**, `[stream, db, "<coll>.changes" | "<coll>.current"]`, keeps the real names
  (Dagster 1.13 accepts any text in a key's parts; the UI labels a node with the last part, so
  that part names the collection and the table), so the Catalog and lineage show a collection as
  MongoDB calls it, spaces, Unicode and `$database` (a database's own events) included; only a
  key too long for Dagster's storage (its `asset_keys` column is 512 characters of JSON,
  escaped to `\\uXXXX`, on PostgreSQL and MySQL) has its collection part cut short and marked
  with `$` and the hash below (no collection name holds a `$`);
- its **name**, for everything Dagster names with `^[A-Za-z0-9_]+$` (the step's output per
  table, and the output of each check of it, which Dagster builds from the name):
  `<stream>__<db>__<coll>_<kind>` when the database and collection are plain (letters and
  digits, single inner underscores), which reads back unambiguously; otherwise each other
  character becomes `_`, each part is cut at 64 characters, and a hash of the exact names is
  appended, so two collections that escape alike (`a-b`, `a.b`, `a b`) still differ. A plain
  name ends in its kind, an escaped one in hex digits, so the two kinds never meet.

**Checks** of a `current` table are evaluated by the transform step itself (check specs of its
multi-asset: a separate check op would be skipped whenever one of the tables it covers was not
changed by the run, and 200 collections would be 600 ops):

- `row_count_matches_source` (MongoDB): the table's rows against the collection's documents
  that the stream's pipeline lets through;
- `freshness` and `schema_drift` (state store only): how long the oldest raw batch not folded
  yet has waited, and whether the newest run that changed the table added or changed columns.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import dagster as dg
from pymongo import MongoClient

from jobs.catalog import SchemaDrift, TableState, fold_lag, schema_drift, tables
from jobs.ops import source_count
from orchestration.keys import keys
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.errors import TidemarkError
from tidemark.object_path import LakePath

TableKind = Literal["changes", "current"]
# (db, collection, kind) of a collection table; `$database` names a database's own events.
TableName = tuple[str, str, str]

# A part that a name may hold as it is: splitting the name on `__` gives it back.
_PLAIN = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")
_NOT_NAME = re.compile(r"[^A-Za-z0-9]")
# Escaped parts are cut here: the hash keeps them apart, and a run's log stays readable.
PART_LIMIT = 64
# Dagster keeps each asset key's JSON text in a VARCHAR(512) on PostgreSQL and MySQL.
KEY_LIMIT = 512
# 128 bits: names are chosen by whoever creates collections, so a short hash could be met on
# purpose (a birthday search found two 40-bit matches among `c` + punctuation in seconds).
_HASH_CHARS = 32
# What marks a key cut short: MongoDB refuses `$` in a collection name (Tidemark's own
# `$database` is never followed by a hash), so a cut key can never be a real collection's.
_CUT_MARK = "$"

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
DESCRIPTION = {
    "current": "its live documents, one row each (Delta Lake, MERGEd by each run).",
    "changes": "its change log, one row per event, partitioned by date (Delta Lake).",
}


@dataclass(frozen=True)
class TableNames:
    """What Dagster calls one collection table."""

    key: dg.AssetKey  # the real names (see the module's docstring for the one exception)
    name: str  # matches ^[A-Za-z0-9_]+$; different for every table of every stream

    @property
    def by_name(self) -> dg.AssetKey:
        """A key whose Python identifier (what Dagster names an output and its checks' outputs
        after) is the table's name: a multi-asset's specs are keyed so, then get `key`."""
        return dg.AssetKey([self.name])


def table_names(stream: str, db: str, coll: str, kind: str) -> TableNames:
    """The key and the Dagster name of `stream`'s table `kind` of `db`.`coll` (`$database`:
    the database's own events)."""
    # MongoDB names hold no NUL, so the joined text stands for exactly one table.
    digest = hashlib.sha256("\0".join((stream, db, coll, kind)).encode()).hexdigest()
    digest = digest[:_HASH_CHARS]
    if all(_PLAIN.fullmatch(p) and len(p) <= PART_LIMIT for p in (db, coll)):
        name = f"{stream}__{db}__{coll}_{kind}"
    else:
        db_part, coll_part = (_NOT_NAME.sub("_", p)[:PART_LIMIT] for p in (db, coll))
        name = f"{stream}__{db_part}__{coll_part}_{kind}_{digest}"
    key = dg.AssetKey([stream, db, f"{coll}.{kind}"])
    cut = coll
    while len(key.to_db_string()) > KEY_LIMIT:
        cut = cut[:-1]
        key = dg.AssetKey([stream, db, f"{cut}{_CUT_MARK}{digest}.{kind}"])
    return TableNames(key, name)


def table_of(key: dg.AssetKey, stream: str) -> TableName | None:
    """(db, collection, kind) of one of `stream`'s collection table keys; None for any other
    key. A collection's name may hold dots: the kind is the last part. (A key cut short for
    Dagster's storage reads back with its cut name.)"""
    if len(key.path) != 3 or key.path[0] != stream:
        return None
    coll, _, kind = key.path[2].rpartition(".")
    return (key.path[1], coll, kind) if coll and kind in ("changes", "current") else None


def on_new_raw_batches() -> dg.AutomationCondition:
    """Requested when a dependency's data version changed since the transform was last
    requested or ran (raw_changes: a new committed batch; a replay window)."""
    return dg.AutomationCondition.any_deps_match(
        dg.AutomationCondition.data_version_changed()
    ).with_label("a new raw batch")


def unless_running(condition: dg.AutomationCondition) -> dg.AutomationCondition:
    return (
        condition
        & ~dg.AutomationCondition.in_progress()
        & ~dg.AutomationCondition.any_deps_in_progress()
    )


def changes_condition() -> dg.AutomationCondition:
    """A collection's `changes`: requested with `curated` on a new batch, so the run selects
    the stream's tables and their checks run after it."""
    return unless_running(on_new_raw_batches().since_last_handled()).with_label(
        "on new raw batches"
    )


def current_condition() -> dg.AutomationCondition:
    """A collection's `current`: requested whenever its `changes` is."""
    requested = dg.AutomationCondition.any_deps_match(dg.AutomationCondition.will_be_requested())
    return requested.with_label("with its changes")


@dataclass(frozen=True)
class TableTranslator:
    """One stream's collection tables as Dagster assets."""

    stream: StreamConfig

    def names(self, table: TableName) -> TableNames:
        return table_names(self.stream.name, *table)

    def key(self, table: TableName) -> dg.AssetKey:
        return self.names(table).key

    def tables(self, known: Sequence[TableName]) -> list[TableName]:
        """The stream's tables as assets: those its runs made, and for a collection stream its
        one collection's from the start (`current` only when the stream keeps one)."""
        names = set(known)
        stream = self.stream
        if stream.scope == "collection" and stream.database and stream.collection:
            names.add((stream.database, stream.collection, "changes"))
            names.add((stream.database, stream.collection, "current"))
        if not stream.current_table:
            names = {n for n in names if n[2] != "current"}
        return sorted(names)

    def asset_spec(self, table: TableName) -> dg.AssetSpec:
        """The table's spec, keyed by its name (`TableNames.by_name`): the step gives it its
        real key after Dagster has named its output from this one."""
        db, coll, kind = table
        upstream = (
            [self.names((db, coll, "changes")).by_name]
            if kind == "current"
            else [keys(self.stream)["raw_changes"], keys(self.stream)["replay"]]
        )
        return dg.AssetSpec(
            self.names(table).by_name,
            deps=upstream,
            group_name=self.stream.name,
            kinds={"delta"},
            skippable=True,
            automation_condition=current_condition() if kind == "current" else changes_condition(),
            description=f"{db}.{coll}: {DESCRIPTION[kind]}",
        )

    def check_specs(self, table: TableName) -> list[dg.AssetCheckSpec]:
        """A `current` table's checks (by the key its spec has); a change log has none."""
        if table[2] != "current":
            return []
        key = self.names(table).by_name
        return [dg.AssetCheckSpec(n, asset=key, description=a) for n, a in ABOUT.items()]

    def metadata(self, state: TableState, drift: SchemaDrift | None = None) -> dict[str, Any]:
        """A table's materialization: the table as it is now, the Spark SQL name that reads it,
        the Tidemark run that made this Delta version, and (for `current`) the columns that run
        added or changed."""
        metadata = {
            **table_metadata(state),
            "dagster/table_name": f"delta.`{state.location}`",
            "tidemark_run": state.run if state.run is not None else 0,
        }
        if state.table == "current":
            metadata["fields_added"] = len(drift.added) if drift else 0
            metadata["fields_changed"] = len(drift.changed) if drift else 0
            if drift is not None and drift.drifted:
                metadata["schema_changes"] = schema_changes_md(drift)
        return metadata


def table_metadata(table: TableState) -> dict[str, Any]:
    """Dagster's table conventions, so the Catalog shows the columns, rows and location."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(name=c.name, type=c.type, description=c.description or None)
            for c in table.columns
        ]
    )
    metadata: dict[str, Any] = {
        "dagster/column_schema": schema,
        "dagster/row_count": table.rows,
        "dagster/uri": table.location.as_uri(),
        "format": "delta",
        "committed_at": dg.MetadataValue.timestamp(table.committed_at),
    }
    if table.delta_version is not None:  # a stream's summary spans several tables
        metadata["delta_version"] = table.delta_version
    return metadata


def schema_changes_md(drift: SchemaDrift) -> dg.MetadataValue:
    return dg.MetadataValue.md(
        "\n".join(
            [*(f"- added `{f}`" for f in drift.added), *(f"- changed `{c}`" for c in drift.changed)]
        )
    )


def check_results(
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
            yield _schema_drift(base, drifts.get((db, coll)))


def _schema_drift(base: dict, found: SchemaDrift | None) -> dg.AssetCheckResult:
    metadata: dict[str, object] = {
        "fields_added": len(found.added) if found else 0,
        "fields_changed": len(found.changed) if found else 0,
        "tidemark_run": found.run if found else 0,
    }
    if found is not None and found.drifted:
        metadata["schema_changes"] = schema_changes_md(found)
    return dg.AssetCheckResult(
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
