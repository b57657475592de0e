"""What the state store says when the definitions load: how far back the oplog reached when
each stream last drained (where its replay partitions start) and the collection tables its
runs made (their assets).

The store is optional then: a SQLite file that does not exist yet is not created, and a store
that cannot be read leaves the configuration alone (no extra tables, the configured
`replay.start`), so a definitions load never fails on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from jobs.catalog import tables_made
from orchestration.table_assets import TableName
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.errors import TidemarkError
from tidemark.tokens import ts_to_datetime

T = TypeVar("T")


def _read_store(state_url: str, read: Callable[[StateStore], T], otherwise: T) -> T:
    sqlite = state_url.startswith("sqlite:///")
    if sqlite and not Path(state_url.removeprefix("sqlite:///")).expanduser().exists():
        return otherwise  # loading the definitions must not create a store
    try:
        store = StateStore(state_url)
    except TidemarkError:
        return otherwise
    try:
        return read(store)
    except TidemarkError:
        return otherwise
    finally:
        store.close()


def oplog_reach(state_url: str) -> dict[str, datetime]:
    """Stream -> the oplog's first entry as its last drain saw it."""
    return _read_store(
        state_url,
        lambda store: {s: ts_to_datetime(ts) for s, ts in store.oplog_firsts().items()},
        {},
    )


def known_tables(state_url: str, streams: Sequence[StreamConfig]) -> dict[str, list[TableName]]:
    """Stream -> (db, collection, kind) of each table its transform runs made."""
    return _read_store(
        state_url, lambda store: {s.name: tables_made(store, s.name) for s in streams}, {}
    )
