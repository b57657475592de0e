"""Change events to the raw zone's table: the array reader (whole replies at once) gives the
same table as the per-event reader (pymongo's decoder) for every kind of event a server
sends, and events it does not read are converted one by one, never lost or altered."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable

import bson
import bsonjs
import pyarrow as pa
import pytest
from bson import SON, Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from jobs.bson_buffer import RawDocuments, array_documents, elements
from jobs.capture import drain, drain_until_caught_up
from jobs.capture._events import array_events_table, events_table, per_event_table
from jobs.capture.reader import ChangeStreamReader, WatchSpec
from jobs.raw_zone import document_json
from jobs.transform import exact_documents, transform
from resources.mongo import cluster_time
from tests.helpers.change_events import change_events, server_reply, walkable
from tests.helpers.lake_reading import committed_table
from tests.helpers.oracle import current_state, source_state

ODD_IDS = [
    1,
    -7,
    Int64(2**40),
    Int64(5),
    ObjectId(),
    'a "quoted" \\ string, ü, \n',
    1.5,
    -0.0,
    {"a": 1, "b": [1, "x"]},
    Binary(uuid.uuid4().bytes, 4),
    datetime.datetime(2020, 1, 2, 3, 4, 5, 678000),
    None,
    Decimal128("1.10"),
    MinKey(),
    MaxKey(),
    Timestamp(5, 6),
]


def _write_every_kind(client: MongoClient, db: str) -> None:
    database = client[db]
    database.create_collection("kinds", changeStreamPreAndPostImages={"enabled": True})
    kinds = database["kinds"]
    kinds.insert_many([{"_id": value, "n": n} for n, value in enumerate(ODD_IDS)])
    kinds.create_index("n")
    kinds.update_one({"_id": 1}, {"$set": {"deep.er": [1, 2]}, "$unset": {"n": ""}})
    kinds.update_one({"_id": -7}, {"$push": {"list": {"$each": [1, 2, 3]}}})
    kinds.replace_one({"_id": Int64(5)}, {"replaced": True})
    kinds.delete_one({"_id": 1.5})
    with client.start_session() as session, session.start_transaction():
        kinds.insert_one({"_id": "in a transaction"}, session=session)
        kinds.update_one({"_id": -7}, {"$inc": {"t": 1}}, session=session)
    kinds.rename("kinds_renamed")
    database["kinds_renamed"].drop()
    database["other"].insert_one({"_id": 1})
    client.drop_database(db)


def _read(
    client: MongoClient, db: str, start: Timestamp, pipeline: list | None = None
) -> list[RawDocuments]:
    options = {
        "startAtOperationTime": start,
        "showExpandedEvents": True,
        "fullDocument": "updateLookup",
        "fullDocumentBeforeChange": "whenAvailable",
    }
    # A small batch size: several replies, each converted on its own.
    with ChangeStreamReader(client, WatchSpec(db, None, options, pipeline or [], 7, 300)) as reader:
        return [reply.events for reply in reader.replies() if len(reply.events)]


@pytest.fixture
def every_kind(raw_client: MongoClient, client: MongoClient, db_name: str) -> Callable:
    start = cluster_time(client)
    _write_every_kind(client, db_name)
    return lambda pipeline=None: _read(raw_client, db_name, start, pipeline)


def test_array_reader_equals_the_per_event_reader_for_every_kind_of_event(every_kind) -> None:
    replies = every_kind()
    kinds = set()
    for docs in replies:
        table = array_events_table(docs)
        assert table is not None, "the array reader gave up on ordinary events"
        expected = per_event_table(docs)
        for name in expected.schema.names:  # column by column, for a readable failure
            assert table[name].equals(expected[name]), name
        assert table.equals(expected)
        kinds.update(table["operation_type"].to_pylist())
    assert {
        "create",
        "createIndexes",
        "insert",
        "update",
        "replace",
        "delete",
        "rename",
        "drop",
        "dropDatabase",
        "invalidate",
    } <= kinds
    events = [RawBSONDocument(raw) for docs in replies for raw in docs.raws()]
    assert sum(1 for e in events if e["operationType"] == "insert") == len(ODD_IDS) + 2
    assert any("lsid" in e and "txnNumber" in e for e in events)  # the transaction
    assert any("collectionUUID" in e for e in events)  # expanded events


def test_document_keys_are_libbson_canonical_extended_json(every_kind) -> None:
    """The keys the array reader writes itself (int32, int64, ObjectId) match bsonjs."""
    table = pa.concat_tables([events_table(docs) for docs in every_kind()])
    keys = [k for k in table["document_key"].to_pylist() if k]
    assert '{ "_id" : { "$numberInt" : "-7" } }' in keys
    assert f'{{ "_id" : {{ "$numberLong" : "{2**40}" }} }}' in keys
    assert f'{{ "_id" : {{ "$oid" : "{ODD_IDS[4]}" }} }}' in keys


def test_events_the_array_reader_does_not_read_are_converted_one_by_one(every_kind) -> None:
    """A top-level regex (a pipeline can add one) is not walked: the per-event reader
    converts those replies, with the same result."""
    replies = every_kind([{"$addFields": {"pattern": {"$literal": Regex("^a", "i")}}}])
    assert replies
    for docs in replies:
        assert array_events_table(docs) is None
        table = events_table(docs)
        assert table.num_rows == len(docs)
        assert table.equals(per_event_table(docs))
        assert table["raw"].to_pylist() == docs.raws()


def _insert_event(n: int, document_key: dict) -> bytes:
    """An insert event laid out as the server writes one, with the given document key."""
    return bson.encode(
        {
            "_id": {"_data": f"82{1000:08X}{n:08X}2B042C0100296E5A1004"},
            "operationType": "insert",
            "clusterTime": Timestamp(1000, n),
            "wallTime": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
            "fullDocument": {**document_key, "v": n},
            "ns": {"db": "shop", "coll": "orders"},
            "documentKey": document_key,
        }
    )


@pytest.mark.fast
@pytest.mark.parametrize(
    "key",
    [
        {"_id": Regex("^a", "i")},
        {"region": Regex("^eu", "m"), "_id": 7},  # a shard key field before _id
        {"_id": ObjectId(), "region": Regex("x")},  # and after it
    ],
    ids=["regex _id", "regex shard key first", "regex shard key last"],
)
def test_a_document_key_holding_a_regex_takes_the_per_event_path(key) -> None:
    raws = [_insert_event(1, {"_id": 1}), _insert_event(2, key), _insert_event(3, {"_id": "s"})]
    for docs in (RawDocuments.of(raws), RawDocuments.of(raws[1:2])):
        assert array_events_table(docs) is None
        table = events_table(docs)
        assert table.equals(per_event_table(docs))
        assert table["raw"].to_pylist() == docs.raws()
    keys = events_table(RawDocuments.of(raws))["document_key"].to_pylist()
    in_order = CodecOptions(document_class=SON)  # the key's fields keep the event's order
    assert list(bson.decode(bsonjs.loads(keys[1]), in_order).items()) == list(key.items())
    assert keys[0] == '{ "_id" : { "$numberInt" : "1" } }'


def test_a_drain_of_document_keys_holding_a_regex_folds_into_current(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
) -> None:
    """The server refuses a regex _id (code 53), so the regex reaches documentKey through a
    pipeline stage: the drain, the raw zone and the fold must all take it. The streams file
    refuses a stage that sets documentKey (issue 23: it keys current), so the stage is put
    on the stream after validation, as a stand-in for a shard key holding such a value."""
    region = {"$regularExpression": {"pattern": "^eu", "options": "i"}}
    stream = make_stream()
    stream.pipeline = [{"$set": {"documentKey.region": {"$literal": region}}}]
    drain(stream, raw_client, sqlite_store, lake)  # the stream's position: now
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": k, "v": k} for k in range(6)])
    coll.update_one({"_id": 2}, {"$set": {"v": "two"}})
    coll.delete_one({"_id": 4})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    source = source_state(raw_client, db_name, "orders")
    assert sorted(got.values()) == sorted(source.values())
    # current is keyed by _id alone (as snapshot rows are); the raw zone keeps the whole key.
    assert set(got) == {
        bsonjs.dumps(bson.encode({"_id": k}), mode=bsonjs.CANONICAL) for k in (0, 1, 2, 3, 5)
    }
    pattern = Regex("^eu", "i")
    raw_keys = committed_table(sqlite_store, lake, stream.name).column("document_key")
    assert set(raw_keys.to_pylist()) == {
        bsonjs.dumps(bson.encode({"_id": k, "region": pattern}), mode=bsonjs.CANONICAL)
        for k in range(6)
    }


@pytest.mark.fast
def test_documents_of_4_kb_and_more_convert_to_json() -> None:
    """pymongo (4.18+) hands out sub-documents of 4 KB and more as memoryviews."""
    full = {"_id": 1, "pad": "x" * 5000}
    raw = bson.encode({"operationType": "insert", "fullDocument": full})
    assert document_json(raw)[0] == bsonjs.dumps(bson.encode(full), mode=bsonjs.CANONICAL)


def _same_table(table: pa.Table, expected: pa.Table) -> None:
    for name in expected.schema.names:  # column by column, for a readable failure
        assert table[name].equals(expected[name]), (name, table[name], expected[name])
    assert table.equals(expected)


@pytest.mark.fast
@settings(max_examples=100, deadline=None, phases=set(Phase) - {Phase.explain})  # quick failures
@given(events=st.lists(change_events(), min_size=1, max_size=4), data=st.data())
def test_the_array_reader_equals_the_per_event_reader_on_generated_events(events, data) -> None:
    """Any change event a server can send, in a reply's buffer as the server lays it out:
    the array reader gives the per-event reader's table, or gives up on the whole batch
    exactly when an event holds a regex where it walks (events_table then takes the
    per-event path). Also for a slice of the reply, and for the events copied into a buffer
    of their own (the last ends at the buffer's end: the reader pads)."""
    reply = server_reply(events)
    cursor = next(value for key, _, value, _ in elements(reply) if key == "cursor")
    batch = next(value for key, _, value, _ in elements(reply, cursor) if key == "nextBatch")
    docs = array_documents(reply, batch)
    assert [list(RawBSONDocument(raw)) for raw in docs.raws()] == [list(e) for e in events]
    start = data.draw(st.integers(0, len(events)), "start")
    end = data.draw(st.integers(start, len(events)), "end")
    for part, kept in (
        (docs, events),
        (docs[start:end], events[start:end]),
        (RawDocuments.of(docs.raws()), events),
    ):
        table = array_events_table(part)
        event("array reader: " + ("gave up" if table is None else f"{len(kept)} events read"))
        if not all(map(walkable, kept)):
            assert table is None
            continue
        assert table is not None, "the array reader gave up on events it reads"
        _same_table(table, per_event_table(part))
