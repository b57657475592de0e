"""Initial snapshot and re-snapshot: the collection(s) copied as committed chunks, resumable.

A snapshot takes the cluster time T, moves the checkpoint to `startAtOperationTime = T` (in
the same transaction that records the snapshot), then copies each collection in `_id` order,
one committed batch per chunk (source `snapshot`, operation `snapshot`, cluster time T) with
the chunk's progress in the same transaction. A crashed copy resumes after its last committed
chunk. A chunk ends at `snapshot_chunk_size` documents or before `snapshot_chunk_bytes`.

Documents and keys stay raw BSON from the server to the raw zone: the position (`last_key`)
is libbson's canonical Extended JSON of `{_id: ...}` and goes back to the server as raw BSON,
so an _id Python cannot decode (a date before year 1 or after 9999) copies and resumes too.

Writes during the copy are fine: every event after T is drained afterwards and folds on
top, because the snapshot's rows sort before any event at or after T.

Event ids of snapshot rows are `82<T>!<snapshot>:<n>`: the resume-token prefix of T followed by
'!', which sorts before every hex digit of a real token at T. A `snapshot_start` row opens each
snapshot and clears the namespace in `current`, so a re-snapshot also removes documents deleted
while the stream's position was lost.

Long because the copy's three guards belong with the copy they guard: T just after the newest
operation, the stream's own pipeline run over each chunk (a row is the fullDocument the
pipeline makes of the document's insert event, so a field it removes is never copied), and
the watch for renames that would have the copy read a collection in part or under another's
name.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import bson
import bsonjs
from bson import MaxKey, MinKey, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import OperationFailure

from jobs.bson_buffer import RawDocuments, elements
from jobs.capture.server_errors import translate
from jobs.capture.writer import RawBatchWriter
from jobs.progress import Meter, ProgressCallback
from jobs.raw_zone import SNAPSHOT, SNAPSHOT_START
from resources.mongo import RAW_CODEC, cluster_time
from state import BatchRecord, Lease, SnapshotRecord, StateStore, new_batch_id
from tidemark.config import StreamConfig
from tidemark.errors import SnapshotPipelineError
from tidemark.object_path import LakePath
from tidemark.tokens import SourceIdentity, next_tick


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
    supersedes: str | None = None,
    source: SourceIdentity | None = None,  # the deployment T belongs to; None: the stored one
) -> SnapshotRecord:
    # T is just after the newest operation: the copy holds the result of every operation up to
    # it, that one too, so the change stream goes on after it and the snapshot's rows sort
    # after its event: folded again (drained, or replayed late) a rename or drop at it would
    # clear the rows the copy holds for its target and move none.
    at = next_tick(cluster_time(client))
    snapshot = SnapshotRecord.starting(
        id=new_batch_id(),
        stream=stream.name,
        reason=reason,
        cluster_time=at,
        namespaces=namespaces(client, stream),
        started_at=datetime.now(UTC),
    )
    store.start_snapshot(lease, snapshot, actor, supersedes, source)
    return snapshot


def _barrier(snapshot: SnapshotRecord, stream: StreamConfig) -> bytes:
    at = snapshot.cluster_time
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


def _row(at: Timestamp, suffix: str, db: str, coll: str, chunk_row: tuple[bytes, bytes]) -> bytes:
    key, document = chunk_row
    return bson.encode(
        {
            "_id": {"_data": snapshot_event_id(at, suffix)},
            "operationType": SNAPSHOT,
            "clusterTime": at,
            "ns": {"db": db, "coll": coll},
            # Both embedded as their raw bytes: nothing of a document is ever decoded here.
            "documentKey": RawBSONDocument(key),
            "fullDocument": RawBSONDocument(document),
        }
    )


# A command holds at most 16 MB: the pipeline's probes go to the server in parts below that.
_PROBE_BYTES = 8 << 20


def through_pipeline(
    client: MongoClient,
    stream: StreamConfig,
    at: Timestamp,
    db: str,
    coll: str,
    rows: list[tuple[bytes, bytes]],
) -> dict[int, bytes]:
    """Row index -> the document the stream's pipeline makes of that row's insert event
    (its `fullDocument`); the rows whose event the pipeline filters out are absent.

    A snapshot row stands for the event that made its document, so it is exactly what the
    pipeline makes of that event: fields the pipeline (or `exclude_fields`) removes or
    rewrites never reach the lake through a copy, and documents it leaves out are not copied
    (they would sit in `current` with no event of the stream ever changing them). The server
    runs the pipeline itself (`$documents`), so every stage means the same here as on the
    stream; without a pipeline every row passes unchanged and nothing is sent.
    """
    pipeline = stream.mongo_pipeline()
    if not pipeline:
        return {n: document for n, (_, document) in enumerate(rows)}
    made: dict[int, bytes] = {}
    database = client.get_database(db, codec_options=RAW_CODEC)
    start = 0
    while start < len(rows):
        probes: list[RawBSONDocument] = []
        size, end = 0, start
        while end < len(rows) and (not probes or size + len(rows[end][1]) < _PROBE_BYTES):
            key, document = rows[end]
            probe = {
                "_id": end,
                "operationType": "insert",
                "clusterTime": at,  # the snapshot row's
                "ns": {"db": db, "coll": coll},
                "documentKey": RawBSONDocument(key),
                "fullDocument": RawBSONDocument(document),
            }
            probes.append(RawBSONDocument(bson.encode(probe)))
            size += len(probes[-1].raw)
            end += 1
        if len(probes) == 1 and size > _PROBE_BYTES:
            # Too large to send in a command: the server makes the event from the stored
            # document itself. It may be newer than the one read (never older than T): the
            # events after T fold on top of it all the same, and a deleted one is not copied.
            query = [
                {"$match": RawBSONDocument(rows[start][0])},
                _insert_event(start, at, db, coll),
            ]
            target: Any = database[coll]
        else:
            # `$documents` reads its argument as an expression: each probe is a literal, or a
            # stored value such as "$email", {$literal: 5} or a DBRef would be evaluated.
            literals = [{"$literal": probe} for probe in probes]
            query, target = [{"$documents": literals}], database
        outcome = [*query, *pipeline, {"$project": {"_id": 1, "fullDocument": 1}}]
        for event in target.aggregate(outcome):
            index = event["_id"]
            made[index] = _snapshot_document(stream, db, coll, rows[index][0], event)
        start = end
    return made


def _insert_event(index: int, at: Timestamp, db: str, coll: str) -> dict[str, Any]:
    """The stored document's insert event as the `$documents` probes have it."""
    return {
        "$replaceWith": {
            "_id": {"$literal": index},
            "operationType": "insert",
            "clusterTime": {"$literal": at},
            "ns": {"db": {"$literal": db}, "coll": {"$literal": coll}},
            "documentKey": {"_id": "$_id"},
            "fullDocument": "$$ROOT",
        }
    }


