"""Writing a version of `current`: a delta of the keys a run touched, or a whole new base.

A run writes a *delta* when it can: the newest of its events per key, kept where it is newer
than what the previous version holds for that key (so a late older event writes nothing),
read from the previous version's key columns only. Its cost follows the run's events.

It writes a new *base* (the previous version merged, with the events folded in by
`jobs.transform.fold`) when there is no previous version, when `current` is rebuilt from the
whole change log (a backfill), or when the run folds a namespace event (drop, dropDatabase,
rename, a snapshot's start): those act on every row of a namespace, and keeping barriers out
of deltas keeps the merge rule (`jobs.transform.merge`) a plain newest-per-key.

Either way the directory is this attempt's own (`v=NNNNNN-<run id>`), written by Spark and
never renamed; it is data once the run commits it (`jobs.transform.run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.curated_zone import current_root, version_dir_name
from jobs.lake import relative
from jobs.transform.doc_columns import (
    expand,
    infer_schema,
    merge_schemas,
    schema_changes,
    schema_from_json,
    with_json,
)
from jobs.transform.fold import (
    KEY,
    NAMESPACE_OPERATIONS,
    STATE_COLUMNS,
    EventFacts,
    Watched,
    barriers_of,
    event_keys,
    fold,
    key_census,
    keyed_events,
    newest_per_key,
    not_cleared,
)
from jobs.transform.merge import merge, read_parts, row_counts
from state import BatchRecord, CurrentVersion, TransformState, VersionKind
from tidemark.config import StreamConfig

# Up to this many events, a delta's winning event ids (~80 MB at most, held by the driver,
# whose default heap is 2 GB) are broadcast to pick out their rows; beyond, Spark joins them
# its own way (the documents are shuffled).
BROADCAST_WINNERS = 1_000_000


@dataclass(frozen=True)
class VersionPlan:
    """What a run folds and onto what."""

    stream: StreamConfig
    number: int  # the run's number: the new version
    run_id: str
    previous: CurrentVersion | None  # the newest version (None: there is none to fold onto)
    events: DataFrame  # the change-log rows to fold
    facts: EventFacts = field(default_factory=EventFacts)  # what is known (default: nothing)
    events_count: int | None = None  # how many events (None: not known)


def folds_namespace_events(batches: list[BatchRecord]) -> bool:
    """True when a batch holds a namespace event (the manifest counts events by type)."""
    return any(b.events_by_type.get(op) for b in batches for op in NAMESPACE_OPERATIONS)


def _directory(lake_root: Path, plan: VersionPlan) -> Path:
    return current_root(lake_root, plan.stream.name) / version_dir_name(plan.number, plan.run_id)


def _previous_rows(
    spark: SparkSession, tstate: TransformState, lake_root: Path, previous: CurrentVersion
) -> list[DataFrame]:
    """The previous version's directories, base first, in its schema."""
    parts = tstate.version_parts(previous.stream, previous.version)
    return read_parts(spark, lake_root, parts, schema_from_json(previous.doc_schema))


def write_base(
    spark: SparkSession, tstate: TransformState, lake_root: Path, plan: VersionPlan
) -> tuple[CurrentVersion, dict[str, list[str]]]:
    """Fold the events onto the previous version (or nothing) and write every row."""
    previous = plan.previous
    old_schema, state = StructType([]), None
    if previous is not None:
        old_schema = schema_from_json(previous.doc_schema)
        state = merge(_previous_rows(spark, tstate, lake_root, previous))
    watched = Watched(plan.stream.database, plan.stream.collection)
    facts = plan.facts
    # A first load whose keys are each once is a projection of the change log's files: read
    # by each action below, with no shuffle and nothing held (rare otherwise: not checked).
    census = None
    if previous is None and facts.plain_json and not facts.namespace_events:
        census = key_census(plan.events, facts)
        facts = replace(facts, unique_keys=not census.repeats)
    direct = census is not None and not census.repeats
    folded = fold(state, plan.events, watched, facts)
    if not facts.plain_json:
        folded = with_json(folded)
    if not direct:
        folded = folded.localCheckpoint()  # the fold (and any Python) runs once, not per action
    new_rows = folded
    if previous is not None:  # with none, every row comes from the events
        new_rows = folded.join(
            plan.events.select(F.col("event_id").alias("_tm_event_id")),
            "_tm_event_id",
            "left_semi",
        )
    merged = merge_schemas(old_schema, _inferred(spark, new_rows))
    target = _directory(lake_root, plan)
    expand(folded, merged).write.parquet(str(target))
    if direct and census is not None:
        written, live = census.rows, census.live  # one row per keyed event
    else:
        written, live = row_counts(folded)  # the rows just written, counted where they are held
    return _record(plan, target, lake_root, "base", plan.number, written, live, merged), (
        schema_changes(old_schema, merged)
    )


