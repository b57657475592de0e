"""The plain JSON of the document columns is one text however it is made: `plain_json` from the
BSON, `flatten` from canonical Extended JSON and the one-pass `documents_json` all give what
the first `flatten` (json.loads with an object hook, json.dumps; kept here as the oracle) gave
for the document's canonical Extended JSON, for documents of any BSON type, `$`-prefixed keys
that mimic the type wrappers included."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
import bsonjs
import pyarrow as pa
import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Regex
from bson.datetime_ms import DatetimeMS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.raw_zone import document_bson, document_json, events_documents
from jobs.transform.extjson import flatten, plain_json
from tests.helpers.change_events import change_events, documents, keys, values

pytestmark = pytest.mark.fast

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _oracle_date(millis: int) -> str | int:
    try:
        moment = _EPOCH + timedelta(milliseconds=millis)
    except OverflowError:
        return millis
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _oracle_unwrap(obj: dict[str, Any]) -> Any:  # the first version, verbatim
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
            return _oracle_date(value) if isinstance(value, int) else value
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


def oracle(canonical: str) -> str:
    value = json.loads(canonical, object_hook=_oracle_unwrap)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def _outcome(fn: Any, arg: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(arg)
    except Exception as exc:
        return "error", type(exc).__name__


WRAPPER_KEYS = ["$oid", "$date", "$numberInt", "$numberLong", "$numberDouble", "$binary"]
WRAPPER_KEYS += ["$timestamp", "$code", "$scope", "$minKey", "$undefined", "$dbPointer", "$x"]
# Sub-documents that read as type wrappers in canonical Extended JSON.
mimics = st.dictionaries(
    st.sampled_from(WRAPPER_KEYS),
    st.one_of(
        st.sampled_from(["5", "5F0A1B2C3D4E5F6A7B8C9D0E", "2020-01-01T00:00:00Z", "1e400"]),
        st.integers(-5, 5),
        st.fixed_dictionaries({"$numberLong": st.just("7")}),
        st.fixed_dictionaries({"base64": st.just("AAAA"), "subType": st.just("04")}),
        st.fixed_dictionaries({"t": st.integers(0, 9), "i": st.integers(0, 9)}),
    ),
    min_size=1,
    max_size=2,
)
extras = st.one_of(
    values,
    mimics,
    st.floats(),
    st.integers(-(2**62), 2**62).map(DatetimeMS),
    st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4)),
    st.binary(max_size=20).map(lambda b: Binary(b, 4)),  # a UUID of the wrong size
    st.builds(Regex, st.text("ab^$.*", max_size=3), st.sampled_from(["", "i", "xsmi"])),
    st.binary(min_size=16, max_size=16).map(lambda b: Decimal128.from_bid(b)),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
)
any_documents = st.one_of(documents, st.dictionaries(keys, extras, max_size=4))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=any_documents)
def test_plain_json_and_flatten_give_the_first_flatten_s_text(document: dict) -> None:
    raw = bson.encode(document)
    canonical = bsonjs.dumps(raw, mode=bsonjs.CANONICAL)
    got = flatten(canonical)
    assert plain_json(raw) == got
    assert plain_json(memoryview(raw)) == got
    expected = _outcome(oracle, canonical)
    if expected[0] == "ok":
        assert got == expected[1]
    # Else the first flatten failed the run: on a "UUID" (subtype 4) that is not 16 bytes (now
    # base64, as other binary), or a `$` key that looks like a wrapper but does not read as
    # one ({"$numberInt": "x"}: now a document, as other `$` keys).


json_texts = st.recursive(
    st.none() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from([*WRAPPER_KEYS, "a"]), inner, max_size=2)
    ),
).map(json.dumps)


@settings(max_examples=300)
@given(text=json_texts)
def test_flatten_reads_any_json_as_the_first_flatten_did(text: str) -> None:
    """Not only libbson's canonical text: hand-made wrappers with odd values too."""
    got, expected = flatten(text), _outcome(oracle, text)
    if expected[0] == "ok":
        assert got == expected[1]


