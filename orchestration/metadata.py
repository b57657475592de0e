"""Run results as Dagster metadata: numeric where the UI should plot them over time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

from jobs.capture import DrainResult
from jobs.catalog import TableState
from jobs.ops import StreamStatus
from jobs.transform import CompactionResult, DeltaDebt, TransformResult
from tidemark.errors import TidemarkError
from tidemark.object_path import LakePath
from tidemark.tokens import ts_to_datetime

COMMON_OPERATIONS = ("insert", "update", "replace", "delete")


@contextmanager
def explained() -> Iterator[None]:
    """A TidemarkError fails the step with its own message, not a stack trace to decode."""
    try:
        yield
    except TidemarkError as exc:
        raise dg.Failure(
            description=str(exc), metadata={"error": type(exc).__name__}, allow_retries=False
        ) from None


def _timestamp(value: Any) -> dg.MetadataValue | None:
    moment = ts_to_datetime(value)
    return dg.MetadataValue.timestamp(moment) if moment else None


def _seconds(value: float) -> float:
    """A duration as the UI should show it: to a tenth of a second."""
    return round(float(value), 1)


def drain_metadata(
    result: DrainResult, status: StreamStatus | None, location: LakePath | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "events": result.events,
        "bytes": result.bytes,
        "files": len(result.files),
        "file_bytes": result.file_bytes,
        "duration_s": round(result.duration_s, 3),
        "stopped": result.stop_reason,
    }
    for operation in sorted(set(COMMON_OPERATIONS) | set(result.events_by_type)):
        metadata[f"events_{operation}"] = result.events_by_type.get(operation, 0)
    for key, value in (
        ("first_cluster_time", _timestamp(result.first_cluster_time)),
        ("last_cluster_time", _timestamp(result.last_cluster_time)),
        ("token_time", _timestamp(result.token_cluster_time)),
    ):
        if value is not None:
            metadata[key] = value
    if result.snapshot is not None:
        metadata["snapshot_chunks"] = result.snapshot.chunks
        metadata["snapshot_documents"] = result.snapshot.documents
        metadata["snapshot_bytes"] = result.snapshot.bytes
        metadata["snapshot_status"] = result.snapshot.status
        metadata["snapshot_reason"] = result.snapshot.reason
    if status is not None:
        if status.lag_seconds is not None:
            metadata["lag_seconds"] = _seconds(status.lag_seconds)
        if status.headroom_seconds is not None:
            metadata["oplog_headroom_seconds"] = _seconds(status.headroom_seconds)
        if status.oplog_window_seconds is not None:
            metadata["oplog_window_seconds"] = _seconds(status.oplog_window_seconds)
    if result.warnings:
        metadata["warnings"] = dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings))
    if location is not None:
        metadata["dagster/uri"] = location.as_uri()
    return metadata


def curated_metadata(
    result: TransformResult, summary: TableState | None, location: LakePath
) -> dict[str, Any]:
    """The stream's fold: what the run did, and each collection's `current` as it is now (a
    run that added nothing still reports them)."""
    metadata: dict[str, Any] = {
        "batches": result.batches,
        "events_read": result.events_read,
        "changes_added": result.changes_added,
        "duplicates_skipped": result.duplicates_skipped,
        "tables_changed": len(result.tables),
        "duration_s": round(result.duration_s, 3),
        "written_as": result.kind or "nothing new",
        "dagster/uri": location.as_uri(),
    }
    added = result.schema.get("added", [])
    widened = result.schema.get("widened", [])
    metadata["fields_added"] = len(added)
    metadata["fields_widened"] = len(widened)
    if added or widened:
        metadata["schema_changes"] = dg.MetadataValue.md(
            "\n".join([*(f"- added `{f}`" for f in added), *(f"- widened `{w}`" for w in widened)])
        )
    if summary is not None:
        metadata["collections"] = len(summary.collections)
        metadata["live_documents"] = summary.rows
        metadata["tables"] = dg.MetadataValue.md(_collections_md(summary))
    return metadata


def _collections_md(summary: TableState) -> str:
    return "| collection | Delta table | Delta version | rows |\n|---|---|---:|---:|\n" + "\n".join(
        f"| {t.name} | `{t.location}` | {t.delta_version} | {t.rows:,} |"
        for t in summary.collections
    )


def compaction_metadata(result: CompactionResult, debt: DeltaDebt) -> dict[str, Any]:
    """Metadata of a compaction's observation of `current`."""
    return {
        "tidemark_run": result.run if result.run is not None else debt.run or 0,
        "deltas_compacted": result.deltas,
        "rows": result.rows,
        "rows_written": result.rows_written,
        "duration_s": round(result.duration_s, 3),
    }
