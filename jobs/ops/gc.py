"""`tidemark gc`: remove raw files that no committed batch lists (orphans of crashed runs), and
curated directories that no committed transform run names or no kept version needs.

A stream is swept only while gc holds every lease its raw zone is written under (the drain's,
which snapshots share, and the replay's), so no writer of it is running: a live writer's files
are never swept, however long it runs. A writer whose lease gc took over (it expired, or its
process is gone) can no longer commit, since its commit is fenced by the lease's epoch. A
stream with a lease held is skipped and swept next time. `min_age_seconds` only spares files
that a writer on a host with a skewed clock might still be renaming into place.

The curated zone is swept under the stream's transform lease as well, so no transform or
compaction is writing: a directory of `current` or of the change log is removed when no
committed run names it (an attempt that died before its commit), or when it only serves
versions pruned more than `min_age_seconds` ago (a reader that resolved one just before its
prune has had that long to finish).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jobs.capture.capture_pass import writer_leases
from jobs.catalog import MANIFEST_TEMP_PREFIX
from jobs.curated_zone import changes_dir, current_root
from jobs.lake import SweepResult, sweep, sweep_orphans
from jobs.raw_zone import RAW
from state import Lease, StateStore, TransformState
from state.leases import CAPTURE_LEASE_TTL, TRANSFORM_LEASE_TTL
from state.transform_runs import parts_of
from tidemark.errors import LeaseHeld, StateStoreError


@dataclass(frozen=True)
class StreamSweep:
    stream: str
    result: SweepResult | None  # None: skipped, a writer holds one of its leases
    note: str = ""
    curated: SweepResult | None = None  # directories of `current` and the change log


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
            held.append(store.acquire_lease(f"transform:{stream}", TRANSFORM_LEASE_TTL))
        except LeaseHeld:
            _release(store, held)
            sweeps.append(StreamSweep(stream, None, "skipped: a run holds its lease"))
            continue
        try:
            committed = store.committed_paths(stream)
            raw = sweep_orphans(lake_root, stream, committed, min_age_seconds)
            curated = sweep_curated(lake_root, store, stream, min_age_seconds)
            sweeps.append(StreamSweep(stream, raw, curated=curated))
        finally:
            _release(store, held)
    return sweeps


def needed_directories(store: StateStore, stream: str, min_age_seconds: float) -> set[str]:
    """The curated directories (lake-relative) readers may still need: every directory of each
    kept version and of versions pruned less than `min_age_seconds` ago, and the change log's."""
    runs = TransformState(store).runs(stream)
    now = datetime.now(UTC)
    needed = {r.changes_path for r in runs if r.changes_path}
    for run in runs:
        if run.path is None:
            continue
        recent = run.pruned_at is None or (now - run.pruned_at).total_seconds() < min_age_seconds
        if recent:
            needed.update(p.path for p in parts_of(runs, run) if p.path)
    return needed


def sweep_curated(
    lake_root: Path, store: StateStore, stream: str, min_age_seconds: float
) -> SweepResult:
    """Remove the stream's curated directories that `needed_directories` does not list (the
    caller holds the transform lease)."""
    needed = needed_directories(store, stream, min_age_seconds)
    roots = [current_root(lake_root, stream), changes_dir(lake_root, stream)]
    # Its directories, and any manifest a crash left half-written (never the manifest itself).
    candidates = [
        p
        for r in roots
        if r.exists()
        for p in sorted(r.iterdir())
        if p.is_dir() or p.name.startswith(MANIFEST_TEMP_PREFIX)
    ]
    return sweep(lake_root, candidates, needed, min_age_seconds, _remove)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _release(store: StateStore, leases: list[Lease]) -> None:
    for lease in leases:
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)
