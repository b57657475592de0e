"""The type rule over Arrow batches: the bodies of the fold's Spark functions (issue 38).

Documents arrive as canonical Extended JSON (the change log's `full_document`, null for a
delete) and are decoded once per batch. `census_batches` is a `mapInArrow` body: one row per
partition, that partition's census (`field_census`) as JSON, added up on the driver to decide
the run's columns (`type_rule.schema_from`). `typed_struct` is an Arrow UDF's body: each
document's typed values (`type_rule.place`) as a struct of the schema's columns, followed by
`RESIDUAL`, the values no column holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import bson
import bsonjs
import pyarrow as pa
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from pyspark.sql.types import StringType, StructField, StructType

from jobs.transform.field_census import census, to_json
from jobs.transform.type_rule import arrow_type, place, residual_json

RESIDUAL = "_tm_residual"  # canonical Extended JSON of the fields no column holds, or null
CENSUS = "census"
# Dates of any year (out of Python's range as DatetimeMS), UUIDs as the Binary they are.
CODEC = CodecOptions(
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)


def decoded(documents: pa.Array) -> list[dict[str, Any] | None]:
    """Canonical Extended JSON documents as Python values, nulls kept."""
    return [
        None if text is None else bson.decode(bsonjs.loads(text), CODEC)
        for text in documents.to_pylist()
    ]


def census_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's documents (its batches' first column) counted: one row, `CENSUS`."""
    documents = [document for batch in batches for document in decoded(batch.column(0)) if document]
    yield pa.RecordBatch.from_pydict({CENSUS: [to_json(census(documents))]})


def typed_type(schema: StructType) -> StructType:
    """What `typed_struct` returns for `schema`: its columns, then `RESIDUAL`."""
    return StructType([*schema.fields, StructField(RESIDUAL, StringType(), True)])


def typed_struct(documents: pa.Array, schema: StructType) -> pa.StructArray:
    """Each document's typed values and residual (`typed_type`); all null for a delete."""
    placed = [place(d, schema) if d is not None else ({}, {}) for d in decoded(documents)]
    rows = pa.array([row for row, _ in placed], arrow_type(schema))
    residuals = pa.array([residual_json(rest) for _, rest in placed], pa.string())
    columns = [*rows.flatten(), residuals]
    return pa.StructArray.from_arrays(columns, names=typed_type(schema).fieldNames())
