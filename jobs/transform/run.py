"""One transform run of one stream: committed raw batches -> `changes` and a new `current`.

The run, under the stream's transform lease (renewed between its phases, so a run longer than
the lease's time keeps it, and one whose lease was taken over stops at the next phase):
1. reads the committed batches not yet transformed; with none (and no backfill owed) it stops
   there, before any Spark work: a quiet stream costs a few SQL queries;
2. writes their events that the change log lacks to a directory of its own
   (`jobs.transform.change_log`);
3. writes the new version of `current` to a directory of its own: a delta of the keys it
   changed, or a whole base (`jobs.transform.versions`), or, when `current` has fallen behind
   the change log because `current_table` was off, a base folded from the whole change log;
4. commits the run, its directories, the version and the batches it consumed in one fenced
   SQL transaction;
5. marks versions beyond `keep_versions` pruned (readers stop resolving them; `tidemark gc`
   deletes the directories no kept version needs);
6. replaces the tables' manifests for other engines (`jobs.catalog`), still under the lease;
   every run first rewrites one a crash after a commit left stale.
Besides those manifests it does no file operation of its own on the lake (Spark writes, the
state store is the catalog), so it runs the same against a remote Spark with the lake on
shared storage. A crash before step 4 leaves the previous version current and is simply run
again; the dead attempt's directories are never read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from jobs.catalog import publish
from jobs.progress import Meter, ProgressCallback
from jobs.transform.change_log import NewEvents, log_new_events
from jobs.transform.fold import EventFacts
from jobs.transform.readers import change_log
from jobs.transform.versions import VersionPlan, folds_namespace_events, write_base, write_delta
from resources.spark import spark_failures
from state import BatchRecord, CurrentVersion, StateStore, TransformState, new_batch_id
from state.leases import TRANSFORM_LEASE_TTL
from tidemark.config import StreamConfig

# The session itself, or how to make one: a run with nothing to do never asks for it.
SparkSource = SparkSession | Callable[[], SparkSession]


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
    kind: str | None = None  # "base" or "delta" when a version was made
    seconds: dict[str, float] = field(default_factory=dict)  # where the run's time went


def _behind_change_log(tstate: TransformState, stream: str) -> bool:
    """True when a committed run extended the change log without folding `current` after its
    newest version (`current_table` was false then): that version misses those events."""
    newest = tstate.latest_version(stream)
    since = newest.version if newest else 0
    return any(run.path is None and run.version > since for run in tstate.runs(stream))


def transform(
    spark: SparkSource,
    store: StateStore,
    lake_root: Path,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None = None,
    progress: ProgressCallback | None = None,
) -> TransformResult:
    """Run the transform for `stream` once; see the module docstring. `progress` hears of
    each phase (change log, current, commit) and the events read. Spark's own failures (out
    of memory, a Connect server gone) leave as Tidemark's errors with their fix, not traces."""
    with spark_failures(f"the transform of stream {stream.name!r}"):
        return _transform(
            spark, store, lake_root, stream, before_commit=before_commit, progress=progress
        )