def _snapshot_document(
    stream: StreamConfig, db: str, coll: str, key: bytes, event: RawBSONDocument
) -> bytes:
    """The event's fullDocument, refused when it cannot stand for the document copied."""
    document = event.get("fullDocument")
    where = f"document {key_to_text(key)} of {db}.{coll}"
    if not isinstance(document, RawBSONDocument):
        raise SnapshotPipelineError(
            f"The pipeline of stream {stream.name!r} leaves no fullDocument in the insert event "
            f"of {where}, so its snapshot cannot copy it (a snapshot row is exactly what the "
            "pipeline makes of the document's insert event).",
            "Keep fullDocument in insert events and remove only fields inside it (for example "
            "`$unset: fullDocument.email`, or the stream's `exclude_fields`), or start the "
            "stream with `start: now` instead of a snapshot.",
        )
    made = bytes(document.raw)
    try:
        same_key = id_document(made) == key
    except ValueError:
        same_key = False
    if not same_key:
        raise SnapshotPipelineError(
            f"The pipeline of stream {stream.name!r} removes or changes fullDocument._id in the "
            f"insert event of {where}: `current` keys each row by the document's _id, and a "
            "snapshot row with another would never be matched by the document's own events.",
            "Leave fullDocument._id as it is in the pipeline (remove or mask other fields).",
        )
    return made


