"""Which column a document's value goes to, and what goes to the residual (issue 38).

One rule for `current`'s typed columns, pure (Spark's type objects, no session):

- a field gets its column the first time a run meets it (`schema_from`), of the kind most of
  that run's values have (`field_census`: counted per partition and added, so the choice
  never depends on the order or split of the run's documents); new columns come in name
  order; a column's type never changes afterwards (no rewrite, and no Delta `typeWidening`,
  which delta-rs and Polars refuse to read: `number_columns`);
- a value goes to its column when the column's type holds it exactly (`place`); else the
  column holds null and the value goes to the row's residual: canonical Extended JSON of a
  document with just the misfit fields at their paths, null when everything fits;
- booleans, strings, numbers (`number_columns`), dates within years 1-9999 (timestamps),
  binaries of subtype 0, sub-documents (structs) and arrays (of one element type) have
  columns, once a value says their type: an empty sub-document or array does not (Parquet
  has no empty struct, and an element type guessed early would refuse every later element),
  and an empty sub-document always goes to the residual (in a struct column it would read
  as a sub-document of nulls);
- an ObjectId goes to a string column marked in its metadata, so that an ObjectId and a
  string never share a column; every other BSON type (regex, BSON timestamps, MinKey,
  MaxKey, code, UUIDs and other binary subtypes) always goes to the residual;
- a field named like Tidemark's own columns (`OWN_PREFIX`) or like the columns Delta's change
  data feed adds (`_change_type`, `_commit_version`, `_commit_timestamp`), or differing only
  in case from an earlier field of the same document level, from a column, or from a name
  that sorts before it in the same run (Delta holds names regardless of case), has no
  column: its value goes to the residual.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import bson
import bsonjs
import pyarrow as pa
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.transform.field_census import Census, FieldCensus, census, column_names
from jobs.transform.number_columns import holds_exactly, stored
from tidemark.errors import SchemaFrozen

BSON_KIND = "tidemark.bson"  # a column's metadata key: the BSON type a string column holds
OBJECT_ID = "objectId"
FIRST_INSTANT = datetime(1, 1, 1, tzinfo=UTC)
LAST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
NUMBERS = (int, Int64, float, Decimal128)
_SCALAR_COLUMNS: dict[str | None, DataType] = {
    "boolean": BooleanType(),
    "string": StringType(),
    "objectId": StringType(),  # marked by `_field`
    "date": TimestampType(),
    "binary": BinaryType(),
}
_ARROW = {
    BooleanType: pa.bool_(),
    LongType: pa.int64(),
    DoubleType: pa.float64(),
    StringType: pa.string(),
    BinaryType: pa.binary(),
    TimestampType: pa.timestamp("us", tz="UTC"),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, NUMBERS) and not isinstance(value, bool)


def _column_type(counted: FieldCensus) -> DataType | None:
    """The column type of a new field, from its run's values (None: no column yet, as for a
    field only ever null, or whose values are mostly of a type with no column)."""
    kind = counted.kind()
    if kind == "number":
        return counted.numbers.column()
    if kind == "document":
        inner = schema_from(StructType([]), counted.fields)
        return inner if inner.fields else None  # Parquet has no empty struct: no column yet
    if kind == "array":
        element = None if counted.items is None else _column_type(counted.items)
        return ArrayType(element, True) if element is not None else None  # no element yet
    return _SCALAR_COLUMNS.get(kind)


def _object_ids(counted: FieldCensus) -> bool:
    """Whether the column holds ObjectIds (or arrays of them, at any depth)."""
    kind = counted.kind()
    if kind == "array" and counted.items is not None:
        return _object_ids(counted.items)
    return kind == "objectId"


def _field(name: str, counted: FieldCensus) -> StructField | None:
    dtype = _column_type(counted)
    if dtype is None:
        return None
    # An ObjectId column, or an array (of arrays) of ObjectIds, is marked: the elements'
    # marker lives on the array's field, as they have no field of their own.
    metadata = {BSON_KIND: OBJECT_ID} if _object_ids(counted) else {}
    return StructField(name, dtype, True, metadata)


def schema_for(existing: StructType, documents: list[dict[str, Any]]) -> StructType:
    """`schema_from` the documents' census."""
    return schema_from(existing, census(documents))


def schema_from(existing: StructType, counted: Census) -> StructType:
    """`existing` with a column for each field the census counts that it lacks (inside
    sub-documents too), in name order; no existing column changes its type. A function of
    the counts alone: the same however a run's documents were ordered or split."""
    fields = {f.name: f for f in existing.fields}
    order = [f.name for f in existing.fields]
    lowered = {name.lower() for name in order}
    for name in sorted(counted):
        field_census, old = counted[name], fields.get(name)
        if old is None:
            if name.lower() in lowered:
                continue  # a case twin of a column (of an earlier run or this one): residual
            lowered.add(name.lower())
            new = _field(name, field_census)
            if new is not None:
                fields[name] = new
                order.append(name)
        elif isinstance(old.dataType, StructType):
            inner = schema_from(old.dataType, field_census.fields)
            fields[name] = StructField(name, inner, True, old.metadata)
        elif (
            isinstance(old.dataType, ArrayType)
            and isinstance(old.dataType.elementType, StructType)
            and field_census.items is not None
        ):  # an array of sub-documents: their new fields too
            element = schema_from(old.dataType.elementType, field_census.items.fields)
            fields[name] = StructField(name, ArrayType(element, True), True, old.metadata)
    return StructType([fields[name] for name in order])


