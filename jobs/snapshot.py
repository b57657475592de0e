"""Initial snapshot and re-snapshot: the collection(s) copied as committed chunks, resumable.

A snapshot takes the cluster time T, moves the checkpoint to `startAtOperationTime = T` (in
the same transaction that records the snapshot), then copies each collection in `_id` order,
one committed batch per chunk (source `snapshot`, operation `snapshot`, cluster time T) with
the chunk's progress in the same transaction. A crashed copy resumes after its last committed
chunk. Writes during the copy are fine: every event after T is drained afterwards and folds on
top, because the snapshot's rows sort before any event at or after T.

Event ids of snapshot rows are `82<T>!<snapshot>:<n>`: the resume-token prefix of T followed by
'!', which sorts before every hex digit of a real token at T. A `snapshot_start` row opens each
snapshot and clears the namespace in `current`, so a re-snapshot also removes documents deleted
while the stream's position was lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
from bson import Timestamp, json_util
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from jobs.bson_batch import RawDocuments
from jobs.raw_writer import RawBatchWriter
from resources.mongo import RAW_CODEC, cluster_time
from state.store import BatchRecord, Lease, SnapshotRecord, StateStore, new_batch_id
from tidemark.config import StreamConfig
from tidemark.tokens import CANONICAL, pack_ts, unpack_ts

SNAPSHOT = "snapshot"
SNAPSHOT_START = "snapshot_start"


def snapshot_event_id(at: Timestamp, suffix: str) -> str:
    return f"82{at.time:08X}{at.inc:08X}!{suffix}"


def namespaces(client: MongoClient, stream: StreamConfig) -> list[tuple[str, str]]:
    """The collections a stream's snapshot copies, in a stable order."""
    if stream.scope == "collection":
        assert stream.database and stream.collection
        return [(stream.database, stream.collection)]
    databases = (
        [stream.database]
        if stream.database
        else [d for d in client.list_database_names() if d not in ("admin", "local", "config")]
    )
    found = []
    for db in sorted(d for d in databases if d):
        for coll in sorted(client[db].list_collection_names(filter={"type": "collection"})):
            if not coll.startswith("system."):
                found.append((db, coll))
    return found


def begin_snapshot(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lease: Lease,
    reason: str,
    actor: str = "tidemark",
) -> SnapshotRecord:
    at = cluster_time(client)
    snapshot = SnapshotRecord(
        id=new_batch_id(),
        stream=stream.name,
        reason=reason,
        cluster_time=pack_ts(at),
        namespaces=namespaces(client, stream),
        namespace_index=0,
        last_key=None,
        chunks=0,
        documents=0,
        bytes=0,
        status="running",
        started_at=datetime.now(UTC),
    )
    store.start_snapshot(lease, snapshot, actor)
    return snapshot


def _barrier(snapshot: SnapshotRecord, stream: StreamConfig) -> bytes:
    at = unpack_ts(snapshot.cluster_time)
    event: dict[str, Any] = {
        "_id": {"_data": snapshot_event_id(at, snapshot.id)},
        "operationType": SNAPSHOT_START,
        "clusterTime": at,
    }
    if stream.database is not None:
        event["ns"] = {
            "db": stream.database,
            **({"coll": stream.collection} if stream.collection else {}),
        }
    return bson.encode(event)


def _row(at: Timestamp, suffix: str, db: str, coll: str, document: RawBSONDocument) -> bytes:
    return bson.encode(
        {
            "_id": {"_data": snapshot_event_id(at, suffix)},
            "operationType": SNAPSHOT,
            "clusterTime": at,
            "ns": {"db": db, "coll": coll},
            "documentKey": {"_id": document["_id"]},
            "fullDocument": document,  # embedded as its raw bytes
        }
    )


def copy_chunks(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    lease: Lease,
    snapshot: SnapshotRecord,
    *,
    after_chunk: Callable[[SnapshotRecord], None] | None = None,
) -> SnapshotRecord:
    """Copy and commit chunks until the snapshot is done (or the run's time budget is up)."""
    clock = time.monotonic()
    max_seconds = stream.budget.max_seconds
    at = unpack_ts(snapshot.cluster_time)
    while snapshot.status != "done":
        if max_seconds and time.monotonic() - clock >= max_seconds:
            return snapshot
        db, coll = (
            snapshot.namespaces[snapshot.namespace_index]
            if snapshot.namespace_index < len(snapshot.namespaces)
            else (None, None)
        )
        raws: list[bytes] = [_barrier(snapshot, stream)] if snapshot.chunks == 0 else []
        documents: list[RawBSONDocument] = []
        if db is not None and coll is not None:
            collection = client.get_database(db, codec_options=RAW_CODEC)[coll]
            # The _id index's order, not $gt: $gt would skip _ids of other BSON types.
            cursor = collection.find().hint([("_id", 1)]).limit(stream.snapshot_chunk_size + 1)
            if snapshot.last_key is not None:
                last = json_util.loads(snapshot.last_key, json_options=CANONICAL)
                cursor = cursor.min([("_id", last["_id"])])
            documents = list(cursor)
            if (
                snapshot.last_key is not None
                and documents
                and bson.encode({"_id": documents[0]["_id"]}) == bson.encode({"_id": last["_id"]})
            ):
                documents = documents[1:]  # min() is inclusive: that one is already copied
            documents = documents[: stream.snapshot_chunk_size]
        first = snapshot.documents
        raws += [
            _row(at, f"{snapshot.id}:{first + n:012d}", db, coll, doc)
            for n, doc in enumerate(documents)
            if db is not None and coll is not None
        ]
        progress = replace(
            snapshot,
            chunks=snapshot.chunks + 1,
            documents=snapshot.documents + len(documents),
            bytes=snapshot.bytes + sum(len(d.raw) for d in documents),
        )
        if len(documents) == stream.snapshot_chunk_size:
            progress.last_key = json_util.dumps(
                {"_id": documents[-1]["_id"]}, json_options=CANONICAL
            )
        else:  # this collection is finished
            progress.namespace_index += 1
            progress.last_key = None
        done = progress.namespace_index >= len(snapshot.namespaces)
        progress.status = "done" if done else "running"
        batch = None
        if raws:
            batch_id = new_batch_id()
            writer = RawBatchWriter(lake_root, stream.name, batch_id)
            writer.add(RawDocuments.of(raws))
            writer.close()
            batch = BatchRecord(
                id=batch_id,
                stream=stream.name,
                source="snapshot",
                event_count=len(raws),
                bytes=sum(map(len, raws)),
                files=writer.files,
                events_by_type=dict(writer.counts),
                first_cluster_time=snapshot.cluster_time,
                last_cluster_time=snapshot.cluster_time,
                snapshot_id=snapshot.id,
            )
        store.commit_snapshot_chunk(lease, progress, batch, done)
        snapshot = progress
        if after_chunk is not None:
            after_chunk(snapshot)
    return snapshot
