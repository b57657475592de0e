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

from jobs.curated_zone import run_changes_dir
from jobs.lake import relative
from jobs.raw_zone import DOCUMENT_FIELDS
from jobs.transform.doc_columns import document_json_udf
from jobs.transform.readers import change_log
from state import BatchRecord, TransformState

CHANGES_COLUMNS = [
    "event_id", "operation_type", "db", "coll", "cluster_time", "cluster_time_inc", "wall_time",
    "txn_number", "lsid", "to_db", "to_coll", "collection_uuid", "document_key", "full_document",
    "full_document_before_change", "update_description", "updated_fields", "removed_fields",
    "operation_description", "batch_id", "source", "date",
]  # fmt: skip


@dataclass(frozen=True)
class NewEvents:
    """What a run added to the change log: its rows (read back from its directory)."""

    frame: DataFrame
    path: str  # lake-relative
    count: int
    first_event_id: str
    last_event_id: str


def _raw_events(
    spark: SparkSession, lake_root: Path, stream: str, batches: list[BatchRecord]
) -> DataFrame:
    paths = [str(lake_root / f.path) for b in batches for f in b.files]
    sources = spark.createDataFrame(
        [(b.id, b.source) for b in batches], "batch_id string, source string"
    )
    raw = (
        spark.read.option("basePath", str(lake_root / "raw" / stream))
        .parquet(*paths)
        .withColumn(
            "batch_id",
            F.regexp_extract(F.col("_metadata.file_name"), r"^(.*)-\d+\.parquet$", 1),
        )
    )
    return raw.join(F.broadcast(sources), "batch_id", "left")


def change_log_rows(raw: DataFrame) -> DataFrame:
    """Raw events -> change-log rows; the documents' JSON is made here, from `raw`."""
    envelope = [
        c
        for c in CHANGES_COLUMNS
        if c not in ("updated_fields", "removed_fields", "date", *DOCUMENT_FIELDS)
    ]
    with_documents = (
        raw.dropDuplicates(["event_id"])
        .select(
            *envelope,
            document_json_udf(F.col("raw")).alias("_documents"),
        )
        .select(
            *envelope,
            *(F.col("_documents").getField(name).alias(name) for name in DOCUMENT_FIELDS),
        )
    )
    update = F.col("update_description")
    return with_documents.select(
        *[c for c in CHANGES_COLUMNS if c not in ("updated_fields", "removed_fields", "date")],
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


def log_new_events(
    spark: SparkSession,
    tstate: TransformState,
    lake_root: Path,
    stream: str,
    batches: list[BatchRecord],
    run: tuple[int, str],
) -> NewEvents | None:
    """Write the batches' events that the change log lacks to this run's directory; None when
    there are none. Spark jobs: the event-id range of the batches, the write, its statistics."""
    if not batches:
        return None
    raw = _raw_events(spark, lake_root, stream, batches)
    low, high = _event_id_range(raw, batches)
    if low is None or high is None:
        return None
    events = change_log_rows(raw)
    overlapping = tstate.change_log_runs(stream, low, high)
    if overlapping:
        paths = [r.changes_path for r in overlapping if r.changes_path]
        seen = (
            change_log(spark, lake_root, paths)
            .where(F.col("event_id").between(low, high))
            .select("event_id")
        )
        events = events.join(seen, "event_id", "left_anti")
    target = run_changes_dir(lake_root, stream, *run)
    events.write.partitionBy("date").parquet(str(target))
    written = spark.read.schema(events.schema).parquet(str(target))
    count, first, last = written.agg(
        F.count(F.lit(1)), F.min("event_id"), F.max("event_id")
    ).first() or (0, None, None)
    if not count:
        return None  # its directory holds no rows: an orphan for `tidemark gc`
    return NewEvents(written, relative(lake_root, target), count, first, last)
