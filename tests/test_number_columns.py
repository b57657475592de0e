"""The numeric type rule (jobs.transform.number_columns): a field's column is chosen wide from
its first run's numbers, holds every one of them that its type can hold, and holds a number
only exactly."""

from __future__ import annotations

from decimal import Context, Decimal

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import DecimalType, DoubleType, IntegerType, LongType

from jobs.transform.number_columns import column_for, exact, holds_exactly, number_type

pytestmark = pytest.mark.fast

int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1).map(Int64)
doubles = st.floats(allow_nan=True, allow_infinity=True)
decimals = (
    st.decimals(allow_nan=False, allow_infinity=False, places=None)
    .filter(lambda d: len(d.as_tuple().digits) <= 34 and -6143 <= d.as_tuple().exponent <= 6111)
    .map(lambda d: Decimal128(d))
)
special_decimals = st.sampled_from(["NaN", "Infinity", "-Infinity", "1E+40", "1E-40"]).map(
    Decimal128
)
numbers = st.one_of(int32s, int64s, doubles, decimals, special_decimals)


def spark_value(column, value) -> Decimal:
    """What the column would store for `value`, read back as an exact number."""
    number = exact(value)
    if isinstance(column, IntegerType | LongType):
        return Decimal(int(number))
    if isinstance(column, DoubleType):
        return Decimal(float(number))
    assert isinstance(column, DecimalType)
    return number.quantize(Decimal(1).scaleb(-column.scale), context=Context(prec=40))


def same(a: Decimal, b: Decimal) -> bool:
    return (a.is_nan() and b.is_nan()) or a == b


@given(numbers)
def test_a_number_is_held_by_its_own_type(value):
    own = number_type(value)
    assert own is None or holds_exactly(own, value)


@given(st.lists(numbers, min_size=1, max_size=6))
def test_a_new_column_holds_its_first_runs_numbers_or_leaves_them_to_the_residual(values):
    column = column_for(values)
    assert (
        column is None
        or column in (LongType(), DoubleType())
        or (isinstance(column, DecimalType) and column.precision == 38)
    )
    for value in values:
        if column is None or holds_exactly(column, value):
            continue
        # The residual takes only what the chosen type cannot hold: a decimal no 38 digits
        # hold, an integer or decimal a double rounds, digits past the decimal's 38, -0.0.
        own = number_type(value)
        rounded_by_double = isinstance(column, DoubleType) and not isinstance(value, float)
        too_many_digits = isinstance(column, DecimalType)
        signed_zero = exact(value).is_zero() and exact(value).is_signed()
        assert own is None or rounded_by_double or too_many_digits or signed_zero, (
            column,
            value,
        )


@given(st.lists(numbers, min_size=1, max_size=6))
def test_a_number_in_its_column_reads_back_exactly(values):
    column = column_for(values)
    for value in values:
        if column is not None and holds_exactly(column, value):
            assert same(spark_value(column, value), exact(value)), (column, value)


@pytest.mark.parametrize(
    ("values", "column"),
    [
        ([1, Int64(2**40)], LongType()),
        ([1], LongType()),  # never int: a later int64 would need Delta's typeWidening
        ([1, 2.5], DoubleType()),
        ([Decimal128("1.25"), 7], DecimalType(38, 2)),
        ([Decimal128("1.25"), Decimal128("123.5")], DecimalType(38, 2)),
        ([Decimal128("NaN")], None),
    ],
)
def test_mixed_numbers_end_in_one_column(values, column):
    assert column_for(values) == column


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (LongType(), 2.5),
        (DoubleType(), Int64(2**53 + 1)),
        (DecimalType(12, 2), 0.1),  # the double 0.1 has 55 digits
        (DecimalType(12, 2), Decimal128("1.255")),
        (LongType(), -0.0),  # its sign lives only in a double
        (DoubleType(), Decimal128("0.1")),
        # 52 digits exactly: a decimal(38, 37) would round it (the adversary's find)
        (DecimalType(38, 37), 6.338653573420518),
    ],
)
def test_a_number_a_column_cannot_hold_exactly_is_not_held(column, value):
    assert not holds_exactly(column, value)
