"""Events over 16 MB on a server that splits them (mongod 6.0.27, `$changeStreamSplitLargeEvent`):
fragments rejoined into one raw-zone row byte-identical to the reference rebuild, runs that stop
only between whole events, a fragment's token never stored, and resumes in the middle of an
event (the reader's own, and a stream opened at a fragment's token)."""

from __future__ import annotations

import signal
import time

import pytest
from bson.raw_bson import RawBSONDocument

from jobs.capture import drain
from jobs.capture._fragments import FragmentOutOfOrder, fragment_of, whole_events
from jobs.capture.reader import ChangeStreamReader
from tests.helpers.drain_child import start_drain_child, wait_until_ready
from tests.helpers.lake_reading import committed_table
from tests.helpers.split_events import fragment_tokens, rebuild, watched_fragments
from tidemark.tokens import token_from_json

pytestmark = pytest.mark.servers("6.0.27")

MB = 1 << 20
IMAGES = {"full_document": "required", "full_document_before_change": "required"}


def _images_collection(client, db_name):
    client[db_name].create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    return client[db_name]["orders"]


def _reference(raw_client, db_name, token_json):
    fragments = watched_fragments(
        raw_client,
        db_name,
        "orders",
        token_from_json(token_json),
        full_document="required",
        full_document_before_change="required",
    )
    return fragments, rebuild(fragments)


def test_a_12_mb_document_with_images_arrives_once_and_whole(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = _images_collection(client, db_name)
    stream = make_stream(**IMAGES)
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    big = "x" * (12 * MB)
    orders.insert_one({"_id": 1, "a": big, "n": 1})
    orders.update_one({"_id": 1}, {"$set": {"n": 2}})  # pre- and post-image: 24 MB
    orders.replace_one({"_id": 1}, {"a": "y" * (12 * MB), "n": 3})
    orders.delete_one({"_id": 1})
    result = drain(stream, raw_client, sqlite_store, lake)
    fragments, expected = _reference(raw_client, db_name, start)
    assert sum("splitEvent" in f for f in fragments) >= 4  # update and replace came split
    assert result.events == 4 and result.stop_reason == "caught_up"
    table = committed_table(sqlite_store, lake, stream.name)
    assert table["operation_type"].to_pylist() == ["insert", "update", "replace", "delete"]
    assert table["raw"].to_pylist() == expected  # byte for byte


def _token_data(store, stream) -> str:
    return token_from_json(store.checkpoint(stream.name).token)["_data"]


def _small_events_and_split_updates(orders) -> None:
    """[insert, 1st fragment], [2nd fragment, insert], [1st fragment], [2nd fragment]: a
    reply (of two events at most) ends in the middle of an event after a whole one. The
    9 MB document was inserted before: each update (both images) is 18 MB, two fragments."""
    for n in (1, 2):
        orders.insert_one({"_id": f"small-{n}"})
        orders.update_one({"_id": 1}, {"$set": {"n": n}})


@pytest.mark.parametrize("budget", [{"max_events": 1}, {"max_bytes": 1}])
def test_a_budget_stops_between_whole_events_and_never_stores_a_fragments_token(
    budget, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = _images_collection(client, db_name)
    stream = make_stream(**IMAGES, batch_size=2, budget=budget)
    orders.insert_one({"_id": 1, "a": "x" * (9 * MB), "n": 0})
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    _small_events_and_split_updates(orders)
    fragments, expected = _reference(raw_client, db_name, start)
    inner, last = fragment_tokens(fragments)
    assert len(last) == 2 and inner
    seen = []
    for _ in range(4):
        result = drain(stream, raw_client, sqlite_store, lake)
        assert result.events == 1, result.stop_reason
        token = _token_data(sqlite_store, stream)
        assert token not in inner  # never the token of a fragment before its event's last
        seen.append(token)
    # Each run ends on its event's own token: the update's is its last fragment's.
    assert seen == [RawBSONDocument(raw)["_id"]["_data"] for raw in expected]
    assert seen[1::2] == last
    assert committed_table(sqlite_store, lake, stream.name)["raw"].to_pylist() == expected
