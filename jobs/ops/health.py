"""Health facts for checks: orphan files in the raw zone and the source's document count."""

from __future__ import annotations

import time
from pathlib import Path

from pymongo import MongoClient

from jobs.lake import relative
from jobs.raw_zone import stream_files
from state import StateStore
from tidemark.config import StreamConfig


def uncommitted_files(
    lake_root: Path, store: StateStore, stream: str, min_age_seconds: float = 300.0
) -> list[str]:
    """Raw files no committed batch lists, older than a run would leave them in flight."""
    committed = store.committed_paths(stream)
    now = time.time()
    return [
        relative(lake_root, p)
        for p in stream_files(lake_root, stream)
        if relative(lake_root, p) not in committed and now - p.stat().st_mtime >= min_age_seconds
    ]


def source_count(client: MongoClient, stream: StreamConfig) -> int:
    assert stream.database and stream.collection
    return client[stream.database][stream.collection].count_documents({})
