"""The census the type rule decides a run's columns from (jobs.transform.field_census): counted
in parts, as Spark's partitions count a run, it gives the schema of the whole, whatever the
order or the split, so a repeated run chooses the same columns."""

from __future__ import annotations

import pytest
from bson.objectid import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import DoubleType, LongType, StringType, StructType

from jobs.transform.field_census import census, from_json, merge_census, to_json
from jobs.transform.type_rule import BSON_KIND, OBJECT_ID, schema_for, schema_from
from tests.test_type_rule import documents

pytestmark = pytest.mark.fast


@settings(max_examples=200, deadline=None)
@given(
    st.lists(documents, max_size=3),
    st.lists(documents, min_size=1, max_size=6),
    st.data(),
)
def test_parts_counted_apart_give_the_schema_of_the_whole_in_any_order(first, run, data):
    existing = schema_for(StructType([]), first)
    cut = data.draw(st.integers(0, len(run)))
    shuffled = data.draw(st.permutations(run))
    parts = [census(run[:cut]), census(run[cut:])]
    added = merge_census(*parts)
    assert added == merge_census(*reversed(parts))
    assert from_json(to_json(added)) == added  # what crosses from the workers to the driver
    whole = schema_for(existing, run)
    assert schema_from(existing, added) == whole
    assert schema_for(existing, shuffled) == whole


@pytest.mark.parametrize(
    ("values", "column"),
    [
        ([1, 2, "x"], LongType()),  # most values are numbers: the stray string is residual
        (["x", "y", 1], StringType()),
        ([1, 2.5, "x", "y"], DoubleType()),  # a tie: numbers come before strings
        ([ObjectId(), ObjectId(), "x"], StringType()),
    ],
)
def test_a_new_field_gets_the_column_of_the_kind_most_of_its_values_have(values, column):
    schema = schema_for(StructType([]), [{"f": v} for v in values])
    (field,) = schema.fields
    assert field.dataType == column
    assert (field.metadata.get(BSON_KIND) == OBJECT_ID) == isinstance(values[0], ObjectId)
