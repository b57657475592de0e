"""The state store's records: what callers hand to the store and get back from it.

Plain dataclasses, free of SQL, so every layer above the store can name them without knowing
how they are kept. The values a column may take are `Literal` aliases defined here, once.
Cluster times are `bson.Timestamp`s and tokens `ResumeToken`s: their packed integers and JSON
text are the store's own columns (`state.columns`), never seen above it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from bson import Timestamp

from state.schema import utc_now
from tidemark.tokens import ResumeToken, SourceIdentity

# Where a batch of the manifest came from: a drain of the change stream, a chunk of a
# snapshot, or a replay of a past window (which never moves the checkpoint).
BatchSource = Literal["incremental", "snapshot", "replay"]

# A snapshot is "running" until its last chunk is committed, then "done".
SnapshotStatus = Literal["running", "done", "superseded"]  # superseded: restarted

# What a transform run wrote for `current`: a base (every row, from a full fold), a delta (the
# rows of the keys it touched, read merged over its base), or a compaction's new base.
RunKind = Literal["base", "delta", "compaction", "merge"]  # what a run wrote; merge: Delta

# The work a lease guards; a stream has one lease of each kind. "capture": a drain, its
# snapshots and `tidemark reset` (every checkpoint move); "replay": a replay of a past window;
# "transform": transform runs and compactions. gc holds all three while it sweeps. Each is a
# row of its own, named by `state.leases.lease_name`.
LeaseKind = Literal["capture", "replay", "transform"]


@dataclass(frozen=True)
class Checkpoint:
    """Where a stream resumes: a resume token, or a cluster time to start at."""

    stream: str
    token: ResumeToken | None
    token_is_invalidate: bool
    start_at_operation_time: Timestamp | None
    cluster_time: Timestamp | None  # of the position
    fingerprint: str
    version: int  # compare-and-set counter: a commit names the version it started from
    updated_at: datetime
    source: SourceIdentity | None = None  # the deployment the position came from; None: unseen

    @property
    def has_position(self) -> bool:
        return self.token is not None or self.start_at_operation_time is not None


@dataclass(frozen=True)
class Lease:
    """A granted lease: the epoch is the fencing token every commit under it is checked by."""

    stream: str  # the stream's name, whatever the kind
    kind: LeaseKind
    owner: str
    epoch: int


@dataclass(frozen=True)
class NewPosition:
    """Where a commit moves the checkpoint to."""

    token: ResumeToken | None = None
    token_is_invalidate: bool = False
    start_at_operation_time: Timestamp | None = None
    cluster_time: Timestamp | None = None
    source: SourceIdentity | None = None  # the deployment it belongs to; None keeps the stored


@dataclass(frozen=True)
class FileEntry:
    """One raw-zone file of a batch."""

    path: str  # relative to the lake root, POSIX separators
    rows: int
    bytes: int


@dataclass
class BatchRecord:
    """One committed batch of the manifest and its files."""

    id: str
    stream: str
    source: BatchSource
    event_count: int
    bytes: int
    files: list[FileEntry]
    events_by_type: dict[str, int] = field(default_factory=dict)
    first_event_id: str | None = None
    last_event_id: str | None = None
    first_cluster_time: Timestamp | None = None
    last_cluster_time: Timestamp | None = None
    token_after: ResumeToken | None = None
    window_start: Timestamp | None = None  # a replay's window [start, end)
    window_end: Timestamp | None = None
    committed_at: datetime | None = None
    epoch: int = 0
    snapshot_id: str | None = None


@dataclass
class SnapshotRecord:
    """A snapshot of a stream's namespaces and how far its copy has come."""

    id: str
    stream: str
    reason: str
    cluster_time: Timestamp  # T: the copy's time, where the change stream goes on
    namespaces: list[tuple[str, str]]
    namespace_index: int
    last_key: str | None
    chunks: int
    documents: int
    bytes: int
    status: SnapshotStatus
    started_at: datetime
    finished_at: datetime | None = None

    @classmethod
    def starting(
        cls,
        id: str,
        stream: str,
        reason: str,
        cluster_time: Timestamp,
        namespaces: list[tuple[str, str]],
        started_at: datetime,
    ) -> SnapshotRecord:
        """A snapshot at its start: running, nothing copied yet."""
        return cls(
            id=id,
            stream=stream,
            reason=reason,
            cluster_time=cluster_time,
            namespaces=namespaces,
            namespace_index=0,
            last_key=None,
            chunks=0,
            documents=0,
            bytes=0,
            status="running",
            started_at=started_at,
        )


@dataclass(frozen=True)
class TransformRun:
    """One committed transform run, and what it wrote of `current`, if anything."""

    stream: str
    run: int
    path: str | None  # None: the run only extended the change log (current_table: false)
    rows: int  # live rows of `current` after this run
    doc_schema: str
    events_folded: int
    changes_added: int
    created_at: datetime
    kind: RunKind | None = None  # None with no path
    base_run: int | None = None  # == run for a base
    written_rows: int | None = None
    changes_path: str | None = None
    first_event_id: str | None = None
    last_event_id: str | None = None
    pruned_at: datetime | None = None

    @property
    def is_base(self) -> bool:
        return self.path is not None and self.base_run == self.run


TableKind = Literal["current", "changes"]


@dataclass(frozen=True)
class CuratedTable:
    """One collection's Delta table as a committed run left it (`coll` "" holds a database's
    own events, such as dropDatabase, in a `changes` table)."""

    stream: str
    run: int
    db: str
    coll: str
    kind: TableKind
    path: str  # lake-relative
    delta_version: int
    rows: int  # live documents (current) or events (changes)
    doc_schema: str = ""  # Spark StructType JSON of the document columns (current)


def new_batch_id() -> str:
    """Time-ordered and unique: files of later batches sort after earlier ones."""
    return f"{utc_now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
