"""A stream's own asset keys and its pool. Each collection table's key and Dagster name are
made in `orchestration.table_assets`.

A stream has `raw_changes`, `replay` and `curated` (its curated zone as a whole: the step that
folds the raw batches, which every transform run materializes).
"""

from __future__ import annotations

import dagster as dg

from tidemark.config import StreamConfig


def keys(stream: StreamConfig) -> dict[str, dg.AssetKey]:
    return {name: dg.AssetKey([stream.name, name]) for name in ("raw_changes", "replay", "curated")}


def pool(stream: StreamConfig) -> str:
    """One concurrency pool per stream (limit 1): a stream never runs twice at once."""
    return f"tidemark_{stream.name}"
