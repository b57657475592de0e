"""One drain of one stream: change stream -> Parquet files in the raw zone -> one SQL commit.

The run takes the stream's lease, opens the change stream at the stored position, reads with
`try_next()` until it is caught up (the server waited `maxAwaitTimeMS` and found nothing), it
reaches the run's horizon (the cluster time taken at start) or a budget, writes the events as
Parquet, and commits the batch manifest and the new resume token in one transaction. Where it
opens and where the checkpoint moves are the rules of `jobs.capture.checkpoint_rules`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

from jobs.capture.capture_pass import Capture, PassBounds, batch_record, capture_pass
from jobs.capture.checkpoint_rules import (
    after_pass,
    as_invalidate,
    check_invalidate,
    position_time,
    start_options,
)
from jobs.capture.drain_result import DrainResult
from jobs.capture.namespaces import missing_namespace
from jobs.capture.snapshot import begin_snapshot, copy_chunks
from jobs.capture.writer import FLUSH_ROWS, RawBatchWriter
from jobs.lake import ensure_writable
from jobs.progress import Meter, ProgressCallback
from resources.mongo import cluster_time, oplog_window, source_identity, unverified_identity
from state import (
    FileEntry,
    Lease,
    SnapshotRecord,
    StateStore,
    new_batch_id,
)
from state.leases import CAPTURE_LEASE_TTL
from tidemark.config import StreamConfig
from tidemark.errors import HistoryLost, ResumedFromInvalidate, SnapshotOutrun, StateStoreError
from tidemark.object_path import LakePath
from tidemark.tokens import SourceIdentity


@dataclass(frozen=True)
class DrainSeams:
    """Where tests and tools reach into a drain: a call before its SQL commit (given the files
    written), one after each snapshot chunk, and the rows per Parquet flush."""

    before_commit: Callable[[list[FileEntry]], None] | None = None
    after_chunk: Callable[[SnapshotRecord], None] | None = None
    flush_rows: int = FLUSH_ROWS


@dataclass(frozen=True)
class DrainRun:
    """What every step of one drain works with: the stream and where it is read from and
    written to, the lease it runs under, and the caller's seams."""

    stream: StreamConfig
    client: MongoClient
    store: StateStore
    lake_root: LakePath
    lease: Lease
    source: SourceIdentity  # the deployment this run reaches
    started_at: datetime
    clock: float  # time.monotonic() at the start
    seams: DrainSeams = DrainSeams()
    progress: ProgressCallback | None = None

    def keep_alive(self) -> None:
        self.store.renew_lease(self.lease, CAPTURE_LEASE_TTL)

    def begin_snapshot(self, reason: str, supersedes: str | None = None) -> SnapshotRecord:
        return begin_snapshot(
            self.stream,
            self.client,
            self.store,
            self.lease,
            reason,
            supersedes=supersedes,
            source=self.source,
        )

    def copy_chunks(self, snapshot: SnapshotRecord) -> SnapshotRecord:
        return copy_chunks(
            self.stream,
            self.client,
            self.store,
            self.lake_root,
            self.lease,
            snapshot,
            self.seams.after_chunk,
            self.progress,
        )


def drain(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: LakePath,
    *,
    resnapshot: bool = False,
    progress: ProgressCallback | None = None,
    seams: DrainSeams = DrainSeams(),
) -> DrainResult:
    """Drain `stream` once and commit; see the module docstring.

    A stream that starts with a snapshot (or is asked to re-snapshot, or has
    `on_history_lost: resnapshot` and lost its position) copies its collections first, chunk
    by chunk, and drains the change stream from the snapshot's time once the copy is done.
    `progress` hears of documents copied and events read so far (`jobs.progress`); `seams`
    are where tests reach in (`DrainSeams`).
    """
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    source = source_identity(client)
    lease = store.acquire_lease(stream.name, "capture", CAPTURE_LEASE_TTL)
    run = DrainRun(
        stream,
        client,
        store,
        lake_root,
        lease,
        source,
        started_at,
        clock,
        seams=seams,
        progress=progress,
    )
    try:
        # Under the lease: a run that may not drain must not change the stream's definition
        # either, or the running one would commit its token under the other's fingerprint.
        # A resnapshot may start on another deployment: its start records that one.
        store.ensure_stream(stream, source, new_source_ok=resnapshot)
        # How far back replay windows can reach, for the Dagster definitions' next load
        # (which reads the state store, never MongoDB).
        window = oplog_window(client)
        if window is not None:
            store.record_oplog_first(stream.name, window.first)
        return _drain_under_lease(run, resnapshot)
    finally:
        # When the state store itself failed, its error is the one to show; the lease then
        # expires, or is taken over once this process has ended.
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)


