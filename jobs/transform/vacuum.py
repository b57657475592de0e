"""Delta VACUUM of a stream's curated tables, with a retention its kept versions outlive.

A MERGE or an OPTIMIZE leaves the files it replaced in place (readers of older versions still
use them); VACUUM deletes those older than the retention. The retention is how long ago the
oldest kept version (`keep_versions`) was committed, plus `min_age_seconds`, so time travel to
every kept version keeps working and a reader that started just before a prune has that long
to finish. The transaction log itself is kept for Delta's `delta.logRetentionDuration`
(30 days by default), longer than any version Tidemark lets a reader resolve.

Most tables have nothing to delete at most gcs, and Spark's VACUUM, even a DRY RUN, costs
about 2 s of jobs and log reads per table (a database stream's lake has hundreds): delta-rs
looks first (`_may_hold_garbage`, a log read and a listing, milliseconds, no JVM), and Spark
lists and deletes only where it found something.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from deltalake.exceptions import DeltaError

from jobs.curated_zone import removed_dir
from jobs.transform.delta_io import is_table, table_ref
from resources.delta_rs import delta_table
from resources.spark_lake import use_lake
from state import StateStore
from tidemark.object_path import LakePath

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def retention_hours(store: StateStore, stream: str, min_age_seconds: float) -> float:
    """Hours a replaced file is kept: the oldest kept run's age plus `min_age_seconds`,
    never below (so a file replaced within the last hour is always kept)."""
    kept = store.transforms.current_runs(stream)
    now = datetime.now(UTC)
    oldest = min((v.created_at for v in kept), default=now)
    seconds = (now - oldest).total_seconds() + min_age_seconds
    # Whole hours, rounded up: Delta rounds `RETAIN n HOURS` to the nearest whole hour
    # (VacuumCommand: `math.round(hours)`), so 0.02 hours would keep nothing at all.
    return float(math.ceil(max(seconds, 0.0) / 3600.0))


def vacuum(
    spark: Any, store: StateStore, lake_root: LakePath, stream: str, min_age_seconds: float
) -> list[str]:
    """VACUUM every table of the stream (the caller holds its transform lease); returns the
    files deleted."""
    hours = retention_hours(store, stream, min_age_seconds)
    paths = {lake_root / t.path for t in store.transforms.tables(stream)}
    paths.add(removed_dir(lake_root, stream))  # Tidemark's own table, not in the catalog
    removed: list[str] = []
    use_lake(spark, lake_root)
    # Below Delta's default of 7 days on purpose: the retention is computed, not guessed.
    spark.conf.set(RETENTION_CHECK, "false")
    try:
        for path in sorted(paths):
            if not is_table(path) or not _may_hold_garbage(path, hours):
                continue
            ref = table_ref(path)
            doomed = [
                r[0] for r in spark.sql(f"VACUUM {ref} RETAIN {hours} HOURS DRY RUN").collect()
            ]
            if doomed:  # else the VACUUM would list the table again and log two empty commits
                spark.sql(f"VACUUM {ref} RETAIN {hours} HOURS").collect()
            removed += doomed
    finally:
        spark.conf.unset(RETENTION_CHECK)
    return removed


def _may_hold_garbage(path: LakePath, hours: float) -> bool:
    """Whether a VACUUM with this retention may delete anything from the table at `path`.

    delta-rs's full dry run lists every file no version within the retention needs, the same
    rule as Spark's, and a superset of what Spark deletes: it also lists Hadoop's hidden
    `.crc` checksums of local files (Spark never deletes hidden files; dropped here) and the
    deletion-vector files of live rows (a needless Spark dry run on such tables, never a
    missed file). A table delta-rs cannot read is left to Spark."""
    try:
        found = delta_table(path).vacuum(
            retention_hours=int(hours), dry_run=True, enforce_retention_duration=False, full=True
        )
    except (DeltaError, OSError):  # a feature it does not read, a store it cannot reach
        return True
    return any(not name.rsplit("/", 1)[-1].startswith(".") for name in found)
