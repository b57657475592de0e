"""Document fields as columns: Spark's JSON schema inference, merged across versions.

New rows get their plain JSON (`curated_zone.TM_JSON`) from the document once; the schema is
the previous version's merged with what Spark infers from the new rows, and a field whose type
changes widens to string (Spark then keeps the raw JSON text of non-string values, so no value
is lost). The canonical document stays beside the columns as the lossless truth.

The per-row Python runs in Arrow UDFs (batches of pyarrow arrays, no pandas in between), made
on first use (`udfs`): `documents_udf` renders an event's canonical documents and the plain
JSON of its full document in one pass over the raw BSON; `document_json_udf` the canonical
ones alone; `flatten_udf` the plain JSON of rows that only have the canonical text. Their
bodies (`*_arrays`) are plain functions of pyarrow arrays.
"""

from __future__ import annotations

import json

import bsonjs
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
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

from jobs.curated_zone import OWN_PREFIX, TM_DELETED, TM_DOCUMENT, TM_JSON
from jobs.raw_zone import DOCUMENT_FIELDS, document_bson, events_documents
from jobs.transform.extjson import flatten, plain_json
from jobs.transform.udfs import arrow_udf_of
from tidemark.errors import SchemaFrozen

# A BSON date is written by `flatten` as exactly this form of ISO 8601 (UTC, milliseconds), and
# read back as a timestamp: a field whose every value is such an instant becomes a timestamp
# column (a field mixing them with other strings stays a string column).
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
JSON_OPTIONS = {
    "allowNonNumericNumbers": "true",
    "mode": "PERMISSIVE",
    "inferTimestamp": "true",
    "timestampFormat": TIMESTAMP_FORMAT,
}
# A field null in every new row says nothing of its type (Spark would call it a string and
# widen an existing number); rows whose field is left out are read from their JSON.
INFER_OPTIONS = {**JSON_OPTIONS, "dropFieldIfAllNull": "true"}

DOCUMENT_JSON_TYPE = StructType([StructField(name, StringType()) for name in DOCUMENT_FIELDS])
# documents_udf's struct: DOCUMENT_FIELDS, then the full document's plain JSON as the state's
# TM_JSON column has it (null where there is no full document).
DOCUMENTS_TYPE = StructType([*DOCUMENT_JSON_TYPE.fields, StructField(TM_JSON, StringType())])


def documents_json(raw: bytes) -> tuple[str | None, ...]:
    """`document_json(raw)` and `flatten` of its full document, the BSON parsed once."""
    return _rendered(document_bson(raw))


def _canonical(documents: tuple[bytes | None, ...]) -> tuple[str | None, ...]:
    return tuple(None if d is None else bsonjs.dumps(d, mode=bsonjs.CANONICAL) for d in documents)


def _rendered(documents: tuple[bytes | None, ...]) -> tuple[str | None, ...]:
    canonical = _canonical(documents)
    return (*canonical, plain_json(documents[0], canonical[0]))


def _struct(rows: list[tuple[str | None, ...]], schema: StructType) -> pa.StructArray:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema.fields)
    return pa.StructArray.from_arrays(
        [pa.array(column, pa.string()) for column in columns], names=schema.fieldNames()
    )


def documents_arrays(raw: pa.Array) -> pa.Array:
    """The events' canonical documents and plain JSON, from the raw zone's BSON bytes."""
    return _struct([_rendered(d) for d in events_documents(raw)], DOCUMENTS_TYPE)


def document_json_arrays(raw: pa.Array) -> pa.Array:
    """The events' documents as canonical Extended JSON, from the raw zone's BSON bytes."""
    return _struct([_canonical(d) for d in events_documents(raw)], DOCUMENT_JSON_TYPE)


def flatten_arrays(documents: pa.Array) -> pa.Array:
    """Canonical Extended JSON documents as plain JSON (`extjson.flatten`)."""
    return pa.array([flatten(d) for d in documents.to_pylist()], pa.string())


def documents_udf(raw: Column | str) -> Column:
    return arrow_udf_of(documents_arrays, DOCUMENTS_TYPE)(raw)


def document_json_udf(raw: Column | str) -> Column:
    return arrow_udf_of(document_json_arrays, DOCUMENT_JSON_TYPE)(raw)


def flatten_udf(documents: Column | str) -> Column:
    return arrow_udf_of(flatten_arrays, StringType())(documents)


