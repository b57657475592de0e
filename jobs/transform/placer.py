"""The type rule's `place`, compiled once per schema: what the fold runs on every document.

`type_rule.place` states the rule value by value (is the value held by its column? then what
does the column store?), which costs two walks of each value, two placements of each
sub-document of an array, and exact decimal arithmetic on every number: ~190 µs for the
benchmark's 0.5 KB document. `placer(schema)` builds, once, one function per column that
answers both at once, with the common cases first (an int in a long column, a float in a
double column need no decimal arithmetic). Its results are `place`'s, which the fast tier
holds it to on any document.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.transform.field_census import column_names, every_name_a_column
from jobs.transform.number_columns import INT_RANGE, holds_exactly, stored
from jobs.transform.type_rule import BSON_KIND, FIRST_INSTANT, LAST_INSTANT, NUMBERS, OBJECT_ID

MISFIT = object()  # a value its column does not hold: it goes to the residual whole
Column = Callable[[Any], tuple[Any, Any]]  # value -> (typed value or MISFIT, rest or None)
Placer = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]


def placer(schema: StructType) -> Placer:
    """`type_rule.place` for `schema`, compiled."""
    columns = {f.name: _column(f) for f in schema.fields}

    def place(document: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        row: dict[str, Any] = {}
        residual: dict[str, Any] = {}
        named = None if every_name_a_column(document) else set(column_names(document))
        for name, value in document.items():
            column = columns.get(name)
            if column is None or (named is not None and name not in named):
                residual[name] = value
                continue
            typed, rest = column(value)
            if typed is MISFIT:
                residual[name] = value
                continue
            row[name] = typed
            if rest:
                residual[name] = rest
        return row, residual

    return place


def _column(field: StructField) -> Column:
    dtype = field.dataType
    if isinstance(dtype, ArrayType):
        element = _column(StructField("element", dtype.elementType, True, field.metadata))
        return _array(element)
    if isinstance(dtype, StructType):
        return _struct(placer(dtype))
    if isinstance(dtype, StringType):
        return _object_id if field.metadata.get(BSON_KIND) == OBJECT_ID else _string
    simple = _SIMPLE.get(type(dtype))
    if simple is not None:
        return simple
    return _number(dtype)


def _struct(place: Placer) -> Column:
    def column(value: Any) -> tuple[Any, Any]:
        if value is None:
            return None, None
        if not isinstance(value, dict) or not value:
            return MISFIT, None  # {} too (`type_rule._fits`)
        return place(value)

    return column


def _array(element: Column) -> Column:
    def column(value: Any) -> tuple[Any, Any]:
        if value is None:
            return None, None
        if not isinstance(value, list):
            return MISFIT, None
        items = []
        for item in value:
            typed, rest = element(item)
            if typed is MISFIT or rest:
                return MISFIT, None  # the residual keeps a misfit array whole
            items.append(typed)
        return items, None

    return column


def _string(value: Any) -> tuple[Any, Any]:
    return (value, None) if value is None or type(value) is str else (MISFIT, None)


def _object_id(value: Any) -> tuple[Any, Any]:
    if value is None:
        return None, None
    return (str(value), None) if isinstance(value, ObjectId) else (MISFIT, None)


def _boolean(value: Any) -> tuple[Any, Any]:
    return (value, None) if value is None or isinstance(value, bool) else (MISFIT, None)


def _timestamp(value: Any) -> tuple[Any, Any]:
    if value is None:
        return None, None
    if isinstance(value, datetime) and FIRST_INSTANT <= value <= LAST_INSTANT:
        return value, None
    return MISFIT, None


def _binary(value: Any) -> tuple[Any, Any]:
    return (value, None) if value is None or type(value) is bytes else (MISFIT, None)


_SIMPLE: dict[type, Column] = {
    BooleanType: _boolean,
    TimestampType: _timestamp,
    BinaryType: _binary,
}


def _number(dtype: DataType) -> Column:
    """A numeric column: ints in a long column and floats in a double column on a fast path,
    the rest by `number_columns` (exact)."""
    integral = isinstance(dtype, IntegerType | LongType)
    low, high = INT_RANGE[dtype] if integral else (0, 0)
    double = isinstance(dtype, DoubleType)

    def column(value: Any) -> tuple[Any, Any]:
        if value is None:
            return None, None
        kind = type(value)
        if kind is int or kind is Int64:
            if integral:
                return (int(value), None) if low <= value <= high else (MISFIT, None)
            if double:
                return (float(value), None) if float(value) == value else (MISFIT, None)
        elif kind is float:
            if double:
                return value, None
            if integral and value.is_integer() and low <= value <= high:
                zero_signed = value == 0 and math.copysign(1.0, value) < 0
                return (MISFIT, None) if zero_signed else (int(value), None)
        elif not isinstance(value, NUMBERS) or isinstance(value, bool):
            return MISFIT, None
        return (stored(dtype, value), None) if holds_exactly(dtype, value) else (MISFIT, None)

    return column
