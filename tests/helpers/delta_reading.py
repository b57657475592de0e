"""Reading the curated Delta tables the way any engine's user would: with the `deltalake`
package (Rust, no JVM; `resources.delta_rs` only opens the table), at each table's newest
version. The tables are found from the state store's record of them (`TransformState.tables`,
lake-relative paths)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import QueryBuilder

from resources.delta_rs import delta_table
from state import StateStore
from tidemark.object_path import LakePath


def query(path: LakePath, sql: str) -> list[dict[str, Any]]:
    """`sql` over the Delta table at `path`, registered as `t`. QueryBuilder, not
    `to_pyarrow_table`: it reads tables with deletion vectors."""
    reader = QueryBuilder().register("t", delta_table(path)).execute(sql)
    return pa.table(reader.read_all()).to_pylist()


def delta_version(path: LakePath) -> int:
    return delta_table(path).version()


def current_tables(store: StateStore, lake: Path, stream: str) -> dict[tuple[str, str], Path]:
    return {
        (t.db, t.coll): lake / t.path
        for t in store.transforms.tables(stream)
        if t.kind == "current"
    }


def change_logs(current: LakePath) -> list[LakePath]:
    """Every collection's `changes` table of the stream that `current` belongs to
    (`<stream>/<db>/<coll>/current`): where the events of its live rows are."""
    stream = current.parent.parent.parent
    return [
        coll / "changes"
        for db in stream.iterdir()
        if db.is_dir()
        for coll in db.iterdir()
        if coll.is_dir() and (coll / "changes" / "_delta_log").exists()
    ]


def current_rows(
    path: LakePath, columns: str = "t.*", logs: list[LakePath] | None = None
) -> list[dict[str, Any]]:
    """`current`'s rows (`columns` of `t`) with each live row's exact document,
    `_tm_document`, joined from the stream's change logs (`logs`, default `change_logs`) by
    the event that set the row, as the README's query does."""
    builder = QueryBuilder().register("t", delta_table(path))
    logs = change_logs(path) if logs is None else logs
    for i, log in enumerate(logs):
        builder = builder.register(f"c{i}", delta_table(log))
    events = (
        " UNION ALL ".join(
            f"SELECT event_id, full_document FROM c{i} WHERE full_document IS NOT NULL"
            for i in range(len(logs))
        )
        or "SELECT CAST(NULL AS STRING) AS event_id, CAST(NULL AS STRING) AS full_document"
    )
    sql = (
        f"SELECT {columns}, e.full_document AS _tm_document FROM t "
        f"LEFT JOIN ({events}) e ON e.event_id = t._tm_event_id"
    )
    return pa.table(builder.execute(sql).read_all()).to_pylist()


def current_documents(path: LakePath, logs: list[LakePath] | None = None) -> dict[str, str]:
    """One collection's `current`: canonical key -> exact document, canonical Extended JSON,
    joined from the change logs (a key twice fails; so does a row with no document)."""
    rows = current_rows(path, "t._tm_key", logs)
    state = {r["_tm_key"]: r["_tm_document"] for r in rows}
    assert len(state) == len(rows), f"a key appears twice in {path}"
    assert None not in state.values(), f"a live row of {path} has no event in the change log"
    return state


def changes_event_ids(store: StateStore, lake: Path, stream: str) -> list[str]:
    """Every event id in the stream's `changes` tables, as often as each is there."""
    return [
        r["event_id"]
        for t in store.transforms.tables(stream)
        if t.kind == "changes"
        for r in query(lake / t.path, "SELECT event_id FROM t")
    ]
