"""Compaction: a version's base and deltas rewritten as one new base.

Deltas make a run's cost follow its changes, and make reads pay for every delta since the
base. Compaction settles that debt off the run's critical path (its own Dagster job, started
when `needs_compaction` says the deltas have grown): it reads the newest version by the merge
rule, tombstones and barriers included (they keep late older events from coming back, so
they are never dropped), and writes them as a base. It commits like a transform run, under
the same lease, as a new version with the same rows: readers of the previous version are
undisturbed, and a crash before the commit leaves it current.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession

from jobs.catalog import publish
from jobs.curated_zone import current_root, version_dir_name
from jobs.lake import relative
from jobs.transform.doc_columns import schema_from_json
from jobs.transform.merge import DELETED, merge, read_parts, row_counts
from state import CurrentVersion, StateStore, TransformState, new_batch_id
from state.leases import TRANSFORM_LEASE_TTL
from tidemark.config import StreamConfig


@dataclass(frozen=True)
class DeltaDebt:
    """How far the newest version is from one base."""

    version: int | None
    deltas: int
    delta_rows: int
    base_rows: int

    def due(self, ratio: float, max_deltas: int) -> bool:
        if self.deltas == 0:
            return False
        return self.deltas >= max_deltas or self.delta_rows >= ratio * max(self.base_rows, 1)


@dataclass(frozen=True)
class CompactionResult:
    stream: str
    version: int | None  # the new version (same rows, one base); None: nothing to compact
    deltas: int  # how many deltas it folded into the base
    rows_written: int
    rows: int
    duration_s: float


def delta_debt(store: StateStore, stream: str) -> DeltaDebt:
    """The newest version's deltas since its base (SQL only: no Spark)."""
    tstate = TransformState(store)
    newest = tstate.latest_version(stream)
    if newest is None:
        return DeltaDebt(None, 0, 0, 0)
    parts = tstate.version_parts(stream, newest.version)
    deltas = [p for p in parts if not p.is_base]
    base = [p for p in parts if p.is_base]
    return DeltaDebt(
        newest.version,
        len(deltas),
        sum(p.written_rows or 0 for p in deltas),
        sum(p.written_rows or 0 for p in base),
    )


def needs_compaction(store: StateStore, stream: StreamConfig) -> bool:
    debt = delta_debt(store, stream.name)
    return debt.due(stream.compaction.delta_ratio, stream.compaction.max_deltas)


def compact(
    spark: SparkSession,
    store: StateStore,
    lake_root: Path,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None = None,
) -> CompactionResult:
    """Rewrite the newest version of `current` as one base, as a new version."""
    started = datetime.now(UTC)
    tstate = TransformState(store)
    lease = store.acquire_lease(f"transform:{stream.name}", TRANSFORM_LEASE_TTL)
    try:
        latest = tstate.latest(stream.name)
        newest = tstate.latest_version(stream.name)
        if latest is None or newest is None or latest.version != newest.version:
            return CompactionResult(stream.name, None, 0, 0, 0, 0.0)  # no version to compact
        parts = tstate.version_parts(stream.name, newest.version)
        if len(parts) < 2:
            return CompactionResult(stream.name, None, 0, 0, newest.rows, 0.0)
        number, run_id = newest.version + 1, new_batch_id()
        schema = schema_from_json(newest.doc_schema)
        rows = merge(read_parts(spark, lake_root, parts, schema))
        target = current_root(lake_root, stream.name) / version_dir_name(number, run_id)
        rows.write.parquet(str(target))
        # The one column the counts need, by name: no job to read a footer for the schema.
        written, live = row_counts(spark.read.schema(f"{DELETED} boolean").parquet(str(target)))
        record = CurrentVersion(
            stream=stream.name,
            version=number,
            path=relative(lake_root, target),
            kind="compaction",
            base_version=number,
            written_rows=written,
            rows=live,
            doc_schema=newest.doc_schema,
            events_folded=0,
            changes_added=0,
            created_at=datetime.now(UTC),
        )
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)
        if before_commit is not None:
            before_commit()
        tstate.commit(lease, stream.name, newest.version, record, [])
        tstate.prune_beyond(stream.name, stream.keep_versions)
        publish(store, lake_root, stream.name)  # the new base, for other engines
        seconds = (datetime.now(UTC) - started).total_seconds()
        return CompactionResult(stream.name, number, len(parts) - 1, written, live, seconds)
    finally:
        store.release_lease(lease)
