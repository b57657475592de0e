"""Issue 38's shape of `current`, ahead of the fold that will write it: the type rule's Arrow
rows and residual, written by Spark as a Delta table with deletion vectors (and nothing that
needs column mapping or type widening), read back value for value by Spark and by delta-rs's
SQL engine. Outside the suite, DuckDB 1.5.5's delta extension and Polars 2.1 read the same
table (issue 38's note); their lines join this test with their pinned dependencies."""

from __future__ import annotations

from datetime import UTC, datetime
from operator import itemgetter

import pyarrow as pa
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex
from pyspark.sql.types import StructType

from jobs.transform.type_rule import schema_for, typed_rows
from tests.helpers.delta_reading import query

OID = ObjectId("6b09b2d07fd6d42aacd7d70a")
DOCUMENTS = [
    {
        "_id": OID,
        "refs": [OID],
        "n": Int64(2**40),
        "price": Decimal128("12.50"),
        "at": datetime(1969, 7, 20, 20, 17, tzinfo=UTC),
        "o": {"p": [1.5, 2.0], "q": "x"},
    },
    {
        "_id": ObjectId("6b09b2d07fd6d42aacd7d70b"),
        "refs": [],
        "n": 2.5,  # a fraction in a long column
        "price": Decimal128("1E+40"),  # past 38 digits
        "at": datetime(1, 1, 1, tzinfo=UTC),
        "o": {"p": [3.0], "q": Regex("a")},
    },
]


def test_typed_rows_and_residual_read_back_from_spark_and_delta_rs(spark, tmp_path):
    schema = schema_for(StructType([]), DOCUMENTS[:1])
    rows, residuals = typed_rows(DOCUMENTS, schema)
    table = pa.Table.from_struct_array(rows).append_column("_tm_residual", residuals)
    path = tmp_path / "current"
    spark.createDataFrame(table).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(str(path))
    expected = table.to_pylist()
    # toArrow, not collect: PySpark's collect() fails on a year-1 timestamp (ValueError:
    # year 0 is out of range), the Arrow path does not.
    by_spark = spark.read.format("delta").load(str(path)).toArrow().to_pylist()
    by_delta_rs = query(path, "SELECT * FROM t")
    key = itemgetter("_id")
    assert sorted(by_spark, key=key) == sorted(expected, key=key)
    assert sorted(by_delta_rs, key=key) == sorted(expected, key=key)
    assert expected[1]["n"] is None and expected[1]["o"]["q"] is None
    assert '"n" : { "$numberDouble" : "2.5" }' in expected[1]["_tm_residual"]
