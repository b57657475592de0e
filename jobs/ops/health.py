"""Health facts for checks: orphan files in the raw zone and the source's document count."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient

from jobs.capture.namespaces import watched_collections
from jobs.lake import relative
from jobs.raw_zone import stream_files
from resources.mongo import source_identity
from state import StateStore
from tidemark.config import StreamConfig
from tidemark.errors import SourceChanged
from tidemark.object_path import LakePath
from tidemark.tokens import SourceIdentity


def uncommitted_files(
    lake_root: LakePath, store: StateStore, stream: str, min_age_seconds: float = 300.0
) -> list[str]:
    """Raw files no committed batch lists, older than a run would leave them in flight."""
    committed = store.committed_paths(stream)
    now = time.time()
    return [
        relative(lake_root, p)
        for p, mtime in stream_files(lake_root, stream)
        if relative(lake_root, p) not in committed and now - mtime >= min_age_seconds
    ]


@dataclass(frozen=True)
class SourceCount:
    """The documents of the source that `current` should hold: those whose insert event the
    stream's pipeline lets through (the snapshot's rule), per watched collection."""

    total: int
    by_collection: dict[str, int] = field(default_factory=dict)  # "db.coll" -> documents
    how: str = "count_documents"  # or "count_documents (filter translated)", "pipeline"


def source_count(
    client: MongoClient, stream: StreamConfig, drained_from: SourceIdentity | None = None
) -> SourceCount:
    """Count what the stream's pipeline lets through, collection by collection, on the
    deployment `drained_from` (the checkpoint's; None: any).

    Raises:
        SourceChanged: `client` reaches another deployment than the stream was drained from.
    """
    reached = source_identity(client)
    if drained_from is not None and drained_from.differs_from(reached):
        raise SourceChanged(
            f"Stream {stream.name!r} was drained from {drained_from.describe()}, and "
            f"MONGODB_URI now reaches {reached.describe()}: its documents say nothing about "
            "the stream's current-state table, so they were not counted.",
            "Point MONGODB_URI back at the deployment the stream was drained from, or move "
            f"the stream on purpose (`tidemark reset {stream.name} --to-now` or `tidemark "
            f"resnapshot {stream.name}`).",
        )
    pipeline = stream.mongo_pipeline()
    query = _as_collection_query(pipeline)
    counts = {}
    for db, coll in watched_collections(client, stream):
        collection = client[db][coll]
        if query is not None:
            counts[f"{db}.{coll}"] = collection.count_documents(query)
        else:
            counts[f"{db}.{coll}"] = _count_through(collection, db, coll, pipeline)
    if not pipeline:
        how = "count_documents"
    elif query is not None:
        how = "count_documents (filter translated)"
    else:
        how = "pipeline"
    return SourceCount(sum(counts.values()), counts, how)


def _count_through(collection: Any, db: str, coll: str, pipeline: list[dict[str, Any]]) -> int:
    """The server runs the pipeline over each document's insert event, as the snapshot does
    with `$documents` (`jobs.capture.snapshot.passed_by_pipeline`), built here from the
    collection itself so nothing leaves the server but the count."""
    insert_event = {
        "operationType": "insert",
        "clusterTime": "$$CLUSTER_TIME",
        "ns": {"db": db, "coll": coll},  # names hold no '$': MongoDB forbids it
        "documentKey": {"_id": "$_id"},
        "fullDocument": "$$ROOT",
    }
    query = [{"$replaceWith": insert_event}, *pipeline, {"$count": "n"}]
    found = list(collection.aggregate(query))
    return int(found[0]["n"]) if found else 0


_FULL_DOCUMENT = "fullDocument."
_LOGICAL = ("$and", "$or", "$nor")
# Operators whose meaning does not follow a field's path: such a filter is run as a pipeline.
_OPAQUE = ("$expr", "$where", "$text", "$jsonSchema", "$comment")


def _as_collection_query(pipeline: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A filter on the collection that passes exactly the documents the pipeline's insert
    events pass, when the pipeline is `$match` stages on `fullDocument.` paths only (an
    index can answer it); None otherwise. `{}` for no pipeline."""
    filters = []
    for stage in pipeline:
        if list(stage) != ["$match"] or not isinstance(stage["$match"], dict):
            return None
        translated = _strip_prefix(stage["$match"])
        if translated is None:
            return None
        filters.append(translated)
    if len(filters) > 1:
        return {"$and": filters}
    return filters[0] if filters else {}


def _strip_prefix(spec: dict[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in _LOGICAL and isinstance(value, list):
            parts = [_strip_prefix(v) if isinstance(v, dict) else None for v in value]
            if any(p is None for p in parts):
                return None
            out[key] = parts
        elif key.startswith(_FULL_DOCUMENT) and len(key) > len(_FULL_DOCUMENT):
            if _mentions(value, _OPAQUE):
                return None
            out[key[len(_FULL_DOCUMENT) :]] = value
        else:
            return None  # operationType, ns, fullDocument itself, $expr ...: run the pipeline
    return out


def _mentions(value: Any, operators: tuple[str, ...]) -> bool:
    if isinstance(value, dict):
        return any(k in operators or _mentions(v, operators) for k, v in value.items())
    if isinstance(value, list):
        return any(_mentions(v, operators) for v in value)
    return False
