"""One transform run of one stream: committed raw batches -> `changes` and a new `current`.

The run (under the stream's transform lease, renewed between its phases, so a run longer
than the lease's time keeps it, and one whose lease was taken over stops at the next phase):
1. finishes what a crashed run left: publishes staged change-log files of committed runs,
   deletes staging and version directories no committed run owns, and the files of versions
   an earlier run marked pruned;
2. reads the committed batches not yet transformed, drops events already in the change log
   (a replayed or re-delivered batch adds nothing), and stages the new ones by date;
3. folds them into the previous version of `current` (or, when `current` has fallen behind
   the change log because `current_table` was off, folds the whole change log afresh) and
   writes the new version to a directory of this attempt's own (`v=NNNNNN-<run id>`);
4. commits the run, the version and the batches it consumed in one fenced SQL transaction;
5. publishes the staged change-log files and marks versions beyond `keep_versions` pruned;
   their files stay until the next run, so a reader that resolved one just before this
   commit can still finish reading it.
A crash before step 4 leaves the previous version current and is simply run again.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.lake import relative
from jobs.raw_zone import DOCUMENT_FIELDS
from jobs.transform.doc_columns import (
    document_json_udf,
    expand,
    infer_schema,
    merge_schemas,
    schema_changes,
    schema_from_json,
    with_json,
)
from jobs.transform.fold import STATE_COLUMNS, Watched, fold
from jobs.transform.tables import (
    changes_dir,
    current_root,
    has_parquet,
    staging_dir,
    version_dir_name,
)
from state import BatchRecord, CurrentVersion, StateStore, TransformState, new_batch_id
from state.leases import TRANSFORM_LEASE_TTL
from tidemark.config import StreamConfig

STATE_SCHEMA = StructType(
    [
        StructField("_tm_db", StringType()),
        StructField("_tm_coll", StringType()),
        StructField("_tm_key", StringType()),
        StructField("_tm_document", StringType()),
        StructField("_tm_event_id", StringType()),
        StructField("_tm_cluster_time", TimestampType()),
        StructField("_tm_json", StringType()),
        StructField("_tm_deleted", BooleanType()),
    ]
)

CHANGES_COLUMNS = [
    "event_id", "operation_type", "db", "coll", "cluster_time", "cluster_time_inc", "wall_time",
    "txn_number", "lsid", "to_db", "to_coll", "collection_uuid", "document_key", "full_document",
    "full_document_before_change", "update_description", "updated_fields", "removed_fields",
    "operation_description", "batch_id", "source", "date",
]  # fmt: skip


@dataclass
class TransformResult:
    stream: str
    version: int | None  # the new current-state version, if one was made
    batches: int
    events_read: int
    changes_added: int
    duplicates_skipped: int
    rows: int | None
    schema: dict[str, list[str]] = field(default_factory=dict)
    duration_s: float = 0.0


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


def _change_log_rows(raw: DataFrame) -> DataFrame:
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


def _only_new(spark: SparkSession, events: DataFrame, lake_root: Path, stream: str) -> DataFrame:
    """Events not already in the change log (looked up in their date partitions only)."""
    log = changes_dir(lake_root, stream)
    if not has_parquet(log):
        return events
    dates = [row.date for row in events.select("date").distinct().collect()]
    seen = spark.read.parquet(str(log)).where(F.col("date").isin(dates)).select("event_id")
    return events.join(seen, "event_id", "left_anti")


def _previous_state(
    spark: SparkSession, lake_root: Path, latest: CurrentVersion | None
) -> DataFrame:
    if latest is None or latest.path is None:
        return spark.createDataFrame([], STATE_SCHEMA)
    frame = spark.read.parquet(str(lake_root / latest.path))
    if "_tm_deleted" not in frame.columns:  # a version written before tombstones existed
        frame = frame.withColumn("_tm_deleted", F.lit(False))
    return frame.select(*STATE_COLUMNS)


def _behind_change_log(tstate: TransformState, stream: str) -> bool:
    """True when a committed run extended the change log without folding `current` after its
    newest version (`current_table` was false then): that version misses those events."""
    newest = tstate.latest_version(stream)
    since = newest.version if newest else 0
    return any(run.path is None and run.version > since for run in tstate.runs(stream))


def _stage_new_events(
    spark: SparkSession, lake_root: Path, stream: str, batches: list[BatchRecord], stage: Path
) -> DataFrame | None:
    """The batches' events not yet in the change log, written to `stage`; None if none."""
    if not batches:
        return None
    events = _change_log_rows(_raw_events(spark, lake_root, stream, batches))
    _only_new(spark, events, lake_root, stream).write.partitionBy("date").parquet(str(stage))
    return spark.read.parquet(str(stage)) if has_parquet(stage) else None


