"""The batch manifest: every committed batch and its raw-zone files.

A raw-zone file exists for readers only once the manifest lists it: a file no batch lists was
written by a run that never committed, and gc may remove it.

Every function takes the open transaction's connection; the store opens the transactions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Row, Select, func, insert, select

from state import schema
from state.columns import token_column, token_value, ts_column, ts_value
from state.records import BatchRecord, BatchSource, FileEntry
from state.schema import utc_now


def insert_batch(conn: Connection, batch: BatchRecord, epoch: int) -> None:
    """Record `batch` and its files, committed under the lease at `epoch`."""
    conn.execute(
        insert(schema.batches).values(**_batch_columns(batch), epoch=epoch, committed_at=utc_now())
    )
    if batch.files:
        conn.execute(
            insert(schema.batch_files),
            [
                {"batch_id": batch.id, "path": f.path, "rows": f.rows, "bytes": f.bytes}
                for f in batch.files
            ],
        )


def _same(value: Any) -> Any:
    return value


def _events_by_type(counts: dict[str, int]) -> str:
    return json.dumps(counts, sort_keys=True)


# The batch row <-> record mapping, written once: each column a batch record fills, with how
# its value becomes the column and back. `epoch` and `committed_at` are the commit's own.
_MAPPING: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "id": (_same, _same),
    "stream": (_same, _same),
    "source": (_same, _same),
    "event_count": (_same, _same),
    "bytes": (_same, _same),
    "events_by_type": (_events_by_type, json.loads),
    "first_event_id": (_same, _same),
    "last_event_id": (_same, _same),
    "first_cluster_time": (ts_column, ts_value),
    "last_cluster_time": (ts_column, ts_value),
    "token_after": (token_column, token_value),
    "window_start": (ts_column, ts_value),
    "window_end": (ts_column, ts_value),
    "snapshot_id": (_same, _same),
}


def _batch_columns(batch: BatchRecord) -> dict[str, Any]:
    return {name: write(getattr(batch, name)) for name, (write, _) in _MAPPING.items()}


def _batch_record(row: Row[Any], files: list[FileEntry]) -> BatchRecord:
    values = {name: read(getattr(row, name)) for name, (_, read) in _MAPPING.items()}
    return BatchRecord(**values, files=files, committed_at=row.committed_at, epoch=row.epoch)


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
    return [_batch_record(r, files.get(r.id, [])) for r in rows]


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
