"""One drain of one stream: change stream -> Parquet files in the raw zone -> one SQL commit.

The run takes the stream's lease, opens the change stream at the stored position, reads with
`try_next()` until it is caught up (the server waited `maxAwaitTimeMS` and found nothing), it
reaches the run's horizon (the cluster time taken at start) or a budget, writes the events as
Parquet, and commits the batch manifest and the new resume token in one transaction.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from jobs.lake import ensure_writable, raw_partition, relative, write_parquet_atomic
from jobs.raw_events import EventColumns
from jobs.stream_errors import translate
from resources.mongo import RAW_CODEC, cluster_time
from state.store import (
    BatchRecord,
    Checkpoint,
    FileEntry,
    NewPosition,
    StateStore,
    new_batch_id,
)
from tidemark.config import StreamConfig
from tidemark.tokens import (
    datetime_to_ts,
    pack_ts,
    token_cluster_time,
    token_from_json,
    token_to_json,
    unpack_ts,
)

# A flush bounds memory: converted rows are written out once either limit is reached.
FLUSH_ROWS = 50_000
FLUSH_BYTES = 64 << 20
LEASE_TTL = timedelta(minutes=10)


@dataclass
class DrainResult:
    """What one run did, for the CLI summary and the Dagster metadata."""

    stream: str
    batch_id: str | None
    events: int
    bytes: int
    files: list[FileEntry]
    events_by_type: dict[str, int]
    stop_reason: (
        str  # caught_up | horizon | budget_events | budget_bytes | budget_seconds | invalidate
    )
    first_cluster_time: Timestamp | None
    last_cluster_time: Timestamp | None
    token_cluster_time: Timestamp | None
    horizon: Timestamp
    started_at: datetime
    duration_s: float
    checkpoint_version: int | None = None

    @property
    def file_bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def start_options(checkpoint: Checkpoint, stream: StreamConfig) -> dict[str, Any]:
    """The `watch()` arguments that open the stream where the checkpoint says."""
    if checkpoint.token is not None:
        token = token_from_json(checkpoint.token)
        # After an invalidate only startAfter may open a new stream past it.
        key = "start_after" if checkpoint.token_is_invalidate else "resume_after"
        return {key: token}
    if checkpoint.start_at_operation_time is not None:
        return {"start_at_operation_time": unpack_ts(checkpoint.start_at_operation_time)}
    if isinstance(stream.start, datetime):
        return {"start_at_operation_time": datetime_to_ts(stream.start)}
    return {}  # "now": the server starts at the current time


def position_time(checkpoint: Checkpoint, options: dict[str, Any]) -> Timestamp | None:
    if checkpoint.cluster_time is not None:
        return unpack_ts(checkpoint.cluster_time)
    return options.get("start_at_operation_time")


def watch_target(client: MongoClient, stream: StreamConfig) -> Any:
    if stream.scope == "cluster":
        return client
    database = client.get_database(stream.database, codec_options=RAW_CODEC)
    if stream.scope == "database":
        return database
    return database.get_collection(stream.collection)


def open_stream(client: MongoClient, stream: StreamConfig, options: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {
        "batch_size": stream.batch_size,
        "max_await_time_ms": stream.max_await_time_ms,
        "show_expanded_events": stream.show_expanded_events or None,
        **options,
    }
    if stream.full_document != "default":
        kwargs["full_document"] = stream.full_document
    if stream.full_document_before_change != "off":
        kwargs["full_document_before_change"] = stream.full_document_before_change
    return watch_target(client, stream).watch(stream.mongo_pipeline(), **kwargs)


class RawBatchWriter:
    """Buffers converted events per hour partition and writes Parquet files at each flush."""

    def __init__(
        self,
        lake_root: Path,
        stream: str,
        batch_id: str,
        flush_rows: int = FLUSH_ROWS,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self.lake_root = lake_root
        self.flush_rows = flush_rows
        self.flush_bytes = flush_bytes
        self.stream = stream
        self.batch_id = batch_id
        self.buffers: dict[tuple[int, int, int, int], EventColumns] = {}
        self.buffered_rows = 0
        self.buffered_bytes = 0
        self.files: list[FileEntry] = []

    def add(self, event: RawBSONDocument, ts: Timestamp) -> None:
        moment = datetime.fromtimestamp(ts.time, UTC)
        key = (moment.year, moment.month, moment.day, moment.hour)
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = EventColumns()
        buffer.add(event)
        self.buffered_rows += 1
        self.buffered_bytes += len(event.raw)
        if self.buffered_rows >= self.flush_rows or self.buffered_bytes >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        for (year, month, day, hour), buffer in sorted(self.buffers.items()):
            moment = datetime(year, month, day, hour, tzinfo=UTC)
            path = raw_partition(self.lake_root, self.stream, moment) / (
                f"{self.batch_id}-{len(self.files):05d}.parquet"
            )
            size = write_parquet_atomic(buffer.to_table(), path)
            self.files.append(FileEntry(relative(self.lake_root, path), len(buffer), size))
        self.buffers.clear()
        self.buffered_rows = 0
        self.buffered_bytes = 0


def drain(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    *,
    before_commit: Callable[[list[FileEntry]], None] | None = None,
    flush_rows: int = FLUSH_ROWS,
) -> DrainResult:
    """Drain `stream` once and commit; see the module docstring. `before_commit` is a test seam."""
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    checkpoint = store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, LEASE_TTL)
    try:
        checkpoint = store.checkpoint(stream.name) or checkpoint  # as of holding the lease
        options = start_options(checkpoint, stream)
        horizon = cluster_time(client)
        batch_id = new_batch_id()
        writer = RawBatchWriter(lake_root, stream.name, batch_id, flush_rows=flush_rows)
        counts: Counter[str] = Counter()
        first_ts: Timestamp | None = None
        last_ts: Timestamp | None = None
        first_id: str | None = None
        last_id: str | None = None
        total_bytes = 0
        events = 0
        budget = stream.budget
        renewed = clock
        invalidated = False
        try:
            with open_stream(client, stream, options) as change_stream:
                token = change_stream.resume_token
                while True:
                    elapsed = time.monotonic() - clock
                    if budget.max_events and events >= budget.max_events:
                        stop = "budget_events"
                        break
                    if budget.max_bytes and total_bytes >= budget.max_bytes:
                        stop = "budget_bytes"
                        break
                    if budget.max_seconds and elapsed >= budget.max_seconds:
                        stop = "budget_seconds"
                        break
                    if time.monotonic() - renewed > LEASE_TTL.total_seconds() / 3:
                        store.renew_lease(lease, LEASE_TTL)
                        renewed = time.monotonic()
                    event = change_stream.try_next()
                    if event is None:
                        # The server found nothing within maxAwaitTimeMS: resume_token is now
                        # the postBatchResumeToken, which moves quiet streams forward too.
                        token = change_stream.resume_token
                        stop = "caught_up"
                        break
                    ts = event["clusterTime"]
                    if ts > horizon:
                        # Not consumed: `token` still points just before this event.
                        stop = "horizon"
                        break
                    writer.add(event, ts)
                    operation = event["operationType"]
                    counts[operation] += 1
                    events += 1
                    total_bytes += len(event.raw)
                    last_id = event["_id"]["_data"]
                    first_id = first_id or last_id
                    first_ts = first_ts or ts
                    last_ts = ts
                    token = change_stream.resume_token
                    if operation == "invalidate":
                        token = event["_id"]
                        invalidated = True
                        stop = "invalidate"
                        break
        except OperationFailure as exc:
            raise translate(exc, stream.name, client, position_time(checkpoint, options)) from None
        writer.flush()
        files = writer.files
        if before_commit is not None:
            before_commit(files)
        token_json = token_to_json(token) if token is not None else None
        token_ts = token_cluster_time(token) if token is not None else None
        position = None
        if token_json is not None and token_json != checkpoint.token:
            position = NewPosition(
                token=token_json,
                token_is_invalidate=invalidated,
                cluster_time=pack_ts(token_ts) if token_ts else None,
            )
        batch = None
        if events:
            batch = BatchRecord(
                id=batch_id,
                stream=stream.name,
                source="incremental",
                event_count=events,
                bytes=total_bytes,
                files=files,
                events_by_type=dict(counts),
                first_event_id=first_id,
                last_event_id=last_id,
                first_cluster_time=pack_ts(first_ts) if first_ts else None,
                last_cluster_time=pack_ts(last_ts) if last_ts else None,
                token_after=token_json,
            )
        version = None
        if batch is not None or position is not None:
            version = store.commit_batch(lease, checkpoint.version, batch, position, ttl=LEASE_TTL)
    finally:
        store.release_lease(lease)
    return DrainResult(
        stream=stream.name,
        batch_id=batch_id if events else None,
        events=events,
        bytes=total_bytes,
        files=files,
        events_by_type=dict(counts),
        stop_reason=stop,
        first_cluster_time=first_ts,
        last_cluster_time=last_ts,
        token_cluster_time=token_ts
        or (unpack_ts(checkpoint.cluster_time) if checkpoint.cluster_time else None),
        horizon=horizon,
        started_at=started_at,
        duration_s=time.monotonic() - clock,
        checkpoint_version=version,
    )
