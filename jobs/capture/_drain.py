"""One drain of one stream: change stream -> Parquet files in the raw zone -> one SQL commit.

The run takes the stream's lease, opens the change stream at the stored position, reads with
`try_next()` until it is caught up (the server waited `maxAwaitTimeMS` and found nothing), it
reaches the run's horizon (the cluster time taken at start) or a budget, writes the events as
Parquet, and commits the batch manifest and the new resume token in one transaction.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

from jobs.capture.capture_pass import (
    PassBounds,
    batch_record,
    capture_pass,
)
from jobs.capture.drain_result import DrainResult
from jobs.capture.namespaces import missing_namespace
from jobs.capture.server_errors import ResumedFromInvalidate
from jobs.capture.snapshot import begin_snapshot, copy_chunks
from jobs.capture.writer import FLUSH_ROWS, RawBatchWriter
from jobs.lake import ensure_writable
from jobs.progress import Meter, ProgressCallback
from resources.mongo import cluster_time, source_identity, unverified_identity
from state import (
    Checkpoint,
    FileEntry,
    Lease,
    NewPosition,
    SnapshotRecord,
    StateStore,
    new_batch_id,
)
from state.leases import CAPTURE_LEASE_TTL
from tidemark.config import StreamConfig
from tidemark.errors import HistoryLost, SnapshotOutrun, StateStoreError, StreamInvalidated
from tidemark.object_path import LakePath
from tidemark.tokens import (
    SourceIdentity,
    datetime_to_ts,
    is_high_water_mark,
    pack_ts,
    token_cluster_time,
    token_from_json,
    token_to_json,
    ts_to_datetime,
    unpack_ts,
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


def drain(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: LakePath,
    *,
    before_commit: Callable[[list[FileEntry]], None] | None = None,
    flush_rows: int = FLUSH_ROWS,
    resnapshot: bool = False,
    after_chunk: Callable[[SnapshotRecord], None] | None = None,
    progress: ProgressCallback | None = None,
) -> DrainResult:
    """Drain `stream` once and commit; see the module docstring.

    A stream that starts with a snapshot (or is asked to re-snapshot, or has
    `on_history_lost: resnapshot` and lost its position) copies its collections first, chunk
    by chunk, and drains the change stream from the snapshot's time once the copy is done.
    `before_commit` and `after_chunk` are test seams; `progress` hears of documents copied
    and events read so far (`jobs.progress`).
    """
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    source = source_identity(client)
    lease = store.acquire_lease(stream.name, "capture", CAPTURE_LEASE_TTL)
    try:
        # Under the lease: a run that may not drain must not change the stream's definition
        # either, or the running one would commit its token under the other's fingerprint.
        # A resnapshot may start on another deployment: its start records that one.
        store.ensure_stream(stream, source, new_source_ok=resnapshot)
        snapshot = _snapshot_phase(
            stream, client, store, lake_root, lease, resnapshot, after_chunk, progress, source
        )
        for attempt in (1, 2):
            if snapshot is not None and snapshot.status != "done":
                return _warned(
                    _snapshot_result(stream, snapshot, started_at, clock), stream, client, source
                )
            try:
                result = _incremental(
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
                    source,
                    progress,
                )
            except HistoryLost as lost:
                if stream.on_history_lost != "resnapshot":
                    raise
                if attempt == 2:
                    raise _outrun(stream, lost) from None
                reason = "history lost"
            else:
                # A second rename-in after the copy: the unmoved position redoes it next run.
                if not result.collection_replaced or attempt == 2:
                    return _warned(result, stream, client, source)
                reason = "collection replaced by a rename"
            snapshot = begin_snapshot(stream, client, store, lease, reason, source=source)
            snapshot = copy_chunks(
                stream, client, store, lake_root, lease, snapshot, after_chunk, progress
            )
        raise AssertionError("unreachable: the second attempt returns or raises")
    finally:
        # When the state store itself failed, its error is the one to show; the lease then
        # expires, or is taken over once this process has ended.
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)


def _warned(
    result: DrainResult, stream: StreamConfig, client: MongoClient, source: SourceIdentity
) -> DrainResult:
    """The result with a warning when the watched namespace does not exist (the run is not
    failed: a stream may wait for its collection to be created), or when the deployment's id
    could not be read (its guard then compares names only)."""
    found = [missing_namespace(client, stream), unverified_identity(source)]
    return replace(result, warnings=[*result.warnings, *(w for w in found if w)])


def _outrun(stream: StreamConfig, lost: HistoryLost) -> SnapshotOutrun:
    """The copy this run made (after losing the history, or a rename-in) was outrun by the
    oplog in turn: a second copy in the same run could be outrun the same way."""
    return SnapshotOutrun(
        f"Stream {stream.name!r} copied its namespace afresh in this run, and the oplog rolled "
        f"past that copy's time before the stream could go on from it "
        f"({lost.problem}). The copy is committed; nothing else was.",
        "The next run copies again (on_history_lost: resnapshot). If this repeats, the oplog "
        "holds less than one copy's time: enlarge it (replSetResizeOplog), copy in larger "
        "chunks (snapshot_chunk_size), or run the drain more often.",
    )


def drain_until_caught_up(
    stream: StreamConfig, client: MongoClient, store: StateStore, lake_root: LakePath
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
    lake_root: LakePath,
    lease: Lease,
    resnapshot: bool,
    after_chunk: Callable[[SnapshotRecord], None] | None,
    progress: ProgressCallback | None,
    source: SourceIdentity,
) -> SnapshotRecord | None:
    """Begin or continue a snapshot when one is due; None when there is none to do."""
    snapshot = store.running_snapshot(stream.name)
    checkpoint = store.checkpoint(stream.name)
    assert checkpoint is not None
    # A resnapshot on another deployment never continues a copy begun on the old one.
    moved = checkpoint.source is not None and checkpoint.source.differs_from(source)
    if resnapshot and (snapshot is None or moved):
        snapshot = begin_snapshot(
            stream,
            client,
            store,
            lease,
            "resnapshot requested" + (" on another deployment" if moved else ""),
            supersedes=snapshot.id if snapshot is not None else None,
            source=source,
        )
    elif snapshot is None and stream.start == "snapshot" and not checkpoint.has_position:
        snapshot = begin_snapshot(stream, client, store, lease, "initial", source=source)
    if snapshot is None:
        return None
    return copy_chunks(stream, client, store, lake_root, lease, snapshot, after_chunk, progress)


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


def _open_invalidated(checkpoint: Checkpoint, stream: StreamConfig) -> None:
    """A stream whose checkpoint is an invalidate either stops there or goes on (startAfter)."""
    if checkpoint.token_is_invalidate and stream.on_invalidate == "stop":
        moment = ts_to_datetime(checkpoint.cluster_time)
        when = f"at {moment:%Y-%m-%d %H:%M:%S} UTC " if moment else ""
        raise StreamInvalidated(
            f"Stream {stream.name!r} ended with an invalidate {when}"
            f"({stream.namespace} was dropped or renamed), and "
            "its on_invalidate is 'stop'; everything up to the invalidate is committed.",
            "Set on_invalidate: continue to follow a re-created collection from there; if "
            "another collection was renamed onto it, its documents were never events of the "
            f"stream: then also run `tidemark resnapshot {stream.name}` to copy them. Or "
            f"`tidemark reset {stream.name} --to-now` to start afresh.",
        )


def _incremental(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: LakePath,
    lease: Lease,
    started_at: datetime,
    clock: float,
    before_commit: Callable[[list[FileEntry]], None] | None,
    flush_rows: int,
    snapshot: SnapshotRecord | None,
    source: SourceIdentity,
    progress: ProgressCallback | None = None,
) -> DrainResult:
    checkpoint = store.checkpoint(stream.name)  # as of holding the lease
    assert checkpoint is not None
    _open_invalidated(checkpoint, stream)
    options = start_options(checkpoint, stream)
    horizon = cluster_time(client)

    def past_horizon(ts: Timestamp) -> bool:
        return ts > horizon

    bounds = PassBounds(past_horizon, stream.budget)
    batch_id = new_batch_id()
    writer = RawBatchWriter(lake_root, stream.name, batch_id, flush_rows=flush_rows)
    keep_alive = lambda: store.renew_lease(lease, CAPTURE_LEASE_TTL)  # noqa: E731
    at = position_time(checkpoint, options)
    meter = Meter(progress, stream.name, "drain", "events", phase="events")
    one_pass = partial(capture_pass, counted=meter.count)
    try:
        got = one_pass(stream, client, writer, options, bounds, keep_alive, position_time=at)
    except ResumedFromInvalidate:
        # Checkpoints committed before closed cursors were detected hold an invalidate's
        # token unflagged; the server names it, so the stream goes on as the flag would say.
        if checkpoint.token_is_invalidate:
            raise
        checkpoint = replace(checkpoint, token_is_invalidate=True)
        _open_invalidated(checkpoint, stream)
        options = start_options(checkpoint, stream)
        got = one_pass(stream, client, writer, options, bounds, keep_alive, position_time=at)
    if before_commit is not None:
        before_commit(writer.files)
    token_json = token_to_json(got.token) if got.token is not None else None
    token_ts = token_cluster_time(got.token) if got.token is not None else None
    position = None
    # The documents a rename brought into the watched collection were never events of this
    # stream: only a copy has them. The position stays before the rename until the copy has
    # begun (it moves the position itself), so a crash in between redoes this.
    replaced = stream.on_invalidate == "continue" and got.renamed_into(stream)
    # An unchanged token keeps its flag: a stream opened with startAfter at an invalidate
    # reports that same token until something new arrives.
    # A stream opened at a snapshot's time T (just after the newest operation) answers with a
    # high-water mark at T before any operation at T exists. Unlike a mark at an operation's
    # time, it does not cover an event at T that comes later (the server resumes before
    # one): the position stays at T until the stream has gone past it.
    ahead = (
        not got.events
        and checkpoint.token is None
        and token_ts is not None
        and pack_ts(token_ts) == checkpoint.start_at_operation_time
        and is_high_water_mark(got.token)
    )
    if token_json is not None and token_json != checkpoint.token and not (replaced or ahead):
        position = NewPosition(
            token=token_json,
            token_is_invalidate=got.invalidated,
            cluster_time=pack_ts(token_ts) if token_ts else None,
            source=source,
        )
    batch = None
    if got.events:
        batch = batch_record(
            batch_id, stream.name, "incremental", got, writer.files, token_after=token_json
        )
    version = None
    if batch is not None or position is not None:
        version = store.commit_batch(
            lease, checkpoint.version, batch, position, ttl=CAPTURE_LEASE_TTL
        )
    meter.finish()  # committed
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
        collection_replaced=replaced,
    )
