"""Explicit checkpoint moves (`tidemark reset`): under the lease, recorded in the state store."""

from __future__ import annotations

from datetime import UTC, datetime

from pymongo import MongoClient

from resources.mongo import cluster_time, oplog_window, source_identity
from state import NewPosition, StateStore
from state.leases import RESET_LEASE_TTL
from tidemark.config import StreamConfig
from tidemark.errors import ResetTimeBeforeOplog, ResetTimeInFuture
from tidemark.tokens import datetime_to_ts, moment_text, ts_to_datetime


def reset_stream(
    stream: StreamConfig,
    client: MongoClient,
    store: StateStore,
    *,
    to_time: datetime | None,
    actor: str,
) -> datetime:
    """Point the stream at `to_time` (None: now) under its current definition, on the
    deployment `client` reaches (recorded with the position); returns the time."""
    if to_time is None:
        target = cluster_time(client)
        description = "now"
    else:
        if to_time.tzinfo is None:
            to_time = to_time.replace(tzinfo=UTC)
        target = datetime_to_ts(to_time)
        # Wall time, not cluster time: an idle cluster's time lags by up to its no-op interval.
        if to_time > datetime.now(UTC):
            raise ResetTimeInFuture(
                f"Cannot reset stream {stream.name!r} to {moment_text(to_time)}: "
                "that is in the future.",
                "Use --to-now, or a time in the past.",
            )
        window = oplog_window(client)
        if window is not None and target < window.first:
            raise ResetTimeBeforeOplog(
                f"Cannot reset stream {stream.name!r} to {moment_text(to_time)}: the "
                f"oplog starts at {moment_text(window.first)}, so the "
                "changes before that are gone.",
                "Choose a time inside the oplog window (see `tidemark status`).",
            )
        description = f"time {to_time.isoformat()}"
    store.ensure_stream_row(stream)
    lease = store.acquire_lease(stream.name, "capture", RESET_LEASE_TTL)
    try:
        store.reset_checkpoint(
            lease,
            stream,
            NewPosition(
                start_at_operation_time=target,
                cluster_time=target,
                source=source_identity(client),
            ),
            description,
            actor,
        )
    finally:
        store.release_lease(lease)
    moment = ts_to_datetime(target)
    assert moment is not None
    return moment
