"""Fields a stream removes never reach the lake: not through a snapshot, a re-snapshot, an
update's description, a pre-image, a replay or the curated tables.

The proof is a scan of every byte the lake (and the state store) holds after all of those:
each file read raw, every Parquet file decoded cell by cell (its pages are compressed), and
every binary cell decoded as BSON too. The fields that stay are looked for the same way, so
an empty lake cannot pass.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
import bsonjs
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from jobs.capture import drain, drain_until_caught_up, replay
from jobs.transform import read_current, transform
from tests.helpers.lake_reading import committed_table
from tidemark.config import StreamConfig
from tidemark.errors import SnapshotPipelineError
from tidemark.field_exclusion import exclusion_stages, outermost, removed_by_stages

SECRET = "zq9secret"  # in every value that must never reach the lake
KEPT = "zq9kept"  # in every value that must


def _value(marker: str, what: str) -> str:
    return f"{marker}-{what}-{uuid.uuid4().hex}"


def _document(key: int) -> dict[str, Any]:
    return {
        "_id": key,
        "name": _value(KEPT, "name"),
        "email": f"{_value(SECRET, 'email')}@example.com",
        "address": {"street": _value(SECRET, "street"), "city": _value(KEPT, "city")},
        "contacts": [{"kind": _value(KEPT, "kind"), "phone": _value(SECRET, "phone")}],
    }


# The same fields removed two ways: by the stream's own pipeline (which must also drop the
# update description: its dotted keys cannot be $unset by path) and by `exclude_fields`.
_PIPELINE = [
    {
        "$unset": [
            "fullDocument.email",
            "fullDocument.address.street",
            "fullDocument.contacts.phone",
            "fullDocumentBeforeChange.email",
            "fullDocumentBeforeChange.address.street",
            "fullDocumentBeforeChange.contacts.phone",
            "updateDescription",
        ]
    }
]
_EXCLUDED = ["email", "address.street", "contacts.phone"]


def _hits(value: Any, marker: bytes) -> int:
    """How often `marker` occurs in a decoded cell (nested lists and structs walked)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return value.encode().count(marker)
    if isinstance(value, bytes):
        found = value.count(marker)
        with contextlib.suppress(Exception):  # a BSON cell (raw events): its text form too
            found = max(found, bsonjs.dumps(value).encode().count(marker))
        return found
    if isinstance(value, dict):
        return sum(_hits(v, marker) + _hits(k, marker) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_hits(v, marker) for v in value)
    return 0


def _scan(root: Path, marker: bytes) -> dict[str, int]:
    """Occurrences of `marker` per file under `root` (or in that one file): raw bytes, and
    Parquet decoded."""
    found: dict[str, int] = {}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        data = path.read_bytes()
        count = data.count(marker)
        if data[:4] == b"PAR1" and data[-4:] == b"PAR1":
            table = pq.read_table(path)
            count += sum(
                _hits(cell, marker) for column in table.columns for cell in column.to_pylist()
            )
        if count:
            found[str(path.relative_to(root.parent if root.is_file() else root))] = count
    return found


