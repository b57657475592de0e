"""Documents -> plain JSON for Spark's schema inference and the document columns.

Spark infers `{"$oid": "..."}` as a struct with a `$oid` field; the document columns are nicer
with the wrappers unwrapped: ObjectId -> hex string, dates -> ISO 8601 strings, Decimal128 ->
its exact decimal string, numbers -> JSON numbers, binary -> base64 (UUIDs as their text).
This form is for the convenience columns only; the lossless canonical document stays beside.

The plain JSON is defined by `flatten` over the canonical Extended JSON (json.loads with a
hook per object, unwrapping each wrapper). `plain_json` gives the same text from the
document's BSON at a fraction of the cost, the work done in C: pymongo's decoder, then orjson
(a tenth of the json module's C encoder's time), Python running only for the values JSON has
no type for (`_plain`). orjson writes some floats and NaN its own way, so a document holding
one of those is encoded by the json module instead, whose text is the definition. The
two readings differ only where canonical Extended JSON is ambiguous or pymongo decodes
differently, so those documents take the canonical route: a key starting with `$` (canonical
JSON cannot tell `{"$oid": ...}` the document from an ObjectId), a regex (pymongo turns its
flags into a number), a DBPointer, a Decimal128 out of range, text that does not decode.
"""

from __future__ import annotations

