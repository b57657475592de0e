"""`tidemark gc`: remove raw files that no committed batch lists (orphans of crashed runs).

A stream is swept only while gc holds every lease its raw zone is written under (the drain's,
which snapshots share, and the replay's), so no writer of it is running: a live writer's files
are never swept, however long it runs. A writer whose lease gc took over (it expired, or its
process is gone) can no longer commit, since its commit is fenced by the lease's epoch. A
stream with a lease held is skipped and swept next time. `min_age_seconds` only spares files
that a writer on a host with a skewed clock might still be renaming into place.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from jobs.capture.capture_pass import writer_leases
from jobs.lake import SweepResult, sweep_orphans
from jobs.raw_zone import RAW
from state import Lease, StateStore
from state.leases import CAPTURE_LEASE_TTL
from tidemark.errors import LeaseHeld, StateStoreError


@dataclass(frozen=True)
class StreamSweep:
    stream: str
    result: SweepResult | None  # None: skipped, a writer holds one of its leases
    note: str = ""


def lake_streams(lake_root: Path) -> list[str]:
    base = lake_root / RAW
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


def collect_garbage(
    lake_root: Path, store: StateStore, min_age_seconds: float = 60.0
) -> list[StreamSweep]:
    sweeps = []
    for stream in lake_streams(lake_root):
        held: list[Lease] = []
        try:
            for name in writer_leases(stream):
                held.append(store.acquire_lease(name, CAPTURE_LEASE_TTL))
        except LeaseHeld:
            _release(store, held)
            sweeps.append(StreamSweep(stream, None, "skipped: a run holds its lease"))
            continue
        try:
            committed = store.committed_paths(stream)
            sweeps.append(
                StreamSweep(stream, sweep_orphans(lake_root, stream, committed, min_age_seconds))
            )
        finally:
            _release(store, held)
    return sweeps


def _release(store: StateStore, leases: list[Lease]) -> None:
    for lease in leases:
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)
