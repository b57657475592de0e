"""`tidemark gc`: remove raw files that no committed batch lists (orphans of crashed runs), and
VACUUM the curated Delta tables.

Each step holds only the leases of the writers it must keep out, and only while it runs, so gc
never starves the stream's other work:

- the raw zone is swept while gc holds every lease it is written under (the drain's, which
  snapshots share, and the replay's), so no writer of it is running: a live writer's files
  are never swept, however long it runs. A writer whose lease gc took over (it expired, or
  its process is gone) can no longer commit, since its commit is fenced by the lease's
  epoch. `min_age_seconds` only spares files that a writer on a host with a skewed clock
  might still be renaming into place. The sweep lists files and deletes orphans: seconds;
- the curated tables are vacuumed under the stream's transform lease alone, so no transform
  or compaction is writing them, with a retention that outlives every kept version
  (`jobs.transform.vacuum`). VACUUM takes minutes on a large lake; drains and replays,
  which never write a curated table, go on meanwhile. It needs Spark: without a session
  (`spark` None) gc sweeps the raw zone only.

A step whose lease is held is skipped and done next time; the other step still runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from jobs.lake import SweepResult, sweep_orphans
from jobs.raw_zone import RAW
from state import Lease, LeaseKind, StateStore
from state.leases import CAPTURE_LEASE_TTL, RAW_WRITER_KINDS, TRANSFORM_LEASE_TTL
from tidemark.errors import LeaseHeld, StateStoreError
from tidemark.object_path import LakePath


@dataclass(frozen=True)
class StreamSweep:
    stream: str
    result: SweepResult | None  # None: skipped, a writer holds one of its leases
    note: str = ""
    curated: list[str] | None = None  # files VACUUM deleted (None: not vacuumed)
    curated_note: str = ""  # why it was not vacuumed, when a run held the transform lease


T = TypeVar("T")

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
        sweeps.append(_sweep(lake_root, store, stream, min_age_seconds, spark))
    return sweeps


def _sweep(
    lake_root: LakePath,
    store: StateStore,
    stream: str,
    min_age_seconds: float,
    spark: Callable[[], Any] | None,
) -> StreamSweep:
    """One stream: its raw orphans under the raw writers' leases, then its VACUUM under the
    transform lease alone."""

    def orphans() -> SweepResult:
        return sweep_orphans(lake_root, stream, store.committed_paths(stream), min_age_seconds)

    raw, note = _under_leases(store, stream, RAW_WRITER_KINDS, CAPTURE_LEASE_TTL, orphans)
    curated, curated_note = None, ""
    if spark is not None and store.transforms.tables(stream):
        curated, curated_note = _under_leases(
            store,
            stream,
            ("transform",),
            TRANSFORM_LEASE_TTL,
            lambda: _vacuum(spark, store, lake_root, stream, min_age_seconds),
        )
    return StreamSweep(stream, raw, note, curated, curated_note)


def _vacuum(
    spark: Callable[[], Any], store: StateStore, lake_root: LakePath, stream: str, age: float
) -> list[str]:
    # Imported here: the transform imports PySpark, which a sweep of a stream without curated
    # tables never needs.
    from jobs.transform.vacuum import vacuum

    return vacuum(spark(), store, lake_root, stream, age)


def _under_leases(
    store: StateStore,
    stream: str,
    kinds: tuple[LeaseKind, ...],
    ttl: timedelta,
    step: Callable[[], T],
) -> tuple[T | None, str]:
    """`step`'s result while gc holds the stream's leases of `kinds`, released right after;
    None and why, when a run holds one of them."""
    held: list[Lease] = []
    try:
        for kind in kinds:
            held.append(store.acquire_lease(stream, kind, ttl))
    except LeaseHeld:
        _release(store, held)
        return None, f"skipped: a run holds its {kind} lease"
    try:
        return step(), ""
    finally:
        _release(store, held)


def _release(store: StateStore, leases: list[Lease]) -> None:
    for lease in leases:
        with contextlib.suppress(StateStoreError):
            store.release_lease(lease)
