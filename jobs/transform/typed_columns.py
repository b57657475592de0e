"""The type rule over Arrow batches: the bodies of the fold's Spark functions (issue 38).

Documents arrive as canonical Extended JSON (the change log's `full_document`, null for a
delete) and are decoded once per batch. `census_batches` is a `mapInArrow` body: one row per
partition, that partition's census (`field_census`) as JSON, added up on the driver to decide
the run's columns (`type_rule.schema_from`); `census_by_namespace_batches` gives one per
collection in the partition, so one job counts all of a segment's collections. `typed_struct`
is an Arrow UDF's body: each document's typed values (`type_rule.place`, compiled by `placer`)
as a struct of the schema's columns, followed by `RESIDUAL`, the values no column holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import bson
import bsonjs
import pyarrow as pa
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, StringType, StructField, StructType

from jobs.curated_zone import TM_DOCUMENT, TM_RESIDUAL
from jobs.transform.field_census import Census, census, from_json, merge_census, to_json
from jobs.transform.placer import placer
from jobs.transform.stored_schema import ddl, stored_metadata
from jobs.transform.type_rule import arrow_type, residual_json
from jobs.transform.udfs import arrow_udf_of

RESIDUAL = TM_RESIDUAL  # canonical Extended JSON of the fields no column holds, or null
# A delete's residual in the fold's MERGE source, never in a table: no residual is empty text.
DELETED = ""
CENSUS = "census"
# Dates of any year (out of Python's range as DatetimeMS), UUIDs as the Binary they are.
CODEC = CodecOptions(
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)


def decoded(documents: pa.Array) -> list[dict[str, Any] | str | None]:
    """Canonical Extended JSON documents as Python values, nulls kept; a document whose
    values do not give back its BSON exactly stays its text, kept whole in the residual."""
    return [None if text is None else _decoded(text) for text in documents.to_pylist()]


def _decoded(text: str) -> dict[str, Any] | str:
    # Python's values lose what they cannot say: a name repeated at one level (MongoDB stores
    # both), a DBRef's field order, the deprecated symbol, undefined and DBPointer types. Such
    # a document is not placed at all; re-encoding shows it (about 6 us a document here).
    try:
        raw = bsonjs.loads(text)
    except ValueError:  # deeper than libbson's JSON parser reads (about 90 levels of values)
        return text
    document = bson.decode(raw, CODEC)
    return document if bson.encode(document) == raw else text


def census_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's placeable documents (its batches' first column) counted: one row,
    `CENSUS`."""
    documents = [d for batch in batches for d in decoded(batch.column(0)) if isinstance(d, dict)]
    yield pa.RecordBatch.from_pydict({CENSUS: [to_json(census(documents))]})


def census_by_namespace_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's rows (db, coll, document or null) counted per collection: one row per
    collection it holds, with `CENSUS` of its placeable documents (none for deletes alone)."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for batch in batches:
        namespaces = zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
        for ns, document in zip(namespaces, decoded(batch.column(2)), strict=True):
            placed = found.setdefault(ns, [])
            if isinstance(document, dict):
                placed.append(document)
    yield pa.RecordBatch.from_pydict(
        {
            "db": [db for db, _ in found],
            "coll": [coll for _, coll in found],
            CENSUS: [to_json(census(documents)) for documents in found.values()],
        }
    )


def typed_type(schema: StructType) -> StructType:
    """What `typed_struct` returns for `schema`: its columns, then `RESIDUAL`."""
    return StructType([*schema.fields, StructField(RESIDUAL, StringType(), True)])


def typed_struct(documents: pa.Array, schema: StructType) -> pa.StructArray:
    """Each document's typed values and residual (`typed_type`); for a delete, typed values
    all null and the residual `DELETED`; for a document kept whole (`decoded`), typed values
    all null and the residual its text."""
    place = placer(schema)
    found = decoded(documents)
    placed = [place(d) if isinstance(d, dict) else None for d in found]
    rows = pa.array([{} if p is None else p[0] for p in placed], arrow_type(schema))
    residuals = pa.array(
        [
            residual_json(p[1]) if p is not None else DELETED if d is None else d
            for d, p in zip(found, placed, strict=True)
        ],
        pa.string(),
    )
    columns = [*rows.flatten(), residuals]
    return pa.StructArray.from_arrays(columns, names=typed_type(schema).fieldNames())


def run_census(documents: DataFrame) -> Census:
    """The census of a frame's documents (its one column, canonical Extended JSON): one
    `mapInArrow` job, a row per partition, added on the driver."""
    rows = documents.mapInArrow(census_batches, f"{CENSUS} string").collect()
    counted: Census = {}
    for row in rows:
        counted = merge_census(counted, from_json(row[CENSUS]))
    return counted


def run_censuses(rows: DataFrame) -> dict[tuple[str, str], Census]:
    """The census of each collection among `rows` (db, coll, then a document as canonical
    Extended JSON or null), every collection with a row named: one `mapInArrow` job for all."""
    schema = f"db string, coll string, {CENSUS} string"
    counted: dict[tuple[str, str], Census] = {}
    for row in rows.mapInArrow(census_by_namespace_batches, schema).collect():
        ns = (row["db"], row["coll"])
        counted[ns] = merge_census(counted.get(ns, {}), from_json(row[CENSUS]))
    return counted


@functools.cache
def _typed_body(schema_json: str) -> Any:
    """`typed_struct` for one schema, as the plain function of one Arrow array a UDF needs
    (made once per schema, so the UDF made of it is too)."""
    schema = StructType.fromJson(json.loads(schema_json))

    def body(documents: pa.Array) -> pa.Array:
        return typed_struct(documents, schema)

    return body


def _bare(dtype: DataType) -> DataType:
    """`dtype` without field metadata: what Spark reads from an Arrow UDF's output, and so
    the return type it must be declared with."""
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _bare(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(_bare(dtype.elementType), True)
    return dtype


def with_typed_columns(rows: DataFrame, schema: StructType, keep: list[str]) -> DataFrame:
    """The `keep` columns of `rows`, then RESIDUAL and the schema's typed columns, placed
    from the rows' TM_DOCUMENT (null where it is), each column with its field's metadata
    (ObjectId markers inside sub-documents too, as `stored_schema` keeps them)."""
    udf = arrow_udf_of(_typed_body(schema.json()), _bare(typed_type(schema)))
    typed = rows.select(*keep, udf(F.col(TM_DOCUMENT)).alias("_typed"))
    columns = typed_type(schema).fields
    value = F.col("_typed").getField
    return typed.select(*keep, *(_marked(value(f.name), f) for f in columns))


def _marked(column: Any, field: StructField) -> Any:
    """The UDF's bare `column` as `current` stores `field` (`stored_schema`): a cast to its
    DDL type (the plain `string` over Spark Connect too), the markers by alias."""
    return column.cast(ddl(field.dataType)).alias(field.name, metadata=stored_metadata(field))
