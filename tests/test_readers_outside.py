"""The README's reader lines, each run against a real `current` table (deletion vectors from a
MERGE, typed columns of every kind the fold writes): every engine gives Spark's rows. Column
mapping is on only where a field's name needs it, and the README says which engines read
such a table."""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars
import pyarrow as pa
import pytest
from bson import Decimal128, ObjectId
from deltalake import DeltaTable

from jobs.capture import drain, drain_until_caught_up
from jobs.transform import delta_io, transform
from tests.helpers.delta_reading import current_tables, query
from tests.helpers.oracle import source_state

README = Path(__file__).resolve().parent.parent / "README.md"
ENGINES = ["Spark", "delta-rs", "DuckDB", "Polars", "pandas"]


def _readme_statements() -> list[tuple[str, str | None]]:
    """The statements of the README's reader block (after its `<!-- readers -->` marker), each
    with the engine its trailing comment names (None for the setup: imports, the path, the
    extension's load)."""
    text = README.read_text()
    block = re.search(r"<!-- readers -->\n```python\n(.*?)```", text, re.S)
    assert block, "the README has no reader block"
    lines = block.group(1).splitlines()
    statements = []
    for node in ast.parse(block.group(1)).body:
        source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        comment = re.search(r"  # (\S+)$", source)
        statements.append((source, comment.group(1) if comment else None))
    return statements


def _read(engine: str, spark: Any, path: Path) -> Any:
    """Run the README's setup statements, then its line for `engine`, on the table at `path`."""
    scope: dict[str, Any] = {"spark": spark}
    ours = None
    for source, named in _readme_statements():
        if source.startswith("path = "):
            scope["path"] = str(path)
        elif named == engine:
            ours = source
        elif named is None:
            exec(source, scope)
    assert ours is not None, f"the README has no line for {engine}"
    return eval(ours, scope)


def _exact(engine: str, spark: Any, path: Path) -> dict[str, str]:
    """The README's exact-document query for `engine` ("Spark SQL" or "DuckDB") on the
    collection whose `current` is at `path`: key -> document."""
    text = README.read_text()
    block = re.search(r"\*\*The exact document\*\*.*?```sql\n(.*?)```", text, re.S)
    assert block, "the README has no exact-document query"
    queries = dict(re.findall(r"-- (Spark SQL|DuckDB)\n(.*?)(?=\n\s*-- |\Z)", block.group(1), re.S))
    example = "<lake>/curated/orders/shop/orders/"
    sql = queries[engine].replace(f"{example}current", str(path))
    sql = sql.replace(f"{example}changes", str(path.parent / "changes"))
    if engine == "Spark SQL":
        result = spark.sql(sql)
    else:
        scope: dict[str, Any] = {}
        for source, named in _readme_statements():
            if named is None and not source.startswith("path = "):
                exec(source, scope)  # the imports and the extension's load
        result = scope["duckdb"].sql(sql).arrow().read_all()
    return {r["_tm_key"]: r["document"] for r in _rows(result)}


def _rows(result: Any) -> list[dict]:
    """An engine's result as rows of Python values, sorted by key."""
    if hasattr(result, "toArrow"):
        table = result.toArrow()  # not collect(): PySpark's conversion fails on year-1 dates
    elif isinstance(result, polars.DataFrame):
        table = result.to_arrow()
    elif hasattr(result, "to_records"):  # pandas
        table = pa.Table.from_pandas(result, preserve_index=False)
    else:
        table = pa.table(result)
    return sorted((_plain(r) for r in table.to_pylist()), key=lambda r: r["_tm_key"])


