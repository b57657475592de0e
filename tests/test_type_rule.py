"""The type rule of `current`'s columns (jobs.transform.type_rule): over generated documents of
every BSON type, a typed value is never a wrong value, the typed values and the residual
together give back every value, and a later run's schema never changes a column's type."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import bson
import bsonjs
import pytest
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.objectid import ObjectId
from bson.regex import Regex
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import ArrayType, StructField, StructType

from jobs.transform.number_columns import exact
from jobs.transform.placer import placer
from jobs.transform.type_rule import (
    BSON_KIND,
    OBJECT_ID,
    arrow_type,
    place,
    residual_json,
    schema_for,
    typed_rows,
)

pytestmark = pytest.mark.fast

CODEC = CodecOptions(
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)
NAMES = ["a", "A", "b", "n", "_tm_x", "_change_type", "s"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(),
    st.decimals(allow_nan=True, places=None)
    .filter(lambda d: not d.is_finite() or len(d.as_tuple().digits) <= 34)
    .filter(lambda d: not d.is_finite() or -6143 <= d.as_tuple().exponent <= 6111)
    .map(Decimal128),
    st.text(max_size=3),
    st.builds(ObjectId),
    st.datetimes(timezones=st.just(UTC)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
    st.integers(-(2**62), 2**62).map(DatetimeMS),
    st.binary(max_size=3),
    st.builds(lambda: Binary.from_uuid(uuid.UUID(int=7))),
    st.just(Regex("a+", "i")),
    st.just(MaxKey()),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    ),
    max_leaves=8,
)
documents = st.dictionaries(st.sampled_from(NAMES), values, max_size=5).map(
    lambda d: bson.decode(bson.encode(d), CODEC)  # what the fold decodes from the raw zone
)


def norm(value):
    """A value compared by what it is, not how Python holds it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | Int64 | float | Decimal128 | Decimal):
        number = Decimal(value) if isinstance(value, Decimal) else exact(value)
        if number.is_nan():
            return ("num", "nan")  # BSON keeps no NaN's sign
        return ("num", number, number.is_signed())
    if isinstance(value, dict):
        kept = {k: norm(v) for k, v in value.items()}
        return ("doc", {k: v for k, v in kept.items() if v is not None})
    if isinstance(value, list):
        return ("arr", [norm(v) for v in value])
    return (type(value).__name__, value)


def only_adds(old, new) -> bool:
    if isinstance(old, StructType) and isinstance(new, StructType):
        fields = {f.name: f.dataType for f in new.fields}
        return all(f.name in fields and only_adds(f.dataType, fields[f.name]) for f in old.fields)
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return only_adds(old.elementType, new.elementType)
    return old == new


def case_twins(dtype) -> bool:
    if isinstance(dtype, StructType):
        names = [f.name.lower() for f in dtype.fields]
        return len(names) != len(set(names)) or any(case_twins(f.dataType) for f in dtype.fields)
    if isinstance(dtype, ArrayType):
        return case_twins(dtype.elementType)
    return False


def empty_structs(dtype) -> bool:
    if isinstance(dtype, StructType):
        return not dtype.fields or any(empty_structs(f.dataType) for f in dtype.fields)
    if isinstance(dtype, ArrayType):
        return empty_structs(dtype.elementType)
    return False


def from_column(field: StructField, value, residual):
    """A typed value as the document held it (an ObjectId column's text as an ObjectId)."""
    if value is None:
        return None
    if isinstance(field.dataType, StructType):
        return rebuild(value, residual or {}, field.dataType)
    if isinstance(field.dataType, ArrayType):
        element = StructField("element", field.dataType.elementType, True, field.metadata)
        return [from_column(element, item, None) for item in value]
    if field.metadata.get(BSON_KIND) == OBJECT_ID:
        return ObjectId(value)
    return value


def rebuild(row: dict, residual: dict, schema: StructType) -> dict:
    """The document's values from its typed values and its residual."""
    fields = {f.name: f for f in schema.fields}
    out = {name: from_column(fields[name], v, residual.get(name)) for name, v in row.items()}
    for name, value in residual.items():
        if out.get(name) is None:
            out[name] = value
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(documents, min_size=1, max_size=4), st.lists(documents, max_size=4))
def test_typed_values_and_the_residual_give_back_every_value(first, later):
    schema = schema_for(StructType([]), first)
    after = schema_for(schema, later)
    # Parquet and Delta hold no empty struct.
    assert not any(empty_structs(f.dataType) for f in after.fields), after
    for old in schema.fields:  # a later run adds fields, never changes a type
        new = next(f for f in after.fields if f.name == old.name)
        assert only_adds(old.dataType, new.dataType), (old, new)
    assert not case_twins(after), after  # Delta holds names regardless of case
    for document in first + later:
        row, residual = place(document, after)
        assert norm(rebuild(row, residual, after)) == norm(document)
        text = residual_json(residual)
        assert (text is None) == (not residual)
        if text is not None:
            assert norm(bson.decode(bsonjs.loads(text), CODEC)) == norm(residual)