def write_delta(
    spark: SparkSession, tstate: TransformState, lake_root: Path, plan: VersionPlan
) -> tuple[CurrentVersion, dict[str, list[str]]]:
    """Write the rows of the keys the events change; see the module docstring."""
    previous = plan.previous
    assert previous is not None and previous.base_version is not None
    frames = _previous_rows(spark, tstate, lake_root, previous)
    keyed = not_cleared(keyed_events(plan.events, plan.facts), barriers_of(frames[0]))
    # Which event wins each key is decided on the narrow columns; the winners' documents are
    # then picked out by event id (unique in the change log) without being shuffled.
    latest = newest_per_key(keyed.select(*KEY, "_tm_event_id"))
    # The keys to look up from the change log's key columns (a few more than `latest`'s,
    # whose own would run its window a second time).
    held = _held(frames, event_keys(plan.events, plan.facts))
    held_id = F.col("_held_event_id")
    winners = (
        latest.join(held, KEY, "left")
        .where(held_id.isNull() | (F.col("_tm_event_id") > held_id))
        .select("_tm_event_id", (held_id.isNotNull() & ~F.col("_held_deleted")).alias("_was_live"))
    )
    if plan.events_count is not None and plan.events_count <= BROADCAST_WINNERS:
        winners = F.broadcast(winners)
    newer = keyed.join(winners, "_tm_event_id")
    newer = newer.select(*STATE_COLUMNS, "_was_live")
    if not plan.facts.plain_json:
        newer = with_json(newer)
    newer = newer.localCheckpoint()
    old_schema = schema_from_json(previous.doc_schema)
    merged = merge_schemas(old_schema, _inferred(spark, newer))
    written, gained, lost = newer.agg(
        F.count(F.lit(1)),
        F.count(F.when(~F.col("_tm_deleted") & ~F.col("_was_live"), 1)),
        F.count(F.when(F.col("_tm_deleted") & F.col("_was_live"), 1)),
    ).first() or (0, 0, 0)
    target = _directory(lake_root, plan)
    expand(newer.drop("_was_live"), merged).write.parquet(str(target))
    live = previous.rows + gained - lost
    record = _record(plan, target, lake_root, "delta", previous.base_version, written, live, merged)
    return record, schema_changes(old_schema, merged)


def _held(frames: list[DataFrame], keys: DataFrame) -> DataFrame:
    """What the previous version holds for `keys`: its newest event id and whether deleted."""
    rows = frames[0].select(*KEY, "_tm_event_id", "_tm_deleted")
    for frame in frames[1:]:
        rows = rows.unionByName(frame.select(*KEY, "_tm_event_id", "_tm_deleted"))
    newest = F.max_by(F.struct("_tm_event_id", "_tm_deleted"), "_tm_event_id")
    return (
        rows.join(keys, KEY, "left_semi")
        .groupBy(*KEY)
        .agg(newest.alias("_held"))
        .select(
            *KEY,
            F.col("_held._tm_event_id").alias("_held_event_id"),
            F.col("_held._tm_deleted").alias("_held_deleted"),
        )
    )


def _inferred(spark: SparkSession, rows: DataFrame) -> StructType:
    """The schema Spark infers from the documents of `rows` (tombstones have none)."""
    documents = rows.where(F.col("_tm_event_id").isNotNull() & ~F.col("_tm_deleted"))
    return infer_schema(spark, documents.select("_tm_json"))


def _record(
    plan: VersionPlan,
    target: Path,
    lake_root: Path,
    kind: VersionKind,
    base_version: int,
    written: int,
    live: int,
    schema: StructType,
) -> CurrentVersion:
    return CurrentVersion(
        stream=plan.stream.name,
        version=plan.number,
        path=relative(lake_root, target),
        kind=kind,
        base_version=base_version,
        written_rows=written,
        rows=live,
        doc_schema=schema.json(),
        events_folded=0,  # the caller knows what it folded
        changes_added=0,
        created_at=datetime.now(UTC),
    )
