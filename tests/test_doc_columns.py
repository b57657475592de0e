"""The document columns' Spark side: the Arrow UDFs give the Python functions' texts, and the
file-free schema inference gives what reading the same texts as a JSON file gave."""

from __future__ import annotations

import datetime
import uuid

import bson
from bson import Binary, Decimal128, Int64, ObjectId, Regex

from jobs.raw_zone import document_json
from jobs.transform.doc_columns import (
    INFER_OPTIONS,
    document_json_udf,
    documents_udf,
    flatten_udf,
    infer_schema,
)
from jobs.transform.extjson import flatten

FULL_DOCUMENTS = [
    {"_id": 1, "n": 2.5, "when": datetime.datetime(2026, 1, 2, 3, 4, 5, 6000)},
    {"_id": ObjectId(), "u": Binary(uuid.uuid4().bytes, 4), "d": Decimal128("1.10")},
    {"_id": Int64(7), "$price": 3, "pattern": Regex("^a", "i"), "nested": {"a": [1, {"b": None}]}},
    {"_id": "x" * 5000},  # 4 KB and more: pymongo hands out a memoryview
]


def _events() -> list[bytes]:
    events = [bson.encode({"operationType": "insert", "fullDocument": d}) for d in FULL_DOCUMENTS]
    events.append(
        bson.encode(
            {
                "operationType": "update",
                "fullDocument": None,
                "fullDocumentBeforeChange": {"_id": 1, "n": 1},
                "updateDescription": {"updatedFields": {"n": 2.5}, "removedFields": ["m"]},
            }
        )
    )
    events.append(bson.encode({"operationType": "drop", "operationDescription": {"a": 1}}))
    return events


def test_the_arrow_udfs_give_the_python_functions_texts(spark) -> None:
    events = _events()
    frame = spark.createDataFrame([(raw,) for raw in events], "raw binary").coalesce(1)
    rows = frame.select(
        documents_udf("raw").alias("both"),
        document_json_udf("raw").alias("canonical"),
        flatten_udf(document_json_udf("raw").getField("full_document")).alias("plain"),
    ).collect()
    for row, raw in zip(rows, events, strict=True):
        canonical = document_json(raw)
        assert tuple(row.canonical) == canonical
        assert tuple(row.both) == (*canonical, flatten(canonical[0]))
        assert row.plain == flatten(canonical[0])
    assert rows[-1].both._tm_json is None  # no full document, no plain JSON


TRICKY_JSON = [
    '{"a":1,"b":[1.5],"c":{},"d":[{}],"":1,"e":{"":2,"f":null}}',
    '{"a":"x","b":[2],"g":NaN,"h":-Infinity,"i":[[]],"j":[null],"k":{"l":[1,"m"]}}',
    '{"a":{"z":1},"k":{"l":[true]},"n":1e+20,"o":-0.0,"p":[1,{"q":1}],"A":1,"`r":2}',
    "not json",
    None,
]


def test_infer_schema_is_what_reading_the_texts_as_a_json_file_infers(spark, tmp_path) -> None:
    rows = spark.createDataFrame([(text,) for text in TRICKY_JSON], "_tm_json string")
    rows.write.text(str(tmp_path / "texts"))  # the route infer_schema had before
    expected = spark.read.options(**INFER_OPTIONS).json(str(tmp_path / "texts")).schema
    got = infer_schema(spark, rows)
    assert got.fields == [f for f in expected.fields if f.name != "_corrupt_record"]
    assert infer_schema(spark, rows.where("false")).fields == []
