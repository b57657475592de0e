"""Reading the lake the way a consumer must: the raw zone's files that committed batches list,
and a curated table's data directories (not its manifest file)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from bson.raw_bson import RawBSONDocument

from jobs.raw_zone import RAW_SCHEMA
from state import StateStore


def committed_table(store: StateStore, lake: Path, stream: str) -> pa.Table:
    tables = [pq.read_table(lake / f.path) for batch in store.batches(stream) for f in batch.files]
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def direct_events(collection, resume_after) -> list[RawBSONDocument]:
    """A plain `watch()` over the same range: the reference the raw zone must equal."""
    events = []
    with collection.watch(
        resume_after=resume_after, max_await_time_ms=300, full_document="updateLookup"
    ) as stream:
        while True:
            event = stream.try_next()
            if event is None:
                return events
            events.append(event)


def data_directories(table_dir: Path) -> list[str]:
    """The names of a curated table's directories (`v=...`, `run=...`), without the manifest
    (`_tidemark_table.json`) that sits beside them."""
    return sorted(p.name for p in table_dir.iterdir() if p.is_dir())
