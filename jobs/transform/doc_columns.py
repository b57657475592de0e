"""Document fields as columns: Spark's JSON schema inference, merged across versions.

New rows get their plain JSON (`_tm_json`) from the canonical document once; the schema is
the previous version's merged with what Spark infers from the new rows, and a field whose type
changes widens to string (Spark then keeps the raw JSON text of non-string values, so no value
is lost). The canonical document stays beside the columns as the lossless truth.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DoubleType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from jobs.raw_zone import DOCUMENT_FIELDS, document_json
from jobs.transform.extjson import flatten
from jobs.transform.fold import STATE_COLUMNS

JSON_OPTIONS = {"allowNonNumericNumbers": "true", "mode": "PERMISSIVE"}


@F.pandas_udf(StringType())
def flatten_udf(documents: pd.Series) -> pd.Series:
    return documents.map(flatten)


DOCUMENT_JSON_TYPE = StructType([StructField(name, StringType()) for name in DOCUMENT_FIELDS])


@F.pandas_udf(DOCUMENT_JSON_TYPE)
def document_json_udf(raw: pd.Series) -> pd.DataFrame:
    """The events' documents as canonical Extended JSON, from the raw zone's BSON bytes."""
    return pd.DataFrame([document_json(r) for r in raw], columns=list(DOCUMENT_FIELDS))


def with_json(state: DataFrame) -> DataFrame:
    """Fill `_tm_json` on rows that lack it, calling Python only for those rows (tombstones
    and barriers have no document, so no JSON)."""
    missing = F.col("_tm_json").isNull() & ~F.col("_tm_deleted")
    have = state.where(~missing)
    need = state.where(missing).withColumn("_tm_json", flatten_udf(F.col("_tm_document")))
    return have.unionByName(need)


def infer_schema(spark: SparkSession, json_rows: DataFrame, scratch: Path) -> StructType:
    """Spark's inference over a column of JSON texts (via a text file, so Connect works too)."""
    shutil.rmtree(scratch, ignore_errors=True)
    json_rows.write.text(str(scratch))
    try:
        if not any(scratch.glob("part-*")):
            return StructType([])
        inferred = spark.read.options(**JSON_OPTIONS).json(str(scratch)).schema
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return StructType([f for f in inferred.fields if f.name != "_corrupt_record"])


def merge_types(old: DataType, new: DataType) -> DataType:
    if old == new or isinstance(new, NullType):
        return old
    if isinstance(old, NullType):
        return new
    if isinstance(old, StructType) and isinstance(new, StructType):
        return merge_schemas(old, new)
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return ArrayType(merge_types(old.elementType, new.elementType), True)
    if {type(old), type(new)} == {LongType, DoubleType}:
        return DoubleType()  # what Spark's own inference does with int and float in one pass
    return StringType()


def merge_schemas(old: StructType, new: StructType) -> StructType:
    fields = {f.name: f.dataType for f in old.fields}
    for field in new.fields:
        fields[field.name] = (
            merge_types(fields[field.name], field.dataType)
            if (field.name in fields)
            else field.dataType
        )
    return StructType([StructField(name, dtype, True) for name, dtype in fields.items()])


def schema_changes(old: StructType, new: StructType) -> dict[str, list[str]]:
    """Top-level fields added and fields whose type changed, for run metadata."""
    before = {f.name: f.dataType for f in old.fields}
    added = [f.name for f in new.fields if f.name not in before]
    widened = [
        f"{f.name}: {before[f.name].simpleString()} -> {f.dataType.simpleString()}"
        for f in new.fields
        if f.name in before and before[f.name] != f.dataType
    ]
    return {"added": added, "widened": widened}


def expand(state: DataFrame, schema: StructType) -> DataFrame:
    """STATE_COLUMNS plus one column per top-level document field."""
    fields = [f for f in schema.fields if not f.name.startswith("_tm_")]
    if not fields:
        return state.select(*STATE_COLUMNS)
    parsed = F.from_json(F.col("_tm_json"), StructType(fields), JSON_OPTIONS)
    return state.select(*STATE_COLUMNS, *(parsed.getField(f.name).alias(f.name) for f in fields))


def schema_from_json(text: str | None) -> StructType:
    return StructType.fromJson(json.loads(text)) if text else StructType([])
