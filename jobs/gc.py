"""`tidemark gc`: remove raw files that no committed batch lists (orphans of crashed runs).

Each stream is swept while holding its lease, so no drain of it is writing at the same time;
a stream whose lease is held is skipped and swept next time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from jobs.lake import RAW, SweepResult, sweep_orphans
from state.store import StateStore
from tidemark.errors import LeaseHeld


@dataclass(frozen=True)
class StreamSweep:
    stream: str
    result: SweepResult | None  # None: skipped, its lease is held
    note: str = ""


def lake_streams(lake_root: Path) -> list[str]:
    base = lake_root / RAW
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


def collect_garbage(
    lake_root: Path, store: StateStore, min_age_seconds: float = 60.0
) -> list[StreamSweep]:
    sweeps = []
    for stream in lake_streams(lake_root):
        try:
            lease = store.acquire_lease(stream, timedelta(minutes=5))
        except LeaseHeld:
            sweeps.append(StreamSweep(stream, None, "skipped: a run holds its lease"))
            continue
        try:
            committed = store.committed_paths(stream)
            sweeps.append(
                StreamSweep(stream, sweep_orphans(lake_root, stream, committed, min_age_seconds))
            )
        finally:
            store.release_lease(lease)
    return sweeps
