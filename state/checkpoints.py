"""Streams and their checkpoints: registration, compare-and-set moves, and explicit resets.

A checkpoint also names the deployment its position came from (`source_*`): a position is
only valid there, so a run on another deployment is refused before it reads anything.

A checkpoint carries a version. A run reads it when it starts and names it when it commits;
the checkpoint moves only if that version is still the current one, so of two runs that
started from the same checkpoint at most one commits. Explicit moves (reset, snapshot) also
bump the version, and leave a line in the reset history.

Every function takes the open transaction's connection; the store opens the transactions.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from bson import Timestamp
from sqlalchemy import Connection, insert, select, update

from state import schema
from state.columns import (
    position_columns,
    source_columns,
    source_value,
    token_value,
    ts_column,
    ts_value,
)
from state.records import Checkpoint, NewPosition
from state.schema import utc_now
from tidemark.config import StreamConfig, describe_definition_change
from tidemark.errors import CheckpointConflict, SourceChanged, StreamDefinitionChanged
from tidemark.tokens import SourceIdentity


def ensure_stream(
    conn: Connection,
    stream: StreamConfig,
    source: SourceIdentity | None = None,
    new_source_ok: bool = False,
) -> Checkpoint:
    """Register `stream`, or check that its definition still matches its checkpoint.

    1. A new stream: register it with an empty checkpoint at version 0.
    2. A changed definition and a checkpoint with a position: refuse (a resume token is only
       valid for the definition it came from).
    3. A changed definition and no position yet: take the new one, and bump the version.
    4. With `source`, the deployment the run reaches: `check_source`.

    Raises:
        StreamDefinitionChanged: the definition changed since the checkpoint was taken.
        SourceChanged: the position came from another deployment than `source`.
    """
    definition = stream.token_definition()
    fingerprint = stream.fingerprint()
    row = conn.execute(select(schema.streams).where(schema.streams.c.name == stream.name)).first()
    if row is None:
        _register(conn, stream)
    elif row.fingerprint != fingerprint:
        checkpoint = read_checkpoint(conn, stream.name)
        if checkpoint is not None and checkpoint.has_position:
            change = describe_definition_change(json.loads(row.definition), definition)
            raise StreamDefinitionChanged(
                f"Stream {stream.name!r} changed since its checkpoint was taken ({change}), "
                "and a resume token is only valid for the definition it came from, so "
                "Tidemark will not resume it.",
                f"Restore the old definition, or run `tidemark reset {stream.name} "
                "--to-now` (or --to-time T) to start the new definition from a chosen "
                "point; the reset is recorded in the state store.",
            )
        _set_definition(conn, stream, utc_now())
        # The version moves too: a run that began under the old definition can then no
        # longer commit (compare-and-set), whatever the order of the two.
        conn.execute(
            update(schema.checkpoints)
            .where(schema.checkpoints.c.stream == stream.name)
            .values(fingerprint=fingerprint, version=schema.checkpoints.c.version + 1)
        )
    if source is not None:
        check_source(conn, stream.name, source, new_source_ok)
    checkpoint = read_checkpoint(conn, stream.name)
    assert checkpoint is not None
    return checkpoint


def check_source(
    conn: Connection, stream: str, source: SourceIdentity, new_source_ok: bool = False
) -> None:
    """Check that the stream's position came from `source`, the deployment a run reaches.

    1. No deployment recorded (a new stream, or a store from before they were): adopt
       `source`. Likewise a part the stored one lacks (an id a user could not read then).
    2. Another deployment and a position: refuse, unless `new_source_ok` (a resnapshot, whose
       start records `source` with its own position); without a position: take `source`.

    Raises:
        SourceChanged: the position came from another deployment.
    """
    stored, has_position = stored_source(conn, stream)
    if stored is not None and stored.differs_from(source):
        if new_source_ok:
            return
        if has_position:
            raise SourceChanged(
                f"Stream {stream!r} was drained from {stored.describe()}, and MONGODB_URI now "
                f"reaches {source.describe()}: its stored position belongs to the other "
                "deployment, where it would skip or invent changes, so Tidemark will not "
                "resume it; nothing was committed.",
                "Point MONGODB_URI back at the deployment the stream was drained from. To "
                f"capture this one from now on, run `tidemark reset {stream} --to-now` (its "
                f"changes from now; `current` keeps the other's rows), or `tidemark resnapshot "
                f"{stream}` (a fresh copy of its collections replaces them, then its changes); "
                "either is recorded in the state store.",
            )
        adopted = source
    else:
        adopted = stored.completed_by(source) if stored is not None else source
    if adopted != stored:
        c = schema.checkpoints
        conn.execute(update(c).where(c.c.stream == stream).values(**source_columns(adopted)))


def stored_source(conn: Connection, stream: str) -> tuple[SourceIdentity | None, bool]:
    """The deployment the stream's position came from, and whether it has a position, read
    from those columns alone: a replay or a reset works whatever the stored token and times
    hold (only a run that resumes from them decodes them)."""
    c = schema.checkpoints
    row = conn.execute(
        select(
            c.c.source_kind, c.c.source_set, c.c.source_id, c.c.token, c.c.start_at_operation_time
        ).where(c.c.stream == stream)
    ).first()
    if row is None:  # not registered yet
        return None, False
    has_position = row.token is not None or row.start_at_operation_time is not None
    return source_value(row), has_position


def ensure_stream_row(conn: Connection, stream: StreamConfig) -> None:
    """Register `stream` if it is new, without checking its definition."""
    exists = conn.execute(
        select(schema.streams.c.name).where(schema.streams.c.name == stream.name)
    ).first()
    if exists is None:
        _register(conn, stream)


def _register(conn: Connection, stream: StreamConfig) -> None:
    now = utc_now()
    fingerprint = stream.fingerprint()
    conn.execute(
        insert(schema.streams).values(name=stream.name, created_at=now, **_definition(stream, now))
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


def _definition(stream: StreamConfig, now: datetime) -> dict[str, Any]:
    """The streams row's columns that say which definition its tokens belong to."""
    return {
        "fingerprint": stream.fingerprint(),
        "definition": json.dumps(stream.token_definition(), default=str),
        "updated_at": now,
    }


