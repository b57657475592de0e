"""The oracle: a seeded random workload, and `current` compared with `find()` on the source."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import bson
import bsonjs
from bson import Decimal128, ObjectId
from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from pymongo import DeleteOne, InsertOne, MongoClient, ReplaceOne, UpdateMany, UpdateOne
from pyspark.sql.types import StructType

from jobs.transform.identity import identity_key

KEYS = 600  # a small key space so deletes, re-inserts and repeated updates collide often


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 2 else 8)
    if kind == 0:
        return rng.randint(-1000, 1000)
    if kind == 1:
        return f"s{rng.randint(0, 99)}"
    if kind == 2:
        return rng.random() * 100
    if kind == 3:
        return rng.random() < 0.5
    if kind == 4:
        return None
    if kind == 5:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 10**7))
    if kind == 6:
        return Decimal128(Decimal(rng.randint(0, 10**6)) / 100)
    if kind == 7:
        return ObjectId()
    if kind == 8:
        return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def make_doc(rng: random.Random, key: Any) -> dict[str, Any]:
    return {
        "_id": key,
        "n": rng.randint(0, 100),
        "mixed": _value(rng),  # changes type from document to document
        "nested": {"a": rng.randint(0, 9), "b": {"c": f"x{rng.randint(0, 9)}"}},
        "arr": [rng.randint(0, 9) for _ in range(rng.randint(0, 5))],
        "tags": rng.sample(["red", "green", "blue", "amber"], k=rng.randint(0, 3)),
    }


def _key(rng: random.Random) -> int:
    return rng.randrange(KEYS)


def _op(rng: random.Random) -> Any:
    key = _key(rng)
    roll = rng.random()
    if roll < 0.12:
        return InsertOne(make_doc(rng, ObjectId()))
    if roll < 0.22:
        return ReplaceOne({"_id": key}, make_doc(rng, key) | {"_id": key}, upsert=True)
    if roll < 0.30:
        return DeleteOne({"_id": key})
    if roll < 0.40:
        return UpdateOne(
            {"_id": key}, {"$set": {"nested.b.c": _value(rng), "mixed": _value(rng)}}, upsert=True
        )
    if roll < 0.47:
        return UpdateOne({"_id": key}, {"$unset": {rng.choice(["mixed", "nested.a", "tags"]): ""}})
    if roll < 0.57:
        return UpdateOne({"_id": key, "n": {"$type": "number"}}, {"$inc": {"n": rng.randint(1, 5)}})
    if roll < 0.67:
        return UpdateOne({"_id": key}, {"$push": {"arr": rng.randint(0, 9)}})
    if roll < 0.74:
        return UpdateOne({"_id": key}, {"$pull": {"arr": rng.randint(0, 9)}})
    if roll < 0.82:
        return UpdateOne({"_id": key, "arr.0": {"$exists": True}}, {"$set": {"arr.0": _value(rng)}})
    if roll < 0.86:
        lo = rng.randrange(KEYS)
        return UpdateMany(
            {"_id": {"$gte": lo, "$lt": lo + 15}, "n": {"$type": "number"}}, {"$inc": {"n": 1}}
        )
    if roll < 0.90:
        return UpdateOne({"_id": key}, {"$set": {"added": {"when": datetime.now(UTC)}}})
    return UpdateOne({"_id": key}, {"$set": {"n": f"now a string {rng.randint(0, 9)}"}})


def seed_collection(client: MongoClient, db: str, coll: str, rng: random.Random) -> int:
    client[db][coll].insert_many([make_doc(rng, k) for k in range(KEYS // 2)])
    return 1


def burst(client: MongoClient, db: str, coll: str, rng: random.Random, operations: int) -> int:
    """About `operations` writes (bulk ops, insert_many, transactions); returns the count."""
    collection = client[db][coll]
    done = 0
    while done < operations:
        roll = rng.random()
        if roll < 0.05:
            docs = [make_doc(rng, ObjectId()) for _ in range(rng.randint(2, 20))]
            collection.insert_many(docs)
            done += 1
        elif roll < 0.10:
            key = _key(rng)
            with client.start_session() as session, session.start_transaction():
                # The same document twice in one transaction, and a second one.
                collection.update_one(
                    {"_id": key}, {"$set": {"n": -1}}, upsert=True, session=session
                )
                collection.update_one({"_id": key}, {"$inc": {"n": 2}}, session=session)  # n is -1
                other = _key(rng)
                if other != key:
                    collection.delete_one({"_id": other}, session=session)
            done += 3
        else:
            ops = [_op(rng) for _ in range(rng.randint(20, 60))]
            collection.bulk_write(ops, ordered=True)
            done += len(ops)
    return done


def drop_and_recreate(client: MongoClient, db: str, coll: str, rng: random.Random) -> int:
    client[db][coll].drop()
    client[db][coll].insert_many([make_doc(rng, k) for k in range(0, KEYS, 3)])
    return 2


def canonical(raw: bytes) -> str:
    return bsonjs.dumps(bytes(raw), mode=bsonjs.CANONICAL)  # large raw documents are memoryviews


def current_key(raw: bytes, codec_options: CodecOptions = DEFAULT_CODEC_OPTIONS) -> str:
    """A source document's key as `current` keys it: its `{_id}` by value (`identity_key`)."""
    value = bson.decode(bytes(raw), codec_options=codec_options)["_id"]
    return identity_key(canonical(bson.encode({"_id": value}, codec_options=codec_options)))