def publish_staged(tstate: TransformState, lake_root: Path, stream: str) -> None:
    """Move committed runs' staged change-log files into their date partitions (idempotent)."""
    for run in tstate.runs(stream):
        if run.changes_staging is None:
            continue
        staged = lake_root / run.changes_staging
        run_id = staged.name
        if staged.exists():
            for file in sorted(staged.rglob("*.parquet")):
                target = changes_dir(lake_root, stream) / file.parent.name / f"{run_id}-{file.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(file, target)
            shutil.rmtree(staged, ignore_errors=True)
        tstate.mark_published(stream, run.version)


def _remove_uncommitted(tstate: TransformState, lake_root: Path, stream: str) -> None:
    runs = tstate.runs(stream)
    owned_staging = {r.changes_staging for r in runs if r.changes_staging}
    staging_root = changes_dir(lake_root, stream) / "_staging"
    if staging_root.exists():
        for directory in staging_root.iterdir():
            if relative(lake_root, directory) not in owned_staging:
                shutil.rmtree(directory, ignore_errors=True)
    owned_versions = {r.path for r in runs if r.path}
    root = current_root(lake_root, stream)
    if root.exists():
        for directory in root.iterdir():
            if relative(lake_root, directory) not in owned_versions:
                shutil.rmtree(directory, ignore_errors=True)


def _mark_pruned(tstate: TransformState, stream: str, keep: int) -> None:
    """Versions beyond `keep` leave the list readers resolve; their files stay for now."""
    versions = tstate.versions(stream)
    for old in versions[: max(0, len(versions) - keep)]:
        tstate.mark_pruned(stream, old.version)


def _delete_pruned(tstate: TransformState, lake_root: Path, stream: str) -> None:
    """Files of versions an earlier run marked pruned: no reader can resolve them any more,
    and one that resolved them before that run's commit has had a whole run's time."""
    for run in tstate.runs(stream):
        if run.pruned_at is not None and run.path:
            shutil.rmtree(lake_root / run.path, ignore_errors=True)