def id_document(document: bytes) -> bytes:
    """`{_id: <value>}` with the document's _id exactly as stored, never decoded: a date
    outside Python's range, an int32 or int64, -0.0 all stay what they are."""
    for name, _type, value, size in elements(document):
        if name == "_id":
            element = document[value - 5 : value + size]  # type byte, "_id" and its NUL, value
            return struct.pack("<i", len(element) + 5) + element + b"\x00"
    raise ValueError("a stored document without _id")


def key_to_text(key: bytes) -> str:
    """Canonical Extended JSON by libbson: lossless for every BSON type (the state store's
    `last_key`)."""
    return bsonjs.dumps(key, mode=bsonjs.CANONICAL)


def key_from_text(text: str) -> bytes:
    return bsonjs.loads(text)


_MIN_KEY = bson.encode({"_id": MinKey()})
_MAX_KEY = bson.encode({"_id": MaxKey()})


def _in_id_order(
    database: Database, coll: str, after: bytes | None, batch_size: int
) -> Iterator[RawBSONDocument]:
    """The collection's documents after the key `after` (from the start when None), in the
    _id index's order across BSON types (a $gt query would stay within one type).

    `min` takes the key as raw BSON, so a key Python cannot decode still resumes. It is
    inclusive (the caller skips the document at `after`), and the server's default upper
    bound, MaxKey, is exclusive: a document whose _id is MaxKey sorts last and is looked up
    on its own once the scan is through.
    """
    if after == _MAX_KEY:  # only a copy made before MaxKey was handled this way stops there
        return
    command = {
        "find": coll,
        "filter": {},
        "hint": {"_id": 1},
        "min": RawBSONDocument(after or _MIN_KEY),
        # What the chunk may take, the skipped document and one to see whether more follow;
        # the server also stops a reply at 16 MB.
        "batchSize": batch_size,
    }
    with database.cursor_command(command, codec_options=RAW_CODEC) as cursor:
        yield from cursor
    yield from database[coll].find({"_id": MaxKey()})


@dataclass
class Chunk:
    rows: list[tuple[bytes, bytes]]  # (the {_id} key, the document), in _id order
    finished: bool  # the collection has no document after these

    @property
    def nbytes(self) -> int:
        return sum(len(document) for _, document in self.rows)


def read_chunk(
    database: Database, coll: str, after: bytes | None, max_documents: int, max_bytes: int
) -> Chunk:
    """The next documents after `after`: at most `max_documents`, and no more than
    `max_bytes` unless one document alone is larger (a chunk always takes one). Reading
    stops at the first document that does not fit, so a chunk of large documents holds about
    `max_bytes` in memory however many documents the collection has."""
    rows: list[tuple[bytes, bytes]] = []
    nbytes = 0
    documents = _in_id_order(database, coll, after, max_documents + 2)
    with closing(documents):
        for index, document in enumerate(documents):
            raw = bytes(document.raw)  # a memoryview into the reply for large documents
            key = id_document(raw)
            if index == 0 and key == after:
                continue  # min() is inclusive: that one is already copied
            if len(rows) == max_documents or (rows and nbytes + len(raw) > max_bytes):
                return Chunk(rows, finished=False)
            rows.append((key, raw))
            nbytes += len(raw)
    return Chunk(rows, finished=True)