def source_state(raw_client: MongoClient, db: str, coll: str) -> dict[str, str]:
    """find() on the source, keyed like `current`: `current_key` -> canonical document."""
    return {current_key(doc.raw): canonical(doc.raw) for doc in raw_client[db][coll].find()}


def current_state(frame) -> dict[str, str]:
    rows = frame.select("_tm_key", "_tm_document").collect()
    state = {r._tm_key: r._tm_document for r in rows}
    assert len(state) == len(rows), "a key appears twice in current"
    return state


def typed_columns_differ(frame, schema=None) -> list:
    """The rows of a `current` frame whose typed columns and residual do not say what their
    `_tm_document` says (`typed_rows.disagreements`), as (key, paths); `schema`: the document
    columns' StructType, default the frame's own. [] when every row agrees."""
    from tests.helpers.typed_rows import row_disagreements

    if schema is None:
        schema = StructType([f for f in frame.schema.fields if not f.name.startswith("_tm_")])
    columns = [f.name for f in schema.fields]
    wrong = []
    for row in frame.collect():
        values = row.asDict(recursive=True)
        paths = row_disagreements(values, values["_tm_document"], columns, "_tm_residual")
        if paths:
            wrong.append((values["_tm_key"], paths))
    return wrong


def removed_rows(spark, lake, stream: str) -> list:
    """The stream's tombstones and namespace barriers, read as a plain Delta table."""
    from jobs.curated_zone import removed_dir

    return spark.read.format("delta").load(str(removed_dir(lake, stream))).collect()


def capture_events(
    raw_client: MongoClient,
    db: str,
    coll: str | None,
    start_at: Any,
    count: int,
    full_document: str = "updateLookup",
) -> list[bytes]:
    """The first `count` real change events from `start_at` (a Timestamp), as raw BSON."""
    target = raw_client[db] if coll is None else raw_client[db][coll]
    raws: list[bytes] = []
    with target.watch(
        start_at_operation_time=start_at, full_document=full_document, max_await_time_ms=200
    ) as stream:
        while len(raws) < count:
            event = stream.try_next()
            if event is not None:
                raws.append(event.raw)
    return raws


def commit_raw_batch(store: Any, lake: Any, stream: str, raws: list[bytes], source: str) -> Any:
    """`raws` written through the project's raw writer and committed as one batch
    (no checkpoint move, as a replay's)."""
    from datetime import timedelta

    from jobs.bson_buffer import RawDocuments
    from jobs.capture.writer import RawBatchWriter
    from state import BatchRecord, new_batch_id

    batch_id = new_batch_id()
    writer = RawBatchWriter(lake, stream, batch_id)
    writer.add(RawDocuments.of(raws))
    writer.close()
    batch = BatchRecord(
        id=batch_id,
        stream=stream,
        source=source,
        event_count=len(raws),
        bytes=sum(map(len, raws)),
        files=writer.files,
        events_by_type=dict(writer.counts),
    )
    kind = "replay" if source == "replay" else "capture"
    lease = store.acquire_lease(stream, kind, timedelta(minutes=1))
    try:
        store.commit_batch(lease, None, batch, None)
    finally:
        store.release_lease(lease)
    return batch