def _fits(field: StructField, value: Any) -> bool:
    dtype = field.dataType
    if value is None:
        return True
    if isinstance(dtype, BooleanType):
        return isinstance(value, bool)
    if isinstance(dtype, StringType):
        oid = field.metadata.get(BSON_KIND) == OBJECT_ID
        return isinstance(value, ObjectId) if oid else type(value) is str
    if isinstance(dtype, TimestampType):
        return isinstance(value, datetime) and FIRST_INSTANT <= value <= LAST_INSTANT
    if isinstance(dtype, BinaryType):
        return type(value) is bytes
    if isinstance(dtype, ArrayType):
        element = StructField("element", dtype.elementType, True, field.metadata)
        return isinstance(value, list) and all(_fits_whole(element, item) for item in value)
    if isinstance(dtype, StructType):
        # {} would read as a struct of nulls, the same as {"a": null}: it keeps its place in
        # the residual, as it does before its field has a column.
        return isinstance(value, dict) and bool(value)
    return _is_number(value) and holds_exactly(dtype, value)


def _fits_whole(field: StructField, value: Any) -> bool:
    """Whether the value fits with nothing left for the residual (an array's element: the
    residual keeps a misfit array whole)."""
    if not _fits(field, value):
        return False
    if isinstance(field.dataType, StructType) and isinstance(value, dict):
        _, rest = place(value, field.dataType)
        return not rest
    return True


def _typed(field: StructField, value: Any) -> Any:
    if isinstance(value, ObjectId):
        return str(value)
    if _is_number(value):
        return stored(field.dataType, value)
    if isinstance(value, list):
        element = StructField("element", field.dataType.elementType, True, field.metadata)
        return [_typed(element, item) for item in value]
    if isinstance(value, dict) and isinstance(field.dataType, StructType):
        return place(value, field.dataType)[0]
    return value


def place(document: dict[str, Any], schema: StructType) -> tuple[dict[str, Any], dict]:
    """The document's typed values by column name (null where it has no value or the value
    does not fit), and its residual: the fields, at their paths, that no column holds."""
    row: dict[str, Any] = {}
    residual: dict[str, Any] = {}
    columns = {f.name: f for f in schema.fields}
    named = set(column_names(document))
    for name, value in document.items():
        field = columns.get(name)
        if field is None or name not in named or not _fits(field, value):
            residual[name] = value
            continue
        if isinstance(field.dataType, StructType) and isinstance(value, dict):
            inner, rest = place(value, field.dataType)
            row[name] = inner
            if rest:
                residual[name] = rest
        else:
            row[name] = _typed(field, value)
    return row, residual


def residual_json(residual: dict[str, Any]) -> str | None:
    """The residual as canonical Extended JSON, or None when everything fit."""
    if not residual:
        return None
    return bsonjs.dumps(bson.encode(residual), mode=bsonjs.CANONICAL)


def arrow_type(dtype: DataType) -> pa.DataType:
    """The Arrow type Spark reads as `dtype` (an Arrow UDF's output, a Parquet column)."""
    if isinstance(dtype, StructType):
        return pa.struct([pa.field(f.name, arrow_type(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return pa.list_(arrow_type(dtype.elementType))
    if isinstance(dtype, DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    return _ARROW[type(dtype)]


def typed_rows(documents: list[dict[str, Any]], schema: StructType) -> tuple[pa.Array, pa.Array]:
    """Each document placed (`place`): its typed values as one Arrow struct array of
    `schema`, and its residual as canonical Extended JSON (null where everything fit)."""
    placed = [place(document, schema) for document in documents]
    rows = pa.array([row for row, _ in placed], arrow_type(schema))
    residuals = pa.array([residual_json(rest) for _, rest in placed], pa.string())
    return rows, residuals


def schema_changes(old: StructType, new: StructType) -> dict[str, list[str]]:
    """What a run did to a table's columns, for run metadata: top-level columns added, and
    columns whose type grew (a struct that gained a field; no type changes otherwise)."""
    before = {f.name: f.dataType for f in old.fields}
    added = [f.name for f in new.fields if f.name not in before]
    widened = [
        f"{f.name}: {before[f.name].simpleString()} -> {f.dataType.simpleString()}"
        for f in new.fields
        if f.name in before and before[f.name] != f.dataType
    ]
    return {"added": added, "widened": widened}


def add_changes(report: dict[str, list[str]], changes: dict[str, list[str]]) -> None:
    """A table's `schema_changes` added to a run's report of them, each once."""
    for kind in ("added", "widened"):
        report[kind] += [c for c in changes[kind] if c not in report[kind]]


def schema_frozen(collection: str, changes: dict[str, list[str]]) -> SchemaFrozen:
    """The error of a stream with `schema: freeze` whose documents made `changes`."""
    return SchemaFrozen(
        f"Collection {collection}'s documents changed its `current` table's schema (columns "
        f"added: {', '.join(changes['added']) or 'none'}; changed: "
        f"{'; '.join(changes['widened']) or 'none'}), and its stream has "
        "`schema: freeze`. This run committed nothing to `current` or the state store, "
        "and the stream's transforms stop at these events: each tries them again.",
        "Set `schema: evolve` on the stream to take the change (new fields get columns by "
        "the README's type rule); the next transform then folds them.",
    )
