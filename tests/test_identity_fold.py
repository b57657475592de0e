"""One row of `current` per `_id` value: `1`, `NumberLong(1)`, `1.0` and `NumberDecimal("1.00")`
are one document to MongoDB, so they are one key (`jobs.transform.identity`), whichever path
makes the key (Spark SQL for a lone int, long or ObjectId, Python for the rest), and a table
keyed by type before that rule is re-keyed in place by the first run that writes to it."""

from __future__ import annotations

import bson
import bsonjs
from bson import Decimal128, Int64
from pyspark.sql.types import StringType, StructField, StructType

from jobs.capture import drain
from jobs.curated_zone import KEY_RULE, TM_KEY, removed_dir
from jobs.transform import exact_documents, transform
from jobs.transform.identity import identity_key
from tests.helpers.delta_reading import current_documents, current_tables
from tests.helpers.oracle import canonical, source_state


def _key_metadata(spark, path) -> dict:
    return spark.read.format("delta").load(str(path)).schema[TM_KEY].metadata


def test_one_row_per_id_value_through_insert_replace_update_and_delete(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many(
        [
            {"_id": Int64(5), "v": 0},  # a long that fits an int: keyed in SQL
            {"_id": 7, "v": 0},
            {"_id": Int64(2**40), "v": 0},  # a long no int holds keeps $numberLong
            {"_id": 3.5, "v": 0},
            {"_id": {"a": Int64(1)}, "v": 0},  # a number inside a sub-document: Python
        ]
    )
    orders.replace_one({"_id": 5}, {"_id": 5.0, "v": 1})  # equal values: the server allows it
    orders.replace_one({"_id": 7}, {"_id": Decimal128("7.00"), "v": 1})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    orders.update_one({"_id": 5}, {"$set": {"v": 2}})  # its documentKey is now 5.0
    orders.update_one({"_id": 7}, {"$set": {"v": 2}})  # and this one NumberDecimal("7.00")
    orders.replace_one({"_id": 2**40}, {"_id": float(2**40), "v": 3})
    orders.delete_one({"_id": {"a": 1}})
    orders.delete_one({"_id": 3.5})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    got = current_documents(path)
    assert got == source_state(raw_client, db_name, "orders")
    assert sorted(got) == sorted(
        [
            '{ "_id" : { "$numberInt" : "5" } }',
            '{ "_id" : { "$numberInt" : "7" } }',
            '{ "_id" : { "$numberLong" : "1099511627776" } }',
        ]
    )
    # The MERGE kept the rule's mark that the table's first commit wrote.
    assert KEY_RULE.items() <= _key_metadata(spark, path).items()


def _typed_key(document_json: str) -> str:
    """The key a table written before the rule held: the `_id` with its BSON type."""
    _id = bson.decode(bsonjs.loads(document_json))["_id"]
    return canonical(bson.encode({"_id": _id}))


def _as_before_the_rule(spark, path, rows: list[dict]) -> None:
    """Overwrite the table at `path` with `rows`, its key column without the rule's mark (and
    for `current`, in the layout of that release: `_tm_document`, no residual)."""
    schema = spark.read.format("delta").load(str(path)).schema
    if "_tm_residual" in schema.fieldNames():
        own = [f for f in schema.fields if f.name != "_tm_residual"]
        schema = StructType([*own, StructField("_tm_document", StringType())])
        rows = [{k: v for k, v in row.items() if k != "_tm_residual"} for row in rows]
    schema[TM_KEY].metadata = {}
    ref = f"delta.`{path}`"
    spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    frame = spark.createDataFrame(rows, schema)
    frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(path))
    assert TM_KEY in spark.read.format("delta").load(str(path)).columns
    assert not _key_metadata(spark, path)


def test_a_table_keyed_by_type_before_the_rule_is_re_keyed_by_the_next_run(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many([{"_id": Int64(1), "v": 0}, {"_id": Int64(2), "v": 0}, {"_id": 3}])
    orders.insert_one({"_id": Int64(9)})
    orders.delete_one({"_id": 9})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    # The lake as the release before the rule left it: keys with their types, no mark, and
    # the twins that rule let happen, older rows under an int32 key: one of _id 1, and one of
    # _id 9, whose NumberLong(9) twin was deleted since (the adversary's find: re-keyed, the
    # twin must stay deleted, not come back as the newest row of its value).
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    rows = [r.asDict() for r in exact_documents(spark, sqlite_store, lake, stream.name).collect()]
    rows = [{k: v for k, v in row.items() if k not in ("_tm_db", "_tm_coll")} for row in rows]
    older = {**rows[0], "_tm_event_id": "0", "_tm_document": '{ "_id" : 1, "v" : -1 }'}
    deleted_twin = {**rows[0], "_tm_event_id": "0", "_tm_document": '{ "_id" : 9 }'}
    for row in rows:
        row[TM_KEY] = _typed_key(row["_tm_document"])
    older[TM_KEY] = '{ "_id" : { "$numberInt" : "1" } }'
    deleted_twin[TM_KEY] = '{ "_id" : { "$numberInt" : "9" } }'
    _as_before_the_rule(spark, path, [*rows, older, deleted_twin])
    removed = removed_dir(lake, stream.name)
    tombstones = [r.asDict() for r in spark.read.format("delta").load(str(removed)).collect()]
    assert [t[TM_KEY] for t in tombstones] == ['{ "_id" : { "$numberInt" : "9" } }']
    tombstones[0][TM_KEY] = '{ "_id" : { "$numberLong" : "9" } }'
    _as_before_the_rule(spark, removed, tombstones)

    orders.update_one({"_id": 2}, {"$set": {"v": 5}})  # keyed { $numberInt: 2 } now
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    keys = [r[TM_KEY] for r in spark.read.format("delta").load(str(removed)).collect()]
    assert keys == [identity_key('{ "_id" : { "$numberLong" : "9" } }')]
    for table in (path, removed):
        assert KEY_RULE.items() <= _key_metadata(spark, table).items()
