"""The curated zone's layout (no Spark here: `tidemark gc` uses it too).

`<lake>/curated/<stream>/changes/run=NNNNNN-<id>/date=YYYY-MM-DD/`  one run's change-log rows
`<lake>/curated/<stream>/current/v=NNNNNN-<id>/`  one run's rows of `current`: a base or a delta
Every run writes directories of its own (named by its attempt), and the state store is the
catalog: a directory is data once a committed run names it, and readers go through the store,
so an attempt that crashed is never read (`tidemark gc` removes its directories). A version of
`current` is its base and deltas merged by the rule in `jobs.transform.merge`; the readers are
in `jobs.transform.readers`.
"""

from __future__ import annotations

from pathlib import Path

# The change log's run files keep the full document's plain JSON beside the table's columns
# (`current` parses its typed columns from it); it is not a column of `changes`: readers drop it.
PLAIN_JSON = "_tm_json"

META_COLUMNS = [
    "_tm_db",
    "_tm_coll",
    "_tm_key",  # canonical Extended JSON of the document key
    "_tm_document",  # canonical Extended JSON of the document: lossless
    "_tm_event_id",  # the event that set this row (resume token _data: sorts in event order)
    "_tm_cluster_time",
    "_tm_json",  # plain JSON of the document, the source of the field columns
]


def curated(lake_root: Path, stream: str) -> Path:
    return lake_root / "curated" / stream


def changes_dir(lake_root: Path, stream: str) -> Path:
    return curated(lake_root, stream) / "changes"


def run_changes_dir(lake_root: Path, stream: str, version: int, run_id: str) -> Path:
    """One run's change-log rows; `run=` makes each a partition of `changes/`, so Spark (or
    any engine reading Hive partitions) reads the runs' directories together."""
    return changes_dir(lake_root, stream) / f"run={version:06d}-{run_id}"


def current_root(lake_root: Path, stream: str) -> Path:
    return curated(lake_root, stream) / "current"


def version_dir_name(version: int, run_id: str) -> str:
    """One directory per attempt: two runs that both think they hold the lease never write
    (or replace) the same directory, and a committed run's directory is never touched."""
    return f"v={version:06d}-{run_id}"
