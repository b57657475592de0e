"""The SQL state store: streams and checkpoints, leases with fencing, the batch manifest,
snapshots, and the transform's runs. Callers hold a `StateStore` (the transform reaches its
part as `store.transforms`) and exchange the records defined in `state.records`."""

from state.records import (
    BatchRecord,
    BatchSource,
    Checkpoint,
    CuratedTable,
    FileEntry,
    Lease,
    LeaseKind,
    NewPosition,
    RunKind,
    SnapshotRecord,
    SnapshotStatus,
    TransformRun,
    new_batch_id,
)
from state.store import StateStore
from state.transform_runs import TransformState

__all__ = [
    "BatchRecord",
    "BatchSource",
    "Checkpoint",
    "CuratedTable",
    "FileEntry",
    "Lease",
    "LeaseKind",
    "NewPosition",
    "RunKind",
    "SnapshotRecord",
    "SnapshotStatus",
    "StateStore",
    "TransformRun",
    "TransformState",
    "new_batch_id",
]
