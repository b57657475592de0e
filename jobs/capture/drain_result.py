"""What one capture run did (a drain's or a replay's): the record the CLI summary and the
Dagster metadata are made from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bson import Timestamp

from jobs.capture.capture_pass import StopReason
from state import BatchRecord, FileEntry, SnapshotRecord


@dataclass
class DrainResult:
    """What one run did, for the CLI summary and the Dagster metadata."""

    stream: str
    batch_id: str | None
    events: int
    bytes: int
    files: list[FileEntry]
    events_by_type: dict[str, int]
    stop_reason: StopReason
    first_cluster_time: Timestamp | None
    last_cluster_time: Timestamp | None
    token_cluster_time: Timestamp | None
    horizon: Timestamp
    started_at: datetime
    duration_s: float
    checkpoint_version: int | None = None
    snapshot: SnapshotRecord | None = None  # the snapshot this run copied chunks of, if any
    # A rename replaced the watched collection (its position was not moved: a copy is due).
    collection_replaced: bool = False
    # What the operator should know though nothing failed (a watched namespace that does not
    # exist: the stream reads nothing until it is created).
    warnings: list[str] = field(default_factory=list)

    @property
    def file_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @classmethod
    def of(
        cls,
        batch: BatchRecord,
        stop: StopReason | None,
        horizon: Timestamp,
        started_at: datetime,
        clock: float,
        **extra: Any,
    ) -> DrainResult:
        """The result of a pass whose consumption is `batch` (`capture_pass.batch_record`,
        committed only if it holds events) and that stopped for `stop` (a drain's or a
        replay's)."""
        assert stop is not None, "every return of a pass says why it stopped"
        return cls(
            stream=batch.stream,
            batch_id=batch.id if batch.event_count else None,
            events=batch.event_count,
            bytes=batch.bytes,
            files=batch.files,
            events_by_type=dict(batch.events_by_type),
            stop_reason=stop,
            first_cluster_time=batch.first_cluster_time,
            last_cluster_time=batch.last_cluster_time,
            horizon=horizon,
            started_at=started_at,
            duration_s=time.monotonic() - clock,
            **{"token_cluster_time": None, **extra},
        )
