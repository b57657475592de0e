"""The state store: the one object callers hold, and its public API.

It holds the database engine and opens every transaction; what happens inside one lives in
the modules named for their part: `leases` (the lease and fencing protocol, and every lease
TTL), `checkpoints` (streams, checkpoints, resets), `manifest` (batches and their files),
`snapshots`. The transform's part is `store.transforms` (`transform_runs.TransformState`),
which commits through the same public `transaction` / `fenced_transaction` as the methods
below.

Every write that moves a checkpoint is one transaction that (1) checks the caller still holds
the lease at the epoch it was granted (fencing), (2) moves the checkpoint only if its version
is the one the run started from (compare-and-set), and (3) records the batch and its files.
A crash anywhere before that transaction commits leaves the checkpoint where it was.

Every method raises `StateStoreError` when the database fails; nothing is then committed.
Long because it is the one object callers hold: each method is a short transaction over the
module that owns its part.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from bson import Timestamp
from sqlalchemy import Connection

from state import checkpoints, leases, manifest, snapshots
from state.engine import database_errors, install_or_check_schema, make_engine
from state.leases import CAPTURE_LEASE_TTL, RESET_LEASE_TTL
from state.records import (
    BatchRecord,
    BatchSource,
    Checkpoint,
    Lease,
    LeaseKind,
    NewPosition,
    SnapshotRecord,
)
from tidemark.config import StreamConfig
from tidemark.tokens import SourceIdentity

if TYPE_CHECKING:
    from state.transform_runs import TransformState


class StateStore:
    """One state database. Holds an engine, so it is a class; every method is a transaction."""

    def __init__(self, url: str) -> None:
        """Open the database at `url`, installing the schema into a new one.

        Raises:
            StateStoreError: `url` is not a database URL, the database is unreachable, or it
                holds another schema version.
        """
        self.url = url
        self.engine = make_engine(url)
        install_or_check_schema(self.engine, url)

    def close(self) -> None:
        self.engine.dispose()

    @cached_property
    def transforms(self) -> TransformState:
        """The transform's runs and folded batches in this store."""
        from state.transform_runs import TransformState  # it is built over this class

        return TransformState(self)

    # -- transactions --------------------------------------------------------------------

    @contextmanager
    def transaction(self, what: str) -> Iterator[Connection]:
        """One transaction: committed when the block ends, rolled back when it raises.

        Raises:
            StateStoreError: the database failed during `what` (named in the message).
        """
        with database_errors(self.url, what), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def fenced_transaction(self, what: str, lease: Lease, ttl: timedelta) -> Iterator[Connection]:
        """A transaction that first fences `lease` (and extends it by `ttl`): every commit
        under a lease goes through here, so a run whose lease was taken over commits nothing.

        Raises:
            LeaseLost: the lease was taken over; the block does not run.
            StateStoreError: the database failed during `what`.
        """
        with self.transaction(what) as conn:
            leases.fence(conn, lease, ttl)
            yield conn

    # -- streams and checkpoints ---------------------------------------------------------

    def ensure_stream(
        self,
        stream: StreamConfig,
        source: SourceIdentity | None = None,
        new_source_ok: bool = False,
    ) -> Checkpoint:
        """Register the stream, or check that its definition still matches its checkpoint,
        and that its position came from `source` (the deployment the run reaches; adopted
        by a checkpoint that names none yet); returns the checkpoint (see
        `checkpoints.ensure_stream` for the steps).

        Raises:
            StreamDefinitionChanged: the definition changed since the checkpoint was taken.
            SourceChanged: the position came from another deployment than `source`.
            StateStoreError: the database failed.
        """
        with self.transaction("stream registration") as conn:
            return checkpoints.ensure_stream(conn, stream, source, new_source_ok)

    def check_source(self, stream: StreamConfig, source: SourceIdentity) -> None:
        """Register the stream if it is new, and check that its position came from `source`
        (see `checkpoints.check_source`); for runs that read by time without resuming
        (replay), whose batches must still come from the stream's deployment.

        Raises:
            SourceChanged: the position came from another deployment than `source`.
            StateStoreError: the database failed.
        """
        with self.transaction("source check") as conn:
            checkpoints.ensure_stream_row(conn, stream)
            checkpoints.check_source(conn, stream.name, source)

    def ensure_stream_row(self, stream: StreamConfig) -> None:
        """Register the stream if it is new, without checking its definition (used by reset
        and the transform, which never resume from a token).

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("stream registration") as conn:
            checkpoints.ensure_stream_row(conn, stream)

    def checkpoint(self, stream: str) -> Checkpoint | None:
        """The stream's checkpoint; None for a stream never registered.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("checkpoint read") as conn:
            return checkpoints.read_checkpoint(conn, stream)

    def stream_names(self) -> list[str]:
        """Every registered stream.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("stream list") as conn:
            return checkpoints.stream_names(conn)

    def record_oplog_first(self, stream: str, first: Timestamp) -> None:
        """Note the oplog's first entry as a run of `stream` saw it (the replay partitions
        start there when the Dagster definitions load next).

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("oplog reach") as conn:
            checkpoints.record_oplog_first(conn, stream, first)

    def oplog_firsts(self) -> dict[str, Timestamp]:
        """Stream -> the oplog's first entry as its last drain saw it.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("oplog reach") as conn:
            return checkpoints.oplog_firsts(conn)

    # -- leases --------------------------------------------------------------------------

    def acquire_lease(
        self, stream: str, kind: LeaseKind, ttl: timedelta, owner: str | None = None
    ) -> Lease:
        """Take `stream`'s lease of `kind` for `ttl` (a `*_LEASE_TTL` of `state.leases`), or
        fail fast.

        A lease past its expiry, or held by a process of this host that no longer exists
        (a crashed run), is taken over; the epoch grows so the old holder can never commit.

        Raises:
            LeaseHeld: another run holds the lease.
            StateStoreError: the database failed.
        """
        with self.transaction("lease acquisition") as conn:
            return leases.acquire(conn, stream, kind, ttl, owner)

    def renew_lease(self, lease: Lease, ttl: timedelta) -> None:
        """Extend `lease` by `ttl` from now, if it is still this run's.

        Raises:
            LeaseLost: the lease was taken over.
            StateStoreError: the database failed.
        """
        with self.fenced_transaction("lease renewal", lease, ttl):
            pass

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up (a lease taken over meanwhile stays with its new holder).

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("lease release") as conn:
            leases.release(conn, lease)

    def lease_rows(self) -> list[dict[str, Any]]:
        """Every lease's name, owner and times (`leases.lease_rows`), for metrics.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("lease list") as conn:
            return leases.lease_rows(conn)

    # -- commits -------------------------------------------------------------------------

    def commit_batch(
        self,
        lease: Lease,
        expected_version: int | None,
        batch: BatchRecord | None,
        position: NewPosition | None,
        ttl: timedelta = CAPTURE_LEASE_TTL,
    ) -> int | None:
        """The one transaction of a run: fence, compare-and-set the checkpoint, record the batch.

        Rules:
        - All or nothing: the steps below are one transaction; if any fails, none happened
          and the run's raw files stay orphans for gc.
        - A run commits only under the lease it was granted (its epoch), so after a takeover
          the old holder cannot commit, however late it wakes up.
        - The checkpoint moves only from the version the run started from, so two runs that
          read the same checkpoint never both move it.

        1. Fence the lease (and extend it by `ttl`).
        2. If `position` is given, move the checkpoint there from `expected_version`; None
           leaves the checkpoint alone (replay batches).
        3. If `batch` is given, record it and its files under the lease's epoch; None moves
           only the checkpoint (a run that found no events).

        Returns the checkpoint's new version (None when `position` is None).

        Raises:
            LeaseLost: the lease was taken over.
            CheckpointConflict: the checkpoint moved since `expected_version`.
            StateStoreError: the database failed.
        """
        new_version = None
        with self.fenced_transaction("commit", lease, ttl) as conn:
            if position is not None:
                assert expected_version is not None
                new_version = checkpoints.compare_and_set(
                    conn, lease.stream, expected_version, position
                )
            if batch is not None:
                manifest.insert_batch(conn, batch, lease.epoch)
        return new_version

    def reset_checkpoint(
        self,
        lease: Lease,
        stream: StreamConfig,
        position: NewPosition,
        description: str,
        actor: str,
    ) -> None:
        """Move a stream to an explicit position under its new definition, in one transaction.

        1. Fence the lease.
        2. Make `stream`'s definition the registered one.
        3. Move the checkpoint to `position`, and record the move in the reset history.

        Raises:
            LeaseLost: the lease was taken over.
            StateStoreError: the database failed.
        """
        with self.fenced_transaction("reset", lease, RESET_LEASE_TTL) as conn:
            checkpoints.reset_to(conn, stream, position, description, actor)

    # -- reading the manifest ------------------------------------------------------------

    def batches(
        self, stream: str | None = None, source: BatchSource | None = None
    ) -> list[BatchRecord]:
        """Committed batches with their files, oldest first; of one stream and source if given.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("batch list") as conn:
            return manifest.batches(conn, stream, source)

    def last_batch(self, stream: str) -> BatchRecord | None:
        """The stream's newest committed batch with its files; None before the first.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("batch list") as conn:
            return manifest.last_batch(conn, stream)

    def committed_paths(self, stream: str | None = None) -> set[str]:
        """The raw-zone files the manifest lists (relative paths); of one stream if given.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("file list") as conn:
            return manifest.committed_paths(conn, stream)

    def batch_count(self, stream: str) -> int:
        """How many batches the stream has committed.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("batch count") as conn:
            return manifest.batch_count(conn, stream)

    def batch_totals(self) -> list[tuple[str, str, int, int, int]]:
        """(stream, source, batches, events, bytes) over every committed batch.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("batch totals") as conn:
            return manifest.batch_totals(conn)

    def resets(self, stream: str) -> list[dict[str, Any]]:
        """The stream's reset history (resets and snapshot starts), oldest first.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("reset history") as conn:
            return checkpoints.reset_history(conn, stream)

    # -- snapshots -----------------------------------------------------------------------

    def start_snapshot(
        self,
        lease: Lease,
        snapshot: SnapshotRecord,
        actor: str,
        supersedes: str | None = None,
        source: SourceIdentity | None = None,
    ) -> None:
        """Start `snapshot` in one transaction.

        1. Fence the lease.
        2. Record the snapshot (and mark the running one it `supersedes` superseded).
        3. Move the checkpoint to the snapshot's time T on `source` (None: the deployment
           stored), recorded in the reset history.

        Raises:
            LeaseLost: the lease was taken over.
            StateStoreError: the database failed.
        """
        with self.fenced_transaction("snapshot start", lease, CAPTURE_LEASE_TTL) as conn:
            snapshots.start_snapshot(conn, snapshot, actor, supersedes, source)

    def commit_snapshot_chunk(
        self, lease: Lease, snapshot: SnapshotRecord, batch: BatchRecord | None, done: bool
    ) -> None:
        """Commit one chunk of `snapshot` in one transaction.

        1. Fence the lease.
        2. Store the snapshot's progress if the chunk before this one is the last stored
           (compare-and-set on `snapshot.chunks`); `done` marks the snapshot finished.
        3. Record the chunk's batch, if it has one, under the lease's epoch.

        Raises:
            LeaseLost: the lease was taken over.
            CheckpointConflict: another run committed this chunk meanwhile.
            StateStoreError: the database failed.
        """
        with self.fenced_transaction("snapshot chunk commit", lease, CAPTURE_LEASE_TTL) as conn:
            snapshots.record_progress(conn, snapshot, done)
            if batch is not None:
                manifest.insert_batch(conn, batch, lease.epoch)

    def snapshots(self, stream: str) -> list[SnapshotRecord]:
        """The stream's snapshots, oldest first.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("snapshot list") as conn:
            return snapshots.snapshots(conn, stream)

    def running_snapshot(self, stream: str) -> SnapshotRecord | None:
        """The stream's newest snapshot still running; None when none is.

        Raises:
            StateStoreError: the database failed.
        """
        with self.transaction("snapshot list") as conn:
            return snapshots.running_snapshot(conn, stream)