def test_a_dollar_key_that_does_not_read_as_a_wrapper_stays_a_document() -> None:
    raw = bson.encode({"a": {"$numberInt": "x"}, "b": {"$numberDouble": {"c": 1}}})
    expected = '{"a":{"$numberInt":"x"},"b":{"$numberDouble":{"c":1}}}'
    assert flatten(bsonjs.dumps(raw, mode=bsonjs.CANONICAL)) == plain_json(raw) == expected


def test_a_uuid_of_the_wrong_size_is_base64_as_other_binary() -> None:
    raw = bson.encode({"a": Binary(b"\x01\x02", 4)})
    assert flatten(bsonjs.dumps(raw, mode=bsonjs.CANONICAL)) == plain_json(raw) == '{"a":"AQI="}'


def test_the_benchmark_document_and_every_wrapper() -> None:
    oid = ObjectId()
    document = {
        "_id": 7,
        "oid": oid,
        "when": datetime(2026, 1, 2, 3, 4, 5, 678000),
        "far": DatetimeMS(2**60),
        "before": DatetimeMS(-(10**12)),
        "dec": Decimal128("1.10"),
        "uuid": Binary(uuid.UUID(int=5).bytes, 4),
        "bin": Binary(b"\x00\x01", 0),
        "old": Binary(b"\x00\x01", 2),
        "nums": [1, Int64(2**40), 1.5, -0.0, float("nan"), float("inf"), 1e-07],
        "text": 'a "quoted" \\ ü \n',
    }
    raw = bson.encode(document)
    expected = oracle(bsonjs.dumps(raw, mode=bsonjs.CANONICAL))
    assert plain_json(raw) == expected
    assert json.loads(expected)["oid"] == str(oid)
    assert json.loads(expected)["when"] == "2026-01-02T03:04:05.678Z"
    assert plain_json(None) is None and flatten(None) is None


def test_document_json_reads_every_document_field() -> None:
    full, before = {"_id": 1, "a": 1.5}, {"_id": 1, "a": 1}
    description = {"updatedFields": {"a": 1.5}, "removedFields": []}
    raw = bson.encode(
        {
            "operationType": "update",
            "fullDocument": full,
            "fullDocumentBeforeChange": before,
            "updateDescription": description,
        }
    )
    canonical = [bsonjs.dumps(bson.encode(d), mode=bsonjs.CANONICAL) for d in (full, before)]
    assert document_json(raw) == (
        canonical[0],
        canonical[1],
        bsonjs.dumps(bson.encode(description), mode=bsonjs.CANONICAL),
        None,
    )
    assert (
        document_json(bson.encode({"operationType": "delete", "fullDocument": None})) == (None,) * 4
    )


# Floats whose text orjson writes its own way (exponents, 1e-5 <= |x| < 1e-4, NaN and the
# infinities), beside the ones it writes as the json module does; and strings that hold such
# text, which must not change what the floats beside them read as.
EDGE_FLOATS = [1e-5, 5e-5, -9.99e-5, 1e-4, 1e-7, 1e15, 1e16, -1e22, 5e-324, 1.7976931348623157e308]
EDGE_FLOATS += [0.0, -0.0, 0.1, 100.0, 2.0**53, float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", EDGE_FLOATS, ids=repr)
def test_a_float_reads_as_the_json_module_writes_it_whatever_orjson_writes(value: float) -> None:
    for document in ({"x": value}, {"x": value, "s": "e-1 0.0000 null", "n": None}):
        raw = bson.encode(document)
        assert plain_json(raw) == oracle(bsonjs.dumps(raw, mode=bsonjs.CANONICAL))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(change_events(), max_size=12), start=st.integers(0, 3))
def test_events_documents_finds_each_events_documents_as_document_bson(events, start) -> None:
    """The batch walk over an Arrow array (a slice of one too, as Spark can hand it) against
    pymongo's per-event reading; odd events (a regex at the top) send the batch the slow way."""
    raws = [bson.encode(e) for e in events]
    array = pa.array([b"\x05\x00\x00\x00\x00"] * start + raws, pa.binary()).slice(start)
    assert events_documents(array) == [document_bson(r) for r in raws]
