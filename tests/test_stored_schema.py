"""`current`'s schema as Delta stores it (jobs.transform.stored_schema): the ObjectId markers of
sub-fields, kept on the top-level column, come back where the type rule put them, and the DDL
a column is cast to is its type, whatever its field names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from jobs.transform.stored_schema import (
    OBJECT_ID_PATHS,
    ddl,
    nested_paths,
    paths_property,
    read,
    stored_metadata,
)
from jobs.transform.type_rule import BSON_KIND, OBJECT_ID, schema_for
from tests.test_type_rule import documents

pytestmark = pytest.mark.fast


def _stored(schema: StructType) -> StructType:
    """The schema as a table holds it: no metadata below the top level."""

    def bare(dtype):
        if isinstance(dtype, StructType):
            return StructType([StructField(f.name, bare(f.dataType)) for f in dtype.fields])
        return dtype.__class__(bare(dtype.elementType)) if hasattr(dtype, "elementType") else dtype

    return StructType(
        [StructField(f.name, bare(f.dataType), True, stored_metadata(f)) for f in schema.fields]
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(documents, min_size=1, max_size=5))
def test_markers_stored_on_the_top_column_come_back_where_the_rule_put_them(batch):
    schema = schema_for(StructType([]), batch)
    assert read(_stored(schema)) == schema


def test_a_nested_marker_is_a_path_and_odd_names_are_quoted():
    oid = StructField("a b`c", StringType(), True, {BSON_KIND: OBJECT_ID})
    many = StructField("ids", ArrayType(StringType()), True, {BSON_KIND: OBJECT_ID})
    inner = StructType([oid, many, StructField("d", DecimalType(38, 2))])
    schema = StructType([StructField("r", ArrayType(inner)), StructField("n", LongType())])
    assert stored_metadata(schema["r"]) == {OBJECT_ID_PATHS: ['["a b`c"]', '["ids"]']}
    assert stored_metadata(schema["n"]) == {}
    assert ddl(schema["r"].dataType) == (
        "array<struct<`a b``c`: string, `ids`: array<string>, `d`: decimal(38, 2)>>"
    )
    assert read(_stored(schema)) == schema


def test_markers_of_sub_fields_a_later_run_adds_come_back_from_the_table_property():
    oid = {BSON_KIND: OBJECT_ID}
    first = StructType([StructField("a", StringType(), True, oid)])
    later = StructType([*first.fields, StructField("it's", ArrayType(StringType()), True, oid)])
    made, grown = StructType([StructField("r", first)]), StructType([StructField("r", later)])
    # Delta's schema evolution keeps the column's metadata from when the table was made.
    table = StructType(
        [StructField("r", _stored(grown)["r"].dataType, True, _stored(made)["r"].metadata)]
    )
    key, value = paths_property(grown)
    assert key == OBJECT_ID_PATHS and nested_paths(grown) == {"r": ['["a"]', '["it\'s"]']}
    assert read(table) != grown  # the column's metadata alone misses the later sub-field
    assert read(table, value) == grown
