"""Which column type holds a field's numbers, and which numbers it holds exactly (issue 38).

A collection mixes int32, int64, double and Decimal128 in one field as drivers write them. Its
column starts at the first number's type and widens only along Delta's own type-widening
paths (Delta 4.x: int to long, double or decimal; decimal to a decimal of more digits), which
change a column's type without rewriting a file. A number the column cannot hold exactly (a
fraction in a long column, an int64 past 2**53 in a double column, a decimal with more digits
than 38) is never rounded into it: the fold writes null there and the value to the row's
residual. Pure: no Spark session, only Spark's type objects.
"""

from __future__ import annotations

from decimal import Context, Decimal

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from pyspark.sql.types import DataType, DecimalType, DoubleType, IntegerType, LongType

MAX_DIGITS = 38  # Spark's and Delta's widest decimal
INT_DIGITS = {IntegerType(): 10, LongType(): 19}  # the digits Delta's int -> decimal keeps
INT_RANGE = {IntegerType(): (-(2**31), 2**31 - 1), LongType(): (-(2**63), 2**63 - 1)}

Number = int | Int64 | float | Decimal128
_EXACT = Context(prec=40)  # `normalize` rounds to its context's precision: more than 34


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


def held(column: DataType, value: Number) -> bool:
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
            return True
        return Decimal(float(number)) == number
    if isinstance(column, DecimalType):
        if not number.is_finite():
            return False
        needed = _decimal_type(number.normalize(_EXACT))
        return needed is not None and _decimal_holds(column, needed)
    return False


def _decimal_holds(column: DecimalType, needed: DecimalType) -> bool:
    integer_digits = column.precision - column.scale
    return needed.scale <= column.scale and needed.precision - needed.scale <= integer_digits


def widened(column: DataType | None, incoming: DataType | None) -> DataType | None:
    """The column's type once a number of type `incoming` reached it: widened along one of
    Delta's paths when one holds both, else unchanged (the number goes to the residual)."""
    if column is None:
        return incoming
    if incoming is None or column == incoming:
        return column
    if isinstance(column, IntegerType) and isinstance(incoming, LongType | DoubleType):
        return incoming
    if isinstance(column, IntegerType | LongType) and isinstance(incoming, DecimalType):
        return _joined(DecimalType(INT_DIGITS[column], 0), incoming) or column
    if isinstance(column, DecimalType) and isinstance(incoming, IntegerType | LongType):
        return _joined(column, DecimalType(INT_DIGITS[incoming], 0)) or column
    if isinstance(column, DecimalType) and isinstance(incoming, DecimalType):
        return _joined(column, incoming) or column
    return column  # long + double, double + anything else, decimal + double: no path


def _joined(a: DecimalType, b: DecimalType) -> DecimalType | None:
    scale = max(a.scale, b.scale)
    integer_digits = max(a.precision - a.scale, b.precision - b.scale)
    if integer_digits + scale > MAX_DIGITS:
        return None
    return DecimalType(integer_digits + scale, scale)


# Delta 4.x's type widening (docs.delta.io, "Delta type widening"), for the tests and the ALTER
# the fold issues: int -> long, double, decimal(>= 10 integer digits); long -> decimal(>= 20);
# decimal(p, s) -> decimal(p + k1, s + k2) with k1 >= k2 >= 0.
def delta_widens(old: DataType, new: DataType) -> bool:
    if old == new:
        return True
    if isinstance(old, IntegerType) and isinstance(new, LongType | DoubleType):
        return True
    if isinstance(old, IntegerType | LongType) and isinstance(new, DecimalType):
        return new.precision - new.scale >= INT_DIGITS[old]
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        k1, k2 = new.precision - old.precision, new.scale - old.scale
        return k1 >= k2 >= 0
    return False
