"""Attacks on field exclusion: the paths test_field_exclusion.py does not walk.

Each test names what it tries to break. The invariant: a value of a field a stream removes
(`exclude_fields`, or its own pipeline) never reaches any byte of the lake or the state store,
and nothing else is lost (every other value arrives exactly as stored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bson
from bson import DBRef

from jobs.capture import drain
from tests.helpers.lake_reading import committed_table
from tests.test_field_exclusion import KEPT, SECRET, _scan, _value


def _events(store, lake: Path, stream: str) -> list[dict[str, Any]]:
    raws = committed_table(store, lake, stream).column("raw").to_pylist()
    return [bson.decode(r) for r in raws]


def _without(document: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != field}


# Breaks "nothing else is lost" (and, for some documents, the copy as a whole): the snapshot
# sent each document to the server inside `$documents`, which reads its argument as an
# expression, so a stored value was evaluated instead of copied: the string "$email" vanished,
# "$$NOW" became the time of the copy, {$literal: 5} became 5, and a DBRef
# ({$ref, $id}), a nested `$`-named field or a dotted field name stopped the copy with the
# server's raw error (which quotes the document's content).
def test_snapshot_rows_are_the_stored_documents_even_when_they_look_like_expressions(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    documents = [
        {"_id": 1, "path": "$email", "now": "$$NOW", "email": _value(SECRET, "e")},
        {"_id": 2, "ref": DBRef("users", 5), "email": _value(SECRET, "e")},
        {"_id": 3, "n": {"$literal": 5}, "email": _value(SECRET, "e")},
        {"_id": 4, "n": {"a.b": _value(KEPT, "dotted")}, "email": _value(SECRET, "e")},
        {"_id": 5, "n": {"$price": _value(KEPT, "dollar")}, "email": _value(SECRET, "e")},
        {"_id": 6, "n": {"$concat": ["$email", "x"]}, "email": _value(SECRET, "e")},
    ]
    coll.insert_many(documents)
    stream = make_stream(start="snapshot", exclude_fields=["email"])
    drain(stream, raw_client, sqlite_store, lake)
    rows = [e["fullDocument"] for e in _events(sqlite_store, lake, stream.name) if "fullDocument" in e]
    assert sorted(rows, key=lambda d: d["_id"]) == [_without(d, "email") for d in documents]
    assert not _scan(lake, SECRET.encode())