import base64
import json
import json.encoder
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
import bsonjs
import orjson
from bson import Binary, Decimal128, MaxKey, MinKey, ObjectId, Timestamp
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _encoder(default: Callable[[Any], Any] | None) -> Callable[[Any], str]:
    """json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True): the plain
    JSON's definition (compact, UTF-8 as is, NaN and Infinity as JavaScript writes them).

    The json module's C encoder, built once: JSONEncoder.encode builds it anew for every
    call (a third of the time a small document takes). No cycle check: decoded values have none.
    """
    make = json.encoder.c_make_encoder
    if make is None:  # an interpreter without the C accelerator
        return json.JSONEncoder(
            ensure_ascii=False, separators=(",", ":"), allow_nan=True, default=default
        ).encode
    encode = make(None, default, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    return lambda value: "".join(encode(value, 0))


_ENCODE = _encoder(None)


def _date(millis: int) -> str | int:
    try:
        moment = _EPOCH + timedelta(milliseconds=millis)
    except OverflowError:
        return millis  # outside datetime's range: the number keeps the value
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _binary(value: Any, obj: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        return obj
    if value.get("subType") == "04":
        try:
            return str(uuid.UUID(bytes=base64.b64decode(value["base64"])))
        except (ValueError, TypeError, KeyError):
            pass  # not 16 bytes: no UUID (this used to fail the whole run), base64 as others
    return value.get("base64")


def _pair(value: Any, obj: dict[str, Any], first: str, second: str) -> Any:
    if not isinstance(value, dict):
        return obj
    return {first: value.get(first), second: value.get(second)}


# Single-key wrappers of canonical Extended JSON: (the value, the wrapper) -> the plain value.
_WRAPPERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "$numberInt": lambda v, _: int(v),
    "$numberLong": lambda v, _: int(v),
    "$numberDouble": lambda v, _: float(v),
    "$oid": lambda v, _: v,
    "$numberDecimal": lambda v, _: v,
    "$symbol": lambda v, _: v,
    "$code": lambda v, _: v,
    "$date": lambda v, _: _date(v) if isinstance(v, int) else v,
    "$binary": _binary,
    "$regularExpression": lambda v, o: (
        f"/{v.get('pattern')}/{v.get('options')}" if isinstance(v, dict) else o
    ),
    "$timestamp": lambda v, o: _pair(v, o, "t", "i"),
    "$minKey": lambda v, _: "MinKey",
    "$maxKey": lambda v, _: "MaxKey",
    "$undefined": lambda v, _: None,
    "$dbPointer": lambda v, o: _pair(v, o, "$ref", "$id"),
}


def _unwrap(obj: dict[str, Any]) -> Any:
    """The object hook: called for every JSON object, innermost first (one dict look-up for
    the ordinary ones: this runs ~20 times per document)."""
    if len(obj) == 1:
        for key in obj:
            wrapper = _WRAPPERS.get(key)
            if wrapper is None:
                return obj
            try:
                return wrapper(obj[key], obj)
            except (ValueError, TypeError, OverflowError):
                # A document whose `$` key only looks like a wrapper ({"$numberInt": "x"}):
                # it stays a document (this used to fail the whole run).
                return obj
    if len(obj) == 2 and "$code" in obj and "$scope" in obj:
        return obj["$code"]
    return obj


def flatten(canonical: str | None) -> str | None:
    """The plain-JSON form of one canonical Extended JSON document."""
    if canonical is None:
        return None
    return _ENCODE(json.loads(canonical, object_hook=_unwrap))


class _NotPlain(Exception):
    """A value `plain_json` leaves to the canonical route."""


def _uuid_or_base64(value: Binary) -> str:
    if value.subtype == 4 and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    return base64.b64encode(value).decode()


# A Decimal128 whose significand is out of range (the BSON spec reads it as zero, libbson
# prints it): the large form (combination bits 11, all ones being infinities and NaNs), or a
# significand of more than 34 digits.
_LARGE_FORM, _SPECIAL = 0x6000000000000000, 0x7800000000000000
_SIGNIFICAND_HIGH, _MAX_SIGNIFICAND = 0x0001FFFFFFFFFFFF, 10**34 - 1


def _decimal(value: Decimal128) -> str:
    bid = value.bid
    high = int.from_bytes(bid[8:], "little")
    if high & _LARGE_FORM == _LARGE_FORM:
        if high & _SPECIAL != _SPECIAL:
            raise _NotPlain
    elif (high & _SIGNIFICAND_HIGH) << 64 | int.from_bytes(bid[:8], "little") > _MAX_SIGNIFICAND:
        raise _NotPlain
    return str(value)  # pymongo's text is libbson's (the BSON spec's) for the others


# What json.dumps cannot write itself, by exact type (pymongo decodes to these classes only).
# int64 (an int), Code and symbols (str), undefined (None) need nothing.
_PLAIN: dict[type, Callable[[Any], Any]] = {
    ObjectId: str,
    DatetimeMS: lambda v: _date(int(v)),
    Decimal128: _decimal,
    Binary: _uuid_or_base64,
    bytes: lambda v: base64.b64encode(v).decode(),  # subtype 0
    Timestamp: lambda v: {"t": v.time, "i": v.inc},
    MinKey: lambda _: "MinKey",
    MaxKey: lambda _: "MaxKey",
}


def _plain(value: Any) -> Any:
    convert = _PLAIN.get(type(value))
    if convert is None:
        raise _NotPlain  # a regex, a DBRef or DBPointer: the canonical route
    return convert(value)


_PLAIN_ENCODE = _encoder(_plain)
# Every date as milliseconds (DatetimeMS), whatever its range, as canonical JSON has it.
_DECODE = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
# A key starting with `$`: an element's type byte, then `$`. A `$` inside a value can match
# too; that document merely takes the canonical route.
_DOLLAR_KEY = re.compile(rb"[\x01-\x13\x7f\xff]\$")
# NaN and the infinities, which orjson writes as null: a double whose exponent bits are all
# ones ends in these two bytes (little-endian). Other bytes can match: then the json module.
_NAN_OR_INFINITY = re.compile(rb"[\xf0-\xff][\x7f\xff]")
# Where orjson's float text can differ from the json module's (float.__repr__): an exponent
# (1e-7 and 1e16 against 1e-07 and 1e+16) and 1e-5 <= |x| < 1e-4 (fixed against exponent).
# Both searches start from a literal (a fast scan); a string holding such text merely takes
# the json module too.
_ORJSON_EXPONENT = re.compile(rb"e[-+0-9]")


def _plain_encode(value: Any, document: bytes) -> str:
    """The plain JSON of a decoded document: orjson's text where it is the json module's."""
    text = orjson.dumps(value, default=_plain)
    if (
        _ORJSON_EXPONENT.search(text) is None
        and b"0.0000" not in text
        and (b"null" not in text or _NAN_OR_INFINITY.search(document) is None)
    ):
        return text.decode()
    return _PLAIN_ENCODE(value)


def plain_json(document: bytes | memoryview | None, canonical: str | None = None) -> str | None:
    """`flatten` of the document's canonical Extended JSON, from its BSON (same text).

    `canonical`, when the caller has it already, spares the canonical route a second render.
    """
    if document is None:
        return None
    document = bytes(document)  # a memoryview's `in` would compare integers
    # Most documents hold no `$` at all: one memchr, and the regex only for the others.
    if b"$" not in document or _DOLLAR_KEY.search(document) is None:
        try:
            return _plain_encode(bson.decode(document, _DECODE), document)
        except Exception:  # _NotPlain, or what the canonical route reports its own way
            pass
    if canonical is None:
        canonical = bsonjs.dumps(document, mode=bsonjs.CANONICAL)
    return flatten(canonical)
