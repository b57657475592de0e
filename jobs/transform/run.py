"""One transform run of one stream: committed raw batches -> each collection's Delta tables.

The run, under the stream's transform lease (renewed between its phases, so a run longer than
the lease's time keeps it, and one whose lease was taken over stops at the next phase):
1. takes the batches to fold: those a killed run left in its intent (it is repeated as it
   was), or else the committed batches not yet transformed, written down as this run's intent
   before any Delta commit. With none it stops there, before any Spark work: a quiet stream
   costs a few SQL queries;
2. appends their events that the change log lacks to their collections' `changes` tables
   (`jobs.transform.change_log`);
3. folds them into the collections' `current` tables and the stream's `removed` table
   (`jobs.transform.apply`);
4. commits the run, the Delta version of every table it changed and the batches it consumed in
   one fenced SQL transaction, which also clears the intent.
Every Delta commit of steps 2-3 carries the run's number and its place in the run
(`jobs.transform.delta_io`), so a run killed anywhere and repeated neither loses nor
duplicates: Delta skips what the first attempt committed, and the state store's record agrees
with each table's version once the repeat commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from jobs.curated_zone import changes_dir, curated, current_dir
from jobs.lake import relative
from jobs.progress import Meter, ProgressCallback
from jobs.raw_zone import SNAPSHOT_START
from jobs.transform.apply import Fold, Folded
from jobs.transform.change_log import NewEvents, held, large_events, log_new_events
from jobs.transform.delta_io import RunWriter, is_table, table_rows
from jobs.transform.fold import NAMESPACE_OPERATIONS, EventFacts, Watched, may_hold
from jobs.transform.late_history import history, to_rebuild
from jobs.transform.run_settings import run_settings, settings_for
from jobs.transform.segments import matching
from resources.spark_failures import spark_failures
from resources.spark_lake import use_lake
from state import BatchRecord, CuratedTable, StateStore, TransformRun, TransformState
from state.leases import TRANSFORM_LEASE_TTL
from state.records import TableKind
from tidemark.config import StreamConfig
from tidemark.errors import CurrentTableBehind, LegacyCuratedZone
from tidemark.object_path import LakePath

# The session itself, or how to make one: a run with nothing to do never asks for it.
SparkSource = SparkSession | Callable[[], SparkSession]


@dataclass
class TransformResult:
    stream: str
    run: int | None  # the run's number when it changed a `current` table
    batches: int
    events_read: int
    changes_added: int
    duplicates_skipped: int
    rows: int | None  # live documents over the stream's `current` tables
    schema: dict[str, list[str]] = field(default_factory=dict)  # "db.coll.field" added/widened
    duration_s: float = 0.0
    kind: str | None = None  # "merge" when `current` tables changed
    seconds: dict[str, float] = field(default_factory=dict)  # where the run's time went
    tables: list[CuratedTable] = field(default_factory=list)  # the tables the run changed
    repeated: bool = False  # it repeated a killed run (then went on with what came since)


def transform(
    spark: SparkSource,
    store: StateStore,
    lake_root: LakePath,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None = None,
    progress: ProgressCallback | None = None,
) -> TransformResult:
    """Run the transform for `stream` once; see the module docstring. `progress` hears of
    each phase (change log, current, commit) and the events read. Spark's own failures (out
    of memory, a Connect server gone) leave as Tidemark's errors with their fix, not traces."""
    with spark_failures(f"the transform of stream {stream.name!r}"):
        result = _transform(
            spark, store, lake_root, stream, before_commit=before_commit, progress=progress
        )
        if not result.repeated:
            return result
        # A killed run was repeated on its own batches: what arrived since is folded now, not
        # left for the next scheduled run.
        after = _transform(
            spark, store, lake_root, stream, before_commit=before_commit, progress=progress
        )
        return _combined(result, after)


def _combined(first: TransformResult, then: TransformResult) -> TransformResult:
    """Two runs made by one call, reported as one (the second's table state)."""
    if not then.batches:
        return first
    made = then if then.run is not None else first
    return replace(
        then,
        run=made.run,
        batches=first.batches + then.batches,
        events_read=first.events_read + then.events_read,
        changes_added=first.changes_added + then.changes_added,
        duplicates_skipped=first.duplicates_skipped + then.duplicates_skipped,
        rows=made.rows,
        kind=made.kind,
        schema={k: first.schema.get(k, []) + then.schema.get(k, []) for k in ("added", "widened")},
        duration_s=first.duration_s + then.duration_s,
        tables=first.tables + then.tables,
        repeated=True,
    )


def _batches(
    tstate: TransformState, stream: str, latest: TransformRun | None
) -> tuple[int, list[BatchRecord], bool]:
    """The run's number, its batches, and whether it repeats a killed run."""
    waiting = tstate.untransformed_batches(stream)
    intent = tstate.intent(stream)
    if intent is not None:
        number, ids = intent
        chosen = set(ids)
        return number, [b for b in waiting if b.id in chosen], True
    return (latest.run if latest else 0) + 1, waiting, False


