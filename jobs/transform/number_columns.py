"""Which column type holds a field's numbers, and which numbers it holds exactly (issue 38).

A collection mixes int32, int64, double and Decimal128 in one field as drivers write them. Its
column's type is chosen wide when the field first appears (`column_for`) and never changes
afterwards, so no reader meets Delta's `typeWidening` feature and no file is rewritten. A
number the column cannot hold exactly (a fraction in a long column, an int64 past 2**53 in a
double column, a decimal with more digits than 38) is never rounded into it: the fold writes
null there and the value to the row's residual. Pure: no Spark session, only Spark's type objects.
"""

from __future__ import annotations

from decimal import Context, Decimal

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from pyspark.sql.types import DataType, DecimalType, DoubleType, IntegerType, LongType

MAX_DIGITS = 38  # Spark's and Delta's widest decimal
INT_RANGE = {IntegerType(): (-(2**31), 2**31 - 1), LongType(): (-(2**63), 2**63 - 1)}

Number = int | Int64 | float | Decimal128
# `normalize` rounds to its context's precision: more digits than any number here has (a
# double's exact value has up to 767 significant digits, a Decimal128 34), so it never rounds.
_EXACT = Context(prec=800)


def exact(value: Number) -> Decimal:
    """The number's exact value (NaN and the infinities as Decimal's)."""
    if isinstance(value, Decimal128):
        return value.to_decimal()
    return Decimal(value)


def number_type(value: Number) -> DataType | None:
    """The narrowest column type that holds `value` exactly: int32 an int, int64 a long, a
    double a double, a Decimal128 the decimal of its digits. None for a Decimal128 no decimal
    of 38 digits holds (NaN, an infinity, 35+ significant digits once its exponent is
    applied): it goes to the residual whatever the column."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number here")
    if isinstance(value, Int64):
        return LongType()
    if isinstance(value, int):
        return IntegerType()
    if isinstance(value, float):
        return DoubleType()
    return _decimal_type(value.to_decimal())


def _decimal_type(value: Decimal) -> DecimalType | None:
    if not value.is_finite():
        return None
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    precision = max(len(digits) + max(0, exponent), scale, 1)
    if precision > MAX_DIGITS:
        return None
    return DecimalType(precision, scale)


def holds_exactly(column: DataType, value: Number) -> bool:
    """Whether a column of this type holds `value` with no change of its value."""
    number = exact(value)
    if number.is_zero() and number.is_signed() and not isinstance(column, DoubleType):
        return False  # -0.0 keeps its sign only in a double
    if isinstance(column, IntegerType | LongType):
        low, high = INT_RANGE[column]
        return (
            number.is_finite() and number == number.to_integral_value() and (low <= number <= high)
        )
    if isinstance(column, DoubleType):
        if number.is_nan():
            return not number.is_snan()  # a signaling NaN has no float: the residual keeps it
        return Decimal(float(number)) == number
    if isinstance(column, DecimalType):
        if not number.is_finite():
            return False
        needed = _decimal_type(number.normalize(_EXACT))
        return needed is not None and _decimal_holds(column, needed)
    return False


def stored(column: DataType, value: Number) -> int | float | Decimal:
    """What a column of this type stores for `value` (the value itself when `held`)."""
    number = exact(value)
    if isinstance(column, IntegerType | LongType):
        return int(number)
    if isinstance(column, DecimalType):
        return number.quantize(Decimal(1).scaleb(-column.scale), context=_EXACT)
    return float(number)


def _decimal_holds(column: DecimalType, needed: DecimalType) -> bool:
    integer_digits = column.precision - column.scale
    return needed.scale <= column.scale and needed.precision - needed.scale <= integer_digits


def column_for(values: list[Number]) -> DataType | None:
    """The column type a new field gets from the numbers of its first run, wide from the
    start so that no later run has to change it: integers of either width a long, any double
    among them a double, decimals (with or without integers) a decimal of 38 digits at their
    largest scale. None when no value has a column type (only residual decimals).

    Not Delta's type widening: measured here (issue 38's note), a table with the
    `typeWidening` reader feature is refused by delta-rs 1.6 (to_pyarrow_table and its SQL)
    and Polars 2.1; only Spark and DuckDB read it. A number a column cannot hold goes to the
    residual instead.
    """
    kinds = [number_type(v) for v in values]
    typed = [k for k in kinds if k is not None]
    if not typed:
        return None
    if any(isinstance(k, DoubleType) for k in typed):
        return DoubleType()
    scales = [k.scale for k in typed if isinstance(k, DecimalType)]
    if scales:
        return DecimalType(MAX_DIGITS, max(scales))
    return LongType()
