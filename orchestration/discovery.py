"""What the state store says when the definitions load: the collection tables each stream's
runs made (their assets).

The store is optional then: a SQLite file that does not exist yet is not created, and a store
that cannot be read leaves the configuration alone (no extra tables), so a definitions load
never fails on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from jobs.catalog import table_names
from orchestration.keys import TableName
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.errors import TidemarkError

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


def known_tables(state_url: str, streams: Sequence[StreamConfig]) -> dict[str, list[TableName]]:
    """Stream -> (db, collection, kind) of each table its transform runs made."""
    return _read_store(
        state_url, lambda store: {s.name: table_names(store, s.name) for s in streams}, {}
    )