def with_json(state: DataFrame) -> DataFrame:
    """Fill TM_JSON on rows that lack it, calling Python only for those rows (tombstones
    and barriers have no document, so no JSON)."""
    missing = F.col(TM_JSON).isNull() & ~F.col(TM_DELETED)
    have = state.where(~missing)
    need = state.where(missing).withColumn(TM_JSON, flatten_udf(F.col(TM_DOCUMENT)))
    return have.unionByName(need)


def infer_schema(spark: SparkSession, json_rows: DataFrame) -> StructType:
    """Spark's JSON schema inference over a one-column DataFrame of JSON texts.

    One pass where the data is (`spark.read.json` of a DataFrame, Spark 4.2+, Connect too): no
    file written, listed or removed, so nothing runs against the lake on the client. The
    schema is what reading those texts as a JSON file infers (with `INFER_OPTIONS`).

    Not `schema_of_variant_agg(try_parse_json(...))`: slower here (a variant is built per
    row), and its types are not JSON inference's (fractions as DECIMAL, VOID, empty structs
    and empty names kept, NaN and Infinity unparsed), so each would need mapping back.
    """
    inferred = spark.read.options(**INFER_OPTIONS).json(json_rows).schema
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


def only_adds(old: DataType, new: DataType | None) -> bool:
    """True when `new` is `old` with fields added (inside structs, at any depth): what Delta's
    schema evolution takes without a rewrite."""
    if new is None or old == new:
        return new is not None
    if isinstance(old, StructType) and isinstance(new, StructType):
        return all(only_adds(f.dataType, _type_of(new, f.name)) for f in old.fields)
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return only_adds(old.elementType, new.elementType)
    return False


def _type_of(schema: StructType, name: str) -> DataType | None:
    return next((f.dataType for f in schema.fields if f.name == name), None)


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


def schema_frozen(collection: str, changes: dict[str, list[str]]) -> SchemaFrozen:
    """The error of a stream with `schema: freeze` whose documents made `changes`."""
    return SchemaFrozen(
        f"Collection {collection}'s documents changed its `current` table's schema (columns "
        f"added: {', '.join(changes['added']) or 'none'}; changed: "
        f"{'; '.join(changes['widened']) or 'none'}), and its stream has "
        "`schema: freeze`. This run committed nothing to `current` or the state store, "
        "and the stream's transforms stop at these events: each tries them again.",
        "Set `schema: evolve` on the stream to take the change (columns are added or "
        "widened by the README's rule); the next transform then folds them.",
    )


def field_columns(schema: StructType) -> StructType:
    """The document fields that become columns: not Tidemark's own names (OWN_PREFIX), and of
    names that differ only in case (which Delta and most engines hold one column or field
    for), the first, at every depth; the others stay in TM_DOCUMENT only."""
    deduplicated = _first_of_case_twins(schema)
    assert isinstance(deduplicated, StructType)
    kept = [f for f in deduplicated.fields if not f.name.lower().startswith(OWN_PREFIX)]
    return StructType(kept)


def _first_of_case_twins(dtype: DataType) -> DataType:
    """`dtype` with, in each struct (inside arrays too), only the first of field names that
    differ only in case: Delta refuses `{"s": {"A": 1, "a": 2}}` as two fields (a legal
    document), and a run that keeps both fails again on every retry."""
    if isinstance(dtype, StructType):
        taken: set[str] = set()
        kept = []
        for f in dtype.fields:
            if f.name.lower() in taken:
                continue
            taken.add(f.name.lower())
            kept.append(StructField(f.name, _first_of_case_twins(f.dataType), True, f.metadata))
        return StructType(kept)
    if isinstance(dtype, ArrayType):
        return ArrayType(_first_of_case_twins(dtype.elementType), dtype.containsNull)
    return dtype


def expand(rows: DataFrame, schema: StructType, keep: list[str]) -> DataFrame:
    """The `keep` columns of `rows`, then one typed column per top-level document field of
    `schema` (`field_columns`), parsed from the rows' plain JSON."""
    fields = field_columns(schema).fields
    if not fields:
        return rows.select(*keep)
    parsed = F.from_json(F.col(TM_JSON), StructType(fields), JSON_OPTIONS)
    return rows.select(*keep, *(parsed.getField(f.name).alias(f.name) for f in fields))


def schema_from_json(text: str | None) -> StructType:
    return StructType.fromJson(json.loads(text)) if text else StructType([])
