"""Whether a `current` row's typed columns and residual say what its document says (issue 38).

Independent of `type_rule.place`: for every field of the document, either the residual holds
the value exactly (and the typed column, if any, null), or the typed column holds the same
value (numbers by exact value, an ObjectId as its hex string, dates as the same instant); and
the residual holds nothing the document lacks. So a reader never sees a wrong value, and
typed values plus residual give back every value of the document.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import bson
import bsonjs
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

CODEC = CodecOptions(
    tz_aware=True,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)
_MISSING = object()


def decoded(text: str | None) -> dict[str, Any]:
    return {} if text is None else bson.decode(bsonjs.loads(text), CODEC)


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, int | Int64 | float | Decimal):
        return Decimal(value)
    return None


def same_value(original: Any, typed: Any) -> bool:
    """`typed` (as Spark or Arrow return it) is `original` (as BSON decodes it)."""
    if isinstance(original, ObjectId):
        return typed == str(original)
    if isinstance(original, datetime) and isinstance(typed, datetime):
        if typed.tzinfo is None:
            typed = typed.astimezone(UTC)  # Spark returns instants in the local zone
        return original == typed
    if isinstance(original, list):
        return (
            isinstance(typed, list)
            and len(typed) == len(original)
            and all(same_value(o, t) for o, t in zip(original, typed, strict=True))
        )
    if isinstance(original, dict):
        return isinstance(typed, dict) and not disagreements(original, typed, {})
    number = _number(original)
    if number is not None:
        got = _number(typed)
        return got is not None and (got.is_nan() if number.is_nan() else got == number)
    return type(original) is type(typed) and original == typed


def identical(original: Any, rest: Any) -> bool:
    """The same BSON value: type, field order and NaN bits included."""
    return bson.encode({"v": original}, codec_options=CODEC) == bson.encode(
        {"v": rest}, codec_options=CODEC
    )


def disagreements(document: dict, typed: dict, residual: dict, path: str = "") -> list[str]:
    """The paths where the typed values (`typed`: a level's columns by name, null where
    absent) and the residual do not say what the document says. [] when they agree."""
    wrong: list[str] = []
    for name in set(document) | set(typed) | set(residual):
        where = f"{path}{name}"
        original = document.get(name, _MISSING)
        value, rest = typed.get(name), residual.get(name, _MISSING)
        if original is _MISSING:
            if value is not None or rest is not _MISSING:
                wrong.append(f"{where}: not in the document")
        elif isinstance(original, dict) and isinstance(value, dict):
            inner = rest if isinstance(rest, dict) else {}
            wrong += disagreements(original, value, inner, f"{where}.")
        elif rest is not _MISSING:
            if value is not None or not identical(original, rest):
                wrong.append(f"{where}: residual {rest!r}, typed {value!r}, document {original!r}")
        elif name not in typed:
            wrong.append(f"{where}: no column and not in the residual: {original!r}")
        elif original is not None and not same_value(original, value):
            wrong.append(f"{where}: typed {value!r}, document {original!r}")
        elif original is None and value is not None:
            wrong.append(f"{where}: typed {value!r}, document null")
    return wrong


def row_disagreements(row: dict, document: str, columns: list[str], residual: str) -> list[str]:
    """`disagreements` for one row read from `current` (`row` by column name, nested values
    as dicts), its document's canonical Extended JSON, and its typed columns' names."""
    typed = {name: row.get(name) for name in columns}
    return disagreements(decoded(document), typed, decoded(row.get(residual)))
