"""Snapshots: a stream's namespaces copied chunk by chunk, resumable after a crash.

Starting a snapshot moves the checkpoint to its time T (the change stream continues there);
each chunk commits its batch with the snapshot's progress, which moves by compare-and-set on
the chunk count, so a chunk is committed once however many runs try.

Every function takes the open transaction's connection; the store opens the transactions.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from sqlalchemy import Connection, Select, insert, select, update

from state import schema
from state.checkpoints import move_checkpoint
from state.columns import ts_column, ts_value
from state.records import NewPosition, SnapshotRecord, SnapshotStatus
from state.schema import utc_now
from tidemark.errors import CheckpointConflict
from tidemark.tokens import SourceIdentity


def start_snapshot(
    conn: Connection,
    snapshot: SnapshotRecord,
    actor: str,
    supersedes: str | None = None,
    source: SourceIdentity | None = None,
) -> None:
    """Record `snapshot` and move its stream's checkpoint to the snapshot's time T on `source`
    (None: the deployment stored); the snapshot `supersedes` names, a copy begun afresh, is
    marked superseded (its chunks are never folded)."""
    if supersedes is not None:
        s = schema.snapshots
        superseded: SnapshotStatus = "superseded"
        conn.execute(
            update(s).where(s.c.id == supersedes).values(status=superseded, finished_at=utc_now())
        )
    conn.execute(
        insert(schema.snapshots).values(
            **{
                **asdict(snapshot),
                "cluster_time": ts_column(snapshot.cluster_time),
                "namespaces": json.dumps(snapshot.namespaces),
            }
        )
    )
    move_checkpoint(
        conn,
        snapshot.stream,
        NewPosition(
            start_at_operation_time=snapshot.cluster_time,
            cluster_time=snapshot.cluster_time,
            source=source,
        ),
        f"snapshot {snapshot.id} ({snapshot.reason})",
        actor,
        utc_now(),
    )


def record_progress(conn: Connection, snapshot: SnapshotRecord, done: bool) -> None:
    """Store `snapshot`'s progress after its newest chunk, if the chunk before is the last stored.

    Raises:
        CheckpointConflict: another run committed this chunk (or a later one) meanwhile.
    """
    s = schema.snapshots
    status: SnapshotStatus = "done" if done else "running"
    moved = conn.execute(
        update(s)
        .where(s.c.id == snapshot.id, s.c.chunks == snapshot.chunks - 1)
        .values(
            namespace_index=snapshot.namespace_index,
            last_key=snapshot.last_key,
            chunks=snapshot.chunks,
            documents=snapshot.documents,
            bytes=snapshot.bytes,
            status=status,
            finished_at=utc_now() if done else None,
        )
    )
    if moved.rowcount != 1:
        raise CheckpointConflict(
            f"Snapshot {snapshot.id} of stream {snapshot.stream!r} moved while this run "
            "copied a chunk; nothing was committed.",
            "Run the drain again: it continues from the last committed chunk.",
        )


def snapshots(conn: Connection, stream: str) -> list[SnapshotRecord]:
    """The stream's snapshots, oldest first."""
    s = schema.snapshots
    return _records(conn, select(s).where(s.c.stream == stream).order_by(s.c.started_at, s.c.id))


def running_snapshot(conn: Connection, stream: str) -> SnapshotRecord | None:
    """The stream's newest snapshot still running."""
    s = schema.snapshots
    running: SnapshotStatus = "running"
    query = (
        select(s)
        .where(s.c.stream == stream, s.c.status == running)
        .order_by(s.c.started_at.desc(), s.c.id.desc())
        .limit(1)
    )
    found = _records(conn, query)
    return found[0] if found else None


def _records(conn: Connection, query: Select[Any]) -> list[SnapshotRecord]:
    return [
        SnapshotRecord(
            **{
                **dict(r._mapping),
                "cluster_time": ts_value(r.cluster_time),
                "namespaces": [tuple(n) for n in json.loads(r.namespaces)],
            }
        )
        for r in conn.execute(query)
    ]
