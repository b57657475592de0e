"""A document's identity as MongoDB sees it: `_id` values the server holds equal are one key.

The unique `_id` index compares numbers by value across their BSON types: `1`,
`NumberLong(1)`, `1.0` and `NumberDecimal("1.00")` are one document, and inserting a second of
them is a duplicate key. A key written as canonical Extended JSON keeps the type, so those
would be four rows of `current`. `identity_key` rewrites each number inside an `_id` (at any
depth of a sub-document) to one representative of its value, chosen so that the common keys
keep the text they always had:

- an integer that fits int32 is `$numberInt`, else one that fits int64 `$numberLong`;
- any other value a double holds exactly is `$numberDouble` (NaN and the infinities too: the
  server holds a decimal NaN equal to a double NaN);
- the rest (a decimal no double holds) is `$numberDecimal`, trailing zeros dropped.

Everything else (strings, ObjectIds, dates, binaries, field names and their order) is left as
the server compares it: byte for byte. A key with nothing to rewrite is returned as given, so
the BSON types only the JSON text holds exactly (a DBPointer, a symbol) are never decoded.

`tests/test_identity.py` holds the rule against a real mongod's duplicate-key answers.
"""

from __future__ import annotations

import json
from decimal import Context, Decimal, InvalidOperation
from typing import Any

import bsonjs

NUMBER_TAGS = ("$numberInt", "$numberLong", "$numberDouble", "$numberDecimal")
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# Enough digits for any Decimal128 (34): `normalize` rounds to its context's precision.
_EXACT = Context(prec=40)
_SPECIAL = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "-NaN": "NaN"}


class _Fields(list):
    """A JSON object as its (name, value) pairs, in order: BSON lets a document repeat a name
    (the server stores `{_id: {a: "x", a: 1}}`), which a dict would collapse into one."""


def identity_key(key_json: str) -> str:
    """`key_json` (canonical Extended JSON of `{"_id": ...}`) with each number rewritten to
    its value's one representative (see the module docstring)."""
    tree = json.loads(key_json, object_pairs_hook=_Fields)
    normalised = _normalised(tree)
    if normalised == tree:
        return key_json
    return bsonjs.dumps(bsonjs.loads(_dumps(normalised)), mode=bsonjs.CANONICAL)


def _normalised(node: Any) -> Any:
    if isinstance(node, _Fields):
        if len(node) == 1:
            ((tag, text),) = node
            if tag in NUMBER_TAGS and isinstance(text, str):
                return _Fields(representative(_value(tag, text)).items())
        if any(name.startswith("$") for name, _ in node):
            return node  # another type's wrapper ($date holds a $numberLong that is no number)
        return _Fields((name, _normalised(value)) for name, value in node)
    if isinstance(node, list):
        return [_normalised(item) for item in node]
    return node


def _dumps(node: Any) -> str:
    """JSON text of a `_normalised` tree, repeated names kept."""
    if isinstance(node, _Fields):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_dumps(item) for item in node) + "]"
    return json.dumps(node)


def _value(tag: str, text: str) -> Decimal:
    if text in _SPECIAL:
        return Decimal(_SPECIAL[text])
    if tag == "$numberDouble":
        return Decimal(float(text))  # the double's exact value
    try:
        return Decimal(text)
    except InvalidOperation as exc:  # not a number bsonjs writes
        raise ValueError(f"{tag} {text!r} is not a number") from exc


def representative(value: Decimal) -> dict[str, str]:
    """The one canonical Extended JSON number that stands for `value`."""
    if value.is_nan():
        return {"$numberDouble": "NaN"}
    if value.is_infinite():
        return {"$numberDouble": "-Infinity" if value < 0 else "Infinity"}
    if value == value.to_integral_value():
        whole = int(value)
        if INT32[0] <= whole <= INT32[1]:
            return {"$numberInt": str(whole)}
        if INT64[0] <= whole <= INT64[1]:
            return {"$numberLong": str(whole)}
    as_double = float(value)
    if Decimal(as_double) == value:
        return {"$numberDouble": repr(as_double)}
    return {"$numberDecimal": str(value.normalize(_EXACT))}
