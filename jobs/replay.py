"""Replay of an operation-time window [start, end): backfill without touching the checkpoint.

The change stream opens with `startAtOperationTime = start` and stops at the first event at or
after `end`. The batch is committed as `source = replay` with its window; the incremental
checkpoint never moves, and the transform drops the events it already has.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from jobs.drain import LEASE_TTL, DrainResult, batch_record, capture, open_reader
from jobs.lake import ensure_writable
from jobs.raw_writer import RawBatchWriter
from jobs.stream_errors import translate
from resources.mongo import cluster_time, oplog_window
from state.store import StateStore, new_batch_id
from tidemark.config import Budget, StreamConfig
from tidemark.errors import TidemarkError
from tidemark.tokens import datetime_to_ts, pack_ts, ts_to_datetime


class ReplayRefused(TidemarkError):
    """A window that cannot be replayed exactly: not closed yet, or older than the oplog."""


def _fmt(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "an unknown time"


def check_window(stream: str, client: MongoClient, start: datetime, end: datetime) -> None:
    now = ts_to_datetime(cluster_time(client))
    if end > datetime.now(UTC) or (now is not None and end > now + timedelta(seconds=10)):
        raise ReplayRefused(
            f"The replay window [{_fmt(start)}, {_fmt(end)}) of stream {stream!r} is not closed "
            "yet: events may still arrive in it.",
            "Replay it after its end; the incremental schedule covers the open window meanwhile.",
        )
    window = oplog_window(client)
    if window is not None and pack_ts(datetime_to_ts(start)) < pack_ts(window.first):
        raise ReplayRefused(
            f"The replay window [{_fmt(start)}, {_fmt(end)}) of stream {stream!r} starts before "
            f"the oplog's first entry ({_fmt(ts_to_datetime(window.first))}): its changes are no "
            "longer on the server, so a replay could not be exact.",
            "Replay only windows inside the oplog (see `tidemark status`); older data needs a "
            "snapshot of the collection.",
        )


def replay(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    lake_root: Path,
    start: datetime,
    end: datetime,
) -> DrainResult:
    """Capture the events of [start, end) as a replay batch; the checkpoint is not moved."""
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    ensure_writable(lake_root)
    check_window(stream.name, client, start, end)
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(f"replay:{stream.name}", LEASE_TTL)
    try:
        start_ts, end_ts = datetime_to_ts(start), datetime_to_ts(end)

        def past_window(ts: Timestamp) -> bool:
            return ts >= end_ts

        options = {"startAtOperationTime": start_ts}
        batch_id = new_batch_id()
        writer = RawBatchWriter(lake_root, stream.name, batch_id)
        # A window is bounded by its end, not by the per-run budgets of the incremental drain.
        unbounded = Budget(max_events=None, max_bytes=None, max_seconds=None)
        try:
            with open_reader(client, stream, options, past_window) as reader:
                got = capture(
                    reader,
                    writer,
                    unbounded,
                    past_window,
                    lambda: store.renew_lease(lease, LEASE_TTL),
                )
        except OperationFailure as exc:
            raise translate(exc, stream.name, client, start_ts) from None
        writer.close()
        got.counts = writer.counts
        if got.events:
            batch = batch_record(
                batch_id,
                stream.name,
                "replay",
                got,
                writer.files,
                window_start=pack_ts(start_ts),
                window_end=pack_ts(end_ts),
            )
            store.commit_batch(lease, None, batch, None, ttl=LEASE_TTL)
    finally:
        store.release_lease(lease)
    return DrainResult.of(stream.name, batch_id, got, writer.files, end_ts, started_at, clock)