@pytest.mark.parametrize("how", ["pipeline", "exclude_fields"])
def test_removed_fields_never_reach_the_lake(
    how, spark, client, raw_client, sqlite_store, state_url_sqlite, lake, make_stream, db_name
):
    coll = client[db_name].create_collection(
        "orders", changeStreamPreAndPostImages={"enabled": True}
    )
    coll.insert_many([_document(k) for k in range(40)])
    removal = {"pipeline": _PIPELINE} if how == "pipeline" else {"exclude_fields": _EXCLUDED}
    stream = make_stream(
        start="snapshot",
        snapshot_chunk_size=15,
        full_document="updateLookup",
        full_document_before_change="required",
        **removal,
    )
    first = drain(stream, raw_client, sqlite_store, lake)
    assert first.snapshot is not None and first.snapshot.status == "done"
    transform(spark, sqlite_store, lake, stream)

    window_start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    coll.update_one({"_id": 0}, {"$set": {"email": _value(SECRET, "email")}})
    coll.update_one({"_id": 1}, {"$set": {"address.street": _value(SECRET, "street")}})
    coll.update_one(
        {"_id": 2},
        {"$set": {"address": {"street": _value(SECRET, "street"), "city": _value(KEPT, "c")}}},
    )
    coll.update_one({"_id": 3}, {"$set": {"contacts.0.phone": _value(SECRET, "phone")}})
    coll.update_one(
        {"_id": 4},
        {"$push": {"contacts": {"kind": _value(KEPT, "k"), "phone": _value(SECRET, "phone")}}},
    )
    coll.update_one({"_id": 5}, {"$unset": {"email": ""}, "$set": {"name": _value(KEPT, "n")}})
    coll.update_one(
        {"_id": 6},
        [{"$set": {"address": {"street": _value(SECRET, "street"), "zip": _value(KEPT, "z")}}}],
    )
    coll.replace_one({"_id": 7}, _document(7))
    coll.delete_one({"_id": 8})
    coll.insert_one(_document(100))
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)

    drain(stream, raw_client, sqlite_store, lake, resnapshot=True)
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)

    # The next whole second, once it has passed: every write above lies inside the window.
    window_end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    time.sleep((window_end - datetime.now(UTC)).total_seconds() + 0.3)
    client[db_name]["elsewhere"].insert_one({})  # moves the stream's tokens past the window
    replayed = replay(stream, raw_client, sqlite_store, lake, window_start, window_end)
    assert replayed.events >= 10
    transform(spark, sqlite_store, lake, stream)

    rows = read_current(spark, sqlite_store, lake, stream.name).count()
    assert rows == coll.count_documents({})

    state_db = Path(state_url_sqlite.removeprefix("sqlite:///"))
    leaks = _scan(lake, SECRET.encode()) | _scan(state_db, SECRET.encode())
    assert not leaks, f"removed fields' values found in {len(leaks)} files: {sorted(leaks)[:5]}"
    kept = _scan(lake, KEPT.encode())
    assert any(p.startswith("raw/") for p in kept), kept
    # The scan reads the Delta tables whole: data files, the transaction log (its statistics
    # hold column values), checkpoints and deletion vectors; the kept values show it looked.
    curated = [p for p in (lake / "curated").rglob("*") if p.is_file()]
    assert any(p.parent.name == "_delta_log" and p.suffix == ".json" for p in curated)
    assert any("/current/" in p and p.endswith(".parquet") for p in kept), kept
    assert any("/changes/" in p and p.endswith(".parquet") for p in kept), kept


def test_a_pipeline_that_drops_the_full_document_stops_the_snapshot(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name]["orders"].insert_many([_document(k) for k in range(3)])
    stream = make_stream(
        start="snapshot", current_table=False, pipeline=[{"$unset": "fullDocument"}]
    )
    with pytest.raises(SnapshotPipelineError, match="fullDocument"):
        drain(stream, raw_client, sqlite_store, lake)
    assert not list(lake.rglob("*.parquet"))


def test_a_pipeline_that_computes_another_id_stops_the_snapshot(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name]["orders"].insert_many([_document(k) for k in range(3)])
    # Computed, so the config check cannot see it: the copy must.
    rewrite = {"$set": {"fullDocument": {"$mergeObjects": ["$fullDocument", {"_id": "x"}]}}}
    stream = make_stream(start="snapshot", pipeline=[rewrite])
    with pytest.raises(SnapshotPipelineError, match="_id"):
        drain(stream, raw_client, sqlite_store, lake)
    assert not list(lake.rglob("*.parquet"))


@pytest.mark.fast
@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("_id", "_id"),
        ("_id.part", "_id"),
        ("address..street", "empty"),
        (".email", "empty"),
        ("email.", "empty"),
        ("", "empty"),
        ("$email", r"'\$'"),
        ("address.$street", r"'\$'"),
        ("tags.0", "array position"),
    ],
)
def test_exclude_fields_refuses_paths_it_cannot_honour(path, message):
    with pytest.raises(ValidationError, match=message):
        StreamConfig(name="s", database="d", collection="c", exclude_fields=[path])


@pytest.mark.fast
def test_exclude_fields_is_part_of_the_definition_fingerprint():
    plain = StreamConfig(name="s", database="d", collection="c")
    excluding = StreamConfig(name="s", database="d", collection="c", exclude_fields=["email"])
    assert plain.fingerprint() != excluding.fingerprint()
    # Streams defined before the option keep their fingerprint.
    assert "exclude_fields" not in plain.token_definition()


