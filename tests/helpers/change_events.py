"""Change events generated for property tests, laid out as the server writes them.

The envelope (token, operationType, clusterTime, wallTime, ns, documentKey, txnNumber, lsid,
to, collectionUUID) holds the types a server sends, often absent or null; documentKey's `_id`
and shard-key fields, the documents and extra top-level fields (a pipeline's `$addFields`)
hold values of any BSON type that pymongo can write, nested. A regex is the one value the
array reader does not walk: `walkable` says whether an event has one where it would look.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import bson
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from hypothesis import strategies as st

ENVELOPE = {
    "_id",
    "operationType",
    "clusterTime",
    "wallTime",
    "ns",
    "documentKey",
    "txnNumber",
    "lsid",
    "to",
    "collectionUUID",
}
OPERATIONS = [
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
    "create",
    "createIndexes",
    "modify",
    "shardCollection",
]

names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
# Field names, some longer than the array reader's 32-byte key window.
keys = names | st.text("abcdefghijklmnopqrstuvwxyz_", min_size=30, max_size=40)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1).map(Int64)
uuids = st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4))
binaries = st.builds(
    Binary, st.binary(max_size=20), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0xFF])
)
timestamps = st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
decimals = st.one_of(
    st.integers(-(10**30), 10**30).map(lambda n: Decimal128(str(n))),
    st.sampled_from(["1.10", "-0", "NaN", "-Infinity", "1E+6144", "-15E-6176"]).map(Decimal128),
)
# Dates as a server writes them (milliseconds); far ones beyond Python's datetime.
dates = st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=UTC)
)
far_dates = st.integers(-(2**62), 2**62).map(DatetimeMS)
regexes = st.builds(Regex, names, st.sampled_from(["", "i", "ms", "imsux"]))

# Values whose type the top-level decode of the per-event reader also reads (no far dates).
plain = st.one_of(
    st.none(),
    st.booleans(),
    int32s,
    int64s,
    st.floats(),
    names,
    binaries,
    st.binary(min_size=12, max_size=12).map(ObjectId),
    dates,
    timestamps,
    decimals,
    st.sampled_from([MinKey(), MaxKey()]),
    st.builds(Code, names),
)
scalars = plain | far_dates | regexes
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(keys, inner, max_size=3),
        st.builds(Code, names, st.dictionaries(keys, inner, max_size=2)),
        st.builds(DBRef, names, inner),
    ),
    max_leaves=4,
)
documents = st.dictionaries(keys, values, max_size=3)

ABSENT = object()


def _maybe(strategy: st.SearchStrategy, null: bool = True) -> st.SearchStrategy:
    """The field absent, null (if a server may send null there) or a value."""
    return st.one_of(st.just(ABSENT), *([st.none()] if null else []), strategy)


# documentKey: an _id of (almost) any type, shard-key fields before or after it; a 4 KB key
# is handed out by pymongo as a memoryview.
ids = st.one_of(
    int32s,
    int64s,
    st.binary(min_size=12, max_size=12).map(ObjectId),
    names,
    binaries,
    uuids,
    decimals,
    st.floats(),
    dates,
    far_dates,
    timestamps,
    st.sampled_from([MinKey(), MaxKey(), None, True]),
    st.dictionaries(keys, values, max_size=3),
    st.just("k" * 4100),
    regexes,
)
shard_keys = st.dictionaries(keys.filter(lambda k: k != "_id"), ids, max_size=2)


@st.composite
def document_keys(draw: st.DrawFn) -> dict[str, Any]:
    before, after = draw(shard_keys), draw(shard_keys)
    key = {**before, "_id": draw(ids)}
    key.update((k, v) for k, v in after.items() if k not in key)
    return key


@st.composite
def tokens(draw: st.DrawFn, at: Timestamp) -> dict[str, Any]:
    """A resume token: `_data` as the server writes it (KeyString hex, the time first)."""
    tail = draw(st.text("0123456789ABCDEF", max_size=40))
    token: dict[str, Any] = {"_data": f"82{at.time:08X}{at.inc:08X}{tail}"}
    if draw(st.booleans()):
        token["_typeBits"] = Binary(draw(st.binary(min_size=1, max_size=3)), 0)
    return token


namespaces = st.fixed_dictionaries({"db": names}, optional={"coll": names})


@st.composite
def change_events(draw: st.DrawFn) -> dict[str, Any]:
    """One change event; its fields in the server's order or shuffled."""
    at = draw(timestamps)
    fields: dict[str, Any] = {
        "_id": draw(tokens(at)),
        "operationType": draw(st.sampled_from(OPERATIONS)),
        "clusterTime": at,
        "wallTime": draw(_maybe(dates | int64s)),
        "ns": draw(_maybe(namespaces)),
        "documentKey": draw(_maybe(document_keys())),
        "fullDocument": draw(_maybe(documents)),
        "fullDocumentBeforeChange": draw(_maybe(documents)),
        "updateDescription": draw(_maybe(documents, null=False)),
        "to": draw(_maybe(st.fixed_dictionaries({"db": names, "coll": names}))),
        "collectionUUID": draw(_maybe(uuids)),
        "txnNumber": draw(_maybe(int32s | int64s)),
        "lsid": draw(
            _maybe(
                st.fixed_dictionaries(
                    {"id": uuids, "uid": st.binary(min_size=32, max_size=32).map(Binary)}
                )
            )
        ),
    }
    # Fields a pipeline adds ($addFields, $set): values the top-level decode reads.
    extra_values = st.one_of(plain, documents, st.lists(documents, max_size=2), regexes)
    extras = draw(
        st.dictionaries(keys.filter(lambda k: k not in ENVELOPE), extra_values, max_size=2)
    )
    fields.update((k, v) for k, v in extras.items() if k not in fields)
    order = list(fields)
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    return {k: fields[k] for k in order if fields[k] is not ABSENT}


def walkable(event: dict[str, Any]) -> bool:
    """Whether the array reader reads this event: no regex at its top level or in the top
    level of its documentKey (the two levels it walks element by element)."""
    key = event.get("documentKey")
    inner = key.values() if isinstance(key, dict) else []
    return not any(isinstance(v, Regex) for v in [*event.values(), *inner])


def server_reply(events: list[dict[str, Any]]) -> bytes:
    """A getMore reply holding `events`, as the server sends one."""
    return bson.encode(
        {
            "cursor": {
                "nextBatch": events,
                "postBatchResumeToken": {"_data": "8200000001000000012B0229296E04"},
                "id": Int64(7),
                "ns": "shop.orders",
            },
            "ok": 1.0,
            "operationTime": Timestamp(1, 1),
        }
    )
