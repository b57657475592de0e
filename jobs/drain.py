"""One drain of one stream: change stream -> Parquet files in the raw zone -> one SQL commit.

The run takes the stream's lease, opens the change stream at the stored position, reads with
`try_next()` until it is caught up (the server waited `maxAwaitTimeMS` and found nothing), it
reaches the run's horizon (the cluster time taken at start) or a budget, writes the events as
Parquet, and commits the batch manifest and the new resume token in one transaction.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from jobs.bson_batch import RawDocuments
from jobs.change_stream_reader import ChangeStreamReader
from jobs.lake import ensure_writable
from jobs.raw_writer import FLUSH_ROWS, RawBatchWriter
from jobs.snapshot import begin_snapshot, copy_chunks
from jobs.stream_errors import translate
from resources.mongo import cluster_time
from state.store import (
    BatchRecord,
    Checkpoint,
    FileEntry,
    Lease,
    NewPosition,
    SnapshotRecord,
    StateStore,
    new_batch_id,
)
from tidemark.config import Budget, StreamConfig
from tidemark.errors import (
    HistoryLost,
    MongoConnectionError,
    StateStoreError,
    StreamInvalidated,
)
from tidemark.tokens import (
    datetime_to_ts,
    pack_ts,
    token_cluster_time,
    token_from_json,
    token_to_json,
    ts_to_datetime,
    unpack_ts,
)

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
    snapshot: SnapshotRecord | None = None  # the snapshot this run copied chunks of, if any

    @property
    def file_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @classmethod
    def of(
        cls,
        stream: str,
        batch_id: str,
        got: Capture,
        files: list[FileEntry],
        horizon: Timestamp,
        started_at: datetime,
        clock: float,
        **extra: Any,
    ) -> DrainResult:
        """The result of a pass that consumed `got` (a drain's or a replay's)."""
        return cls(
            stream=stream,
            batch_id=batch_id if got.events else None,
            events=got.events,
            bytes=got.bytes,
            files=files,
            events_by_type=dict(got.counts),
            stop_reason=got.stop,
            first_cluster_time=got.first_ts,
            last_cluster_time=got.last_ts,
            horizon=horizon,
            started_at=started_at,
            duration_s=time.monotonic() - clock,
            **{"token_cluster_time": None, **extra},
        )


def start_options(checkpoint: Checkpoint, stream: StreamConfig) -> dict[str, Any]:
    """The $changeStream options that open the stream where the checkpoint says."""
    if checkpoint.token is not None:
        try:
            token = token_from_json(checkpoint.token)
        except (ValueError, TypeError) as exc:
            raise StateStoreError(
                f"The checkpoint of stream {stream.name!r} holds a damaged resume token "
                f"({str(exc)[:120]}); nothing was drained.",
                f"Run `tidemark reset {stream.name} --to-time T` with the time to restart from "
                "(see `tidemark status`), or restore the state store from a backup.",
            ) from None
        # After an invalidate only startAfter may open a new stream past it.
        key = "startAfter" if checkpoint.token_is_invalidate else "resumeAfter"
        return {key: token}
    if checkpoint.start_at_operation_time is not None:
        return {"startAtOperationTime": unpack_ts(checkpoint.start_at_operation_time)}
    if isinstance(stream.start, datetime):
        return {"startAtOperationTime": datetime_to_ts(stream.start)}
    return {}  # "now": the server starts at the current time


def position_time(checkpoint: Checkpoint, options: dict[str, Any]) -> Timestamp | None:
    if checkpoint.cluster_time is not None:
        return unpack_ts(checkpoint.cluster_time)
    return options.get("startAtOperationTime")


def open_reader(
    client: MongoClient,
    stream: StreamConfig,
    start: dict[str, Any],
    is_past_end: Callable[[Timestamp], bool],
) -> ChangeStreamReader:
    options: dict[str, Any] = dict(start)
    if stream.full_document != "default":
        options["fullDocument"] = stream.full_document
    if stream.full_document_before_change != "off":
        options["fullDocumentBeforeChange"] = stream.full_document_before_change
    if stream.show_expanded_events:
        options["showExpandedEvents"] = True
    return ChangeStreamReader(
        client,
        stream.database,
        stream.collection,
        options,
        stream.mongo_pipeline(),
        batch_size=stream.batch_size,
        max_await_time_ms=stream.max_await_time_ms,
        is_past_end=is_past_end,
    )


@dataclass
class Capture:
    """What one pass over a change stream consumed."""

    events: int = 0
    bytes: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    first_ts: Timestamp | None = None
    last_ts: Timestamp | None = None
    first_id: str | None = None
    last_id: str | None = None
    token: Any = None  # the resume token after the last event consumed
    stop: str = ""
    invalidated: bool = False


def _cluster_time(event: RawBSONDocument) -> Timestamp:
    return event["clusterTime"]


def _first_past_end(
    events: RawDocuments, end: int, is_past_end: Callable[[Timestamp], bool]
) -> int:
    """Index of the first event past the end (cluster times never go back in a stream)."""
    low, high = 0, end
    while low < high:
        middle = (low + high) // 2
        if is_past_end(_cluster_time(events[middle])):
            high = middle
        else:
            low = middle + 1
    return low


def capture(
    reader: ChangeStreamReader,
    writer: RawBatchWriter,
    budget: Budget,
    is_past_end: Callable[[Timestamp], bool],
    keep_alive: Callable[[], None],
) -> Capture:
    """Consume whole batches until caught up, past the end, a budget, or an invalidate.

    Work here is per batch, not per event: the cut for a budget is an index, the horizon is
    checked on a batch's last event (a binary search only when it crosses), an invalidate can
    only be a stream's last event, and the events go to the writer as raw bytes.
    """
    clock = time.monotonic()
    renewed = clock
    got = Capture(token=reader.initial_token)
    for batch in reader.batches():
        events = batch.events
        if not events:
            # Caught up (only such batches are empty): the batch's token is the
            # postBatchResumeToken, which moves quiet streams forward too.
            got.token = batch.token_after
            got.stop = "caught_up"
            return got
        now = time.monotonic()
        if budget.max_seconds and now - clock >= budget.max_seconds:
            got.stop = "budget_seconds"
            return got
        if now - renewed > LEASE_TTL.total_seconds() / 3:
            keep_alive()
            renewed = now
        take, stop = len(events), ""
        if budget.max_events:
            left = budget.max_events - got.events
            if left < take:
                take, stop = max(left, 0), "budget_events"
        if budget.max_bytes:
            sizes = got.bytes + np.cumsum(events.sizes[:take])
            crossing = int(np.searchsorted(sizes, budget.max_bytes))  # first at or above
            if crossing < take:  # the event that crosses the limit is the last
                take, stop = crossing + 1, "budget_bytes"
        if take and is_past_end(_cluster_time(events[take - 1])):
            take, stop = _first_past_end(events, take, is_past_end), "horizon"
        if take and events[take - 1]["operationType"] == "invalidate":
            got.invalidated, stop = True, "invalidate"
        if take:
            consumed = events[:take]
            writer.add(consumed)
            got.events += take
            got.bytes += consumed.nbytes
            if got.first_id is None:
                got.first_id = consumed[0]["_id"]["_data"]
                got.first_ts = _cluster_time(consumed[0])
            last = consumed[-1]
            got.last_id, got.last_ts = last["_id"]["_data"], _cluster_time(last)
            whole = take == len(events) and not got.invalidated
            got.token = batch.token_after if whole else last["_id"]
        if stop:
            got.stop = stop
            return got
        if batch.caught_up:  # consumed whole: its token is the postBatchResumeToken
            got.stop = "caught_up"
            return got
    got.stop = "closed"
    return got


def batch_record(
    batch_id: str, stream: str, source: str, got: Capture, files: list[FileEntry], **extra: Any
) -> BatchRecord:
    return BatchRecord(
        id=batch_id,
        stream=stream,
        source=source,
        event_count=got.events,
        bytes=got.bytes,
        files=files,
        events_by_type=dict(got.counts),
        first_event_id=got.first_id,
        last_event_id=got.last_id,
        first_cluster_time=pack_ts(got.first_ts) if got.first_ts else None,
        last_cluster_time=pack_ts(got.last_ts) if got.last_ts else None,
        **extra,
    )


def drain(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    *,
    before_commit: Callable[[list[FileEntry]], None] | None = None,
    flush_rows: int = FLUSH_ROWS,
    resnapshot: bool = False,
    after_chunk: Callable[[SnapshotRecord], None] | None = None,
) -> DrainResult:
    """Drain `stream` once and commit; see the module docstring.

    A stream that starts with a snapshot (or is asked to re-snapshot, or has
    `on_history_lost: resnapshot` and lost its position) copies its collections first, chunk
    by chunk, and drains the change stream from the snapshot's time once the copy is done.
    `before_commit` and `after_chunk` are test seams.
    """
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, LEASE_TTL)
    try:
        snapshot = _snapshot_phase(stream, client, store, lake_root, lease, resnapshot, after_chunk)
        for attempt in (1, 2):
            if snapshot is not None and snapshot.status != "done":
                return _snapshot_result(stream, snapshot, started_at, clock)
            try:
                return _incremental(
                    stream,
                    client,
                    store,
                    lake_root,
                    lease,
                    started_at,
                    clock,
                    before_commit,
                    flush_rows,
                    snapshot,
                )
            except HistoryLost:
                if stream.on_history_lost != "resnapshot" or attempt == 2:
                    raise
                snapshot = begin_snapshot(stream, client, store, lease, "history lost")
                snapshot = copy_chunks(
                    stream, client, store, lake_root, lease, snapshot, after_chunk=after_chunk
                )
        raise AssertionError("unreachable: the second attempt returns or raises")
    finally:
        # When the state store itself failed, its error is the one to show; the lease then
        # expires, or is taken over once this process has ended.
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)


def drain_until_caught_up(
    stream: StreamConfig, client: MongoClient, store: StateStore, lake_root: Path
) -> int:
    """Run drains (each bounded by its budget, or a snapshot's chunks) until one is caught up;
    returns the events committed."""
    events = 0
    while True:
        result = drain(stream, client, store, lake_root)
        events += result.events
        if result.stop_reason == "caught_up":
            return events


def _snapshot_phase(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    lease: Lease,
    resnapshot: bool,
    after_chunk: Callable[[SnapshotRecord], None] | None,
) -> SnapshotRecord | None:
    """Begin or continue a snapshot when one is due; None when there is none to do."""
    snapshot = store.running_snapshot(stream.name)
    checkpoint = store.checkpoint(stream.name)
    assert checkpoint is not None
    if snapshot is None and resnapshot:
        snapshot = begin_snapshot(stream, client, store, lease, "resnapshot requested")
    elif snapshot is None and stream.start == "snapshot" and not checkpoint.has_position:
        snapshot = begin_snapshot(stream, client, store, lease, "initial")
    if snapshot is None:
        return None
    return copy_chunks(stream, client, store, lake_root, lease, snapshot, after_chunk=after_chunk)


def _snapshot_result(
    stream: StreamConfig, snapshot: SnapshotRecord, started_at: datetime, clock: float
) -> DrainResult:
    at = unpack_ts(snapshot.cluster_time)
    return DrainResult(
        stream=stream.name,
        batch_id=None,
        events=0,
        bytes=0,
        files=[],
        events_by_type={},
        stop_reason="snapshot_in_progress",
        first_cluster_time=None,
        last_cluster_time=None,
        token_cluster_time=at,
        horizon=at,
        started_at=started_at,
        duration_s=time.monotonic() - clock,
        snapshot=snapshot,
    )


def _incremental(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    lease: Lease,
    started_at: datetime,
    clock: float,
    before_commit: Callable[[list[FileEntry]], None] | None,
    flush_rows: int,
    snapshot: SnapshotRecord | None,
) -> DrainResult:
    checkpoint = store.checkpoint(stream.name)  # as of holding the lease
    assert checkpoint is not None
    if checkpoint.token_is_invalidate and stream.on_invalidate == "stop":
        moment = ts_to_datetime(checkpoint.cluster_time)
        raise StreamInvalidated(
            f"Stream {stream.name!r} ended with an invalidate at "
            f"{moment:%Y-%m-%d %H:%M:%S} UTC ({stream.namespace} was dropped or renamed), and "
            "its on_invalidate is 'stop'; everything up to the invalidate is committed.",
            "Set on_invalidate: continue to follow a re-created collection from there, or "
            f"`tidemark reset {stream.name} --to-now` to start afresh.",
        )
    options = start_options(checkpoint, stream)
    horizon = cluster_time(client)

    def past_horizon(ts: Timestamp) -> bool:
        return ts > horizon

    batch_id = new_batch_id()
    writer = RawBatchWriter(lake_root, stream.name, batch_id, flush_rows=flush_rows)
    try:
        with open_reader(client, stream, options, past_horizon) as reader:
            got = capture(
                reader,
                writer,
                stream.budget,
                past_horizon,
                lambda: store.renew_lease(lease, LEASE_TTL),
            )
    except OperationFailure as exc:
        writer.close()
        raise translate(exc, stream.name, client, position_time(checkpoint, options)) from None
    except PyMongoError as exc:  # the server went away, and one resume attempt failed too
        writer.close()
        raise MongoConnectionError(
            f"MongoDB became unreachable while stream {stream.name!r} was drained "
            f"({type(exc).__name__}: {str(exc).split(', Timeout')[0][:200]}); nothing was "
            "committed.",
            "The next run resumes from the last checkpoint once the server is back.",
        ) from None
    writer.close()
    got.counts = writer.counts
    if before_commit is not None:
        before_commit(writer.files)
    token_json = token_to_json(got.token) if got.token is not None else None
    token_ts = token_cluster_time(got.token) if got.token is not None else None
    position = None
    if token_json is not None and token_json != checkpoint.token:
        position = NewPosition(
            token=token_json,
            token_is_invalidate=got.invalidated,
            cluster_time=pack_ts(token_ts) if token_ts else None,
        )
    batch = None
    if got.events:
        batch = batch_record(
            batch_id, stream.name, "incremental", got, writer.files, token_after=token_json
        )
    version = None
    if batch is not None or position is not None:
        version = store.commit_batch(lease, checkpoint.version, batch, position, ttl=LEASE_TTL)
    return DrainResult.of(
        stream.name,
        batch_id,
        got,
        writer.files,
        horizon,
        started_at,
        clock,
        token_cluster_time=token_ts
        or (unpack_ts(checkpoint.cluster_time) if checkpoint.cluster_time else None),
        checkpoint_version=version,
        snapshot=snapshot,
    )