@pytest.mark.fast
@pytest.mark.parametrize(
    "stage",
    [
        {"$unset": "fullDocument._id"},
        {"$set": {"fullDocument._id": "x"}},
        {"$project": {"fullDocument._id": 0}},
    ],
)
def test_a_pipeline_that_rewrites_the_documents_id_is_refused(stage):
    with pytest.raises(ValidationError, match=r"fullDocument\._id"):
        StreamConfig(name="s", database="d", collection="c", pipeline=[stage])


_VALUES = [
    {"b": 1, "c": 2},
    {"c": 2},
    [{"b": 1, "c": 2}, {"c": 3}, 4, [{"b": 5, "c": 6}], [[{"b": 7}]]],
    {"b": {"x": 1}, "c": [1, 2]},
    "plain",
    None,
    [],
]


def test_an_updates_values_lose_what_unset_removes_from_the_document(client, db_name):
    """`$set: {a: v}` gives updatedFields {a: v}: the rewrite of the description must remove
    from v exactly what the server's `$unset` of `fullDocument.a.b` removes from a document
    {a: v}, arrays (and arrays in arrays) included."""

    events = [
        {
            "_id": n,
            "fullDocument": {"a": value},
            "updateDescription": {"updatedFields": {"a": value}, "removedFields": []},
        }
        for n, value in enumerate(_VALUES)
    ]
    got = list(client[db_name].aggregate([{"$documents": events}, *exclusion_stages(["a.b"])]))
    assert len(got) == len(_VALUES)
    for event in got:
        assert event["updateDescription"]["updatedFields"] == event["fullDocument"]
    assert got[2]["fullDocument"]["a"][0] == {"c": 2}  # it did remove something
    assert all(
        "updateDescription" not in e
        for e in client[db_name].aggregate(
            [
                {"$documents": [{"_id": 0, "fullDocument": {"a": {"b": 1}}}]},
                *exclusion_stages(["a.b"]),
            ]
        )
    )
    # Deeper than the rewrite follows arrays: dropped, never kept.
    deep = [[[[{"b": SECRET}]]]]
    (event,) = client[db_name].aggregate(
        [
            {"$documents": [{"_id": 0, "updateDescription": {"updatedFields": {"a": deep}}}]},
            *exclusion_stages(["a.b"]),
        ]
    )
    assert SECRET not in str(event)
    assert "a" in event["updateDescription"]["updatedFields"]


def test_a_document_too_large_to_send_back_still_loses_its_removed_fields(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    big = {**_document(1), "blob": "k" * (9 << 20)}  # over the probes' 8 MB: made on the server
    client[db_name]["orders"].insert_many([_document(0), big])
    stream = make_stream(start="snapshot", exclude_fields=_EXCLUDED)
    drain(stream, raw_client, sqlite_store, lake)
    raws = committed_table(sqlite_store, lake, stream.name).column("raw").to_pylist()
    documents = [bson.decode(r)["fullDocument"] for r in raws if b"fullDocument" in r]
    assert sorted(d["_id"] for d in documents) == [0, 1]
    assert all(SECRET.encode() not in r for r in raws)
    assert all(KEPT in d["name"] and KEPT in d["address"]["city"] for d in documents)


@pytest.mark.fast
def test_a_pipelines_static_removal_from_an_image_is_carried_to_every_document_field():
    stages = [
        {"$match": {"fullDocument.status": "active"}},
        {"$unset": ["fullDocument.email", "fullDocumentBeforeChange.ssn", "wallTime"]},
        {"$unset": "fullDocument.address.street"},
        {"$project": {"fullDocument.phone": 0, "updateDescription": 0}},
        {"$project": {"fullDocument.name": 1}},  # an inclusion keeps, removes nothing named
        {"$unset": ["fullDocument.items.0", "fullDocument.$x"]},  # not expressible: left alone
        {"$set": {"fullDocument.card": "masked"}},  # a mask: the stage's own business
    ]
    assert removed_by_stages(stages) == ["email", "ssn", "address.street", "phone"]
    stream = StreamConfig.model_validate(
        {
            "name": "s",
            "database": "d",
            "collection": "c",
            "pipeline": stages[:2],
            "exclude_fields": ["ssn", "email.work"],
        }
    )
    # Both lists meet once, outermost first: the server refuses a path and one under it.
    assert stream.mongo_pipeline()[len(stages[:2]) :] == exclusion_stages(["ssn", "email"])
    # Carried over, not fingerprinted twice: the pipeline as written is in the fingerprint.
    assert "exclude_fields" in stream.token_definition()
    assert outermost(["a.b", "a", "c", "a.b", "c.d"]) == ["a", "c"]
