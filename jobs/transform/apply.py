"""Folding a run's new events into each collection's `current` Delta table.

Each collection's events are folded in segments between the namespace events that touch it
(`jobs.transform.segments`; `jobs.transform.fold` states the rules). For a segment, per key,
the newest event not cleared by a barrier nor older than the key's tombstone is MERGEd into its
collection's `current`: it replaces a row only when newer than the row's event, a delete
removes the row, and an insert or update of a key with no row adds one. Deletes are also MERGEd
into the stream's `removed` table (tombstones), and each namespace event clears its tables'
older rows and leaves a barrier there.

`removed` is a Delta table of Tidemark's own beside the collections (`jobs.curated_zone`):
readers of `current` never filter anything, and a late older event still finds what removed
its document. Its rows name the run that wrote them: a repeat of a killed run reads only what
earlier runs removed, exactly as the first attempt did, so it plans the same commits.

Documents are typed by `type_rule` from each segment's census (`typed_columns`): a new field
adds a column (Delta schema evolution), a misfit value goes to the residual; no table is
rewritten for a type, only once if written before that layout or keyed by type (`_rewrite`).

Long because the fold is one class whose steps share a run's state: the collections reached,
the barriers to write, the writer's slots, and what a rebuild may write (`late_history`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.curated_zone import (
    CURRENT_META,
    OWN_PREFIX,
    REMOVED_COLUMNS,
    TM_CLUSTER_TIME,
    TM_COLL,
    TM_DB,
    TM_DELETED,
    TM_DOCUMENT,
    TM_EVENT_ID,
    TM_KEY,
    TM_RESIDUAL,
    TM_RUN,
    columns_ddl,
    current_dir,
    names,
    removed_dir,
)
from jobs.transform import stored_schema
from jobs.transform.change_log import held, with_documents
from jobs.transform.delta_io import (
    RunWriter,
    current_properties,
    is_table,
    needs_column_mapping,
    table_property,
    table_ref,
)
from jobs.transform.field_census import Census, merge_census
from jobs.transform.fold import (
    KEY,
    EventFacts,
    Watched,
    keyed_by_value,
    keyed_events,
    marked_by_value,
    newest_per_key,
    not_cleared,
    rekeyed,
    rekeyed_removals,
    tombstones_of,
)
from jobs.transform.segments import (
    FOLD_SLOTS_FROM,
    Namespace,
    Scope,
    Segments,
    in_scope,
    matching,
    namespace_events,
    scope_of,
    spans_of,
)
from jobs.transform.type_rule import add_changes, schema_changes, schema_from, schema_frozen
from jobs.transform.typed_columns import DELETED, run_census, run_censuses, with_typed_columns
from tidemark.object_path import LakePath

KEPT = [c for c in names(CURRENT_META) if c != TM_RESIDUAL]  # the residual is made, not kept
AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"
# Up to this many repeated keys in a segment, their winning event ids are broadcast (a few MB);
# beyond, a window over the whole segment finds them.
BROADCAST_KEYS = 200_000


@dataclass
class Folded:
    """What a run's fold changed: the `current` tables it wrote, and their schemas' changes."""

    tables: dict[Namespace, StructType] = field(default_factory=dict)
    schema: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def joined(self, then: Folded) -> Folded:
        """This fold's changes, then `then`'s (a table's newest schema is `then`'s)."""
        schema = {k: {n: list(v) for n, v in c.items()} for k, c in self.schema.items()}
        for key, changes in then.schema.items():
            add_changes(schema.setdefault(key, {"added": [], "widened": []}), changes)
        return Folded({**self.tables, **then.tables}, schema)


class Fold:
    """One run's fold over its stream's tables (see the module docstring)."""

    def __init__(
        self,
        writer: RunWriter,
        watched: Watched,
        known: list[Namespace],
        facts: EventFacts,
        run_namespaces: list[Namespace],
        frozen: bool = False,
    ) -> None:
        self.writer = writer
        self.frozen = frozen  # `schema: freeze`: drift fails the run (`_schema_for`)
        self.run_namespaces = sorted(run_namespaces)  # the collections the run's events name
        self.spark = writer.spark
        self.watched = watched
        self.facts = facts
        # The collections with a `current` table: committed ones, then those this run's plan
        # reached, in plan order (a repeat reaches them in the same order).
        self.namespaces: list[Namespace] = sorted(known)
        self.result = Folded()
        self.typed_keys: set[Namespace] = set()  # keyed by type, not value (`KEY_RULE`)
        self.old_layout: set[Namespace] = set()  # typed before `type_rule`: no TM_RESIDUAL
        self.barriers: list[tuple[Any, ...]] = []  # `removed` rows of this run's namespace events
        # A `rebuild`'s tables: it writes no other, and folds every event that removed anything.
        self.only: set[Namespace] | None = None

    # -- paths and what is on disk -------------------------------------------------------

    def _current(self, ns: Namespace) -> LakePath:
        return current_dir(self.writer.lake_root, self.writer.stream, *ns)

    def _removed(self) -> LakePath:
        return removed_dir(self.writer.lake_root, self.writer.stream)

    def _reach(self, ns: Namespace) -> None:
        if ns not in self.namespaces:
            self.namespaces.append(ns)

    def _table_schema(self, ns: Namespace) -> StructType:
        path = self._current(ns)
        if not is_table(path):
            return StructType([])
        schema = self.spark.read.format("delta").load(str(path)).schema
        if not keyed_by_value(schema):
            self.typed_keys.add(ns)
        if TM_RESIDUAL not in schema.fieldNames() or TM_DOCUMENT in schema.fieldNames():
            self.old_layout.add(ns)
        own = [f for f in schema.fields if not f.name.startswith(OWN_PREFIX)]
        marks = table_property(self.spark, path, stored_schema.OBJECT_ID_PATHS)
        return stored_schema.read(StructType(own), marks)

    def _documents(self, rows: DataFrame) -> DataFrame:
        """`rows` of `current` with their documents, from the stream's change logs."""
        w = self.writer
        return with_documents(self.spark, rows, w.lake_root, w.stream, self.namespaces)

    def _earlier_removals(self) -> DataFrame | None:
        """`removed` as earlier runs left it (see the module docstring); None in a `rebuild`,
        whose events hold every delete and namespace event that made those rows."""
        path = self._removed()
        if self.only is not None or not is_table(path):
            return None
        table = self.spark.read.format("delta").load(str(path))
        return table.where(F.col(TM_RUN) != F.lit(self.writer.run))

    # -- the run -------------------------------------------------------------------------

    def run(self, events: DataFrame, repeat: bool = False) -> Folded:
        """Fold `events`; a `repeat` of a killed run also turns the change feed back on for
        each table it changed (the kill may have come between a rewrite and that)."""
        folded = self._run(events)
        if repeat:
            for ns in sorted(folded.tables):
                if is_table(self._current(ns)):
                    self.writer.set_change_feed(self._current(ns), True)
        return folded

    def rebuild(self, history: DataFrame, repeat: bool = False) -> Folded:
        """Fold the whole `history` of this fold's collections (`run_namespaces`) onto their
        tables emptied first, as if no event of theirs had been folded (`late_history`)."""
        self.only = set(self.run_namespaces)
        self.writer.slots = max(self.writer.slots, FOLD_SLOTS_FROM)
        for ns in self.run_namespaces:
            path, slot = self._current(ns), self.writer.slot()
            if is_table(path):
                self.writer.vectors_when_large(path)
                self.writer.sql(f"DELETE FROM {table_ref(path)}", path, slot)
        return self.run(history, repeat)

    def _run(self, events: DataFrame) -> Folded:
        self.writer.slots = max(self.writer.slots, FOLD_SLOTS_FROM)
        self._rekey_removed(self.writer.slot())
        keyed = keyed_events(events, self.facts)
        segments = Segments()  # each collection's events between its own namespace events
        found = namespace_events(events) if self.facts.namespace_events else []
        # The run's one collection gets its table even from a segment with no rows.
        always = len(self.run_namespaces) == 1
        if found and not always:
            segments.spans = spans_of(keyed)
        for event in found:
            scope = scope_of(event, self.watched)
            if always or not segments.empty(event.event_id, scope):
                self._segment(segments.due(keyed, event.event_id, scope), scope)
            self._namespace_event(event)
            reached = sorted({*self.namespaces, *self.run_namespaces})
            segments.passed(reached, scope, event.event_id)
        if always or not segments.empty():
            self._segment(segments.due(keyed))
        self._write_barriers()
        return self.result

    def _segment(self, segment: DataFrame, scope: Scope | None = None) -> None:
        """Fold `segment`'s rows, of the collections in `scope` (None: every one)."""
        removals = self._earlier_removals()
        if removals is not None:
            barriers = removals.where(F.col(TM_KEY).isNull()).select(
                F.col(TM_DB).alias("_b_db"),
                F.col(TM_COLL).alias("_b_coll"),
                F.col(TM_EVENT_ID).alias("_b_event_id"),
            )
            segment = not_cleared(segment, barriers)
        latest, shuffled = self._newest(segment)
        if removals is not None:
            tombstones = removals.where(F.col(TM_KEY).isNotNull()).select(
                *KEY, F.col(TM_EVENT_ID).alias("_t_event_id")
            )
            # A tombstone of this very event (a repeat) does not hide it: strictly newer only.
            hidden = latest.join(tombstones, KEY).where(F.col("_t_event_id") > F.col(TM_EVENT_ID))
            latest = latest.join(hidden.select(*KEY), KEY, "left_anti")
        if shuffled or removals is not None or self.facts.other_keys:
            # Held once: each collection's MERGE and the tombstones read it.
            latest = held(latest, self.facts.large)
        counted = run_censuses(latest.select(TM_DB, TM_COLL, TM_DOCUMENT))
        # The run's one collection gets its table even from a segment with no rows.
        scoped = [ns for ns in self.run_namespaces if scope is None or in_scope(ns, scope)]
        for ns in scoped if len(self.run_namespaces) == 1 else sorted(counted):
            self._reach(ns)
            self._merge_rows(ns, latest.where(matching([Watched(*ns)])), counted.get(ns, {}))
        slot = self.writer.slot()
        if self.facts.deletes and counted:  # no rows, no deletes: no MERGE
            deletes = latest.where(F.col(TM_DELETED)).select(
                *KEY, TM_EVENT_ID, TM_CLUSTER_TIME, F.lit(self.writer.run).alias(TM_RUN)
            )
            self._merge_tombstones(deletes, slot)

    def _newest(self, segment: DataFrame) -> tuple[DataFrame, bool]:
        """The newest event of each key, and whether finding it shuffled the documents. One
        aggregate over the key columns alone first: most runs have each key once (a load, a
        snapshot, changes spread over many documents) and then the events are the answer;
        the keys that repeat are few, and their winners are picked by a broadcast join."""
        per_key = segment.groupBy(*KEY).agg(
            F.count(F.lit(1)).alias("_n"), F.max(TM_EVENT_ID).alias("_w")
        )
        repeated = per_key.where(F.col("_n") > 1).select(*KEY, "_w")
        count = repeated.count()
        if not count:
            return segment, False
        if count > BROADCAST_KEYS:
            return newest_per_key(segment), True
        winners = segment.join(F.broadcast(repeated), KEY, "left")
        newest = winners.where(F.col("_w").isNull() | (F.col(TM_EVENT_ID) == F.col("_w")))
        return newest.drop("_w"), True

    # -- current -------------------------------------------------------------------------

    def _merge_rows(self, ns: Namespace, rows: DataFrame, counted: Census) -> None:
        """MERGE the newest rows of a segment into the collection's `current`; `counted` is
        the census of their documents."""
        rewrite, merge = self.writer.slot(), self.writer.slot()
        schema = self._schema_for(ns, counted, rewrite)
        self._merge_current(ns, with_typed_columns(rows, schema, KEPT), merge)

    def _schema_for(self, ns: Namespace, counted: Census, slot: int) -> StructType:
        """The table's schema with the columns the census brings (`type_rule`); a table in an
        old layout (`_rewrite`) is rewritten in it first (in `slot`), its documents counted."""
        old = self._table_schema(ns)
        upgrade = ns in self.old_layout
        if upgrade:
            table = self._documents(self.spark.read.format("delta").load(str(self._current(ns))))
            counted = merge_census(run_census(table.select(TM_DOCUMENT)), counted)
        merged = schema_from(StructType([]) if upgrade else old, counted)
        key = f"{ns[0]}.{ns[1]}"
        changes = schema_changes(old, merged)
        if self.frozen and old.fields and not upgrade and changes["added"] + changes["widened"]:
            raise schema_frozen(key, changes)
        if changes["added"] or changes["widened"]:
            add_changes(self.result.schema.setdefault(key, {"added": [], "widened": []}), changes)
        path = self._current(ns)
        if is_table(path) and needs_column_mapping(merged) > needs_column_mapping(old):
            self.writer.map_columns(path)  # before a name that needs it arrives
        if is_table(path) and stored_schema.nested_paths(merged) != stored_schema.nested_paths(old):
            self.writer.set_property(path, *stored_schema.paths_property(merged))  # see there
        if upgrade or ns in self.typed_keys:
            self._rewrite(ns, merged, slot)
        self.result.tables[ns] = merged
        return merged

    def _rewrite(self, ns: Namespace, schema: StructType, slot: int) -> None:
        path = self._current(ns)
        table = self._documents(self.spark.read.format("delta").load(str(path)))
        if ns in self.typed_keys:
            table = rekeyed(table, tombstones=tombstones_of(self._earlier_removals(), ns))
        typed = marked_by_value(with_typed_columns(table, schema, KEPT))
        self.writer.overwrite(typed, path, slot)
        self.typed_keys.discard(ns)
        self.old_layout.discard(ns)

    def _merge_current(self, ns: Namespace, typed: DataFrame, slot: int) -> None:
        path = self._current(ns)
        if not is_table(path):
            live = marked_by_value(typed.where(~F.col(TM_RESIDUAL).eqNullSafe(DELETED)))
            properties = self.writer.new_table(current_properties(self.result.tables[ns]))
            self.writer.create(live, path, properties, slot)
            return
        self.writer.vectors_when_large(path)
        newer = f"s.{TM_EVENT_ID} > t.{TM_EVENT_ID}"
        deleted = f"s.{TM_RESIDUAL} <=> '{DELETED}'"
        statement = (
            f"MERGE INTO {table_ref(path)} t USING {{source}} s ON t.{TM_KEY} = s.{TM_KEY} "
            f"WHEN MATCHED AND {newer} AND {deleted} THEN DELETE "
            f"WHEN MATCHED AND {newer} THEN UPDATE SET * "
            f"WHEN NOT MATCHED AND NOT ({deleted}) THEN INSERT *"
        )
        self.spark.conf.set(AUTO_MERGE, "true")
        try:
            self.writer.sql(statement, path, slot, source=typed)
        finally:
            self.spark.conf.unset(AUTO_MERGE)

    # -- removed -------------------------------------------------------------------------

    def _merge_tombstones(self, deletes: DataFrame, slot: int) -> None:
        path = self._removed()
        if not is_table(path):
            properties = self.writer.new_table({})  # `removed`: no property but the vectors
            self.writer.create(marked_by_value(deletes), path, properties, slot)
            return
        self.writer.vectors_when_large(path)
        same_key = " AND ".join(f"t.{c} = s.{c}" for c in KEY)
        statement = (
            f"MERGE INTO {table_ref(path)} t USING {{source}} s ON {same_key} "
            f"WHEN MATCHED AND s.{TM_EVENT_ID} > t.{TM_EVENT_ID} THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        self.writer.sql(statement, path, slot, source=deletes)

    def _barrier(self, db: str | None, coll: str | None, event: Any) -> None:
        self.barriers.append((db, coll, None, event.event_id, event.cluster_time, self.writer.run))

    def _write_barriers(self) -> None:
        """The run's barriers, in one commit at its end: the run itself never reads them (it
        reads what earlier runs removed), so one append serves all its namespace events."""
        if not self.barriers:
            return
        frame = marked_by_value(
            self.spark.createDataFrame(self.barriers, columns_ddl(REMOVED_COLUMNS))
        )
        properties = self.writer.new_table({})
        self.writer.create(frame, self._removed(), properties, self.writer.slot())

    def _rekey_removed(self, slot: int) -> None:
        """`removed` keyed by value if it was not (`KEY_RULE`), before any run reads it."""
        path = self._removed()
        table = self.spark.read.format("delta").load(str(path)) if is_table(path) else None
        if table is not None and not keyed_by_value(table.schema):
            self.writer.overwrite(rekeyed_removals(table), path, slot, change_feed=False)

    # -- namespace events ----------------------------------------------------------------

    def _clear(self, ns: Namespace, event: Any) -> None:
        """Remove the collection's rows older than `event` (a table not made yet has none)."""
        slot = self.writer.slot()
        path = self._current(ns)
        if is_table(path):
            self.writer.vectors_when_large(path)
            older = f"{TM_EVENT_ID} < '{event.event_id}'"
            statement = f"DELETE FROM {table_ref(path)} WHERE {older}"
            self.writer.sql(statement, path, slot)
        if ns not in self.result.tables:
            self.result.tables[ns] = self._table_schema(ns)

    def _namespace_event(self, event: Any) -> None:
        op = event.operation_type
        if op == "rename":
            self._rename(event)
            return
        (scope,) = scope_of(event, self.watched)
        for ns in [ns for ns in self.namespaces if scope.contains(*ns)]:
            self._clear(ns, event)
        self._barrier(scope.database, scope.collection, event)

    def _rename(self, event: Any) -> None:
        source: Namespace = (event.db, event.coll)
        target: Namespace = (event.to_db, event.to_coll)
        # A rebuild's rename out of what it rebuilds moved what the target holds already.
        moves = self.watched.contains(*target) and (self.only is None or target in self.only)
        if moves:
            self._reach(target)
            self._clear(target, event)
            self._move(source, target, event)
        self._clear(source, event)
        self._barrier(*source, event)
        if moves:
            self._barrier(*target, event)

    def _move(self, source: Namespace, target: Namespace, event: Any) -> None:
        """The source's rows older than the rename, MERGEd into the target (newest per key
        wins), typed in the target's schema from their documents."""
        rewrite, merge = self.writer.slot(), self.writer.slot()
        path = self._current(source)
        if not is_table(path):
            return
        self._table_schema(source)
        table = self.spark.read.format("delta").load(str(path))
        older = table.where(F.col(TM_EVENT_ID) < F.lit(event.event_id))
        rows = self._documents(older).select(*KEPT, TM_DOCUMENT)
        if source in self.typed_keys:
            rows = rekeyed(rows, tombstones=tombstones_of(self._earlier_removals(), source))
        schema = self._schema_for(target, run_census(rows.select(TM_DOCUMENT)), rewrite)
        self._merge_current(target, with_typed_columns(rows, schema, KEPT), merge)
