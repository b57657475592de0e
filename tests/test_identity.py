"""`_id` values MongoDB holds equal are one key (jobs.transform.identity), held against a real
mongod: two `_id`s get one key exactly when the server refuses the second as a duplicate."""

from __future__ import annotations

import itertools
from decimal import Decimal

import bson
import bsonjs
import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import DuplicateKeyError

from jobs.transform.identity import identity_key


def key_of(value: object) -> str:
    """The `_id`'s key as the fold sees it: canonical Extended JSON of `{"_id": value}`."""
    return bsonjs.dumps(bson.encode({"_id": value}), mode=bsonjs.CANONICAL)


# Values that meet each other under several BSON types: the pairs drawn collide often.
BASES = [
    Decimal(0),
    Decimal(1),
    Decimal(-3),
    Decimal(2**31),
    Decimal(2**53 + 1),
    Decimal(2**63 - 1),
    Decimal("0.5"),
    Decimal("0.1"),
    Decimal("1e300"),
    Decimal("NaN"),
    Decimal("Infinity"),
]


@st.composite
def numbers(draw: st.DrawFn) -> object:
    """One of BASES written as one of the BSON number types that can hold it."""
    base = draw(st.sampled_from(BASES))
    forms: list[object] = [float(base), Decimal128(str(base))]
    if base.is_finite() and base == base.to_integral_value():
        whole = int(base)
        forms.append(Decimal128(f"{whole}.00"))
        if -(2**63) <= whole < 2**63:
            forms.append(Int64(whole))
        if -(2**31) <= whole < 2**31:
            forms.append(whole)
    if base.is_finite() and base == 0:
        forms.append(-0.0)
    value = draw(st.sampled_from(forms))
    return draw(st.sampled_from([value, {"a": value}, {"a": value, "s": "x"}]))


@pytest.mark.fast
@pytest.mark.parametrize(
    "values",
    [
        [1, Int64(1), 1.0, Decimal128("1.00"), Decimal128("1")],
        [0, -0.0, Decimal128("-0"), Int64(0)],
        [float("nan"), Decimal128("NaN")],
        [{"a": 5, "b": "x"}, {"a": Int64(5), "b": "x"}, {"a": 5.0, "b": "x"}],
    ],
)
def test_values_the_server_holds_equal_share_one_key(values):
    assert len({identity_key(key_of(v)) for v in values}) == 1


@pytest.mark.fast
@pytest.mark.parametrize(
    "pair",
    [
        (1, "1"),
        (1, True),
        (0.1, Decimal128("0.1")),  # the double 0.1 is not one tenth
        (Int64(2**53 + 1), float(2**53 + 1)),  # the double rounds to 2**53
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # field order is part of a document's value
    ],
)
def test_values_the_server_holds_different_keep_different_keys(pair):
    a, b = pair
    assert identity_key(key_of(a)) != identity_key(key_of(b))


@pytest.mark.fast
@pytest.mark.parametrize(
    "value",
    [ObjectId("6b09b2d07fd6d42aacd7d70a"), "SKU-1", 7, {"d": bson.datetime_ms.DatetimeMS(10**15)}],
)
def test_keys_with_nothing_to_rewrite_keep_their_text(value):
    """Existing tables keyed by an ObjectId, a string or an int32 keep their keys."""
    assert identity_key(key_of(value)) == key_of(value)


@pytest.mark.fast
@given(numbers())
def test_the_key_of_a_key_is_itself(value):
    once = identity_key(key_of(value))
    assert identity_key(once) == once


@pytest.mark.fast
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (
            '{ "_id" : { "a" : "x", "a" : { "$numberLong" : "1" } } }',
            '{ "_id" : { "a" : "x", "a" : { "$numberInt" : "1" } } }',
        ),
        (
            '{ "_id" : { "a" : { "$numberLong" : "1" }, "a" : "x" } }',
            '{ "_id" : { "a" : { "$numberInt" : "1" }, "a" : "x" } }',
        ),
    ],
)
def test_a_name_an_id_repeats_keeps_each_of_its_values(key, expected):
    """The server stores `{_id: {a: "x", a: NumberLong(1)}}` beside `{_id: {a: 1}}` (no
    duplicate key): both fields stay in the key, or the two documents would be one row."""
    assert identity_key(key) == expected
    assert identity_key('{ "_id" : { "a" : { "$numberInt" : "1" } } }') != expected


_collections = itertools.count()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(first=numbers(), second=numbers())
def test_one_key_exactly_when_the_server_refuses_a_duplicate_id(client, db_name, first, second):
    coll = client[db_name][f"ids_{next(_collections)}"]
    coll.insert_one({"_id": first})
    try:
        coll.insert_one({"_id": second})
        duplicate = False
    except DuplicateKeyError:
        duplicate = True
    same = identity_key(key_of(first)) == identity_key(key_of(second))
    assert same == duplicate, (first, second, identity_key(key_of(first)))
