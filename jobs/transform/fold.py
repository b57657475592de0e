"""The fold: previous current-state rows + new change events, in event order -> new rows.

Event order is the resume token's `_data` (event id), whose server encoding starts with the
cluster time and keeps the order of events inside a transaction. Per key (namespace +
canonical `{_id}` key) the newest event wins: insert / replace / update with a post-image
upsert it, delete turns it into a tombstone; an update whose post-image is null (the document
was gone when the server looked it up, and its delete follows) changes nothing.

The state remembers what it removed, so an older event folded late (a replay window before
the stream's start or before a snapshot, a replay transformed while the incremental drain
lags) never brings a document back:
- a delete leaves a tombstone row (`_tm_deleted`, the delete's event id, no document);
- drop, dropDatabase, rename and a snapshot's start act on whole namespaces: they remove the
  rows before them in their scope and leave one barrier row per scope (`_tm_key` null,
  `_tm_coll` null for a database, `_tm_db` null for the whole cluster) with their event id.
  A keyed event older than a barrier of its namespace is ignored.
Readers never see tombstones or barriers (`jobs.transform.read_current` filters them). Both are
rows keyed like the documents, so a later merge-by-key fold keeps working the same way.

A rename moves the source's rows to the target when the target is one the stream watches
(a database or cluster stream renaming inside its scope); a rename out of the watched scope
(a collection stream's collection renamed away, a database stream's collection moved to
another database) removes them, as a drop does: the stream no longer sees their changes.
An event of the source older than the rename that arrives after it is ignored (the source's
barrier), not moved: only what the fold knew at the rename moves.

Snapshot rows are upserts whose event ids sort at the snapshot's time. Events are folded in
segments between namespace events, each segment applied to what came before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import bson
import bsonjs
import pyarrow as pa
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import StringType

from jobs.curated_zone import PLAIN_JSON
from jobs.raw_zone import SNAPSHOT, SNAPSHOT_START

KEY = ["_tm_db", "_tm_coll", "_tm_key"]
KEY_OPERATIONS = ["insert", "update", "replace", "delete", SNAPSHOT]
# snapshot_start opens a (re-)snapshot: its scope is replaced by the snapshot's rows.
NAMESPACE_OPERATIONS = ["drop", "dropDatabase", "rename", SNAPSHOT_START]
STATE_COLUMNS = [
    "_tm_db",
    "_tm_coll",
    "_tm_key",  # null on a barrier row
    "_tm_document",
    "_tm_event_id",
    "_tm_cluster_time",
    "_tm_json",  # on rows this fold set: the change log's, or null (the caller derives it)
    "_tm_deleted",  # tombstones and barriers: never shown to readers
]
STATE_DDL = (
    "_tm_db string, _tm_coll string, _tm_key string, _tm_document string, "
    "_tm_event_id string, _tm_cluster_time timestamp, _tm_json string, _tm_deleted boolean"
)

# Values decoded only to be encoded again: sub-documents stay raw, dates of any range survive.
_KEY_CODEC = CodecOptions(
    document_class=RawBSONDocument,
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)
# documentKey forms that already are the canonical `{_id}` key (an _id alone of these types).
ID_ONLY = r'^\{ "_id" : \{ "\$(numberInt|numberLong|oid)" : "[^"]*" \} \}$'


@dataclass(frozen=True)
class EventFacts:
    """What a run knows of its events without reading them (the batches' manifest, the change
    log's census) and so need not look for. The defaults know nothing: always right, slower."""

    plain_json: bool = False  # every event row carries its document's plain JSON (`_tm_json`)
    namespace_events: bool = True  # a namespace event may be among them
    other_keys: bool = True  # a documentKey may be other than `{_id}` of an int, long or oid
    unique_keys: bool = False  # no document key occurs twice among them (`key_census`)


@dataclass(frozen=True)
class Watched:
    """The namespaces a stream watches: a collection, a database (collection None) or all."""

    database: str | None = None
    collection: str | None = None

    def contains(self, db: str | None, coll: str | None) -> bool:
        if self.database is None:
            return True
        return db == self.database and (self.collection is None or coll == self.collection)


def id_key(document_key: str | None) -> str | None:
    """`{"_id": ...}` of a documentKey, in libbson's canonical Extended JSON.

    On a sharded collection documentKey also holds the shard key's fields (and they change when
    the shard key is refined), while a snapshot row's key is `{_id}`: `_id` alone is the one
    key of a document in `current`.
    """
    if document_key is None:
        return None
    value = RawBSONDocument(bsonjs.loads(document_key), _KEY_CODEC).get("_id")
    if value is None:
        return document_key  # no _id to key by: keep what the server gave
    key = bson.encode({"_id": value}, codec_options=_KEY_CODEC)
    return bsonjs.dumps(key, mode=bsonjs.CANONICAL)


@arrow_udf(StringType())
def id_key_udf(document_keys: pa.Array) -> pa.Array:
    return pa.array([id_key(k) for k in document_keys.to_pylist()], pa.string())


def with_canonical_key(rows: DataFrame, other_keys: bool = True) -> DataFrame:
    """`rows` with `_tm_key`, the canonical key of their documentKey (not null). Python runs
    only for the rows whose key is not already `{_id}`, and not at all when `other_keys` is
    false: a UDF under `when` would still be evaluated for every row, so the two kinds are
    split (two reads of `rows`) and unioned."""
    if not other_keys:
        return rows.withColumn("_tm_key", F.col("document_key"))
    id_only = F.col("document_key").rlike(ID_ONLY)
    plain = rows.where(id_only).withColumn("_tm_key", F.col("document_key"))
    other = rows.where(~id_only).withColumn("_tm_key", id_key_udf(F.col("document_key")))
    return plain.unionByName(other)


def keyed_events(events: DataFrame, facts: EventFacts | None = None) -> DataFrame:
    """Events that set or remove one document, in the state's column names. `_tm_json` is the
    change log's plain JSON of the document when the events carry it (null otherwise: the
    caller derives it from `_tm_document`)."""
    facts = facts or EventFacts()
    op = F.col("operation_type")
    plain = F.col(PLAIN_JSON) if PLAIN_JSON in events.columns else F.lit(None).cast("string")
    rows = events.where(
        op.isin(KEY_OPERATIONS)
        & F.col("document_key").isNotNull()
        & ~((op == "update") & F.col("full_document").isNull())
    )
    return with_canonical_key(rows, facts.other_keys).select(
        F.col("db").alias("_tm_db"),
        F.col("coll").alias("_tm_coll"),
        F.col("_tm_key"),
        F.when(op != "delete", F.col("full_document")).alias("_tm_document"),
        F.col("event_id").alias("_tm_event_id"),
        F.col("cluster_time").alias("_tm_cluster_time"),
        F.when(op != "delete", plain).alias("_tm_json"),
        (op == "delete").alias("_tm_deleted"),
    )


def event_keys(events: DataFrame, facts: EventFacts | None = None) -> DataFrame:
    """KEY of the events' documents: those of `keyed_events(events)` and perhaps a few more,
    for a semi-join. Only the narrow columns are read, not the documents."""
    facts = facts or EventFacts()
    rows = events.where(F.col("document_key").isNotNull()).select("db", "coll", "document_key")
    return with_canonical_key(rows, facts.other_keys).select(
        F.col("db").alias("_tm_db"), F.col("coll").alias("_tm_coll"), "_tm_key"
    )


@dataclass(frozen=True)
class KeyCensus:
    """The keyed rows of a run's events, counted per key (`key_census`)."""

    repeats: bool  # a document key occurs twice
    rows: int  # keyed rows: documents and tombstones
    live: int  # of them, documents


def key_census(events: DataFrame, facts: EventFacts | None = None) -> KeyCensus:
    """One Spark job over the events' key columns. A first load of inserts or a snapshot has
    no key twice: its rows need no shuffle to find each key's newest event, and its counts
    are these."""
    rows = keyed_events(events, facts).select(*KEY, "_tm_deleted")
    per_key = rows.groupBy(*KEY).agg(
        F.count(F.lit(1)).alias("n"), F.count(F.when(~F.col("_tm_deleted"), 1)).alias("live")
    )
    most, total, live = per_key.agg(F.max("n"), F.sum("n"), F.sum("live")).first() or (0, 0, 0)
    return KeyCensus(bool(most and most > 1), int(total or 0), int(live or 0))


def barriers_of(state: DataFrame) -> DataFrame:
    """The state's barrier rows: (db, coll, event id) below which a namespace is cleared."""
    return state.where(F.col("_tm_key").isNull()).select(
        F.col("_tm_db").alias("_b_db"),
        F.col("_tm_coll").alias("_b_coll"),
        F.col("_tm_event_id").alias("_b_event_id"),
    )


def not_cleared(keyed: DataFrame, barriers: DataFrame) -> DataFrame:
    """Keyed events not older than a barrier of their namespace (a late event stays gone)."""
    covers = (
        (F.col("_b_db").isNull() | (F.col("_b_db") == F.col("_tm_db")))
        & (F.col("_b_coll").isNull() | (F.col("_b_coll") == F.col("_tm_coll")))
        & (F.col("_tm_event_id") < F.col("_b_event_id"))
    )
    return keyed.join(F.broadcast(barriers), covers, "left_anti")


def newest_per_key(events: DataFrame) -> DataFrame:
    """Keyed rows (STATE_COLUMNS and more): the one with the greatest event id per key."""
    newest_first = Window.partitionBy(*KEY).orderBy(F.col("_tm_event_id").desc())
    ranked = events.withColumn("_tm_rank", F.row_number().over(newest_first))
    return ranked.where(F.col("_tm_rank") == 1).drop("_tm_rank")


def apply_segment(state: DataFrame, events: DataFrame) -> DataFrame:
    """The newest event per key, applied where it is newer than the row's (tombstones too)."""
    latest = newest_per_key(events)
    held = state.where(F.col("_tm_key").isNotNull()).select(
        *KEY, F.col("_tm_event_id").alias("_held_event_id")
    )
    newer = latest.join(held, KEY, "left").where(
        F.col("_held_event_id").isNull() | (F.col("_tm_event_id") > F.col("_held_event_id"))
    )
    kept = state.join(newer.select(*KEY), KEY, "left_anti")  # barrier rows (null key) stay
    return kept.unionByName(newer.select(*STATE_COLUMNS))


def _barrier_row(spark: Any, db: str | None, coll: str | None, event: Any) -> DataFrame:
    return spark.createDataFrame(
        [(db, coll, None, None, event.event_id, event.cluster_time, None, True)], STATE_DDL
    )


def _in(db: str | None, coll: str | None) -> Column:
    """Rows of a scope: a collection, a database (coll None), everything (db None)."""
    if db is None:
        return F.lit(True)
    in_db = F.col("_tm_db").eqNullSafe(F.lit(db))
    return in_db if coll is None else in_db & F.col("_tm_coll").eqNullSafe(F.lit(coll))


def _clear(state: DataFrame, db: str | None, coll: str | None, event: Any) -> DataFrame:
    """Remove the scope's rows before `event` and leave its barrier."""
    before = F.col("_tm_event_id") < F.lit(event.event_id)
    cleared = state.where(~(_in(db, coll) & before))
    return cleared.unionByName(_barrier_row(state.sparkSession, db, coll, event))


def apply_namespace_event(state: DataFrame, event: Any, watched: Watched) -> DataFrame:
    if event.operation_type == SNAPSHOT_START:
        return _clear(state, event.db, event.coll, event)
    if event.operation_type == "dropDatabase":
        return _clear(state, event.db, None, event)
    if event.operation_type == "drop":
        return _clear(state, event.db, event.coll, event)
    # rename: the source's live rows before it move to the target if the stream watches the
    # target; the target's old rows go (dropTarget).
    before = F.col("_tm_event_id") < F.lit(event.event_id)
    source = _in(event.db, event.coll) & before
    moving = (
        state.where(source & ~F.col("_tm_deleted"))
        .withColumn("_tm_db", F.lit(event.to_db))
        .withColumn("_tm_coll", F.lit(event.to_coll))
    )
    state = _clear(state, event.db, event.coll, event)
    if not watched.contains(event.to_db, event.to_coll):
        return state  # out of scope: gone, as with a drop
    # What the target holds since the rename is newer than what moves: newest per key wins.
    return apply_segment(_clear(state, event.to_db, event.to_coll, event), moving)


def fold(
    previous: DataFrame | None,
    events: DataFrame,
    watched: Watched | None = None,
    facts: EventFacts | None = None,
) -> DataFrame:
    """The new state rows (STATE_COLUMNS): `previous` (None: nothing yet) with `events` folded
    in, in event order; `facts` spare the work of looking for what cannot be there."""
    watched, facts = watched or Watched(), facts or EventFacts()
    barriers = []
    if facts.namespace_events:
        found = (
            events.where(F.col("operation_type").isin(NAMESPACE_OPERATIONS))
            .select("event_id", "operation_type", "db", "coll", "to_db", "to_coll", "cluster_time")
            .collect()
        )
        barriers = sorted(found, key=lambda event: event.event_id)
    if previous is None and not barriers:
        # Nothing to fold onto and nothing to clear: the newest event of each key is its row,
        # and with each key once, the event itself.
        keyed = keyed_events(events, facts)
        return (keyed if facts.unique_keys else newest_per_key(keyed)).select(*STATE_COLUMNS)
    if previous is None:
        previous = events.sparkSession.createDataFrame([], STATE_DDL)
    state = previous.select(*STATE_COLUMNS)
    keyed = not_cleared(keyed_events(events, facts), barriers_of(state))
    lower: str | None = None
    for barrier in [*barriers, None]:
        segment = keyed
        if lower is not None:
            segment = segment.where(F.col("_tm_event_id") > F.lit(lower))
        if barrier is not None:
            segment = segment.where(F.col("_tm_event_id") < F.lit(barrier.event_id))
        state = apply_segment(state, segment)
        if barrier is not None:
            state = apply_namespace_event(state, barrier, watched)
            # Cut the lineage: each segment would otherwise re-plan every one before it.
            state = state.localCheckpoint()
            lower = barrier.event_id
    return state