def _transform(
    spark: SparkSource,
    store: StateStore,
    lake_root: Path,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None,
    progress: ProgressCallback | None,
) -> TransformResult:
    clock = time.monotonic()
    tstate = TransformState(store)
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(f"transform:{stream.name}", TRANSFORM_LEASE_TTL)
    try:
        publish(store, lake_root, stream.name)  # heals a crash between a commit and its manifest
        batches = tstate.untransformed_batches(stream.name)
        latest = tstate.latest(stream.name)
        backfill = stream.current_table and _behind_change_log(tstate, stream.name)
        if not batches and not backfill:
            return TransformResult(stream.name, None, 0, 0, 0, 0, None)
        phases = {"plan": time.monotonic() - clock}
        meter = Meter(progress, stream.name, "transform", "events")
        events_read = sum(b.event_count for b in batches)
        meter.enter("change log", total=events_read)
        mark = time.monotonic()
        # A classic or a Connect session (neither is callable), or a factory of one.
        session = spark() if callable(spark) else spark
        phases["spark_session"], mark = time.monotonic() - mark, time.monotonic()
        run = ((latest.version if latest else 0) + 1, new_batch_id())
        new = log_new_events(session, tstate, lake_root, stream.name, batches, run)
        phases["change_log"], mark = time.monotonic() - mark, time.monotonic()
        added = new.count if new is not None else 0
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)  # between phases: LeaseLost if taken over
        meter.enter("current", done=meter.total)

        record: CurrentVersion | None = None
        schema_report: dict[str, list[str]] = {}
        if stream.current_table and (new is not None or backfill):
            record, schema_report = _new_version(
                session, tstate, lake_root, stream, run, new, batches, backfill
            )
        elif new is not None:  # current_table off: the run only extends the change log
            record = CurrentVersion(stream.name, run[0], None, 0, "", 0, added, datetime.now(UTC))
        if record is not None and new is not None:
            record = replace(
                record,
                changes_path=new.path,
                first_event_id=new.first_event_id,
                last_event_id=new.last_event_id,
            )
        phases["current"], mark = time.monotonic() - mark, time.monotonic()
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)
        meter.enter("commit")
        if before_commit is not None:
            before_commit()
        tstate.commit(
            lease, stream.name, latest.version if latest else None, record, [b.id for b in batches]
        )
        if stream.current_table:
            tstate.prune_beyond(stream.name, stream.keep_versions)
        publish(store, lake_root, stream.name)
        phases["commit"] = time.monotonic() - mark
        meter.finish()
        made = record is not None and record.path is not None
        return TransformResult(
            stream=stream.name,
            version=run[0] if made else None,
            batches=len(batches),
            events_read=events_read,
            changes_added=added,
            duplicates_skipped=events_read - added,
            rows=record.rows if made and record is not None else None,
            schema=schema_report,
            duration_s=time.monotonic() - clock,
            kind=record.kind if made and record is not None else None,
            seconds=phases,
        )
    finally:
        store.release_lease(lease)


def _new_version(
    spark: SparkSession,
    tstate: TransformState,
    lake_root: Path,
    stream: StreamConfig,
    run: tuple[int, str],
    new: NewEvents | None,
    batches: list[BatchRecord],
    backfill: bool,
) -> tuple[CurrentVersion, dict[str, list[str]]]:
    previous = tstate.latest_version(stream.name)
    if backfill:
        # `current` misses runs that only extended the change log: fold the whole log afresh.
        logged = tstate.change_log_runs(stream.name)
        events = _whole_change_log(spark, lake_root, logged, new)
        # Older runs' directories may lack the plain JSON: EventFacts() knows nothing.
        plan = VersionPlan(stream, run[0], run[1], None, events)
        record, report = write_base(spark, tstate, lake_root, plan)
        folded = sum(r.changes_added for r in logged) + _n(new)
        return replace(record, events_folded=folded, changes_added=_n(new)), report
    assert new is not None
    namespace = folds_namespace_events(batches)
    facts = EventFacts(plain_json=True, namespace_events=namespace, other_keys=new.other_keys)
    plan = VersionPlan(stream, run[0], run[1], previous, new.frame, facts, new.count)
    if previous is None or namespace:
        record, report = write_base(spark, tstate, lake_root, plan)
    else:
        record, report = write_delta(spark, tstate, lake_root, plan)
    return replace(record, events_folded=new.count, changes_added=new.count), report


def _n(new: NewEvents | None) -> int:
    return new.count if new is not None else 0


def _whole_change_log(
    spark: SparkSession, lake_root: Path, logged: list[CurrentVersion], new: NewEvents | None
) -> DataFrame:
    paths = [r.changes_path for r in logged if r.changes_path]
    parts = [change_log(spark, lake_root, paths)] if paths else []
    parts += [new.frame] if new is not None else []
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part, allowMissingColumns=True)
    return events