def _refuse_legacy(
    tstate: TransformState, stream: StreamConfig, batches: list[BatchRecord]
) -> None:
    runs = tstate.runs(stream.name)
    if any(r.kind in ("base", "delta", "compaction") for r in runs):  # before Delta Lake
        raise LegacyCuratedZone(
            f"Stream {stream.name!r}'s curated tables were written by a Tidemark older than "
            "its Delta Lake tables (a base and deltas under a JSON manifest); this Tidemark "
            "does not fold onto them.",
            f"Run `tidemark resnapshot {stream.name}` to rebuild every collection's tables "
            "from a fresh copy (the raw zone and the old curated files stay until gc).",
        )
    # A (re)snapshot replaces the stream's whole scope: runs before it no longer matter, so
    # neither do runs before the newest run that folded into `current` (only a snapshot lets
    # one follow a run that did not).
    if any(b.events_by_type.get(SNAPSHOT_START) for b in batches):
        return
    since = max((r.run for r in runs if r.kind == "merge"), default=0)
    behind = [r.run for r in runs if r.path is None and r.changes_added and r.run > since]
    if stream.current_table and behind:
        raise CurrentTableBehind(
            f"Stream {stream.name!r} ran with current_table: false (runs "
            f"{behind[0]}-{behind[-1]} only extended the change log), so its `current` "
            "tables miss those runs' events.",
            f"Run `tidemark resnapshot {stream.name}` to rebuild them from a fresh copy.",
        )


def _transform(
    spark: SparkSource,
    store: StateStore,
    lake_root: LakePath,
    stream: StreamConfig,
    *,
    before_commit: Callable[[], None] | None,
    progress: ProgressCallback | None,
) -> TransformResult:
    clock = time.monotonic()
    tstate = store.transforms
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(stream.name, "transform", TRANSFORM_LEASE_TTL)
    try:
        latest = tstate.latest(stream.name)
        number, batches, repeat = _batches(tstate, stream.name, latest)
        if not batches:
            return TransformResult(stream.name, None, 0, 0, 0, 0, None)
        _refuse_legacy(tstate, stream, batches)
        if not repeat:
            tstate.record_intent(lease, stream.name, number, [b.id for b in batches])
        phases = {"plan": time.monotonic() - clock}
        meter = Meter(progress, stream.name, "transform", "events")
        events_read = sum(b.event_count for b in batches)
        meter.enter("change log", total=events_read)
        mark = time.monotonic()
        # A classic or a Connect session (neither is callable), or a factory of one.
        session = spark() if callable(spark) else spark
        use_lake(session, lake_root)
        phases["spark_session"], mark = time.monotonic() - mark, time.monotonic()
        known = tstate.tables(stream.name)
        recorded = {lake_root / t.path: t.delta_version for t in known}
        vectors_from = stream.deletion_vectors_from_bytes
        writer = RunWriter(
            session, lake_root, stream.name, number, recorded, vectors_from=vectors_from
        )
        large = large_events(batches)
        largest = max((t.rows for t in known if t.kind == "current"), default=0)
        with run_settings(session, settings_for(events_read, largest, large)):
            new = log_new_events(writer, tstate, batches, large)
            phases["change_log"], mark = time.monotonic() - mark, time.monotonic()
            added = new.count if new is not None else 0
            store.renew_lease(lease, TRANSFORM_LEASE_TTL)  # between phases: LeaseLost if lost
            meter.enter("current", done=meter.total)
            folded = Folded()
            if stream.current_table and new is not None:
                folded = _fold(writer, tstate, stream, new, batches, repeat, large)
        tables = _table_records(writer, tstate, stream.name, folded, new)
        phases["current"], mark = time.monotonic() - mark, time.monotonic()
        store.renew_lease(lease, TRANSFORM_LEASE_TTL)
        meter.enter("commit")
        if before_commit is not None:
            before_commit()
        record = _run_record(stream, number, new, tables, tstate, lake_root)
        tstate.commit(
            lease,
            stream.name,
            latest.run if latest else None,
            record,
            [b.id for b in batches],
            tables,
        )
        if stream.current_table:
            tstate.prune_beyond(stream.name, stream.keep_versions)
        phases["commit"] = time.monotonic() - mark
        meter.finish()
        made = record is not None and record.path is not None
        return TransformResult(
            stream=stream.name,
            run=number if made else None,
            batches=len(batches),
            events_read=events_read,
            changes_added=added,
            duplicates_skipped=events_read - added,
            rows=record.rows if made and record is not None else None,
            schema=_schema_report(folded),
            duration_s=time.monotonic() - clock,
            kind="merge" if made else None,
            seconds=phases,
            tables=tables,
            repeated=repeat,
        )
    finally:
        store.release_lease(lease)


