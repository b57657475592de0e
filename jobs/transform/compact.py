"""Compaction: Delta OPTIMIZE of each `current` table, then its deletion vectors purged.

A run's MERGE marks the rows it replaces in deletion vectors and adds small files, so its
cost follows its changes; reads pay for every small file and every deletion vector since.
Compaction settles that off the run's critical path (its own Dagster job, started when
`needs_compaction` counts enough merges since the last one): OPTIMIZE bin-packs the small
files, and `REORG TABLE ... APPLY (PURGE)` rewrites the files that carry deletion vectors.
Neither changes a row, so readers of any version are undisturbed, and a crash midway leaves
the tables as they were or merely better packed. It commits like a transform run, under the
same lease, recording each table's new Delta version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs.curated_zone import curated
from jobs.lake import relative
from jobs.transform.delta_io import table_ref, table_version
from resources.spark_lake import use_lake
from state import CuratedTable, StateStore, TransformRun
from state.leases import TRANSFORM_LEASE_TTL
from tidemark.config import StreamConfig
from tidemark.object_path import LakePath

COMPACTION = "optimize"  # the run kind a compaction records


@dataclass(frozen=True)
class DeltaDebt:
    """How many runs merged into `current` since the last compaction."""

    run: int | None  # the newest run
    deltas: int  # merge runs since the last compaction
    delta_rows: int  # rows those runs changed (events folded)
    base_rows: int  # live rows now

    def due(self, ratio: float, max_deltas: int) -> bool:
        if self.deltas == 0:
            return False
        return self.deltas >= max_deltas or self.delta_rows >= ratio * max(self.base_rows, 1)


@dataclass(frozen=True)
class CompactionResult:
    stream: str
    run: int | None  # the run it recorded; None: nothing to compact
    deltas: int  # merge runs it settled
    rows_written: int  # rows in the files it rewrote (0 when nothing needed it)
    rows: int
    duration_s: float


def delta_debt(store: StateStore, stream: str) -> DeltaDebt:
    """The merges since the last compaction (SQL only: no Spark)."""
    runs = [r for r in store.transforms.runs(stream) if r.path is not None]
    if not runs:
        return DeltaDebt(None, 0, 0, 0)
    since = [r for r in runs if r.kind != COMPACTION]
    # The first run's files are fresh (no deletion vector, nothing replaced): it is the base
    # the merges after it are counted from, as a compaction is.
    last = max((r.run for r in runs if r.kind == COMPACTION), default=runs[0].run)
    since = [r for r in since if r.run > last]
    return DeltaDebt(runs[-1].run, len(since), sum(r.events_folded for r in since), runs[-1].rows)


def needs_compaction(store: StateStore, stream: StreamConfig) -> bool:
    debt = delta_debt(store, stream.name)
    return debt.due(stream.compaction.delta_ratio, stream.compaction.max_deltas)


def compact(
    spark,
    store: StateStore,
    lake_root: LakePath,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None = None,
) -> CompactionResult:
    """OPTIMIZE and purge every `current` table of the stream, as a new run."""
    clock = time.monotonic()
    tstate = store.transforms
    lease = store.acquire_lease(stream.name, "transform", TRANSFORM_LEASE_TTL)
    try:
        latest = tstate.latest(stream.name)
        tables = [t for t in tstate.tables(stream.name) if t.kind == "current"]
        debt = delta_debt(store, stream.name)
        # A killed transform's intent owns the next run number: it is repeated first.
        if latest is None or not tables or tstate.intent(stream.name) is not None:
            return CompactionResult(stream.name, None, 0, 0, 0, 0.0)
        number = latest.run + 1
        use_lake(spark, lake_root)
        rewritten, records = 0, []
        for table in tables:
            path = lake_root / table.path
            for statement in ("OPTIMIZE {t}", "REORG TABLE {t} APPLY (PURGE)"):
                for row in spark.sql(statement.format(t=table_ref(path))).collect():
                    metrics = row.asDict().get("metrics")
                    if metrics is not None:
                        rewritten += int(metrics["numFilesAdded"] or 0)
            store.renew_lease(lease, TRANSFORM_LEASE_TTL)
            records.append(
                CuratedTable(
                    stream.name, number, table.db, table.coll, "current", table.path,
                    table_version(path), table.rows, table.doc_schema,
                )
            )  # fmt: skip
        rows = sum(t.rows for t in records)
        record = TransformRun(
            stream=stream.name,
            run=number,
            path=relative(lake_root, curated(lake_root, stream.name)),
            rows=rows,
            doc_schema="",
            events_folded=0,
            changes_added=0,
            created_at=datetime.now(UTC),
            kind=COMPACTION,
            base_run=number,
        )
        if before_commit is not None:
            before_commit()
        tstate.commit(lease, stream.name, latest.run, record, [], records)
        tstate.prune_beyond(stream.name, stream.keep_versions)
        return CompactionResult(
            stream.name, number, debt.deltas, rewritten, rows, time.monotonic() - clock
        )
    finally:
        store.release_lease(lease)
