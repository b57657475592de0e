"""Replay of an operation-time window [start, end): backfill without touching the checkpoint.

The change stream opens with `startAtOperationTime = start` and stops at the first event at or
after `end`. The batch is committed as `source = replay` with its window; the incremental
checkpoint never moves, and the transform drops the events it already has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from bson import Timestamp
from pymongo import MongoClient

from jobs.capture.capture_pass import (
    PassBounds,
    batch_record,
    capture_pass,
)
from jobs.capture.drain_result import DrainResult
from jobs.capture.writer import RawBatchWriter
from jobs.lake import ensure_writable
from resources.mongo import cluster_time, oplog_window, source_identity
from state import FileEntry, StateStore, new_batch_id
from state.leases import CAPTURE_LEASE_TTL
from tidemark.config import Budget, StreamConfig
from tidemark.errors import HistoryLost, ReplayRefused
from tidemark.object_path import LakePath
from tidemark.tokens import datetime_to_ts, moment_text, ts_to_datetime


def check_window(stream: str, client: MongoClient, start: datetime, end: datetime) -> None:
    now = ts_to_datetime(cluster_time(client))
    if end > datetime.now(UTC) or (now is not None and end > now + timedelta(seconds=10)):
        raise ReplayRefused(
            f"The replay window [{moment_text(start)}, {moment_text(end)}) of stream {stream!r} "
            "is not closed yet: events may still arrive in it.",
            "Replay it after its end; the incremental schedule covers the open window meanwhile.",
        )
    window = oplog_window(client)
    if window is not None and datetime_to_ts(start) < window.first:
        raise ReplayRefused(
            f"The replay window [{moment_text(start)}, {moment_text(end)}) of stream {stream!r} "
            f"starts before the oplog's first entry ({moment_text(window.first)}): its changes "
            "are no longer on the server, so a replay could not be exact.",
            "Replay only windows inside the oplog (see `tidemark status`); older data needs a "
            "snapshot of the collection.",
        )


def replay(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: LakePath,
    start: datetime,
    end: datetime,
    *,
    before_commit: Callable[[list[FileEntry]], None] | None = None,
) -> DrainResult:
    """Capture the events of [start, end) as a replay batch; the checkpoint is not moved.

    The window is read until the stream's tokens pass `end` (an empty reply is not its end),
    with no per-run budget, and through invalidates when the stream continues after them.
    """
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    check_window(stream.name, client, start, end)
    # The window is read by time, but its events join the stream's: from its deployment only.
    store.check_source(stream, source_identity(client))
    lease = store.acquire_lease(stream.name, "replay", CAPTURE_LEASE_TTL)
    try:
        start_ts, end_ts = datetime_to_ts(start), datetime_to_ts(end)

        def past_window(ts: Timestamp) -> bool:
            return ts >= end_ts

        unbounded = Budget(max_events=None, max_bytes=None, max_seconds=None)
        follow = stream.on_invalidate == "continue"
        bounds = PassBounds(past_window, unbounded, until_end=True, follow_invalidate=follow)
        batch_id = new_batch_id()
        writer = RawBatchWriter(lake_root, stream.name, batch_id)
        try:
            got = capture_pass(
                stream,
                client,
                writer,
                {"startAtOperationTime": start_ts},
                bounds,
                lambda: store.renew_lease(lease, CAPTURE_LEASE_TTL),
                position_time=start_ts,
            )
        except HistoryLost:
            # The oplog rolled past the window's start between the check and the read: the
            # window is older than the oplog now, as if the check had found it so.
            raise ReplayRefused(
                f"The replay window [{moment_text(start)}, {moment_text(end)}) of stream "
                f"{stream.name!r} fell off the oplog while it was being read: its changes are no "
                "longer on the server, so a replay could not be exact. Nothing was committed.",
                "Replay only windows well inside the oplog (see `tidemark status`); older "
                "data needs a snapshot of the collection.",
            ) from None
        if before_commit is not None:
            before_commit(writer.files)
        batch = batch_record(
            batch_id,
            stream.name,
            "replay",
            got,
            writer.files,
            window_start=start_ts,
            window_end=end_ts,
        )
        if got.events:
            store.commit_batch(lease, None, batch, None, ttl=CAPTURE_LEASE_TTL)
    finally:
        store.release_lease(lease)
    return DrainResult.of(batch, got.stop, end_ts, started_at, clock)
