"""The change log: a run's new events, from the committed raw batches to each collection's
`changes` Delta table.

A run reads its batches' raw files, drops the events the change log already holds (a replayed
or re-delivered batch adds nothing), and appends the rest to the `changes` table of their
collection, partitioned by date. Only when a committed run's event-id range overlaps the new
events' are the tables read for that check, and then only the files inside the range (Delta's
file statistics), so its cost follows the run's events, not the log's length. Rows of this
run's own batches are not "already held": a repeat of a killed run must fold them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

import bsonjs
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from jobs.curated_zone import CHANGES_COLUMNS, TM_DOCUMENT, TM_EVENT_ID, changes_dir, names
from jobs.raw_zone import DOCUMENT_FIELDS, RAW_SCHEMA, events_documents
from jobs.transform.delta_io import CHANGES_PROPERTIES, RunWriter, is_table
from jobs.transform.fold import ID_ONLY
from jobs.transform.udfs import arrow_udf_of
from state import BatchRecord, TransformState
from tidemark.object_path import LakePath

_RAW_COLUMNS = from_arrow_schema(RAW_SCHEMA)
# From this many raw bytes per event in a batch, a run holds its rows on disk rather than in
# the driver's memory: a change-log row of a 36 MB event carries ~60 MB of JSON, and sixteen
# of them held in memory ran a 2 GB driver out of it (see also resources.spark's Parquet
# settings).
LARGE_EVENT_BYTES = 1 << 20
DOCUMENT_JSON_TYPE = StructType([StructField(name, StringType()) for name in DOCUMENT_FIELDS])
NAMESPACE_TYPE = StructType([StructField("db", StringType()), StructField("coll", StringType())])


def document_json_arrays(raw: pa.Array) -> pa.Array:
    """The events' documents (`DOCUMENT_FIELDS`) as canonical Extended JSON, from the raw
    zone's BSON bytes: the body of the change log's one Python pass over its events."""
    columns: list[list[str | None]] = [[] for _ in DOCUMENT_FIELDS]
    for documents in events_documents(raw):
        for column, document in zip(columns, documents, strict=True):
            column.append(
                None if document is None else bsonjs.dumps(document, mode=bsonjs.CANONICAL)
            )
    return pa.StructArray.from_arrays(
        [pa.array(column, pa.string()) for column in columns], names=list(DOCUMENT_FIELDS)
    )


def document_json_udf(raw: Column | str) -> Column:
    return arrow_udf_of(document_json_arrays, DOCUMENT_JSON_TYPE)(raw)


def large_events(batches: list[BatchRecord]) -> bool:
    """True when a batch's events average LARGE_EVENT_BYTES or more (the manifest's bytes)."""
    return any(b.event_count and b.bytes / b.event_count >= LARGE_EVENT_BYTES for b in batches)


def held(frame: DataFrame, on_disk: bool) -> DataFrame:
    """`frame` computed once and held for the run's later reads: on disk for large events,
    else where Spark likes (memory, spilling to disk)."""
    if on_disk:
        return frame.localCheckpoint(storageLevel=StorageLevel.DISK_ONLY)
    return frame.localCheckpoint()


@dataclass(frozen=True)
class NewEvents:
    """What a run added to the change log: its rows, held by Spark with their plain JSON."""

    frame: DataFrame
    namespaces: list[tuple[str | None, str | None]]  # (db, coll); None: a database's, a stream's
    count: int
    first_event_id: str
    last_event_id: str
    other_keys: bool  # a documentKey among them is not already the canonical `{_id}` key


def _raw_events(
    spark: SparkSession, lake_root: LakePath, stream: str, batches: list[BatchRecord]
) -> DataFrame:
    paths = [str(lake_root / f.path) for b in batches for f in b.files]
    # Each batch's source as a literal map: no DataFrame to broadcast, so no Spark job (and
    # no Python worker) just to attach it.
    sources = F.create_map(*(F.lit(v) for b in batches for v in (b.id, b.source)))
    batch_id = F.regexp_extract(F.col("_metadata.file_name"), r"^(.*)-\d+\.parquet$", 1)
    return (
        spark.read.option("basePath", str(lake_root / "raw" / stream))
        .schema(_RAW_COLUMNS)  # known: no job to read a file's footer for it
        .parquet(*paths)
        .withColumn("batch_id", batch_id)
        .withColumn("source", sources[F.col("batch_id")])
    )


def change_log_rows(raw: DataFrame) -> DataFrame:
    """Raw events (one row per event id) -> change-log rows; the documents' canonical
    Extended JSON is made here from `raw`, in one Python pass per event."""
    derived = ("updated_fields", "removed_fields", "date")
    columns = names(CHANGES_COLUMNS)
    envelope = [c for c in columns if c not in (*derived, *DOCUMENT_FIELDS)]
    documents = DOCUMENT_FIELDS
    with_documents = raw.select(
        *envelope, document_json_udf(F.col("raw")).alias("_documents")
    ).select(
        *envelope,
        # Cast: over Spark Connect a UDF's string comes back typed `string collate
        # UTF8_BINARY`, which Delta then writes into the table's schema and which readers
        # outside Spark (deltalake, DuckDB) refuse; the cast makes it the plain `string`.
        *(F.col("_documents").getField(name).cast("string").alias(name) for name in documents),
    )
    update = F.col("update_description")
    return with_documents.select(
        *[c for c in columns if c not in derived],
        F.get_json_object(update, "$.updatedFields").alias("updated_fields"),
        F.from_json(update, "struct<removedFields: array<string>>")
        .getField("removedFields")
        .alias("removed_fields"),
        F.to_date("cluster_time").alias("date"),
    )


def _event_id_range(raw: DataFrame, batches: list[BatchRecord]) -> tuple[str | None, str | None]:
    """The batches' lowest and highest event id: from the manifest when every batch records
    them (a capture pass reads events in order), otherwise from the files (a Spark job)."""
    firsts = [b.first_event_id for b in batches]
    lasts = [b.last_event_id for b in batches]
    if all(firsts) and all(lasts):
        return min(f for f in firsts if f), max(last for last in lasts if last)
    low, high = raw.agg(F.min("event_id"), F.max("event_id")).first() or (None, None)
    return low, high


@dataclass(frozen=True)
class _Census:
    """What a run will add, counted before anything is written."""

    repeats: bool  # an event id occurs twice in the batches or is logged already
    other_keys: bool  # a documentKey is not already the canonical `{_id}` (`fold.ID_ONLY`)
    count: int  # the events the change log lacks (each once)
    first: str | None
    last: str | None
    namespaces: list[tuple[str | None, str | None]]  # (db, coll) of those events, sorted


def _census(raw: DataFrame, seen: DataFrame | None) -> _Census:
    """One job over the event-id and document-key columns alone (`seen`: the change log's ids
    in range). It tells the common run (no replay, no re-run) that its rows need no
    de-duplication, so they are written without a shuffle of the raw BSON; gives the count, id
    range and namespaces of what will be written, so nothing is read back; and whether a key
    needs Python to be made canonical (`fold.with_canonical_key`)."""
    key = F.col("document_key")
    other = (key.isNotNull() & ~key.rlike(ID_ONLY)).cast("int")
    namespace = F.struct("db", "coll")
    ids = raw.select("event_id", F.lit(1).alias("new"), other.alias("other"), namespace.alias("ns"))
    if seen is not None:
        nothing = F.lit(None).cast(NAMESPACE_TYPE)
        ids = ids.unionByName(
            seen.select(
                "event_id", F.lit(0).alias("new"), F.lit(0).alias("other"), nothing.alias("ns")
            )
        )
    per_id = ids.groupBy("event_id").agg(
        F.count(F.lit(1)).alias("n"),
        F.min("new").alias("new"),
        F.max("other").alias("other"),
        F.max("ns").alias("ns"),  # an event's namespace (a logged row has none: null)
    )
    new = F.col("new") == 1  # in the batches, not logged yet
    adds = F.when(new, F.col("event_id"))
    row = per_id.agg(
        F.max("n"),
        F.count(adds),
        F.min(adds),
        F.max(adds),
        F.max("other"),
        F.collect_set(F.when(new, F.col("ns"))),
    ).first()
    assert row is not None  # a global aggregate has one row
    most, count, first, last, other_keys, found = row
    namespaces = sorted(((n.db, n.coll) for n in found), key=lambda n: (n[0] or "", n[1] or ""))
    return _Census(bool(most and most > 1), bool(other_keys), count, first, last, namespaces)


def log_new_events(
    writer: RunWriter,
    tstate: TransformState,
    batches: list[BatchRecord],
    large: bool = False,
) -> NewEvents | None:
    """Append the batches' events that the change log lacks to their collections' `changes`
    tables; None when there are none (then nothing is written). `large`: the batches' events
    are large (`large_events`), so their rows are made one task at a time and held on disk.
    Spark jobs: the event-id
    range of the batches when the manifest lacks it, the census of event ids and namespaces
    (`_census`), the rows held once, one append per collection."""
    if not batches:
        return None
    spark, lake_root, stream = writer.spark, writer.lake_root, writer.stream
    raw = _raw_events(spark, lake_root, stream, batches)
    low, high = _event_id_range(raw, batches)
    if low is None or high is None:
        return None
    seen = _logged(writer, tstate, batches, low, high)
    census = _census(raw, seen)
    if not census.count:
        return None
    if census.repeats:
        # A replay or a re-run (rare): whole rows shuffled by event id, as before.
        raw = raw.dropDuplicates(["event_id"])
        if seen is not None:
            raw = raw.join(seen, "event_id", "left_anti")
    if large:
        # One task at a time: two tasks each turning a ~36 MB event into ~60 MB of JSON (and
        # queueing the next events for Python) ran a 2 GB driver out of memory under load.
        raw = raw.coalesce(1)
    # Held once: each collection's append, and the fold after them, read these rows.
    events = held(change_log_rows(raw), large)
    for db, coll in census.namespaces:
        rows = events.where(
            F.col("db").eqNullSafe(F.lit(db)) & F.col("coll").eqNullSafe(F.lit(coll))
        )
        path = changes_dir(lake_root, stream, db, coll)
        writer.create(rows, path, CHANGES_PROPERTIES, writer.slot(), partition_by=["date"])
    assert census.first is not None and census.last is not None
    return NewEvents(
        events, census.namespaces, census.count, census.first, census.last, census.other_keys
    )


def _logged(
    writer: RunWriter,
    tstate: TransformState,
    batches: list[BatchRecord],
    low: str,
    high: str,
) -> DataFrame | None:
    """The ids in [low, high] that committed runs logged (None: no committed run's range
    overlaps it, so none can be)."""
    if not tstate.change_log_runs(writer.stream, low, high):
        return None
    tables = [t for t in tstate.tables(writer.stream) if t.kind == "changes"]
    if not tables:
        return None
    ours = [b.id for b in batches]
    frames = [
        writer.spark.read.format("delta")
        .load(str(writer.lake_root / t.path))
        .where(F.col("event_id").between(low, high) & ~F.col("batch_id").isin(ours))
        .select("event_id")
        for t in tables
    ]
    seen = frames[0]
    for frame in frames[1:]:
        seen = seen.unionByName(frame)
    return seen


def with_documents(
    spark: SparkSession,
    rows: DataFrame,
    lake_root: LakePath,
    stream: str,
    namespaces: list[tuple[str, str]],
) -> DataFrame:
    """`rows` (of `current`, keyed by TM_EVENT_ID) with TM_DOCUMENT: the full document of the
    event that set each row, from the change logs of `namespaces` (a row moved by a rename
    keeps the event of the collection it came from, so the caller names every collection).
    Rows that already carry TM_DOCUMENT (a table written before issue 38) are returned as
    they are."""
    if TM_DOCUMENT in rows.columns:
        return rows

    def documents(_: LakePath, log: DataFrame) -> DataFrame:
        return log.where(F.col("full_document").isNotNull()).select(
            F.col("event_id").alias(TM_EVENT_ID), F.col("full_document").alias(TM_DOCUMENT)
        )

    paths = [changes_dir(lake_root, stream, *ns) for ns in namespaces]
    events = read_logs(spark, paths, documents)
    if events is None:
        return rows.withColumn(TM_DOCUMENT, F.lit(None).cast("string"))
    return rows.join(events, TM_EVENT_ID, "left")


def read_logs(
    spark: SparkSession,
    paths: list[LakePath],
    shape: Callable[[LakePath, DataFrame], DataFrame],
) -> DataFrame | None:
    """The change logs at `paths` that exist, each `shape`d, as one frame (columns matched by
    name; one a log lacks is null there). None when no log exists."""
    logs = [shape(p, spark.read.format("delta").load(str(p))) for p in paths if is_table(p)]
    if not logs:
        return None
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), logs)
