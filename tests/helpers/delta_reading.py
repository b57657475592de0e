"""Reading the curated Delta tables the way any engine's user would: with the `deltalake`
package (Rust, no JVM, no Tidemark code), at each table's newest version. The tables are found
from the state store's record of them (`TransformState.tables`, lake-relative paths)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from resources.spark_lake import endpoint, region
from state import StateStore, TransformState
from tidemark.object_path import LakePath, ObjectPath


def delta_table(path: LakePath) -> DeltaTable:
    """The Delta table at `path`, local or on the S3 server (found as any AWS client finds a
    store: the standard variables, here the test server's)."""
    if not isinstance(path, ObjectPath):
        return DeltaTable(str(path))
    # The variables Tidemark's own Spark settings read (resources/spark_lake.py).
    options = {"AWS_REGION": region(os.environ) or "us-east-1"}
    url = endpoint(os.environ)
    if url:
        options |= {"AWS_ENDPOINT_URL": url, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
        options["AWS_ALLOW_HTTP"] = str(url.startswith("http:")).lower()
    return DeltaTable(str(path), storage_options=options)


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
        for t in TransformState(store).tables(stream)
        if t.kind == "current"
    }


def current_documents(path: Path) -> dict[str, str]:
    """One collection's `current`: canonical key -> canonical document (a key twice fails)."""
    rows = query(path, "SELECT _tm_key, _tm_document FROM t")
    state = {r["_tm_key"]: r["_tm_document"] for r in rows}
    assert len(state) == len(rows), f"a key appears twice in {path}"
    return state


def changes_event_ids(store: StateStore, lake: Path, stream: str) -> list[str]:
    """Every event id in the stream's `changes` tables, as often as each is there."""
    return [
        r["event_id"]
        for t in TransformState(store).tables(stream)
        if t.kind == "changes"
        for r in query(lake / t.path, "SELECT event_id FROM t")
    ]
