"""Asset keys and pools: a stream's own assets, and one key per collection table.

A stream has `raw_changes`, `replay` and `curated` (its curated zone as a whole: the step that
folds the raw batches, which every transform run materializes). Each collection table is an
asset of its own, keyed `[stream, db, "<coll>.changes" | "<coll>.current"]`: the Dagster UI
labels a graph node with its key's last part, so that part names the collection and the table
(`[stream, db, coll, "current"]` drew every collection's node as "current"). A database's own
events (dropDatabase) are the table `$database.changes`.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg

from tidemark.config import StreamConfig

TableKind = Literal["changes", "current"]
# (db, collection, kind) of a collection table; `$database` names a database's own events.
TableName = tuple[str, str, str]


def keys(stream: StreamConfig) -> dict[str, dg.AssetKey]:
    return {name: dg.AssetKey([stream.name, name]) for name in ("raw_changes", "replay", "curated")}


def table_key(stream: str, db: str, coll: str, kind: str) -> dg.AssetKey:
    return dg.AssetKey([stream, db, f"{coll}.{kind}"])


def table_of(key: dg.AssetKey, stream: str) -> TableName | None:
    """(db, collection, kind) of one of `stream`'s collection table keys; None for any other
    key. A collection's name may hold dots: the kind is the last part."""
    if len(key.path) != 3 or key.path[0] != stream:
        return None
    coll, _, kind = key.path[2].rpartition(".")
    return (key.path[1], coll, kind) if coll and kind in ("changes", "current") else None


def pool(stream: StreamConfig) -> str:
    """One concurrency pool per stream (limit 1): a stream never runs twice at once."""
    return f"tidemark_{stream.name}"
