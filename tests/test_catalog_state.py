"""What the state store says of a stream's collection tables, with no Spark and no mongod:
which tables exist (the Dagster assets), and what each run did to a `current` table's columns
(the `schema_drift` check)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from jobs.catalog import schema_drift, tables_made
from orchestration.table_assets import TableTranslator
from state import CuratedTable, TransformRun
from tidemark.config import StreamConfig


def _schema(**fields: str) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields.items()
            ],
        }
    )


def _run(store, stream: str, number: int, tables: list[tuple[str, str, str, str]]) -> None:
    run = TransformRun(
        stream=stream,
        run=number,
        path=f"curated/{stream}",
        rows=1,
        doc_schema="",
        events_folded=1,
        changes_added=1,
        created_at=datetime.now(UTC),
        kind="merge",
        base_run=number,
    )
    records = [
        CuratedTable(
            stream, number, db, coll, kind, f"curated/{stream}/{db}/{coll}/{kind}", 0, 1, s
        )
        for db, coll, kind, s in tables
    ]
    lease = store.acquire_lease(stream, "transform", timedelta(minutes=5))
    try:
        store.transforms.commit(lease, stream, number - 1 or None, run, [], records)
    finally:
        store.release_lease(lease)


@pytest.mark.fast
def test_drift_compares_each_table_with_its_own_previous_run(store):
    stream = StreamConfig(name="shop", database="shop")
    store.ensure_stream(stream)
    _run(store, "shop", 1, [("shop", "a", "current", _schema(n="long"))])
    _run(store, "shop", 2, [("shop", "b", "current", _schema(s="string"))])
    (a, b) = schema_drift(store, "shop")
    assert (a.coll, a.run, a.drifted) == ("a", 1, False)  # a table's first run is no drift
    assert (b.coll, b.run, b.drifted) == ("b", 2, False)

    # Run 3 changes a's type and adds a column; b (untouched) keeps its verdict.
    _run(store, "shop", 3, [("shop", "a", "current", _schema(n="string", m="double"))])
    drifts = {d.coll: d for d in schema_drift(store, "shop")}
    assert drifts["a"].changed == ["n: bigint -> string"] and drifts["a"].added == ["m"]
    assert drifts["a"].run == 3 and not drifts["b"].drifted

    _run(store, "shop", 4, [("shop", "a", "current", _schema(n="string", m="double"))])
    assert not {d.coll: d for d in schema_drift(store, "shop")}["a"].drifted  # same columns


@pytest.mark.fast
def test_the_tables_that_become_assets(store):
    stream = StreamConfig(name="shop", database="shop")
    store.ensure_stream(stream)
    _run(
        store,
        "shop",
        1,
        [
            ("shop", "a", "changes", ""),
            ("shop", "a", "current", _schema()),
            ("shop", "", "changes", ""),  # dropDatabase events
            ("", "", "changes", ""),  # a cluster snapshot's marker: the stream's own
        ],
    )
    found = tables_made(store, "shop")
    assert found == [
        ("shop", "$database", "changes"),
        ("shop", "a", "changes"),
        ("shop", "a", "current"),
    ]
    assert TableTranslator(stream).tables(found) == sorted(found)

    one = StreamConfig(name="one", database="d", collection="c")
    assert TableTranslator(one).tables([]) == [("d", "c", "changes"), ("d", "c", "current")]
    no_current = StreamConfig(
        name="log", database="d", collection="c", current_table=False, full_document="default"
    )
    assert TableTranslator(no_current).tables([]) == [("d", "c", "changes")]
