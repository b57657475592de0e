"""The fold: previous current-state rows + new change events, in event order -> new rows.

Event order is the resume token's `_data` (event id), whose server encoding starts with the
cluster time and keeps the order of events inside a transaction. Per key (namespace +
document key) the newest event wins: insert / replace / update with a post-image upsert it,
delete removes it; an update whose post-image is null (the document was gone when the server
looked it up) changes nothing. drop, dropDatabase, rename and a snapshot's start act on whole
namespaces, so the events are folded in segments between them, each applied to what came
before. Snapshot rows are upserts whose event ids sort at the snapshot's time.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

KEY = ["_tm_db", "_tm_coll", "_tm_key"]
KEY_OPERATIONS = ["insert", "update", "replace", "delete", "snapshot"]
# snapshot_start opens a (re-)snapshot: its scope is replaced by the snapshot's rows.
NAMESPACE_OPERATIONS = ["drop", "dropDatabase", "rename", "snapshot_start"]
STATE_COLUMNS = [
    "_tm_db",
    "_tm_coll",
    "_tm_key",
    "_tm_document",
    "_tm_event_id",
    "_tm_cluster_time",
    "_tm_json",  # null on rows this fold set: the caller derives it from _tm_document
]


def keyed_events(events: DataFrame) -> DataFrame:
    """Events that set or remove one document, in the state's column names."""
    op = F.col("operation_type")
    return events.where(
        op.isin(KEY_OPERATIONS)
        & F.col("document_key").isNotNull()
        & ~((op == "update") & F.col("full_document").isNull())
    ).select(
        F.col("db").alias("_tm_db"),
        F.col("coll").alias("_tm_coll"),
        F.col("document_key").alias("_tm_key"),
        F.col("full_document").alias("_tm_document"),
        F.col("event_id").alias("_tm_event_id"),
        F.col("cluster_time").alias("_tm_cluster_time"),
        F.lit(None).cast("string").alias("_tm_json"),
        op.alias("_op"),
    )


def apply_segment(state: DataFrame, events: DataFrame) -> DataFrame:
    """The newest event per key, applied where it is newer than the row's."""
    newest_first = Window.partitionBy(*KEY).orderBy(F.col("_tm_event_id").desc())
    latest = events.withColumn("_rank", F.row_number().over(newest_first)).where("_rank = 1")
    held = state.select(*KEY, F.col("_tm_event_id").alias("_held_event_id"))
    newer = latest.join(held, KEY, "left").where(
        F.col("_held_event_id").isNull() | (F.col("_tm_event_id") > F.col("_held_event_id"))
    )
    kept = state.join(newer.select(*KEY), KEY, "left_anti")
    upserts = newer.where(F.col("_op") != "delete").select(*STATE_COLUMNS)
    return kept.unionByName(upserts)


def apply_namespace_event(state: DataFrame, event: Any) -> DataFrame:
    before = F.col("_tm_event_id") < F.lit(event.event_id)
    in_db = F.col("_tm_db") == F.lit(event.db)
    in_coll = in_db & (F.col("_tm_coll") == F.lit(event.coll))
    if event.operation_type == "snapshot_start":
        if event.db is None:
            return state.where(~before)  # a whole-cluster stream
        return state.where(~((in_coll if event.coll is not None else in_db) & before))
    if event.operation_type == "dropDatabase":
        return state.where(~(in_db & before))
    if event.operation_type == "drop":
        return state.where(~(in_coll & before))
    # rename: the target's old documents go (dropTarget), the source's move to the target.
    in_target = (F.col("_tm_db") == F.lit(event.to_db)) & (
        F.col("_tm_coll") == F.lit(event.to_coll)
    )
    state = state.where(~(in_target & before))
    moving = in_coll & before
    return state.withColumn(
        "_tm_db", F.when(moving, F.lit(event.to_db)).otherwise(F.col("_tm_db"))
    ).withColumn("_tm_coll", F.when(moving, F.lit(event.to_coll)).otherwise(F.col("_tm_coll")))


def fold(previous: DataFrame, events: DataFrame) -> DataFrame:
    """The new state rows (STATE_COLUMNS): `previous` with `events` folded in, in event order."""
    barriers = (
        events.where(F.col("operation_type").isin(NAMESPACE_OPERATIONS))
        .select("event_id", "operation_type", "db", "coll", "to_db", "to_coll")
        .orderBy("event_id")
        .collect()
    )
    keyed = keyed_events(events)
    state = previous.select(*STATE_COLUMNS)
    lower: str | None = None
    for barrier in [*barriers, None]:
        segment = keyed
        if lower is not None:
            segment = segment.where(F.col("_tm_event_id") > F.lit(lower))
        if barrier is not None:
            segment = segment.where(F.col("_tm_event_id") < F.lit(barrier.event_id))
        state = apply_segment(state, segment)
        if barrier is not None:
            state = apply_namespace_event(state, barrier)
            # Cut the lineage: each segment would otherwise re-plan every one before it.
            state = state.localCheckpoint()
            lower = barrier.event_id
    return state
