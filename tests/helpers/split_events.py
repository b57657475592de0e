"""The reference for events over 16 MB: a plain `watch()` with `$changeStreamSplitLargeEvent`,
and the event rebuilt from its fragments by merging their top-level fields in order (the last
fragment's `_id` first, `splitEvent` left out): what the raw zone must hold byte for byte."""

from __future__ import annotations

from typing import Any

import bson
from bson import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

SPLIT = [{"$changeStreamSplitLargeEvent": {}}]
RAW = CodecOptions(document_class=RawBSONDocument, tz_aware=True)


def watched_fragments(
    client: MongoClient, db: str, coll: str, resume_after: Any, **options: Any
) -> list[RawBSONDocument]:
    """Every event and fragment after `resume_after`, as the server sends them."""
    target = client.get_database(db, codec_options=RAW)[coll]
    out = []
    with target.watch(SPLIT, resume_after=resume_after, max_await_time_ms=300, **options) as s:
        while (event := s.try_next()) is not None:
            out.append(event)
    return out


def rebuild(fragments: list[RawBSONDocument]) -> list[bytes]:
    """Whole events from a plain stream's events and fragments, decoded and encoded again by
    pymongo (an implementation independent of Tidemark's byte splicing)."""
    events: list[bytes] = []
    pending: list[RawBSONDocument] = []
    for doc in fragments:
        if "splitEvent" not in doc:
            events.append(doc.raw)
            continue
        pending.append(doc)
        if doc["splitEvent"]["fragment"] == doc["splitEvent"]["of"]:
            merged: dict[str, Any] = {"_id": pending[-1]["_id"]}
            for fragment in pending:
                merged.update((k, v) for k, v in fragment.items() if k not in ("_id", "splitEvent"))
            events.append(bson.encode(merged, codec_options=RAW))
            pending = []
    assert not pending, "the plain stream ended in the middle of an event"
    return events


def fragment_tokens(fragments: list[RawBSONDocument]) -> tuple[list[str], list[str]]:
    """(tokens of fragments that are not their event's last, tokens of last fragments)."""
    inner, last = [], []
    for doc in fragments:
        if "splitEvent" in doc:
            split = doc["splitEvent"]
            (last if split["fragment"] == split["of"] else inner).append(doc["_id"]["_data"])
    return inner, last
