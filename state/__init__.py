"""The SQL state store: streams and checkpoints, leases with fencing, the batch manifest,
snapshots, and the transform's runs. Callers hold a `StateStore` (and the transform a
`TransformState` over it) and exchange the records defined in `state.records`."""

from state.records import (
    BatchRecord,
    BatchSource,
    Checkpoint,
    CuratedTable,
    CurrentVersion,
    FileEntry,
    Lease,
    LeaseKind,
    NewPosition,
    SnapshotRecord,
    SnapshotStatus,
    VersionKind,
    new_batch_id,
)
from state.store import StateStore
from state.transform_runs import TransformState

__all__ = [
    "BatchRecord",
    "BatchSource",
    "Checkpoint",
    "CuratedTable",
    "CurrentVersion",
    "FileEntry",
    "Lease",
    "LeaseKind",
    "NewPosition",
    "SnapshotRecord",
    "SnapshotStatus",
    "StateStore",
    "TransformState",
    "VersionKind",
    "new_batch_id",
]
