"""Asset keys and pools: a stream's own assets, and one key per collection table.

A stream has `raw_changes`, `replay` and `curated` (its curated zone as a whole: the step that
folds the raw batches, which every transform run materializes). Each collection table is an
asset of its own, keyed `[stream, db, coll, "changes" | "current"]`; a database's own events
(dropDatabase) are the `changes` table of the collection `$database`.
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
    return dg.AssetKey([stream, db, coll, kind])


def pool(stream: StreamConfig) -> str:
    """One concurrency pool per stream (limit 1): a stream never runs twice at once."""
    return f"tidemark_{stream.name}"
