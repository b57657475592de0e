"""Readers of the curated tables: the change log and any kept version of `current`.

Both resolve what to read through the state store (the catalog), so a directory that no
committed run names is never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.transform.doc_columns import PLAIN_JSON, schema_from_json
from jobs.transform.merge import live, merge, read_parts
from state import StateStore, TransformState
from tidemark.errors import TidemarkError

RUN = "run"  # the partition column of the change log's run directories; readers drop it


def read_changes(spark: Any, store: StateStore, lake_root: Path, stream: str) -> Any:
    """The change log: one row per event, de-duplicated, partitioned by date (without the
    plain JSON a run keeps beside the rows for `current`)."""
    runs = TransformState(store).change_log_runs(stream)
    if not runs:
        raise TidemarkError(
            f"Stream {stream!r} has no change log yet.", "Run the transform after a drain."
        )
    frame = change_log(spark, lake_root, [r.changes_path for r in runs if r.changes_path])
    return frame.drop(PLAIN_JSON)


def change_log(spark: Any, lake_root: Path, paths: list[str]) -> Any:
    """The change-log rows of the given run directories (lake-relative, of one stream)."""
    base = (lake_root / paths[0]).parent
    frame = spark.read.option("basePath", str(base)).parquet(*(str(lake_root / p) for p in paths))
    return frame.drop(RUN)


def read_current(
    spark: Any,
    store: StateStore,
    lake_root: Path,
    stream: str,
    version: int | None = None,
    *,
    with_deleted: bool = False,
) -> Any:
    """A committed version of the current-state table (default: the newest); with its
    tombstones and barriers (`_tm_deleted`) when `with_deleted`."""
    tstate = TransformState(store)
    versions = tstate.versions(stream)
    if not versions:
        raise TidemarkError(
            f"Stream {stream!r} has no current-state version yet.",
            "Run the transform after a drain.",
        )
    if version is None:
        chosen = versions[-1]
    else:
        matches = [v for v in versions if v.version == version]
        if not matches:
            kept = ", ".join(str(v.version) for v in versions)
            raise TidemarkError(
                f"Version {version} of stream {stream!r}'s current-state table is not kept.",
                f"Kept versions: {kept} (raise keep_versions in the streams config to keep more).",
            )
        chosen = matches[0]
    parts = tstate.version_parts(stream, chosen.version)
    merged = merge(read_parts(spark, lake_root, parts, schema_from_json(chosen.doc_schema)))
    return merged if with_deleted else live(merged)
