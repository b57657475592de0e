"""What one capture run did (a drain's or a replay's): the record the CLI summary and the
Dagster metadata are made from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bson import Timestamp

from jobs.capture.capture_pass import Capture, StopReason
from state import FileEntry, SnapshotRecord


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
        assert got.stop is not None, "every return of a pass says why it stopped"
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
