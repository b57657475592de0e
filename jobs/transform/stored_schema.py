"""The type rule's schema as `current` stores it in Delta, and back (issue 38).

Two things of Spark Connect shape how the typed columns are written:

- a cast to a type object sends each string with its collation, and the server then types the
  column `string collate UTF8_BINARY`, which Delta writes into the table's schema and which
  delta-rs and DuckDB refuse to read; a cast to a DDL text (`ddl`) gives the plain `string`;
- so field metadata can be given only where an alias gives it, on a top-level column. The
  type rule marks ObjectId fields at any depth (`type_rule.BSON_KIND`); a top-level column
  stores the paths of its marked sub-fields in its own metadata (`OBJECT_ID_PATHS`), and
  `read` puts the markers back where the rule expects them;
- Delta's schema evolution keeps an existing column's metadata, so the paths of sub-fields a
  later run adds to an existing column go to the table property of the same name (a JSON
  object of each column's paths, `paths_property`), set before the write that adds them.

Pure: Spark's type objects only.
"""

from __future__ import annotations

import json

from pyspark.sql.types import ArrayType, DataType, DecimalType, StructField, StructType

from jobs.transform.delta_io import quoted
from jobs.transform.type_rule import BSON_KIND, OBJECT_ID

# A top-level column's metadata: the paths of its marked sub-fields, each a JSON list of field
# names (Spark's metadata holds lists of strings, not lists of lists; a name may hold a dot).
OBJECT_ID_PATHS = "tidemark.bson.paths"


def ddl(dtype: DataType) -> str:
    """`dtype` as a Spark DDL type, every field name quoted."""
    if isinstance(dtype, StructType):
        fields = (f"{quoted(f.name)}: {ddl(f.dataType)}" for f in dtype.fields)
        return f"struct<{', '.join(fields)}>"
    if isinstance(dtype, ArrayType):
        return f"array<{ddl(dtype.elementType)}>"
    if isinstance(dtype, DecimalType):
        return f"decimal({dtype.precision}, {dtype.scale})"
    return dtype.simpleString()


def _marked(dtype: DataType, path: list[str]) -> list[list[str]]:
    if isinstance(dtype, ArrayType):
        return _marked(dtype.elementType, path)
    if not isinstance(dtype, StructType):
        return []
    found = []
    for f in dtype.fields:
        if BSON_KIND in f.metadata:
            found.append([*path, f.name])
        found += _marked(f.dataType, [*path, f.name])
    return found


def _paths(field: StructField) -> list[str]:
    return [json.dumps(path) for path in _marked(field.dataType, [])]


def stored_metadata(field: StructField) -> dict:
    """A top-level column's metadata as `current` stores it: its own, plus the paths of its
    marked sub-fields."""
    paths = _paths(field)
    return {**field.metadata, OBJECT_ID_PATHS: paths} if paths else dict(field.metadata)


def nested_paths(schema: StructType) -> dict[str, list[str]]:
    """The paths of each top-level column's marked sub-fields, for the columns with any."""
    return {f.name: paths for f in schema.fields if (paths := _paths(f))}


def paths_property(schema: StructType) -> tuple[str, str]:
    """The table property `OBJECT_ID_PATHS` for a table of `schema`, as (key, value): set
    before the write that adds the sub-fields, so that a repeat of a run killed between the
    two finds them marked."""
    return OBJECT_ID_PATHS, json.dumps(nested_paths(schema), sort_keys=True)


def _mark(dtype: DataType, path: list[str]) -> DataType:
    if isinstance(dtype, ArrayType):
        return ArrayType(_mark(dtype.elementType, path), dtype.containsNull)
    if not isinstance(dtype, StructType) or not path:
        return dtype
    fields = []
    for f in dtype.fields:
        if f.name == path[0]:
            inner = _mark(f.dataType, path[1:])
            own = {**f.metadata, BSON_KIND: OBJECT_ID} if len(path) == 1 else f.metadata
            f = StructField(f.name, inner, f.nullable, own)
        fields.append(f)
    return StructType(fields)


def read(schema: StructType, paths: str | None = None) -> StructType:
    """A schema read from `current` with its stored markers back on their sub-fields: those
    in its columns' metadata and those of the table property `paths` (`paths_property`)."""
    later = json.loads(paths) if paths else {}
    fields = []
    for f in schema.fields:
        metadata = dict(f.metadata)
        dtype = f.dataType
        for path in [*metadata.pop(OBJECT_ID_PATHS, []), *later.get(f.name, [])]:
            dtype = _mark(dtype, json.loads(path))
        fields.append(StructField(f.name, dtype, f.nullable, metadata))
    return StructType(fields)
