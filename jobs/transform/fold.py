"""The fold's rules: which change events set or remove a document, and which one wins.

Event order is the resume token's `_data` (event id), whose server encoding starts with the
cluster time and keeps the order of events inside a transaction. Per key (namespace +
canonical `{_id}` key) the newest event wins: insert / replace / update with a post-image
upsert it, delete removes it; an update whose post-image is null (the document was gone when
the server looked it up, and its delete follows) changes nothing.

What was removed is remembered, so an older event folded late (a replay window before the
stream's start or before a snapshot, a replay transformed while the incremental drain lags)
never brings a document back: a delete leaves a tombstone, and drop, dropDatabase, rename and
a snapshot's start leave a barrier for their namespace (`jobs.transform.apply` keeps both in
the stream's `removed` table). A keyed event older than a barrier of its namespace, or than
its key's tombstone, is ignored.

A rename moves the source's rows to the target when the target is one the stream watches (a
database or cluster stream renaming inside its scope); a rename out of the watched scope (a
collection stream's collection renamed away, a database stream's collection moved to another
database) removes them, as a drop does: the stream no longer sees their changes. An event of
the source older than the rename that arrives after the rename was folded is not dropped by the
source's barrier: its run rebuilds the collections the renames link it to from their history
(`jobs.transform.late_history`).

Snapshot rows are upserts whose event ids sort at the snapshot's time. A collection's events
are folded in segments between the namespace events that touch it, each segment applied to what
came before (`jobs.transform.segments`).
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
from pyspark.sql.types import StringType, StructType

from jobs.curated_zone import (
    KEY_RULE,
    TM_CLUSTER_TIME,
    TM_COLL,
    TM_DB,
    TM_DELETED,
    TM_DOCUMENT,
    TM_EVENT_ID,
    TM_KEY,
)
from jobs.raw_zone import SNAPSHOT, SNAPSHOT_START
from jobs.transform.identity import identity_key
from jobs.transform.udfs import arrow_udf_of

KEY = [TM_DB, TM_COLL, TM_KEY]  # a document's key across the stream's collections
KEY_OPERATIONS = ["insert", "update", "replace", "delete", SNAPSHOT]
# snapshot_start opens a (re-)snapshot: its scope is replaced by the snapshot's rows.
NAMESPACE_OPERATIONS = ["drop", "dropDatabase", "rename", SNAPSHOT_START]

# Values decoded only to be encoded again: sub-documents stay raw, dates of any range survive.
_KEY_CODEC = CodecOptions(
    document_class=RawBSONDocument,
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)
# documentKey forms that already are the canonical `{_id}` key (an _id alone of these types),
# once a `$numberLong` that fits an int32 is written `$numberInt` (`identity`): no Python.
ID_ONLY = r'^\{ "_id" : \{ "\$(numberInt|numberLong|oid)" : "[^"]*" \} \}$'
LONG_ID = r'^\{ "_id" : \{ "\$numberLong" : "(-?[0-9]+)" \} \}$'


@dataclass(frozen=True)
class EventFacts:
    """What a run knows of its events without reading them (the batches' manifest, the change
    log's census) and so need not look for. The defaults know nothing: always right, slower."""

    namespace_events: bool = True  # a namespace event may be among them
    other_keys: bool = True  # a documentKey may be other than `{_id}` of an int, long or oid
    deletes: bool = True  # a delete may be among them
    large: bool = False  # events of a MB or more (`change_log.large_events`): rows held on disk


def may_hold(batches: list[Any], operations: list[str]) -> bool:
    """True when a batch may hold an event of `operations`: the manifest counts each batch's
    events by type (a batch with events but no counts might hold any)."""
    return any(
        (b.event_count and not b.events_by_type)
        or any(b.events_by_type.get(op) for op in operations)
        for b in batches
    )


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
    """`{"_id": ...}` of a documentKey, in libbson's canonical Extended JSON, its numbers
    written by their value (`identity.identity_key`: `1` and `NumberLong(1)` are one key).

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
    return identity_key(bsonjs.dumps(key, mode=bsonjs.CANONICAL))


def id_key_arrays(document_keys: pa.Array) -> pa.Array:
    """`id_key` of each documentKey."""
    return pa.array([id_key(k) for k in document_keys.to_pylist()], pa.string())


def id_key_udf(document_keys: Column | str) -> Column:
    return arrow_udf_of(id_key_arrays, StringType())(document_keys)


def identity_key_arrays(keys: pa.Array) -> pa.Array:
    """`identity_key` of each key a `current` table written before the rule holds."""
    return pa.array([None if k is None else identity_key(k) for k in keys.to_pylist()], pa.string())


def rekeyed(
    rows: DataFrame, within: tuple[str, ...] = (), tombstones: DataFrame | None = None
) -> DataFrame:
    """Rows of a table whose keys kept their numbers' types (written before the identity rule:
    `curated_zone.KEY_RULE`), keyed by value, and the newest row of each key (`within` the
    other key columns) where two now share one, unless a strictly newer tombstone of that
    value removed it (`tombstones`: TM_KEY, `_t_event_id`): the type-keyed MERGE of a delete
    missed an older twin keyed by the other type."""
    key = arrow_udf_of(identity_key_arrays, StringType())(F.col(TM_KEY)).cast("string")
    newest_first = Window.partitionBy(*within, TM_KEY).orderBy(F.col(TM_EVENT_ID).desc())
    ranked = rows.withColumn(TM_KEY, key).withColumn("_rank", F.row_number().over(newest_first))
    newest = ranked.where(F.col("_rank") == 1).drop("_rank")
    if tombstones is None:
        return newest
    hidden = newest.join(tombstones, TM_KEY).where(F.col("_t_event_id") > F.col(TM_EVENT_ID))
    return newest.join(hidden.select(TM_KEY), TM_KEY, "left_anti")


def tombstones_of(removals: DataFrame | None, ns: tuple[str, str]) -> DataFrame | None:
    """A collection's tombstones among `removals` (the `removed` table's rows): TM_KEY and
    their event id as `_t_event_id`."""
    if removals is None:
        return None
    ours = (F.col(TM_DB) == ns[0]) & (F.col(TM_COLL) == ns[1]) & F.col(TM_KEY).isNotNull()
    return removals.where(ours).select(TM_KEY, F.col(TM_EVENT_ID).alias("_t_event_id"))


def rekeyed_removals(removed: DataFrame) -> DataFrame:
    """`removed` (tombstones keyed, barriers not) re-keyed by value (`rekeyed`)."""
    tombstones = rekeyed(removed.where(F.col(TM_KEY).isNotNull()), within=(TM_DB, TM_COLL))
    barriers = removed.where(F.col(TM_KEY).isNull())
    return marked_by_value(tombstones.unionByName(barriers))


def marked_by_value(frame: DataFrame) -> DataFrame:
    """`frame` with TM_KEY marked as keyed by value (`KEY_RULE`), as a table's first commit
    or rewrite must write it (a MERGE keeps the table's mark)."""
    return frame.withMetadata(TM_KEY, KEY_RULE)


def keyed_by_value(schema: StructType) -> bool:
    """Whether a table of this schema keys its rows by the `_id`'s value (`KEY_RULE`)."""
    return any(f.name == TM_KEY and KEY_RULE.items() <= f.metadata.items() for f in schema.fields)


def _by_value(key: Column) -> Column:
    """An `ID_ONLY` key as `identity_key` writes it, in SQL: only a `$numberLong` that fits an
    int32 changes (to `$numberInt`)."""
    value = F.regexp_extract(key, LONG_ID, 1).try_cast("long")
    small = key.rlike(LONG_ID) & value.between(-(2**31), 2**31 - 1)
    as_int = F.concat(F.lit('{ "_id" : { "$numberInt" : "'), value.cast("string"), F.lit('" } }'))
    return F.when(small, as_int).otherwise(key)


def with_canonical_key(rows: DataFrame, other_keys: bool = True) -> DataFrame:
    """`rows` with TM_KEY, the canonical key of their documentKey (not null). Python runs
    only for the rows whose key is not already `{_id}`, and not at all when `other_keys` is
    false: a UDF under `when` would still be evaluated for every row, so the two kinds are
    split (two reads of `rows`) and unioned."""
    if not other_keys:
        return rows.withColumn(TM_KEY, _by_value(F.col("document_key")))
    id_only = F.col("document_key").rlike(ID_ONLY)
    plain = rows.where(id_only).withColumn(TM_KEY, _by_value(F.col("document_key")))
    # Cast: over Spark Connect a UDF's string is `string collate UTF8_BINARY`, which delta-rs
    # refuses in a table's schema (see change_log); the union below hides that only while
    # its plain side comes first.
    key = id_key_udf(F.col("document_key")).cast("string")
    other = rows.where(~id_only).withColumn(TM_KEY, key)
    return plain.unionByName(other)


def keyed_events(events: DataFrame, facts: EventFacts | None = None) -> DataFrame:
    """Events that set or remove one document, in the state's column names (TM_DOCUMENT null
    on a delete)."""
    facts = facts or EventFacts()
    op = F.col("operation_type")
    rows = events.where(
        op.isin(KEY_OPERATIONS)
        & F.col("document_key").isNotNull()
        & ~((op == "update") & F.col("full_document").isNull())
    )
    return with_canonical_key(rows, facts.other_keys).select(
        F.col("db").alias(TM_DB),
        F.col("coll").alias(TM_COLL),
        F.col(TM_KEY),
        F.when(op != "delete", F.col("full_document")).alias(TM_DOCUMENT),
        F.col("event_id").alias(TM_EVENT_ID),
        F.col("cluster_time").alias(TM_CLUSTER_TIME),
        (op == "delete").alias(TM_DELETED),
    )


def not_cleared(keyed: DataFrame, barriers: DataFrame) -> DataFrame:
    """Keyed events not older than a barrier of their namespace (a late event stays gone);
    `barriers` has `_b_db`, `_b_coll` (null: every collection or database) and `_b_event_id`."""
    covers = (
        (F.col("_b_db").isNull() | (F.col("_b_db") == F.col(TM_DB)))
        & (F.col("_b_coll").isNull() | (F.col("_b_coll") == F.col(TM_COLL)))
        & (F.col(TM_EVENT_ID) < F.col("_b_event_id"))
    )
    return keyed.join(F.broadcast(barriers), covers, "left_anti")


def newest_per_key(events: DataFrame) -> DataFrame:
    """Of `keyed_events`' rows (other columns may follow), the one with the greatest event id
    per key."""
    newest_first = Window.partitionBy(*KEY).orderBy(F.col(TM_EVENT_ID).desc())
    ranked = events.withColumn("_rank", F.row_number().over(newest_first))
    return ranked.where(F.col("_rank") == 1).drop("_rank")
