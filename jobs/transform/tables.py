"""The curated zone's layout and its readers.

`<lake>/curated/<stream>/changes/date=YYYY-MM-DD/...`  the change log (Spark skips `_staging`)
`<lake>/curated/<stream>/current/v=NNNNNN-<run>/`      one directory per current-state version
Readers of `current` go through the state store, which names the committed versions (each
transform attempt writes a directory of its own, and only the committed one is ever read).
A version's files also hold tombstones and namespace barriers (`_tm_deleted`), which the fold
needs and `read_current` hides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from state import StateStore, TransformState
from tidemark.errors import TidemarkError

META_COLUMNS = [
    "_tm_db",
    "_tm_coll",
    "_tm_key",  # canonical Extended JSON of the document key
    "_tm_document",  # canonical Extended JSON of the document: lossless
    "_tm_event_id",  # the event that set this row (resume token _data: sorts in event order)
    "_tm_cluster_time",
    "_tm_json",  # plain JSON of the document, the source of the field columns
]
# In the files only: true on tombstones (deleted keys) and barriers (cleared namespaces).
DELETED = "_tm_deleted"


def curated(lake_root: Path, stream: str) -> Path:
    return lake_root / "curated" / stream


def changes_dir(lake_root: Path, stream: str) -> Path:
    return curated(lake_root, stream) / "changes"


def staging_dir(lake_root: Path, stream: str, run_id: str) -> Path:
    return changes_dir(lake_root, stream) / "_staging" / run_id


def current_root(lake_root: Path, stream: str) -> Path:
    return curated(lake_root, stream) / "current"


def version_dir_name(version: int, run_id: str) -> str:
    """One directory per attempt: two runs that both think they hold the lease never write
    (or replace) the same directory, and a committed run's directory is never touched."""
    return f"v={version:06d}-{run_id}"


def has_parquet(path: Path) -> bool:
    return path.exists() and any(path.rglob("*.parquet"))


def read_changes(spark: Any, lake_root: Path, stream: str) -> Any:
    """The change log: one row per event, de-duplicated, partitioned by date."""
    path = changes_dir(lake_root, stream)
    if not has_parquet(path):
        raise TidemarkError(
            f"Stream {stream!r} has no change log yet.", "Run the transform after a drain."
        )
    return spark.read.parquet(str(path))


def read_current(
    spark: Any, store: StateStore, lake_root: Path, stream: str, version: int | None = None
) -> Any:
    """A committed version of the current-state table (default: the newest)."""
    versions = TransformState(store).versions(stream)
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
    return live_rows(spark.read.parquet(str(lake_root / chosen.path)))


def live_rows(frame: Any) -> Any:
    """The rows readers see: documents, without the fold's tombstones and barriers."""
    if DELETED not in frame.columns:
        return frame  # a version written before tombstones existed
    return frame.where(~frame[DELETED]).drop(DELETED)