class RenameWatch:
    """The renames in a database or cluster stream's scope since its snapshot's time T.

    The copy reads its collections one after another, long after T, by name: a collection of
    the copy list renamed before its copy ended is read in part (or not at all, or another
    collection renamed onto its name is read in its stead), and the rename event, folded
    later, moves only the rows that were copied. Such a copy is made afresh. A rename of a
    collection already copied is folded as any event; a collection stream's own renames are
    folded as drops or copied afresh by the drain."""

    def __init__(self, client: MongoClient, stream: StreamConfig, snapshot: SnapshotRecord):
        self.client, self.stream = client, stream
        self.at = snapshot.cluster_time
        self.position: dict[str, Any] = {"start_at_operation_time": self.at}
        self.sources: set[tuple[str, str]] = set()

    def renamed(self, names: list[tuple[str, str]]) -> bool:
        """True when one of `names` was renamed since T (read up to now)."""
        if self.stream.scope == "collection":
            return False
        target = self.client if self.stream.database is None else self.client[self.stream.database]
        try:
            with target.watch(
                [{"$match": {"operationType": "rename"}}], max_await_time_ms=50, **self.position
            ) as events:
                while events.alive:
                    event = events.try_next()
                    if event is None:
                        break
                    self.sources.add((event["ns"]["db"], event["ns"]["coll"]))
                if events.resume_token is not None:
                    self.position = {"start_after": events.resume_token}
        except OperationFailure as exc:
            raise translate(exc, self.stream.name, self.client, self.at) from None
        return any(tuple(name) in self.sources for name in names)


def copy_chunks(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: LakePath,
    lease: Lease,
    snapshot: SnapshotRecord,
    after_chunk: Callable[[SnapshotRecord], None] | None = None,
    progress: ProgressCallback | None = None,
) -> SnapshotRecord:
    """Copy and commit chunks until the snapshot is done (or the run's time budget is up);
    `progress` hears of the documents copied against the collections' estimated count."""
    clock = time.monotonic()
    meter = Meter(progress, stream.name, "snapshot", "documents", resumed_from=snapshot.documents)
    if progress is not None:  # the metadata count: one cheap command per collection
        meter.enter("copy", total=estimated_documents(client, snapshot))
    max_seconds = stream.budget.max_seconds
    at = snapshot.cluster_time
    renames = RenameWatch(client, stream, snapshot)
    while snapshot.status != "done":
        if max_seconds and time.monotonic() - clock >= max_seconds:
            meter.finish()
            return snapshot
        db, coll = (
            snapshot.namespaces[snapshot.namespace_index]
            if snapshot.namespace_index < len(snapshot.namespaces)
            else (None, None)
        )
        raws: list[bytes] = [_barrier(snapshot, stream)] if snapshot.chunks == 0 else []
        chunk = Chunk([], finished=True)
        if db is not None and coll is not None:
            after = key_from_text(snapshot.last_key) if snapshot.last_key is not None else None
            database = client.get_database(db, codec_options=RAW_CODEC)
            chunk = read_chunk(
                database, coll, after, stream.snapshot_chunk_size, stream.snapshot_chunk_bytes
            )
            # After the read: a rename before it shows now; one after it finds the collection
            # read whole so far, and is seen at its next chunk (or it was copied through).
            if renames.renamed(snapshot.namespaces[snapshot.namespace_index :]):
                reason = "restarted: a collection it copies was renamed"
                snapshot = begin_snapshot(
                    stream, client, store, lease, reason, supersedes=snapshot.id
                )
                at, renames = snapshot.cluster_time, RenameWatch(client, stream, snapshot)
                continue
            first = snapshot.documents
            made = through_pipeline(client, stream, at, db, coll, chunk.rows)
            raws += [
                _row(at, f"{snapshot.id}:{first + n:012d}", db, coll, (key, made[n]))
                for n, (key, _) in enumerate(chunk.rows)
                if n in made
            ]
        moved = replace(
            snapshot,
            chunks=snapshot.chunks + 1,
            documents=snapshot.documents + len(chunk.rows),
            bytes=snapshot.bytes + chunk.nbytes,
        )
        if chunk.finished:
            moved.namespace_index += 1
            moved.last_key = None
        else:
            moved.last_key = key_to_text(chunk.rows[-1][0])
        done = moved.namespace_index >= len(snapshot.namespaces)
        moved.status = "done" if done else "running"
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
        store.commit_snapshot_chunk(lease, moved, batch, done)
        snapshot = moved
        meter.count(snapshot.documents)
        if after_chunk is not None:
            after_chunk(snapshot)
    meter.finish()
    return snapshot


def estimated_documents(client: MongoClient, snapshot: SnapshotRecord) -> int:
    """The snapshot's collections' document counts from their metadata (no scan)."""
    return sum(client[db][coll].estimated_document_count() for db, coll in snapshot.namespaces)
