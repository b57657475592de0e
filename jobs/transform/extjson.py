"""Canonical Extended JSON -> plain JSON for Spark's schema inference.

Spark infers `{"$oid": "..."}` as a struct with a `$oid` field; the document columns are nicer
with the wrappers unwrapped: ObjectId -> hex string, dates -> ISO 8601 strings, Decimal128 ->
its exact decimal string, numbers -> JSON numbers, binary -> base64 (UUIDs as their text).
This form is for the convenience columns only; the lossless canonical document stays beside.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _date(millis: int) -> str | int:
    try:
        moment = _EPOCH + timedelta(milliseconds=millis)
    except OverflowError:
        return millis  # outside datetime's range: the number keeps the value
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _unwrap(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if not key.startswith("$"):
            return obj
        if key in ("$numberInt", "$numberLong"):
            return int(value)
        if key == "$numberDouble":
            return float(value)
        if key in ("$oid", "$numberDecimal", "$symbol", "$code"):
            return value
        if key == "$date":
            return _date(value) if isinstance(value, int) else value
        if key == "$binary" and isinstance(value, dict):
            if value.get("subType") == "04":
                return str(uuid.UUID(bytes=base64.b64decode(value["base64"])))
            return value.get("base64")
        if key == "$regularExpression" and isinstance(value, dict):
            return f"/{value.get('pattern')}/{value.get('options')}"
        if key == "$timestamp" and isinstance(value, dict):
            return {"t": value.get("t"), "i": value.get("i")}
        if key == "$minKey":
            return "MinKey"
        if key == "$maxKey":
            return "MaxKey"
        if key == "$undefined":
            return None
        if key == "$dbPointer" and isinstance(value, dict):
            return {"$ref": value.get("$ref"), "$id": value.get("$id")}
        return obj
    if set(obj) == {"$code", "$scope"}:
        return obj["$code"]
    return obj


def flatten(canonical: str | None) -> str | None:
    """The plain-JSON form of one canonical Extended JSON document."""
    if canonical is None:
        return None
    value = json.loads(canonical, object_hook=_unwrap)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
