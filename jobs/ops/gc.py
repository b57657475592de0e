"""`tidemark gc`: remove raw files that no committed batch lists (orphans of crashed runs), and
VACUUM the curated Delta tables.

A stream is swept only while gc holds every lease its raw zone is written under (the drain's,
which snapshots share, and the replay's), so no writer of it is running: a live writer's files
are never swept, however long it runs. A writer whose lease gc took over (it expired, or its
process is gone) can no longer commit, since its commit is fenced by the lease's epoch. A
stream with a lease held is skipped and swept next time. `min_age_seconds` only spares files
that a writer on a host with a skewed clock might still be renaming into place.

The curated tables are vacuumed under the stream's transform lease as well, so no transform or
compaction is writing, with a retention that outlives every kept version
(`jobs.transform.vacuum`). That needs Spark: without a session (`spark` None) gc sweeps the
raw zone only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.lake import SweepResult, sweep_orphans
from jobs.raw_zone import RAW
from state import Lease, StateStore, TransformState
from state.leases import CAPTURE_LEASE_TTL, RAW_WRITER_KINDS, TRANSFORM_LEASE_TTL
from tidemark.errors import LeaseHeld, StateStoreError
from tidemark.object_path import LakePath


@dataclass(frozen=True)
class StreamSweep:
    stream: str
    result: SweepResult | None  # None: skipped, a writer holds one of its leases
    note: str = ""
    curated: list[str] | None = None  # files VACUUM deleted (None: not vacuumed)


UNKNOWN_STREAM = (
    "skipped: this state store never registered the stream (is TIDEMARK_STATE_URL the "
    "lake's own?); nothing was deleted"
)


def lake_streams(lake_root: LakePath) -> list[str]:
    base = lake_root / RAW
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


def collect_garbage(
    lake_root: LakePath,
    store: StateStore,
    min_age_seconds: float = 60.0,
    spark: Callable[[], Any] | None = None,
) -> list[StreamSweep]:
    """Sweep every stream of the lake; `spark` makes the session VACUUM runs in (asked for
    only when a stream has curated tables)."""
    sweeps = []
    registered = set(store.stream_names())
    for stream in lake_streams(lake_root):
        if stream not in registered:
            # Its files are committed or not by another state store's batches (a host with
            # the wrong TIDEMARK_STATE_URL sees a shared lake): to this one they would all
            # look like orphans. A stream's row exists before its first file is written.
            sweeps.append(StreamSweep(stream, None, UNKNOWN_STREAM))
            continue
        held: list[Lease] = []
        try:
            for kind in RAW_WRITER_KINDS:
                held.append(store.acquire_lease(stream, kind, CAPTURE_LEASE_TTL))
            held.append(store.acquire_lease(stream, "transform", TRANSFORM_LEASE_TTL))
        except LeaseHeld:
            _release(store, held)
            sweeps.append(StreamSweep(stream, None, "skipped: a run holds its lease"))
            continue
        try:
            committed = store.committed_paths(stream)
            raw = sweep_orphans(lake_root, stream, committed, min_age_seconds)
            curated = None
            if spark is not None and TransformState(store).tables(stream):
                # Imported here: the transform imports PySpark, which a sweep of a stream
                # without curated tables never needs.
                from jobs.transform.vacuum import vacuum

                curated = vacuum(spark(), store, lake_root, stream, min_age_seconds)
            sweeps.append(StreamSweep(stream, raw, curated=curated))
        finally:
            _release(store, held)
    return sweeps


def _release(store: StateStore, leases: list[Lease]) -> None:
    for lease in leases:
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)
