"""Per-stream status: where the checkpoint is, how far behind, and how close to the oplog's edge."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pymongo import MongoClient

from jobs.capture.namespaces import missing_namespace
from resources.mongo import cluster_time, oplog_window
from state import BatchRecord, StateStore
from tidemark.config import StreamConfig
from tidemark.tokens import moment_text, ts_to_datetime

YOUNG_OPLOG_SECONDS = 3600


@dataclass(frozen=True)
class StreamStatus:
    stream: str
    namespace: str
    position_time: datetime | None  # cluster time of the stored token / start point
    lag_seconds: float | None  # cluster now - position
    last_batch: BatchRecord | None
    batches: int
    oplog_first: datetime | None
    oplog_window_seconds: float | None
    headroom_seconds: float | None  # time until the stored position falls off the oplog
    definition_changed: bool
    oplog_fill: float | None = None  # fraction of the oplog's maximum size in use
    # The watched collection or database does not exist (a sentence), or None: the stream
    # reads nothing until it is created, which may be what the operator waits for.
    missing_namespace: str | None = None
    # The checkpoint is an invalidate and on_invalidate is 'stop': drains refuse to go on.
    stopped_at_invalidate: bool = False

    @property
    def condition(self) -> str:
        """One word or two for a table: what most needs the operator's attention."""
        if self.definition_changed:
            return "CHANGED: reset needed"
        if self.stopped_at_invalidate:
            return "STOPPED at invalidate"
        if self.missing_namespace:
            return "WAITING: namespace missing"
        return "ok"

    def warnings(self) -> list[str]:
        """Each thing `condition` flags, as a sentence naming what to do."""
        found = []
        if self.stopped_at_invalidate:
            moment = f" at {moment_text(self.position_time)}" if self.position_time else ""
            found.append(
                f"stream {self.stream} stopped at an invalidate{moment} ({self.namespace} was "
                "dropped or renamed) and its on_invalidate is 'stop': nothing after it is "
                "drained. Set on_invalidate: continue to follow a re-created collection (and "
                f"`tidemark resnapshot {self.stream}` if another was renamed onto it), or "
                f"`tidemark reset {self.stream} --to-now` to start afresh"
            )
        if self.missing_namespace:
            found.append(f"stream {self.stream}: {self.missing_namespace}")
        return found

    @property
    def oplog_is_young(self) -> bool:
        """Neither full nor an hour old: too little history to project the headroom from."""
        return (
            self.oplog_fill is not None
            and self.oplog_fill < 0.95
            and (self.oplog_window_seconds or 0) < YOUNG_OPLOG_SECONDS
        )


def stream_status(stream: StreamConfig, client: MongoClient, store: StateStore) -> StreamStatus:
    checkpoint = store.checkpoint(stream.name)
    position = None
    if checkpoint is not None:
        position = checkpoint.cluster_time or checkpoint.start_at_operation_time
    now_ts = cluster_time(client)
    window = oplog_window(client)
    lag = headroom = None
    if position is not None:
        lag = max(0, now_ts.time - position.time)
        if window is not None:
            # The position falls off when the oplog's window, once full, no longer reaches it.
            headroom = window.projected_seconds - (window.last.time - position.time)
    return StreamStatus(
        stream=stream.name,
        namespace=stream.namespace,
        position_time=ts_to_datetime(position),
        lag_seconds=lag,
        last_batch=store.last_batch(stream.name) if checkpoint else None,
        batches=store.batch_count(stream.name) if checkpoint else 0,
        oplog_first=ts_to_datetime(window.first) if window else None,
        oplog_window_seconds=window.seconds if window else None,
        headroom_seconds=headroom,
        definition_changed=bool(checkpoint and checkpoint.fingerprint != stream.fingerprint()),
        missing_namespace=missing_namespace(client, stream),
        stopped_at_invalidate=bool(
            checkpoint and checkpoint.token_is_invalidate and stream.on_invalidate == "stop"
        ),
        oplog_fill=(
            window.size_bytes / window.max_bytes
            if window and window.size_bytes and window.max_bytes
            else None
        ),
    )