def transform(
    spark: SparkSession,
    store: StateStore,
    lake_root: Path,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None = None,
) -> TransformResult:
    """Run the transform for `stream` once; see the module docstring."""
    clock = time.monotonic()
    tstate = TransformState(store)
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(f"transform:{stream.name}", TRANSFORM_LEASE_TTL)
    try:
        publish_staged(tstate, lake_root, stream.name)
        _remove_uncommitted(tstate, lake_root, stream.name)
        _delete_pruned(tstate, lake_root, stream.name)
        batches = tstate.untransformed_batches(stream.name)
        latest = tstate.latest(stream.name)
        backfill = stream.current_table and _behind_change_log(tstate, stream.name)
        if not batches and not backfill:
            return TransformResult(stream.name, None, 0, 0, 0, 0, None)
        run_number = (latest.version if latest else 0) + 1
        run_id = new_batch_id()
        stage = staging_dir(lake_root, stream.name, run_id)
        delta = _stage_new_events(spark, lake_root, stream.name, batches, stage)
        events_read = sum(b.event_count for b in batches)
        added = delta.count() if delta is not None else 0
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)  # between phases: LeaseLost if taken over

        record = None
        schema_report: dict[str, list[str]] = {}
        rows = None
        if added or backfill:
            record, schema_report = _new_version(
                spark, lake_root, stream, tstate, delta, run_number, run_id, added
            )
            rows = record.rows
        if record is not None and added:
            record = replace(record, changes_staging=relative(lake_root, stage))
        else:
            shutil.rmtree(stage, ignore_errors=True)
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)
        if before_commit is not None:
            before_commit()
        tstate.commit(
            lease, stream.name, latest.version if latest else None, record, [b.id for b in batches]
        )
        publish_staged(tstate, lake_root, stream.name)
        if stream.current_table:
            _mark_pruned(tstate, stream.name, stream.keep_versions)
        return TransformResult(
            stream=stream.name,
            version=run_number if record is not None and record.path else None,
            batches=len(batches),
            events_read=events_read,
            changes_added=added,
            duplicates_skipped=events_read - added,
            rows=rows,
            schema=schema_report,
            duration_s=time.monotonic() - clock,
        )
    finally:
        store.release_lease(lease)


def _new_version(
    spark: SparkSession,
    lake_root: Path,
    stream: StreamConfig,
    tstate: TransformState,
    delta: DataFrame | None,
    run_number: int,
    run_id: str,
    added: int,
) -> tuple[CurrentVersion, dict[str, list[str]]]:
    now = datetime.now(UTC)
    if not stream.current_table:
        return CurrentVersion(stream.name, run_number, None, 0, "", 0, added, None, now), {}
    previous, events = _fold_input(spark, lake_root, stream.name, tstate, delta)
    watched = Watched(stream.database, stream.collection)
    state = with_json(fold(_previous_state(spark, lake_root, previous), events, watched))
    scratch = current_root(lake_root, stream.name) / f"_infer-{run_id}"
    state = state.localCheckpoint()  # the fold and the Python UDF run once, not per action
    inferred = infer_schema(
        spark,
        state.where(F.col("_tm_event_id").isNotNull() & ~F.col("_tm_deleted"))
        .join(events.select(F.col("event_id").alias("_tm_event_id")), "_tm_event_id", "left_semi")
        .select("_tm_json"),
        scratch,
    )
    old_schema = schema_from_json(previous.doc_schema if previous else None)
    merged = merge_schemas(old_schema, inferred)
    temp = current_root(lake_root, stream.name) / f"_tmp-{run_id}"
    expand(state, merged).write.parquet(str(temp))
    rows = spark.read.parquet(str(temp)).where(~F.col("_tm_deleted")).count()
    final = current_root(lake_root, stream.name) / version_dir_name(run_number, run_id)
    os.replace(temp, final)  # this attempt's own name: no other run writes or reads it yet
    record = CurrentVersion(
        stream=stream.name,
        version=run_number,
        path=relative(lake_root, final),
        rows=rows,
        doc_schema=merged.json(),
        events_folded=events.count() if previous is None else added,
        changes_added=added,
        changes_staging=None,
        created_at=now,
    )
    return record, schema_changes(old_schema, merged)


def _fold_input(
    spark: SparkSession,
    lake_root: Path,
    stream: str,
    tstate: TransformState,
    delta: DataFrame | None,
) -> tuple[CurrentVersion | None, DataFrame]:
    """The version to fold onto and the events to fold: the new ones onto the newest version,
    or, when that version misses events of the change log (`current_table` was turned on
    after runs without it), every event of the change log onto nothing (a backfill)."""
    if not _behind_change_log(tstate, stream):
        assert delta is not None
        return tstate.latest_version(stream), delta
    logged = changes_dir(lake_root, stream)
    parts = [spark.read.parquet(str(logged))] if has_parquet(logged) else []
    parts += [delta] if delta is not None else []
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part, allowMissingColumns=True)
    return None, events
