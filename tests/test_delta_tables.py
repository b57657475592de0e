"""The curated tables as other engines see them: one Delta table pair per collection, read with
no Tidemark code (delta-rs, plain Spark), the change feed, and field names that collide with
SQL or with Tidemark's own columns."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from bson import Decimal128, ObjectId
from deltalake import DeltaTable, QueryBuilder

from jobs.capture import drain, drain_until_caught_up
from jobs.curated_zone import name_of, segment
from jobs.transform import read_changes, read_current, transform
from state import StateStore
from tests.helpers.delta_reading import current_documents
from tests.helpers.oracle import source_state
from tidemark.errors import CuratedTableMissing, SchemaFrozen


def delta_rs(path, sql: str) -> pa.Table:
    """A query over the Delta table at `path` by delta-rs (Rust, no JVM). Its
    `to_pyarrow_table` refuses deletion vectors; its SQL engine applies them."""
    return pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute(sql).read_all())


def current_tables(store, lake, stream: str) -> dict[tuple[str, str], object]:
    return {
        (t.db, t.coll): lake / t.path
        for t in store.transforms.tables(stream)
        if t.kind == "current"
    }


@pytest.mark.fast
@pytest.mark.parametrize("name", ["orders", "a/b", "50%", ".hidden", "with space", "ü.x"])
def test_a_collection_name_is_one_path_segment_that_reads_back(name):
    encoded = segment(name)
    assert "/" not in encoded and not encoded.startswith(".")
    assert name_of(encoded) == name


def test_each_collection_has_its_own_tables_that_delta_rs_reads_as_find(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db = client[db_name]
    db.orders.insert_many(
        [{"_id": i, "qty": i, "at": dt.datetime(2026, 1, i + 1)} for i in range(6)]
    )
    db.users.insert_many([{"_id": ObjectId(), "name": f"u{i}"} for i in range(4)])
    db.gone.insert_many([{"_id": i} for i in range(3)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    db.orders.update_many({"_id": {"$lt": 3}}, {"$set": {"qty": 100}})
    db.orders.delete_one({"_id": 5})
    db.gone.drop()
    db.later.insert_one({"_id": "first", "v": Decimal128("1.50")})  # appears in a later run
    db.users.rename("members")
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    result = transform(spark, sqlite_store, lake, stream)
    assert result.run == 2

    tables = current_tables(sqlite_store, lake, stream.name)
    assert {coll for _, coll in tables} == {"orders", "users", "members", "gone", "later"}
    for (_, coll), path in tables.items():
        assert path == lake / "curated" / stream.name / db_name / coll / "current"
        assert current_documents(path) == source_state(raw_client, db_name, coll), coll
    # Typed where lossless: a BSON date is a timestamp column; no second JSON copy.
    orders = spark.read.format("delta").load(str(tables[(db_name, "orders")]))
    types = dict(orders.dtypes)
    assert types["at"] == "timestamp" and types["qty"] == "bigint"
    assert "_tm_json" not in types and "_tm_deleted" not in types
    changes = [t for t in sqlite_store.transforms.tables(stream.name) if t.kind == "changes"]
    logged = {t.coll: t.rows for t in changes}
    assert logged["orders"] == 6 + 3 + 1 and logged["later"] == 1


def test_a_frozen_schema_fails_the_run_on_drift_and_evolve_then_folds_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """`schema: freeze`: a new field or a type change fails the run, naming the columns,
    before `current` or the state store changes; the same events fold once the stream is
    set to `evolve`. A first load and changes that keep the schema go through."""
    stream = make_stream(schema="freeze")
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "n": i} for i in range(3)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)  # the first load sets the schema
    coll.update_one({"_id": 0}, {"$set": {"n": 10}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)  # no drift
    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    before, version = current_documents(path), sqlite_store.transforms.latest(stream.name)

    coll.update_one({"_id": 1}, {"$set": {"n": "one", "extra": True}})  # "one": the residual
    drain(stream, raw_client, sqlite_store, lake)
    for _ in range(2):  # each try fails the same way, nothing committed
        with pytest.raises(SchemaFrozen) as failed:
            transform(spark, sqlite_store, lake, stream)
        assert "added: extra" in str(failed.value) and "changed: none" in str(failed.value)
        assert "Set `schema: evolve`" in str(failed.value)
        assert current_documents(path) == before
        assert sqlite_store.transforms.latest(stream.name) == version

    result = transform(spark, sqlite_store, lake, make_stream(schema="evolve"))
    assert result.schema == {"added": [f"{db_name}.orders.extra"], "widened": []}
    assert current_documents(path) == source_state(raw_client, db_name, "orders")


def test_engines_read_every_collection_right_after_a_nested_type_change(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """No compaction in between: plain Spark and delta-rs read the table as it is. A nested
    value that does not fit its column goes to the residual; a nested field added widens the
    struct; no other row changes."""
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "meta": {"size": i, "tags": ["a"]}} for i in range(5)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.update_one({"_id": 1}, {"$set": {"meta.size": "large"}})  # int -> string, nested
    coll.update_one({"_id": 2}, {"$set": {"meta.extra": {"x": 1}}})  # a nested field added
    drain(stream, raw_client, sqlite_store, lake)
    result = transform(spark, sqlite_store, lake, stream)
    after = "struct<size:bigint,tags:array<string>,extra:struct<x:bigint>>"
    widened = f"{db_name}.orders.meta: struct<size:bigint,tags:array<string>> -> {after}"
    assert result.schema["widened"] == [widened]

    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    plain = spark.read.format("delta").load(str(path))
    assert dict(plain.dtypes)["meta"] == after
    rows = sorted(((r["meta"]["size"], r["_tm_residual"]) for r in plain.collect()), key=str)
    large = '{ "meta" : { "size" : "large" } }'
    assert rows == [(0, None), (2, None), (3, None), (4, None), (None, large)]  # by str


def test_the_change_feed_gives_only_what_a_run_changed(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "v": 0} for i in range(20)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    (before,) = [t for t in sqlite_store.transforms.tables(stream.name) if t.kind == "current"]

    coll.update_many({"_id": {"$in": [1, 2, 3]}}, {"$set": {"v": 1}})
    coll.delete_one({"_id": 4})
    coll.insert_one({"_id": 99, "v": 9})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", before.delta_version + 1)
        .load(str(lake / before.path))
    )
    got = sorted((r["_change_type"], r["_tm_key"]) for r in feed.collect())
    key = '{ "_id" : { "$numberInt" : "%d" } }'
    assert got == sorted(
        [("update_preimage", key % i) for i in (1, 2, 3)]
        + [("update_postimage", key % i) for i in (1, 2, 3)]
        + [("delete", key % 4), ("insert", key % 99)]
    )


COLLIDING = {
    "part": 1,
    "rn": 2,
    "date": "d",
    "run": 3,
    "_tm_key": "mine",
    "_tm_document": "also mine",
    "Name": "upper",
    "name": "lower",
    "with space": 4,
    "a.b": 5,
    "select": 6,
    "": "empty",
    "$dollar": 7,
}


def test_field_names_that_collide_with_sql_or_tidemark_survive_end_to_end(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, **COLLIDING} for i in range(3)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.update_one({"_id": 1}, {"$set": {"rn": 20}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    plain = spark.read.format("delta").load(str(path))
    columns = plain.columns
    for name in ("part", "rn", "date", "run", "with space", "a.b", "select", "$dollar"):
        assert name in columns, name
    # Tidemark's own names stay Tidemark's; of two names differing in case, one column.
    assert [c for c in columns if c.lower() == "name"] == ["Name"]
    rows = {r["_tm_key"]: r for r in plain.collect()}
    assert rows['{ "_id" : { "$numberInt" : "1" } }']["rn"] == 20
    assert all(r["_tm_key"].startswith('{ "_id"') for r in rows.values())
    sql = QueryBuilder().register("t", DeltaTable(str(path)))
    (count,) = (
        sql.execute('SELECT count(*) AS n FROM t WHERE "rn" >= 2').read_all()["n"].to_pylist()
    )
    assert count == 3


@pytest.mark.fast
def test_reading_a_table_no_run_made_yet_names_the_fix(tmp_path):
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    fix = "Run the transform after a drain"
    with pytest.raises(
        CuratedTableMissing, match=rf"no current-state table for shop\.orders yet\. {fix}"
    ):
        read_current(None, store, tmp_path, "orders", db="shop", coll="orders")
    with pytest.raises(
        CuratedTableMissing, match=rf"Stream 'orders' has no change log yet\. {fix}"
    ):
        read_changes(None, store, tmp_path, "orders")
