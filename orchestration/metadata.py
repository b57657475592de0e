"""Run results as Dagster metadata: numeric where the UI should plot them over time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

from jobs.capture import DrainResult
from jobs.ops import StreamStatus
from jobs.transform import CompactionResult, DeltaDebt, TransformResult
from tidemark.errors import TidemarkError
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


def drain_metadata(result: DrainResult, status: StreamStatus | None) -> dict[str, Any]:
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
            metadata["lag_seconds"] = float(status.lag_seconds)
        if status.headroom_seconds is not None:
            metadata["oplog_headroom_seconds"] = float(status.headroom_seconds)
        if status.oplog_window_seconds is not None:
            metadata["oplog_window_seconds"] = float(status.oplog_window_seconds)
    return metadata


def transform_metadata(result: TransformResult) -> dict[str, dict[str, Any]]:
    """Metadata for `changes` and for `current`."""
    changes = {
        "batches": result.batches,
        "events_read": result.events_read,
        "changes_added": result.changes_added,
        "duplicates_skipped": result.duplicates_skipped,
        "duration_s": round(result.duration_s, 3),
    }
    current: dict[str, Any] = {
        "duration_s": round(result.duration_s, 3),
        "events_folded": result.changes_added,
    }
    if result.version is not None:
        current["version"] = result.version
        current["written_as"] = result.kind or ""
    if result.rows is not None:
        current["rows"] = result.rows
    added = result.schema.get("added", [])
    widened = result.schema.get("widened", [])
    current["fields_added"] = len(added)
    current["fields_widened"] = len(widened)
    if added or widened:
        current["schema_changes"] = dg.MetadataValue.md(
            "\n".join([*(f"- added `{f}`" for f in added), *(f"- widened `{w}`" for w in widened)])
        )
    return {"changes": changes, "current": current}


def compaction_metadata(result: CompactionResult, debt: DeltaDebt) -> dict[str, Any]:
    """Metadata of a compaction's observation of `current`."""
    return {
        "version": result.version if result.version is not None else debt.version or 0,
        "deltas_compacted": result.deltas,
        "rows": result.rows,
        "rows_written": result.rows_written,
        "duration_s": round(result.duration_s, 3),
    }
