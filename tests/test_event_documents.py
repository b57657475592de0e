"""The change log's reading of an event's documents: `document_json` gives each document field
as canonical Extended JSON, and the batch walk `events_documents` finds what pymongo's
per-event reading finds."""

from __future__ import annotations

import bson
import bsonjs
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.raw_zone import document_bson, document_json, events_documents
from tests.helpers.change_events import change_events

pytestmark = pytest.mark.fast


def test_document_json_reads_every_document_field() -> None:
    full, before = {"_id": 1, "a": 1.5}, {"_id": 1, "a": 1}
    description = {"updatedFields": {"a": 1.5}, "removedFields": []}
    raw = bson.encode(
        {
            "operationType": "update",
            "fullDocument": full,
            "fullDocumentBeforeChange": before,
            "updateDescription": description,
        }
    )
    canonical = [bsonjs.dumps(bson.encode(d), mode=bsonjs.CANONICAL) for d in (full, before)]
    assert document_json(raw) == (
        canonical[0],
        canonical[1],
        bsonjs.dumps(bson.encode(description), mode=bsonjs.CANONICAL),
        None,
    )
    assert (
        document_json(bson.encode({"operationType": "delete", "fullDocument": None})) == (None,) * 4
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(change_events(), max_size=12), start=st.integers(0, 3))
def test_events_documents_finds_each_events_documents_as_document_bson(events, start) -> None:
    """The batch walk over an Arrow array (a slice of one too, as Spark can hand it) against
    pymongo's per-event reading; odd events (a regex at the top) send the batch the slow way."""
    raws = [bson.encode(e) for e in events]
    array = pa.array([b"\x05\x00\x00\x00\x00"] * start + raws, pa.binary()).slice(start)
    assert events_documents(array) == [document_bson(r) for r in raws]
