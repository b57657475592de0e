"""What each curated table of a stream is now: its Delta path, version, rows and columns.

The state store is the catalog: every committed run records the Delta version of each table it
changed, so this module answers from SQL alone (no Spark, no listing of the lake). Any engine
reads a table by its path, with Delta's own log; nothing here needs to be published for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from jobs.curated_zone import (
    CHANGES_COLUMNS,
    CURRENT_META,
    DATABASE_EVENTS,
    NAMESPACE_COLUMNS,
    Column,
    curated,
)
from state import CuratedTable, StateStore
from tidemark.object_path import LakePath

TableName = Literal["current", "changes"]


@dataclass(frozen=True)
class TableState:
    """A curated table as its newest committed run left it; for a stream-wide summary
    (`stream_table`), `db` and `coll` are None and `collections` names its tables."""

    stream: str
    table: TableName
    delta_version: int | None  # the table's Delta version; None for a summary of several
    rows: int
    committed_at: datetime
    location: LakePath
    columns: list[Column] = field(default_factory=list)
    db: str | None = None
    coll: str | None = None
    run: int | None = None  # the transform run that made this state (a summary: the newest)
    collections: list[TableState] = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.db is None:
            return self.stream
        return f"{self.db}.{self.coll or DATABASE_EVENTS}"


def tables(store: StateStore, lake_root: LakePath, stream: str, **_: Any) -> list[TableState]:
    """Every collection table of the stream: its `changes`, then its `current`."""
    tstate = store.transforms
    when = {r.run: r.created_at for r in tstate.runs(stream)}
    found = tstate.tables(stream)
    order = sorted(found, key=lambda t: (t.kind != "changes", t.db, t.coll))
    return [_state(lake_root, t, when[t.run]) for t in order if t.run in when]


def stream_table(
    store: StateStore, lake_root: LakePath, stream: str, table: TableName
) -> TableState | None:
    """The stream's `table` over all its collections: rows summed, the columns and Delta path
    of its one collection (or, when there are several, NAMESPACE_COLUMNS then the shared
    ones, and the stream's curated directory)."""
    parts = [t for t in tables(store, lake_root, stream) if t.table == table]
    if not parts:
        return None
    newest = max(parts, key=lambda t: t.committed_at)
    columns = parts[0].columns if len(parts) == 1 else _shared_columns(parts)
    return TableState(
        stream=stream,
        table=table,
        delta_version=parts[0].delta_version if len(parts) == 1 else None,
        run=max(t.run or 0 for t in parts),
        rows=sum(t.rows for t in parts),
        committed_at=newest.committed_at,
        location=parts[0].location if len(parts) == 1 else curated(lake_root, stream),
        columns=columns,
        collections=parts,
    )


def _shared_columns(parts: list[TableState]) -> list[Column]:
    meta = CURRENT_META if parts[0].table == "current" else CHANGES_COLUMNS
    return [*NAMESPACE_COLUMNS, *meta]


def _state(lake_root: LakePath, table: CuratedTable, committed_at: datetime) -> TableState:
    if table.kind == "current":
        columns = [*CURRENT_META, *document_columns(table.doc_schema)]
    else:
        columns = list(CHANGES_COLUMNS)
    return TableState(
        stream=table.stream,
        table="current" if table.kind == "current" else "changes",
        delta_version=table.delta_version,
        rows=table.rows,
        committed_at=committed_at,
        location=lake_root / table.path,
        columns=columns,
        db=table.db,
        coll=table.coll,
        run=table.run,
    )


def document_columns(doc_schema: str | None) -> list[Column]:
    """The document columns of a table, from its Spark schema JSON (no Spark needed)."""
    if not doc_schema:
        return []
    fields = json.loads(doc_schema).get("fields", [])
    return [Column(f["name"], _type_name(f["type"])) for f in fields]


def _type_name(spark_type: Any) -> str:
    """Spark's JSON form of a type as its SQL name (`long` -> bigint, nested in kind)."""
    if isinstance(spark_type, str):
        return {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}.get(
            spark_type, spark_type
        )
    kind = spark_type.get("type")
    if kind == "array":
        return f"array<{_type_name(spark_type['elementType'])}>"
    if kind == "map":
        return f"map<{_type_name(spark_type['keyType'])},{_type_name(spark_type['valueType'])}>"
    if kind == "struct":
        inner = ",".join(f"{f['name']}:{_type_name(f['type'])}" for f in spark_type["fields"])
        return f"struct<{inner}>"
    return str(kind)


@dataclass(frozen=True)
class SchemaDrift:
    """What the newest run that changed a `current` table did to its columns."""

    db: str
    coll: str
    run: int
    added: list[str]
    changed: list[str]  # "field: old -> new"

    @property
    def drifted(self) -> bool:
        return bool(self.added or self.changed)


def schema_drift(store: StateStore, stream: str) -> list[SchemaDrift]:
    """Each `current` table's columns as its newest run left them against the run before that
    (a table's first run adds its columns, which is not drift)."""
    tstate = store.transforms
    newest = [t for t in tstate.tables(stream) if t.kind == "current"]
    before: dict[int, dict[tuple[str, str], CuratedTable]] = {}
    drifts = []
    for table in newest:
        if table.run not in before:
            earlier = tstate.tables(stream, run=table.run - 1)
            before[table.run] = {(t.db, t.coll): t for t in earlier if t.kind == "current"}
        previous = before[table.run].get((table.db, table.coll))
        if previous is None:
            drifts.append(SchemaDrift(table.db, table.coll, table.run, [], []))
            continue
        old = {c.name: c.type for c in document_columns(previous.doc_schema)}
        new = {c.name: c.type for c in document_columns(table.doc_schema)}
        added = [name for name in new if name not in old]
        changed = [f"{n}: {old[n]} -> {t}" for n, t in new.items() if n in old and old[n] != t]
        drifts.append(SchemaDrift(table.db, table.coll, table.run, added, changed))
    return drifts


@dataclass(frozen=True)
class FoldLag:
    """How far the curated tables trail the raw zone: committed batches not folded yet."""

    batches: int
    oldest_committed_at: datetime | None

    def seconds(self, now: datetime) -> float:
        if self.oldest_committed_at is None:
            return 0.0
        return max(0.0, (now - self.oldest_committed_at).total_seconds())


def fold_lag(store: StateStore, stream: str) -> FoldLag:
    """The batches the next transform run would fold (a snapshot's chunks count once it is
    whole), and when the oldest of them was committed."""
    waiting = store.transforms.untransformed_batches(stream)
    times = [b.committed_at for b in waiting if b.committed_at is not None]
    return FoldLag(len(waiting), min(times) if times else None)


def tables_made(store: StateStore, stream: str) -> list[tuple[str, str, TableName]]:
    """(db, collection, kind) of every table the stream's runs have made (a database's own
    events under the collection name `$database`)."""
    found = store.transforms.tables(stream)
    return [
        (t.db, t.coll or DATABASE_EVENTS, "current" if t.kind == "current" else "changes")
        for t in found
        if t.db  # events with no database are the stream's own markers, no collection's
    ]
