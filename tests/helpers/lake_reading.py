"""Reading the lake the way a consumer must: the raw zone's files that committed batches list,
and a curated Delta table's own log and files (no Tidemark code in between)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from bson.raw_bson import RawBSONDocument

from jobs.raw_zone import RAW_SCHEMA
from state import StateStore
from tidemark.object_path import LakePath, ObjectPath


def read_parquet(path: LakePath, columns: list[str] | None = None) -> pa.Table:
    """A raw file, local or on object storage."""
    if isinstance(path, ObjectPath):
        return pq.read_table(path.fs_path, filesystem=path.fs, columns=columns)
    return pq.read_table(path, columns=columns)


def committed_table(store: StateStore, lake: LakePath, stream: str) -> pa.Table:
    tables = [read_parquet(lake / f.path) for batch in store.batches(stream) for f in batch.files]
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


def delta_log(table_dir: Path) -> list[dict[str, Any]]:
    """Every commit of a Delta table, oldest first: its version and actions, read from the
    `_delta_log` JSON files as any Delta reader does."""
    commits = []
    for path in sorted((table_dir / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        commits.append({"version": int(path.stem), "actions": actions})
    return commits


def marked_commits(table_dir: Path) -> list[tuple[str, int]]:
    """The (stream, slot) marks Tidemark's commits carry in their `userMetadata`, in commit
    order (jobs.transform.delta_io)."""
    marks = []
    for commit in delta_log(table_dir):
        for action in commit["actions"]:
            meta = action.get("commitInfo", {}).get("userMetadata")
            if isinstance(meta, str) and meta.startswith("tidemark:"):
                stream, slot = meta[len("tidemark:") :].rsplit(":", 1)
                marks.append((stream, int(slot)))
    return marks


MAINTENANCE = frozenset({"VACUUM START", "VACUUM END"})


def unrecorded_commits(table_dir: Path, recorded: int) -> list[int]:
    """The table's versions after `recorded` (the state store's) that changed data: a run's
    commit the store does not know. VACUUM's own commits change none, and may follow the
    recorded version unrecorded (`tidemark gc` runs between transforms)."""
    commits = delta_log(table_dir)
    assert recorded <= max(c["version"] for c in commits), f"{table_dir}: {recorded} is ahead"
    return [
        c["version"]
        for c in commits
        if c["version"] > recorded
        and not any(a.get("commitInfo", {}).get("operation") in MAINTENANCE for a in c["actions"])
    ]


def data_files(table_dir: Path) -> set[str]:
    """The Parquet files on disk under a Delta table (its log apart), table-relative."""
    return {
        str(p.relative_to(table_dir))
        for p in table_dir.rglob("*.parquet")
        if "_delta_log" not in p.relative_to(table_dir).parts
    }


def live_files(spark: Any, table_dir: Path) -> set[str]:
    """The Parquet files the table's newest version reads, table-relative."""
    root = table_dir.resolve()
    files = spark.read.format("delta").load(str(table_dir)).inputFiles()
    return {str(Path(unquote(urlparse(f).path)).relative_to(root)) for f in files}