def _set_definition(conn: Connection, stream: StreamConfig, now: datetime) -> None:
    conn.execute(
        update(schema.streams)
        .where(schema.streams.c.name == stream.name)
        .values(**_definition(stream, now))
    )


def read_checkpoint(conn: Connection, stream: str) -> Checkpoint | None:
    """The stream's checkpoint; None for a stream never registered."""
    row = conn.execute(
        select(schema.checkpoints).where(schema.checkpoints.c.stream == stream)
    ).first()
    if row is None:
        return None
    return Checkpoint(
        stream=row.stream,
        token=token_value(row.token),
        token_is_invalidate=bool(row.token_is_invalidate),
        start_at_operation_time=ts_value(row.start_at_operation_time),
        cluster_time=ts_value(row.cluster_time),
        fingerprint=row.fingerprint,
        version=row.version,
        updated_at=row.updated_at,
        source=source_value(row),
    )


def record_oplog_first(conn: Connection, stream: str, first: Timestamp) -> None:
    """Note the oplog's first entry as a run of `stream` saw it."""
    streams = schema.streams
    conn.execute(
        update(streams).where(streams.c.name == stream).values(oplog_first=ts_column(first))
    )


def oplog_firsts(conn: Connection) -> dict[str, Timestamp]:
    """Stream -> the oplog's first entry as its last drain saw it (streams that never saw one
    are left out)."""
    streams = schema.streams
    rows = conn.execute(select(streams.c.name, streams.c.oplog_first))
    return {name: ts for name, first in rows if (ts := ts_value(first)) is not None}


def stream_names(conn: Connection) -> list[str]:
    """Every registered stream."""
    return list(conn.execute(select(schema.streams.c.name)).scalars())


def compare_and_set(
    conn: Connection, stream: str, expected_version: int, position: NewPosition
) -> int:
    """Move the checkpoint to `position` if it is still at `expected_version`; the new version.

    Raises:
        CheckpointConflict: the checkpoint moved since the run read it.
    """
    checkpoints = schema.checkpoints
    new_version = expected_version + 1
    done = conn.execute(
        update(checkpoints)
        .where(checkpoints.c.stream == stream, checkpoints.c.version == expected_version)
        .values(**position_columns(position), version=new_version, updated_at=utc_now())
    )
    if done.rowcount != 1:
        raise CheckpointConflict(
            f"The checkpoint of stream {stream!r} moved while this run drained "
            f"(expected version {expected_version}); nothing was committed.",
            "Run the drain again: it starts from the new checkpoint.",
        )
    return new_version


def reset_to(
    conn: Connection,
    stream: StreamConfig,
    position: NewPosition,
    description: str,
    actor: str,
) -> None:
    """Make `stream`'s definition the registered one and move its checkpoint to `position`;
    a copy still running from another deployment than `position`'s is superseded."""
    now = utc_now()
    old_source, _ = stored_source(conn, stream.name)
    if old_source and position.source and old_source.differs_from(position.source):
        # Its rows so far and its last key are the other deployment's: continued here it
        # would read this one's documents after that key into it.
        s = schema.snapshots
        conn.execute(
            update(s)
            .where((s.c.stream == stream.name) & (s.c.status == "running"))
            .values(status="superseded", finished_at=now)
        )
    _set_definition(conn, stream, now)
    move_checkpoint(conn, stream.name, position, description, actor, now, stream.fingerprint())


def move_checkpoint(
    conn: Connection,
    stream: str,
    position: NewPosition,
    description: str,
    actor: str,
    now: datetime,
    fingerprint: str | None = None,
) -> None:
    """An explicit move (reset, snapshot): the checkpoint, and a line in the reset history.

    `fingerprint` is the definition the new position belongs to; None keeps the checkpoint's.
    """
    # The history keeps the stored columns as they are, a damaged token's text included.
    c = schema.checkpoints
    old = conn.execute(
        select(c.c.token, c.c.cluster_time, c.c.fingerprint).where(c.c.stream == stream)
    ).first()
    if fingerprint is None:
        assert old is not None, "a checkpoint keeps its fingerprint only if it exists"
        fingerprint = old.fingerprint
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
            **position_columns(position),
            fingerprint=fingerprint,
            version=schema.checkpoints.c.version + 1,
            updated_at=now,
        )
    )


def reset_history(conn: Connection, stream: str) -> list[dict[str, Any]]:
    """Every explicit move of the stream's checkpoint, oldest first."""
    r = schema.resets
    rows = conn.execute(select(r).where(r.c.stream == stream).order_by(r.c.id)).all()
    return [dict(row._mapping) for row in rows]
