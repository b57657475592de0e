"""The state store API: stream registry, checkpoints, leases with fencing, the batch manifest.

Every write that moves a checkpoint is one transaction that (1) checks the caller still holds
the lease at the epoch it was granted (fencing), (2) moves the checkpoint only if its version
is the one the run started from (compare-and-set), and (3) records the batch and its files.
A crash anywhere before that transaction commits leaves the checkpoint where it was.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, SQLAlchemyError

from state import schema
from tidemark.config import StreamConfig, describe_definition_change
from tidemark.errors import (
    CheckpointConflict,
    LeaseHeld,
    LeaseLost,
    StateStoreError,
    StreamDefinitionChanged,
    TransformConflict,
)


def _now() -> datetime:
    return datetime.now(UTC)


def redact_url(url: str) -> str:
    return re.sub(r"(://[^:/@]+:)([^@]*)(@)", r"\1***\3", url)


@dataclass(frozen=True)
class Checkpoint:
    stream: str
    token: str | None  # canonical Extended JSON
    token_is_invalidate: bool
    start_at_operation_time: int | None  # packed Timestamp
    cluster_time: int | None  # packed Timestamp of the position
    fingerprint: str
    version: int
    updated_at: datetime

    @property
    def has_position(self) -> bool:
        return self.token is not None or self.start_at_operation_time is not None


@dataclass(frozen=True)
class Lease:
    stream: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class NewPosition:
    """Where a commit moves the checkpoint to."""

    token: str | None = None
    token_is_invalidate: bool = False
    start_at_operation_time: int | None = None
    cluster_time: int | None = None

    def columns(self) -> dict[str, Any]:
        """The checkpoint columns this position sets."""
        return {
            "token": self.token,
            "token_is_invalidate": self.token_is_invalidate,
            "start_at_operation_time": self.start_at_operation_time,
            "cluster_time": self.cluster_time,
        }


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the lake root, POSIX separators
    rows: int
    bytes: int


@dataclass
class BatchRecord:
    id: str
    stream: str
    source: str
    event_count: int
    bytes: int
    files: list[FileEntry]
    events_by_type: dict[str, int] = field(default_factory=dict)
    first_event_id: str | None = None
    last_event_id: str | None = None
    first_cluster_time: int | None = None
    last_cluster_time: int | None = None
    token_after: str | None = None
    window_start: int | None = None
    window_end: int | None = None
    committed_at: datetime | None = None
    epoch: int = 0
    snapshot_id: str | None = None


@dataclass
class SnapshotRecord:
    id: str
    stream: str
    reason: str
    cluster_time: int
    namespaces: list[tuple[str, str]]
    namespace_index: int
    last_key: str | None
    chunks: int
    documents: int
    bytes: int
    status: str
    started_at: datetime
    finished_at: datetime | None = None


@dataclass(frozen=True)
class CurrentVersion:
    stream: str
    version: int
    path: str | None  # None: the run only extended the change log (current_table: false)
    rows: int
    doc_schema: str
    events_folded: int
    changes_added: int
    changes_staging: str | None
    created_at: datetime
    pruned_at: datetime | None = None


def new_batch_id() -> str:
    """Time-ordered and unique: files of later batches sort after earlier ones."""
    return f"{_now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


def normalize_url(url: str) -> str:
    """postgresql:// means psycopg 3 here (the driver Tidemark installs)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _make_engine(url: str) -> Engine:
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StateStoreError(
            f"The state store URL {redact_url(url)!r} is not a database URL.",
            "Set TIDEMARK_STATE_URL to sqlite:///path/state.db or "
            "postgresql://user:password@host:5432/db.",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_setup(dbapi_connection, _record) -> None:
            # Let SQLAlchemy's BEGIN below be the only transaction control.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:
            # Take the write lock up front: two writers never deadlock upgrading read locks.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


class StateStore:
    """One state database. Holds an engine, so it is a class; every method is a transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)
        with self._errors("open"):
            self._install_or_check_schema()

    def close(self) -> None:
        self.engine.dispose()

    # -- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except OperationalError as exc:
            raise StateStoreError(
                f"The state store at {redact_url(self.url)} failed during {what}: "
                f"{str(exc.orig).strip().splitlines()[0] if exc.orig else exc}.",
                "Check that the database is up and reachable (TIDEMARK_STATE_URL); "
                "nothing was committed by this operation.",
            ) from None

    @contextmanager
    def _tx(self, what: str) -> Iterator[Connection]:
        with self._errors(what), self.engine.begin() as conn:
            yield conn

    def _install_or_check_schema(self) -> None:
        try:
            schema.metadata.create_all(self.engine)
        except IntegrityError:
            pass  # another process created the tables at the same moment
        except SQLAlchemyError as exc:
            if "already exists" not in str(exc):
                raise
        with self._tx("schema check") as conn:
            found = conn.execute(select(schema.schema_version.c.version)).scalars().all()
            if not found:
                conn.execute(
                    insert(schema.schema_version).values(
                        version=schema.SCHEMA_VERSION, installed_at=_now()
                    )
                )
            elif max(found) != schema.SCHEMA_VERSION:
                raise StateStoreError(
                    f"The state store at {redact_url(self.url)} has schema version {max(found)}, "
                    f"and this Tidemark uses version {schema.SCHEMA_VERSION}.",
                    "Run the Tidemark release that matches it, or point TIDEMARK_STATE_URL "
                    "at a new database.",
                )

    # -- streams and checkpoints ---------------------------------------------------------

    def ensure_stream(self, stream: StreamConfig) -> Checkpoint:
        """Register the stream, or check that its definition still matches its checkpoint."""
        definition = stream.token_definition()
        fingerprint = stream.fingerprint()
        now = _now()
        with self._tx("stream registration") as conn:
            row = conn.execute(
                select(schema.streams).where(schema.streams.c.name == stream.name)
            ).first()
            if row is None:
                self._register(conn, stream)
            elif row.fingerprint != fingerprint:
                checkpoint = self._checkpoint(conn, stream.name)
                if checkpoint is not None and checkpoint.has_position:
                    change = describe_definition_change(json.loads(row.definition), definition)
                    raise StreamDefinitionChanged(
                        f"Stream {stream.name!r} changed since its checkpoint was taken "
                        f"({change}), "
                        "and a resume token is only valid for the definition it came from, so "
                        "Tidemark will not resume it.",
                        f"Restore the old definition, or run `tidemark reset {stream.name} "
                        "--to-now` (or --to-time T) to start the new definition from a chosen "
                        "point; the reset is recorded in the state store.",
                    )
                # No position yet: the new definition simply replaces the old one.
                conn.execute(
                    update(schema.streams)
                    .where(schema.streams.c.name == stream.name)
                    .values(
                        fingerprint=fingerprint,
                        definition=json.dumps(definition, default=str),
                        updated_at=now,
                    )
                )
                # The version moves too: a run that began under the old definition can then
                # no longer commit (compare-and-set), whatever the order of the two.
                conn.execute(
                    update(schema.checkpoints)
                    .where(schema.checkpoints.c.stream == stream.name)
                    .values(fingerprint=fingerprint, version=schema.checkpoints.c.version + 1)
                )
            checkpoint = self._checkpoint(conn, stream.name)
        assert checkpoint is not None
        return checkpoint

    def ensure_stream_row(self, stream: StreamConfig) -> None:
        """Register the stream if it is new, without checking its definition (used by reset)."""
        with self._tx("stream registration") as conn:
            exists = conn.execute(
                select(schema.streams.c.name).where(schema.streams.c.name == stream.name)
            ).first()
            if exists is None:
                self._register(conn, stream)

    @staticmethod
    def _register(conn: Connection, stream: StreamConfig) -> None:
        now = _now()
        fingerprint = stream.fingerprint()
        conn.execute(
            insert(schema.streams).values(
                name=stream.name,
                fingerprint=fingerprint,
                definition=json.dumps(stream.token_definition(), default=str),
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            insert(schema.checkpoints).values(
                stream=stream.name,
                token_is_invalidate=False,
                fingerprint=fingerprint,
                version=0,
                updated_at=now,
            )
        )

    def checkpoint(self, stream: str) -> Checkpoint | None:
        with self._tx("checkpoint read") as conn:
            return self._checkpoint(conn, stream)

    @staticmethod
    def _checkpoint(conn: Connection, stream: str) -> Checkpoint | None:
        row = conn.execute(
            select(schema.checkpoints).where(schema.checkpoints.c.stream == stream)
        ).first()
        if row is None:
            return None
        return Checkpoint(
            stream=row.stream,
            token=row.token,
            token_is_invalidate=bool(row.token_is_invalidate),
            start_at_operation_time=row.start_at_operation_time,
            cluster_time=row.cluster_time,
            fingerprint=row.fingerprint,
            version=row.version,
            updated_at=row.updated_at,
        )

    def stream_names(self) -> list[str]:
        with self._tx("stream list") as conn:
            return list(conn.execute(select(schema.streams.c.name)).scalars())

    # -- leases --------------------------------------------------------------------------

    def acquire_lease(self, stream: str, ttl: timedelta, owner: str | None = None) -> Lease:
        """Take the stream's lease or fail fast with `LeaseHeld`.

        A lease past its expiry, or held by a process of this host that no longer exists
        (a crashed run), is taken over; the epoch grows so the old holder can never commit.
        """
        host = socket.gethostname()
        pid = os.getpid()
        owner = owner or f"{host}:{pid}:{uuid.uuid4().hex[:8]}"
        now = _now()
        leases = schema.leases
        with self._tx("lease acquisition") as conn:
            row = conn.execute(
                select(leases).where(leases.c.stream == stream).with_for_update()
            ).first()
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(leases).values(
                                stream=stream,
                                owner=owner,
                                host=host,
                                pid=pid,
                                epoch=1,
                                acquired_at=now,
                                expires_at=now + ttl,
                            )
                        )
                except IntegrityError:
                    raise self._held(stream, None) from None
                return Lease(stream, owner, 1)
            if (
                row.owner is not None
                and row.expires_at > now
                and not _dead_local(row.host, row.pid)
            ):
                raise self._held(stream, row)
            done = conn.execute(
                update(leases)
                .where(leases.c.stream == stream, leases.c.epoch == row.epoch)
                .values(
                    owner=owner,
                    host=host,
                    pid=pid,
                    epoch=row.epoch + 1,
                    acquired_at=now,
                    expires_at=now + ttl,
                )
            )
            if done.rowcount != 1:
                raise self._held(stream, row)
            return Lease(stream, owner, row.epoch + 1)

    @staticmethod
    def _held(stream: str, row: Any) -> LeaseHeld:
        who = f" by {row.owner} since {row.acquired_at:%Y-%m-%d %H:%M:%S} UTC" if row else ""
        until = f", until {row.expires_at:%H:%M:%S} UTC at the latest" if row else ""
        return LeaseHeld(
            f"Stream {stream!r} is being drained by another run (lease held{who}{until}); "
            "two runs of one stream never drain at once.",
            "Wait for that run to finish. If it died on another host, its lease expires by "
            "itself; a run that died on this host is detected and taken over automatically.",
        )

    def renew_lease(self, lease: Lease, ttl: timedelta) -> None:
        with self._tx("lease renewal") as conn:
            self._fence(conn, lease, ttl)

    def release_lease(self, lease: Lease) -> None:
        leases = schema.leases
        with self._tx("lease release") as conn:
            conn.execute(
                update(leases)
                .where(leases.c.stream == lease.stream, leases.c.epoch == lease.epoch)
                .values(owner=None, expires_at=_now())
            )

    @staticmethod
    def _fence(conn: Connection, lease: Lease, ttl: timedelta) -> None:
        leases = schema.leases
        done = conn.execute(
            update(leases)
            .where(
                leases.c.stream == lease.stream,
                leases.c.epoch == lease.epoch,
                leases.c.owner == lease.owner,
            )
            .values(expires_at=_now() + ttl)
        )
        if done.rowcount != 1:
            raise LeaseLost(
                f"This run's lease on stream {lease.stream!r} (epoch {lease.epoch}) was taken "
                "over by another run, so its commit was refused and its checkpoint not moved.",
                "Nothing is lost: the other run drains the same events. If runs keep losing "
                "their lease, raise the lease time or lower the run budget.",
            )

    # -- commits -------------------------------------------------------------------------

    def commit_batch(
        self,
        lease: Lease,
        expected_version: int | None,
        batch: BatchRecord | None,
        position: NewPosition | None,
        ttl: timedelta = timedelta(minutes=10),
    ) -> int | None:
        """The one transaction of a run: fence, compare-and-set the checkpoint, record the batch.

        `position` None leaves the checkpoint alone (replay batches); `batch` None moves only the
        checkpoint (a run that found no events). Returns the checkpoint's new version.
        """
        checkpoints = schema.checkpoints
        new_version = None
        with self._tx("commit") as conn:
            self._fence(conn, lease, ttl)
            if position is not None:
                assert expected_version is not None
                new_version = expected_version + 1
                done = conn.execute(
                    update(checkpoints)
                    .where(
                        checkpoints.c.stream == lease.stream,
                        checkpoints.c.version == expected_version,
                    )
                    .values(**position.columns(), version=new_version, updated_at=_now())
                )
                if done.rowcount != 1:
                    raise CheckpointConflict(
                        f"The checkpoint of stream {lease.stream!r} moved while this run drained "
                        f"(expected version {expected_version}); nothing was committed.",
                        "Run the drain again: it starts from the new checkpoint.",
                    )
            if batch is not None:
                self._insert_batch(conn, batch, lease.epoch)
        return new_version

    @staticmethod
    def _insert_batch(conn: Connection, batch: BatchRecord, epoch: int) -> None:
        conn.execute(
            insert(schema.batches).values(
                id=batch.id,
                stream=batch.stream,
                source=batch.source,
                epoch=epoch,
                event_count=batch.event_count,
                bytes=batch.bytes,
                first_event_id=batch.first_event_id,
                last_event_id=batch.last_event_id,
                first_cluster_time=batch.first_cluster_time,
                last_cluster_time=batch.last_cluster_time,
                events_by_type=json.dumps(batch.events_by_type, sort_keys=True),
                token_after=batch.token_after,
                window_start=batch.window_start,
                window_end=batch.window_end,
                snapshot_id=batch.snapshot_id,
                committed_at=_now(),
            )
        )
        if batch.files:
            conn.execute(
                insert(schema.batch_files),
                [
                    {"batch_id": batch.id, "path": f.path, "rows": f.rows, "bytes": f.bytes}
                    for f in batch.files
                ],
            )

    def reset_checkpoint(
        self,
        lease: Lease,
        stream: StreamConfig,
        position: NewPosition,
        description: str,
        actor: str,
    ) -> None:
        """Move a stream to an explicit position under the new definition; recorded in `resets`."""
        now = _now()
        with self._tx("reset") as conn:
            self._fence(conn, lease, timedelta(minutes=1))
            conn.execute(
                update(schema.streams)
                .where(schema.streams.c.name == stream.name)
                .values(
                    fingerprint=stream.fingerprint(),
                    definition=json.dumps(stream.token_definition(), default=str),
                    updated_at=now,
                )
            )
            self._move_checkpoint(
                conn, stream.name, position, description, actor, stream.fingerprint(), now
            )

    def _move_checkpoint(
        self,
        conn: Connection,
        stream: str,
        position: NewPosition,
        description: str,
        actor: str,
        fingerprint: str,
        now: datetime,
    ) -> None:
        """An explicit move (reset, snapshot): the checkpoint, and a line in `resets`."""
        old = self._checkpoint(conn, stream)
        conn.execute(
            insert(schema.resets).values(
                stream=stream,
                at=now,
                actor=actor,
                from_token=old.token if old else None,
                from_cluster_time=old.cluster_time if old else None,
                to_description=description,
                old_fingerprint=old.fingerprint if old else None,
                new_fingerprint=fingerprint,
            )
        )
        conn.execute(
            update(schema.checkpoints)
            .where(schema.checkpoints.c.stream == stream)
            .values(
                **position.columns(),
                fingerprint=fingerprint,
                version=schema.checkpoints.c.version + 1,
                updated_at=now,
            )
        )

    # -- reading the manifest ------------------------------------------------------------

    def batches(self, stream: str | None = None, source: str | None = None) -> list[BatchRecord]:
        b = schema.batches
        query = select(b).order_by(b.c.committed_at, b.c.id)
        if stream:
            query = query.where(b.c.stream == stream)
        if source:
            query = query.where(b.c.source == source)
        with self._tx("batch list") as conn:
            rows = conn.execute(query).all()
            files: dict[str, list[FileEntry]] = {}
            ids = [r.id for r in rows]
            for chunk in _chunks(ids, 500):
                for f in conn.execute(
                    select(schema.batch_files)
                    .where(schema.batch_files.c.batch_id.in_(chunk))
                    .order_by(schema.batch_files.c.path)
                ):
                    files.setdefault(f.batch_id, []).append(FileEntry(f.path, f.rows, f.bytes))
        return [
            BatchRecord(
                id=r.id,
                stream=r.stream,
                source=r.source,
                event_count=r.event_count,
                bytes=r.bytes,
                files=files.get(r.id, []),
                events_by_type=json.loads(r.events_by_type),
                first_event_id=r.first_event_id,
                last_event_id=r.last_event_id,
                first_cluster_time=r.first_cluster_time,
                last_cluster_time=r.last_cluster_time,
                token_after=r.token_after,
                window_start=r.window_start,
                window_end=r.window_end,
                committed_at=r.committed_at,
                epoch=r.epoch,
                snapshot_id=r.snapshot_id,
            )
            for r in rows
        ]

    def last_batch(self, stream: str) -> BatchRecord | None:
        found = self.batches(stream)
        return found[-1] if found else None

    def committed_paths(self, stream: str | None = None) -> set[str]:
        f, b = schema.batch_files, schema.batches
        query = select(f.c.path)
        if stream:
            query = query.join(b, b.c.id == f.c.batch_id).where(b.c.stream == stream)
        with self._tx("file list") as conn:
            return set(conn.execute(query).scalars())

    def resets(self, stream: str) -> list[dict[str, Any]]:
        r = schema.resets
        with self._tx("reset history") as conn:
            rows = conn.execute(select(r).where(r.c.stream == stream).order_by(r.c.id)).all()
        return [dict(row._mapping) for row in rows]

    # -- snapshots -----------------------------------------------------------------------

    def start_snapshot(self, lease: Lease, snapshot: SnapshotRecord, actor: str) -> None:
        """One transaction: record the snapshot and move the checkpoint to its time T."""
        now = _now()
        with self._tx("snapshot start") as conn:
            self._fence(conn, lease, timedelta(minutes=10))
            old = self._checkpoint(conn, snapshot.stream)
            conn.execute(
                insert(schema.snapshots).values(
                    **{**asdict(snapshot), "namespaces": json.dumps(snapshot.namespaces)}
                )
            )
            assert old is not None
            self._move_checkpoint(
                conn,
                snapshot.stream,
                NewPosition(
                    start_at_operation_time=snapshot.cluster_time,
                    cluster_time=snapshot.cluster_time,
                ),
                f"snapshot {snapshot.id} ({snapshot.reason})",
                actor,
                old.fingerprint,
                now,
            )

    def commit_snapshot_chunk(
        self, lease: Lease, snapshot: SnapshotRecord, batch: BatchRecord | None, done: bool
    ) -> None:
        """One transaction: the chunk's batch and the snapshot's progress (compare-and-set)."""
        s = schema.snapshots
        with self._tx("snapshot chunk commit") as conn:
            self._fence(conn, lease, timedelta(minutes=10))
            moved = conn.execute(
                update(s)
                .where(s.c.id == snapshot.id, s.c.chunks == snapshot.chunks - 1)
                .values(
                    namespace_index=snapshot.namespace_index,
                    last_key=snapshot.last_key,
                    chunks=snapshot.chunks,
                    documents=snapshot.documents,
                    bytes=snapshot.bytes,
                    status="done" if done else "running",
                    finished_at=_now() if done else None,
                )
            )
            if moved.rowcount != 1:
                raise CheckpointConflict(
                    f"Snapshot {snapshot.id} of stream {snapshot.stream!r} moved while this run "
                    "copied a chunk; nothing was committed.",
                    "Run the drain again: it continues from the last committed chunk.",
                )
            if batch is not None:
                self._insert_batch(conn, batch, lease.epoch)

    def snapshots(self, stream: str) -> list[SnapshotRecord]:
        s = schema.snapshots
        with self._tx("snapshot list") as conn:
            rows = conn.execute(
                select(s).where(s.c.stream == stream).order_by(s.c.started_at, s.c.id)
            ).all()
        return [
            SnapshotRecord(
                **{**dict(r._mapping), "namespaces": [tuple(n) for n in json.loads(r.namespaces)]}
            )
            for r in rows
        ]

    def running_snapshot(self, stream: str) -> SnapshotRecord | None:
        running = [s for s in self.snapshots(stream) if s.status == "running"]
        return running[-1] if running else None

    def batch_count(self, stream: str) -> int:
        b = schema.batches
        with self._tx("batch count") as conn:
            return conn.execute(select(func.count()).where(b.c.stream == stream)).scalar_one()


class TransformState:
    """The transform's half of the store: versions of `current` and which batches are folded."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def untransformed_batches(self, stream: str) -> list[BatchRecord]:
        """Committed batches not folded yet; chunks of an unfinished snapshot wait for the rest
        (a namespace is replaced by its snapshot as a whole)."""
        done = self._transformed_ids(stream)
        unfinished = {s.id for s in self.store.snapshots(stream) if s.status != "done"}
        return [
            b
            for b in self.store.batches(stream)
            if b.id not in done and b.snapshot_id not in unfinished
        ]

    def _transformed_ids(self, stream: str) -> set[str]:
        t = schema.transformed_batches
        with self.store._tx("transform progress") as conn:
            return set(conn.execute(select(t.c.batch_id).where(t.c.stream == stream)).scalars())

    def versions(self, stream: str, include_pruned: bool = False) -> list[CurrentVersion]:
        v = schema.current_versions
        query = select(v).where(v.c.stream == stream, v.c.path.is_not(None))
        query = query.order_by(v.c.version)
        if not include_pruned:
            query = query.where(v.c.pruned_at.is_(None))
        with self.store._tx("version list") as conn:
            return [CurrentVersion(**dict(row._mapping)) for row in conn.execute(query)]

    def runs(self, stream: str) -> list[CurrentVersion]:
        """Every committed run, with or without a current-state version."""
        v = schema.current_versions
        query = select(v).where(v.c.stream == stream).order_by(v.c.version)
        with self.store._tx("run list") as conn:
            return [CurrentVersion(**dict(row._mapping)) for row in conn.execute(query)]

    def latest(self, stream: str) -> CurrentVersion | None:
        """The newest committed run (its number is the next run's compare-and-set base)."""
        found = self.runs(stream)
        return found[-1] if found else None

    def latest_version(self, stream: str) -> CurrentVersion | None:
        """The newest current-state version."""
        found = self.versions(stream, include_pruned=True)
        return found[-1] if found else None

    def commit(
        self,
        lease: Lease,
        stream: str,
        expected_latest: int | None,
        version: CurrentVersion | None,
        batch_ids: list[str],
    ) -> None:
        """One transaction: fence, check no other version landed, add the version, mark batches."""
        v = schema.current_versions
        with self.store._tx("transform commit") as conn:
            self.store._fence(conn, lease, timedelta(minutes=30))
            latest = conn.execute(
                select(func.max(v.c.version)).where(v.c.stream == stream)
            ).scalar_one_or_none()
            if latest != expected_latest:
                raise TransformConflict(
                    f"Another transform of stream {stream!r} committed version {latest} while this "
                    f"one worked from version {expected_latest}; nothing was committed.",
                    "Run the transform again: it starts from the newest version.",
                )
            if version is not None:
                conn.execute(
                    insert(v).values(
                        **{
                            k: getattr(version, k)
                            for k in (
                                "stream",
                                "version",
                                "path",
                                "rows",
                                "doc_schema",
                                "events_folded",
                                "changes_added",
                                "changes_staging",
                                "created_at",
                            )
                        }
                    )
                )
            if batch_ids:
                now = _now()
                conn.execute(
                    insert(schema.transformed_batches),
                    [
                        {
                            "batch_id": b,
                            "stream": stream,
                            "version": version.version if version else None,
                            "transformed_at": now,
                        }
                        for b in batch_ids
                    ],
                )

    def mark_published(self, stream: str, version: int) -> None:
        v = schema.current_versions
        with self.store._tx("publish") as conn:
            conn.execute(
                update(v)
                .where(v.c.stream == stream, v.c.version == version)
                .values(changes_staging=None)
            )

    def mark_pruned(self, stream: str, version: int) -> None:
        v = schema.current_versions
        with self.store._tx("prune") as conn:
            conn.execute(
                update(v)
                .where(v.c.stream == stream, v.c.version == version)
                .values(pruned_at=_now())
            )


def _dead_local(host: str | None, pid: int | None) -> bool:
    """True for a holder on this host whose process is gone (crashed or killed)."""
    if host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state == "Z"


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