def _plain(value: Any) -> Any:
    """Values as every engine gives them: instants in UTC, structs as dicts, nulls None."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, float) and value != value:
        return None  # pandas holds a null number as NaN
    return value


def _files_with_deletion_vectors(path: Path) -> int:
    """The table's live data files that carry a deletion vector (its JSON log, no checkpoint
    yet: a few commits)."""
    live: dict[str, Any] = {}
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        for action in actions:
            live.pop(action.get("remove", {}).get("path"), None)
        added = [action["add"] for action in actions if "add" in action]
        live.update({add["path"]: add.get("deletionVector") for add in added})
    return sum(1 for vector in live.values() if vector)


def _document(n: int) -> dict:
    """A document with a column of each kind the fold writes."""
    return {
        "_id": n,
        "when": datetime(1969 - n, 7, 20, 20, 17, tzinfo=UTC),  # before 1970
        "price": Decimal128(f"{n}.50"),
        "owner": ObjectId(),
        "tags": ["a", "b"][: n % 3],
        "address": {"city": f"c{n}", "geo": {"lat": n / 3}},
        "count": n,
    }


def test_every_readme_reader_line_reads_current_as_spark_does(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = client[db_name]["orders"]
    # Deletion vectors from the table's first byte: made without them, on from the next run.
    stream = make_stream(deletion_vectors_from_bytes=1)
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many([_document(n) for n in range(40)])  # files the MERGE only marks
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert "deletionVectors" not in (DeltaTable(str(path)).protocol().reader_features or [])
    orders.delete_one({"_id": 3})
    orders.update_one({"_id": 4}, {"$set": {"count": 40, "address.city": "moved"}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)  # a MERGE: deletion vectors

    protocol = DeltaTable(str(path)).protocol()
    assert "deletionVectors" in (protocol.reader_features or [])
    assert _files_with_deletion_vectors(path), "the MERGE rewrote its files: nothing to apply"
    assert "columnMapping" not in (protocol.reader_features or [])  # no name needs it
    expected = _rows(_read("Spark", spark, path))
    assert sorted(r["_id"] for r in expected) == [n for n in range(40) if n != 3]
    for engine in ENGINES[1:]:
        assert _rows(_read(engine, spark, path)) == expected, engine
    for engine in ("Spark SQL", "DuckDB"):  # and the README's exact-document query
        assert _exact(engine, spark, path) == source_state(raw_client, db_name, "orders")

    # A name Delta refuses without column mapping turns it on, from the run that brings it.
    orders.update_one({"_id": 2}, {"$set": {"unit price": 9, "nested": {"a;b": 1}}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    assert "columnMapping" in (DeltaTable(str(path)).protocol().reader_features or [])
    expected = _rows(_read("Spark", spark, path))
    by_id = {r["_id"]: (r["unit price"], r["nested"]) for r in expected}
    assert by_id[2] == (9, {"a;b": 1}) and by_id[1] == (None, None)
    for engine in ["delta-rs", "DuckDB", "pandas"]:
        assert _rows(_read(engine, spark, path)) == expected, engine
    with pytest.raises(Exception, match="columnMapping"):  # as the README says
        _read("Polars", spark, path)


def test_a_small_current_has_no_deletion_vectors_and_every_reader_reads_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Below `deletion_vectors_from_bytes` a MERGE rewrites the files it touches: the table
    has no deletion vectors, so delta-rs's `to_pyarrow_table` and Polars read it too."""
    orders = client[db_name]["orders"]
    stream = make_stream()  # the default: 16 MB
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many([_document(n) for n in range(40)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    orders.delete_one({"_id": 3})
    orders.update_one({"_id": 4}, {"$set": {"count": 40}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()

    table = DeltaTable(str(path))
    assert "deletionVectors" not in (table.protocol().reader_features or [])
    assert not _files_with_deletion_vectors(path)
    expected = _rows(_read("Spark", spark, path))
    assert sorted(r["_id"] for r in expected) == [n for n in range(40) if n != 3]
    assert _rows(table.to_pyarrow_table()) == expected
    assert _rows(polars.read_delta(str(path))) == expected


def test_a_reader_between_a_runs_commits_sees_a_real_past_state_in_event_order(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """A run commits to `current` once per segment between namespace events: an engine that
    reads the newest version by path while the run commits sees each of them. Each is a past
    state of the collection, in event order (the README says so)."""
    orders = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()

    states = [{1: 0, 2: 0}, {1: 1, 2: 0}, {1: 1, 2: 0, 3: 0}, {}, {4: 0}, {4: 0, 5: 0}]
    orders.replace_one({"_id": 1}, {"v": 1})  # its event carries the document (no lookup)
    orders.insert_one({"_id": 3, "v": 0})
    orders.drop()
    orders.insert_one({"_id": 4, "v": 0})
    orders.insert_one({"_id": 5, "v": 0})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    seen = []

    def read_after_commit(moment: str, table: Any, slot: int) -> None:
        if moment == "after" and str(table) == str(path):
            seen.append({r["_id"]: r["v"] for r in query(path, "SELECT _id, v FROM t")})

    monkeypatch.setattr(delta_io, "COMMIT_HOOK", read_after_commit)
    transform(spark, sqlite_store, lake, stream)

    assert len(seen) >= 3 and seen[-1] == states[-1], seen  # the segments, then the drop's
    places = [states.index(state) for state in seen]  # each seen state is one of them...
    assert places == sorted(places), seen  # ...and they come in event order
    assert {} in seen  # the drop's commit: the collection just after it, empty
