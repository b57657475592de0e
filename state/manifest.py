"""The batch manifest: every committed batch and its raw-zone files.

A raw-zone file exists for readers only once the manifest lists it: a file no batch lists was
written by a run that never committed, and gc may remove it.

Every function takes the open transaction's connection; the store opens the transactions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Select, func, insert, select

from state import schema
from state.records import BatchRecord, BatchSource, FileEntry
from state.schema import utc_now


def insert_batch(conn: Connection, batch: BatchRecord, epoch: int) -> None:
    """Record `batch` and its files, committed under the lease at `epoch`."""
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
            committed_at=utc_now(),
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


def batches(
    conn: Connection, stream: str | None = None, source: BatchSource | None = None
) -> list[BatchRecord]:
    """Committed batches, oldest first; of one stream and one source when given."""
    b = schema.batches
    query = select(b).order_by(b.c.committed_at, b.c.id)
    if stream:
        query = query.where(b.c.stream == stream)
    if source:
        query = query.where(b.c.source == source)
    return batches_of(conn, query)


def last_batch(conn: Connection, stream: str) -> BatchRecord | None:
    """The stream's newest committed batch."""
    b = schema.batches
    query = (
        select(b)
        .where(b.c.stream == stream)
        .order_by(b.c.committed_at.desc(), b.c.id.desc())
        .limit(1)
    )
    found = batches_of(conn, query)
    return found[0] if found else None


def committed_paths(conn: Connection, stream: str | None = None) -> set[str]:
    """The files the manifest lists, of one stream when given."""
    f, b = schema.batch_files, schema.batches
    query = select(f.c.path)
    if stream:
        query = query.join(b, b.c.id == f.c.batch_id).where(b.c.stream == stream)
    return set(conn.execute(query).scalars())


def batch_count(conn: Connection, stream: str) -> int:
    """How many batches the stream has committed."""
    b = schema.batches
    return conn.execute(select(func.count()).where(b.c.stream == stream)).scalar_one()


def batches_of(conn: Connection, query: Select[Any]) -> list[BatchRecord]:
    """The batches `query` (a select of the batches table) selects, in its order, each with
    its files."""
    rows = conn.execute(query).all()
    files: dict[str, list[FileEntry]] = {}
    for chunk in _chunks([r.id for r in rows], 500):  # bound the IN list's parameters
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


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def batch_totals(conn: Connection) -> list[tuple[str, str, int, int, int]]:
    """(stream, source, batches, events, bytes) summed over every committed batch: one
    aggregate, so a metrics scrape costs one query however many batches there are."""
    b = schema.batches
    query = select(
        b.c.stream, b.c.source, func.count(), func.sum(b.c.event_count), func.sum(b.c.bytes)
    ).group_by(b.c.stream, b.c.source)
    return [
        (stream, source, int(count), int(events or 0), int(size or 0))
        for stream, source, count, events, size in conn.execute(query)
    ]