def _drain_under_lease(run: DrainRun, resnapshot: bool) -> DrainResult:
    """The snapshot due, then the change stream; once more after a copy the stream needed
    (its history lost, or a rename-in), never twice."""
    snapshot = _snapshot_phase(run, resnapshot)
    for attempt in (1, 2):
        if snapshot is not None and snapshot.status != "done":
            return _warned(run, _snapshot_result(run, snapshot))
        try:
            result = _incremental(run, snapshot)
        except HistoryLost as lost:
            if run.stream.on_history_lost != "resnapshot":
                raise
            if attempt == 2:
                raise _outrun(run.stream, lost) from None
            reason = "history lost"
        else:
            # A second rename-in after the copy: the unmoved position redoes it next run.
            if not result.collection_replaced or attempt == 2:
                return _warned(run, result)
            reason = "collection replaced by a rename"
        snapshot = run.copy_chunks(run.begin_snapshot(reason))
    raise AssertionError("unreachable: the second attempt returns or raises")


def _warned(run: DrainRun, result: DrainResult) -> DrainResult:
    """The result with a warning when the watched namespace does not exist (the run is not
    failed: a stream may wait for its collection to be created), or when the deployment's id
    could not be read (its guard then compares names only)."""
    found = [missing_namespace(run.client, run.stream), unverified_identity(run.source)]
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


def _snapshot_phase(run: DrainRun, resnapshot: bool) -> SnapshotRecord | None:
    """Begin or continue a snapshot when one is due; None when there is none to do."""
    stream = run.stream
    snapshot = run.store.running_snapshot(stream.name)
    checkpoint = run.store.checkpoint(stream.name)
    assert checkpoint is not None
    # A resnapshot on another deployment never continues a copy begun on the old one.
    moved = checkpoint.source is not None and checkpoint.source.differs_from(run.source)
    if resnapshot and (snapshot is None or moved):
        snapshot = run.begin_snapshot(
            "resnapshot requested" + (" on another deployment" if moved else ""),
            supersedes=snapshot.id if snapshot is not None else None,
        )
    elif snapshot is None and stream.start == "snapshot" and not checkpoint.has_position:
        snapshot = run.begin_snapshot("initial")
    if snapshot is None:
        return None
    return run.copy_chunks(snapshot)


def _snapshot_result(run: DrainRun, snapshot: SnapshotRecord) -> DrainResult:
    at = snapshot.cluster_time
    return DrainResult(
        stream=run.stream.name,
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
        started_at=run.started_at,
        duration_s=time.monotonic() - run.clock,
        snapshot=snapshot,
    )


def _incremental(run: DrainRun, snapshot: SnapshotRecord | None) -> DrainResult:
    """One pass over the change stream from the checkpoint, to the horizon taken now, and its
    commit (`checkpoint_rules` say where the pass opens and where the checkpoint moves)."""
    stream = run.stream
    checkpoint = run.store.checkpoint(stream.name)  # as of holding the lease
    assert checkpoint is not None
    check_invalidate(checkpoint, stream)
    options = start_options(checkpoint, stream)
    horizon = cluster_time(run.client)

    def past_horizon(ts: Timestamp) -> bool:
        return ts > horizon

    bounds = PassBounds(past_horizon, stream.budget)
    batch_id = new_batch_id()
    writer = RawBatchWriter(run.lake_root, stream.name, batch_id, flush_rows=run.seams.flush_rows)
    at = position_time(checkpoint, options)
    meter = Meter(run.progress, stream.name, "drain", "events", phase="events")

    def one_pass(options: dict[str, Any]) -> Capture:
        return capture_pass(
            stream,
            run.client,
            writer,
            options,
            bounds,
            run.keep_alive,
            position_time=at,
            counted=meter.count,
        )

    try:
        got = one_pass(options)
    except ResumedFromInvalidate:  # an unflagged invalidate's token (rule 3)
        if checkpoint.token_is_invalidate:
            raise
        checkpoint = as_invalidate(checkpoint)
        check_invalidate(checkpoint, stream)
        got = one_pass(start_options(checkpoint, stream))
    if run.seams.before_commit is not None:
        run.seams.before_commit(writer.files)
    move = after_pass(checkpoint, got, stream, run.source)
    batch = batch_record(
        batch_id, stream.name, "incremental", got, writer.files, token_after=got.resume_token
    )
    version = None
    if got.events or move.position is not None:
        version = run.store.commit_batch(
            run.lease,
            checkpoint.version,
            batch if got.events else None,
            move.position,
            ttl=CAPTURE_LEASE_TTL,
        )
    meter.finish()  # committed
    token = got.resume_token
    return DrainResult.of(
        batch,
        got.stop,
        horizon,
        run.started_at,
        run.clock,
        token_cluster_time=(token.cluster_time if token is not None else None)
        or checkpoint.cluster_time,
        checkpoint_version=version,
        snapshot=snapshot,
        collection_replaced=move.collection_replaced,
    )