@pytest.mark.parametrize(
    ("first", "then", "residual"),
    [
        ({"n": 1}, {"n": 2.5}, {"n": 2.5}),  # a long column: the fraction is not rounded
        ({"s": "x"}, {"s": ObjectId("6b09b2d07fd6d42aacd7d70a")}, None),
        (
            {"d": datetime(2020, 1, 1, tzinfo=UTC)},
            {"d": bson.datetime_ms.DatetimeMS(-(2**62))},
            None,
        ),
        ({"a": [1, 2]}, {"a": [1, "x"]}, {"a": [1, "x"]}),  # an array misfits whole
        ({"r": [ObjectId("6b09b2d07fd6d42aacd7d70a")]}, {"r": ["6b09b2d07fd6d42aacd7d70a"]}, None),
        ({"o": {"p": 1}}, {"o": {"p": "x", "q": 2}}, {"o": {"p": "x"}}),
        ({"e": {}}, {"e": {}}, None),  # no empty struct column: Parquet has none
        ({"e": {"p": 1}}, {"e": {}}, None),  # {} is not a struct of nulls ({"p": null})
        ({"l": [{"p": 1}]}, {"l": [{"p": 2}, {}]}, None),  # nor inside an array
    ],
)
def test_a_value_its_column_cannot_hold_goes_to_the_residual_and_the_column_holds_null(
    first, then, residual
):
    schema = schema_for(StructType([]), [first])
    schema = schema_for(schema, [then])
    row, rest = place(then, schema)
    expected = residual if residual is not None else then
    assert norm(rest) == norm(expected)
    for name in expected:
        column = row.get(name)
        assert column is None or isinstance(column, dict), (name, column)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"a": []}, {"a": [1, 2]}),  # the element type comes with the first element
        ({"l": [{"p": 1}]}, {"l": [{"p": 2, "q": "x"}]}),  # sub-documents in an array grow
        ({"o": {"p": 1}}, {"o": {"p": 2, "q": [True]}}),
    ],
)
def test_a_later_run_gives_new_fields_their_columns(first, then):
    schema = schema_for(schema_for(StructType([]), [first]), [then])
    row, residual = place(then, schema)
    assert residual == {}
    assert norm(rebuild(row, {}, schema)) == norm(then)


def test_what_fits_is_typed_with_nothing_left_over():
    oid = ObjectId("6b09b2d07fd6d42aacd7d70a")
    when = datetime(1969, 7, 20, 20, 17, tzinfo=UTC)  # before 1970 too
    document = {
        "_id": oid,
        "refs": [oid, oid],
        "n": Int64(2**40),
        "price": Decimal128("12.50"),
        "at": when,
        "o": {"p": [1.5, 2.0]},
    }
    schema = schema_for(StructType([]), [document])
    row, residual = place(document, schema)
    assert residual == {}
    assert row == {
        "_id": str(oid),
        "refs": [str(oid), str(oid)],
        "n": 2**40,
        "price": Decimal("12.50"),
        "at": when,
        "o": {"p": [1.5, 2.0]},
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(documents, min_size=1, max_size=5))
def test_the_typed_rows_are_an_arrow_array_of_the_schema_with_the_same_values(batch):
    schema = schema_for(StructType([]), batch)
    rows, residuals = typed_rows(batch, schema)
    assert rows.type == arrow_type(schema) and len(rows) == len(residuals) == len(batch)
    for document, row, text in zip(batch, rows.to_pylist(), residuals.to_pylist(), strict=True):
        residual = bson.decode(bsonjs.loads(text), CODEC) if text is not None else {}
        assert norm(rebuild(row, residual, schema)) == norm(document)


@settings(max_examples=400, deadline=None)
@given(st.lists(documents, min_size=1, max_size=4), st.lists(documents, min_size=1, max_size=6))
@example(first=[{"s": [0.0]}], later=[{"s": [Decimal128("NaN")]}])  # a NaN is not == a NaN
def test_the_compiled_placer_places_as_the_rule_says(first, later):
    """`placer` (what the fold runs) gives `place`'s typed values and residual, for documents
    that fit their columns and documents that do not."""
    schema = schema_for(StructType([]), first)
    place_compiled = placer(schema)
    for document in [*first, *later]:
        compiled, ruled = place_compiled(document), place(document, schema)
        assert identical(compiled, ruled), (compiled, ruled)


def identical(a, b) -> bool:
    """Equal values of the same Python types, a NaN equal to a NaN (`==` says a NaN is not
    itself unless it is the same object)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b