def _fold(
    writer: RunWriter,
    tstate: TransformState,
    stream: StreamConfig,
    new: NewEvents,
    batches: list[BatchRecord],
    repeat: bool,
    large: bool,
) -> Folded:
    made = tstate.tables(stream.name)
    known = [(t.db, t.coll) for t in made if t.kind == "current"]
    facts = EventFacts(
        namespace_events=may_hold(batches, NAMESPACE_OPERATIONS),
        other_keys=new.other_keys,
        deletes=may_hold(batches, ["delete"]),
        large=large,
    )
    watched = Watched(stream.database, stream.collection)
    collections = [(db, coll) for db, coll in new.namespaces if db is not None and coll is not None]
    frozen = stream.schema_policy == "freeze"
    # Late events behind a rename: their collections are folded again from their history.
    logs = [(t.db or None, t.coll or None) for t in made]
    newest = tstate.newest_logged_event(stream.name)
    rebuilt = to_rebuild(new, newest, logs + new.namespaces, writer.lake_root, stream.name)
    events, first = new.frame, Folded()
    if rebuilt:
        past = history(writer.spark, writer.lake_root, stream.name, rebuilt)
        # Read from the change logs once: each of the rebuild's segments reads it.
        past = held(past, large) if past is not None else None
        ours = [ns for ns in known if ns in rebuilt]
        again = EventFacts(large=large)  # the whole history: assume nothing of it
        fold = Fold(writer, watched, ours, again, rebuilt, frozen)
        first = fold.rebuild(past, repeat) if past is not None else first
        known = sorted({*known, *first.tables})
        # The rest: a database's or the stream's own events stay (their collection is null).
        events = events.where(~matching([Watched(*ns) for ns in rebuilt], "db", "coll"))
        collections = [ns for ns in collections if ns not in rebuilt]
    folded = Fold(writer, watched, known, facts, collections, frozen).run(events, repeat)
    return first.joined(folded)


def _table_records(
    writer: RunWriter,
    tstate: TransformState,
    stream: str,
    folded: Folded,
    new: NewEvents | None,
) -> list[CuratedTable]:
    """The Delta version and rows of every table the run changed, from the tables' logs
    (`delta_io.table_rows`: no Spark job)."""
    lake = writer.lake_root
    before = {(t.db, t.coll, t.kind): t for t in tstate.tables(stream)}

    def record(db: str, coll: str, kind: TableKind, path: LakePath, schema: str) -> CuratedTable:
        last = before.get((db, coll, kind))
        since = last.delta_version if last else -1
        version, rows = table_rows(path, since, last.rows if last else 0)
        return CuratedTable(
            stream, writer.run, db, coll, kind, relative(lake, path), version, rows, schema
        )

    records = []
    for db, coll in new.namespaces if new is not None else []:
        records.append(
            record(db or "", coll or "", "changes", changes_dir(lake, stream, db, coll), "")
        )
    for (db, coll), schema in sorted(folded.tables.items()):
        path = current_dir(lake, stream, db, coll)
        if is_table(path):
            records.append(record(db, coll, "current", path, schema.json()))
    return records


def _run_record(
    stream: StreamConfig,
    number: int,
    new: NewEvents | None,
    tables: list[CuratedTable],
    tstate: TransformState,
    lake_root: LakePath,
) -> TransformRun | None:
    if new is None:
        return None  # every event was logged already: the batches are marked, nothing else
    # Folded: a run may change no table, and a reader may still travel back to it.
    wrote_current = stream.current_table
    rows = 0
    if wrote_current:
        changed = {(t.db, t.coll) for t in tables if t.kind == "current"}
        before = tstate.tables(stream.name)
        kept = [t for t in before if t.kind == "current" and (t.db, t.coll) not in changed]
        rows = sum(t.rows for t in tables if t.kind == "current") + sum(t.rows for t in kept)
    return TransformRun(
        stream=stream.name,
        run=number,
        path=relative(lake_root, curated(lake_root, stream.name)) if wrote_current else None,
        rows=rows,
        doc_schema="",
        events_folded=new.count if wrote_current else 0,
        changes_added=new.count,
        created_at=datetime.now(UTC),
        kind="merge" if wrote_current else None,
        base_run=number if wrote_current else None,
        first_event_id=new.first_event_id,
        last_event_id=new.last_event_id,
        changes_path=relative(lake_root, curated(lake_root, stream.name)),
    )


def _schema_report(folded: Folded) -> dict[str, list[str]]:
    report: dict[str, list[str]] = {"added": [], "widened": []}
    for table, changes in sorted(folded.schema.items()):
        for kind in ("added", "widened"):
            report[kind] += [f"{table}.{c}" for c in changes[kind]]
    return report
