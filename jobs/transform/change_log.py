"""The change log: a run's new events, from the committed raw batches to `changes`.

A run reads its batches' raw files, drops the events the change log already holds (a replayed
or re-delivered batch adds nothing), and writes the rest to a directory of its own,
partitioned by date. Only the committed runs whose event-id range overlaps the new events'
are read for that check, and only the row groups inside the range (Parquet statistics), so
its cost follows the run's events, not the log's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from jobs.curated_zone import run_changes_dir
from jobs.lake import relative
from jobs.raw_zone import DOCUMENT_FIELDS, RAW_SCHEMA
from jobs.transform.doc_columns import PLAIN_JSON, documents_udf
from jobs.transform.fold import ID_ONLY
from jobs.transform.readers import change_log
from state import BatchRecord, TransformState

CHANGES_COLUMNS = [
    "event_id", "operation_type", "db", "coll", "cluster_time", "cluster_time_inc", "wall_time",
    "txn_number", "lsid", "to_db", "to_coll", "collection_uuid", "document_key", "full_document",
    "full_document_before_change", "update_description", "updated_fields", "removed_fields",
    "operation_description", "batch_id", "source", "date",
]  # fmt: skip
# Beside them in a run's files, not a column of the `changes` table (`read_changes` drops it):
# the full document's plain JSON, rendered in the same Python pass as the canonical documents,
# so `current` parses its typed columns from it and runs no Python over a document again.
LOGGED_JSON = PLAIN_JSON


_RAW_COLUMNS = from_arrow_schema(RAW_SCHEMA)


@dataclass(frozen=True)
class NewEvents:
    """What a run added to the change log: its rows (read back from its directory)."""

    frame: DataFrame
    path: str  # lake-relative
    count: int
    first_event_id: str
    last_event_id: str
    other_keys: bool  # a documentKey among them is not already the canonical `{_id}` key


def _raw_events(
    spark: SparkSession, lake_root: Path, stream: str, batches: list[BatchRecord]
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
    """Raw events (one row per event id) -> change-log rows and LOGGED_JSON; the documents'
    JSON, canonical and plain, is made here from `raw`, in one Python pass per event."""
    envelope = [
        c
        for c in CHANGES_COLUMNS
        if c not in ("updated_fields", "removed_fields", "date", *DOCUMENT_FIELDS)
    ]
    documents = [*DOCUMENT_FIELDS, LOGGED_JSON]
    with_documents = raw.select(*envelope, documents_udf(F.col("raw")).alias("_documents")).select(
        *envelope, *(F.col("_documents").getField(name).alias(name) for name in documents)
    )
    update = F.col("update_description")
    return with_documents.select(
        *[c for c in CHANGES_COLUMNS if c not in ("updated_fields", "removed_fields", "date")],
        LOGGED_JSON,
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


def _census(raw: DataFrame, seen: DataFrame | None) -> _Census:
    """One job over the event-id and document-key columns alone (`seen`: the change log's ids
    in range). It tells the common run (no replay, no re-run) that its rows need no
    de-duplication, so they are written without a shuffle of the raw BSON; gives the count and
    id range of what will be written, so nothing is read back; and whether a key needs Python
    to be made canonical (`fold.with_canonical_key`)."""
    key = F.col("document_key")
    other = (key.isNotNull() & ~key.rlike(ID_ONLY)).cast("int")
    ids = raw.select("event_id", F.lit(1).alias("new"), other.alias("other"))
    if seen is not None:
        ids = ids.unionByName(
            seen.select("event_id", F.lit(0).alias("new"), F.lit(0).alias("other"))
        )
    per_id = ids.groupBy("event_id").agg(
        F.count(F.lit(1)).alias("n"), F.min("new").alias("new"), F.max("other").alias("other")
    )
    adds = F.when(F.col("new") == 1, F.col("event_id"))  # in the batches, not logged yet
    row = per_id.agg(F.max("n"), F.count(adds), F.min(adds), F.max(adds), F.max("other")).first()
    assert row is not None  # a global aggregate has one row
    most, count, first, last, other_keys = row
    return _Census(bool(most and most > 1), bool(other_keys), count, first, last)


def log_new_events(
    spark: SparkSession,
    tstate: TransformState,
    lake_root: Path,
    stream: str,
    batches: list[BatchRecord],
    run: tuple[int, str],
) -> NewEvents | None:
    """Write the batches' events that the change log lacks to this run's directory; None when
    there are none (then nothing is written). Spark jobs: the event-id range of the batches
    when the manifest lacks it, the census of event ids (`_census`), the write."""
    if not batches:
        return None
    raw = _raw_events(spark, lake_root, stream, batches)
    low, high = _event_id_range(raw, batches)
    if low is None or high is None:
        return None
    overlapping = tstate.change_log_runs(stream, low, high)
    paths = [r.changes_path for r in overlapping if r.changes_path]
    seen = None
    if paths:
        seen = (
            change_log(spark, lake_root, paths)
            .where(F.col("event_id").between(low, high))
            .select("event_id")
        )
    census = _census(raw, seen)
    if not census.count:
        return None
    if census.repeats:
        # A replay or a re-run (rare): whole rows shuffled by event id, as before.
        raw = raw.dropDuplicates(["event_id"])
        if seen is not None:
            raw = raw.join(seen, "event_id", "left_anti")
    events = change_log_rows(raw)
    target = run_changes_dir(lake_root, stream, *run)
    events.write.partitionBy("date").parquet(str(target))
    written = spark.read.schema(events.schema).parquet(str(target))
    assert census.first is not None and census.last is not None
    return NewEvents(
        written,
        relative(lake_root, target),
        census.count,
        census.first,
        census.last,
        census.other_keys,
    )
