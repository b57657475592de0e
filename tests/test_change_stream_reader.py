"""The change-stream reader below watch(): the same events as pymongo's watch(), and the
drivers' resume rules under real server faults (the failCommand fail point)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from jobs.capture.reader import ChangeStreamReader, WatchSpec
from tests.helpers.lake_reading import direct_events

# The server-version matrix: the embedded 6.0.5 and 6.0.27, which splits large events.
pytestmark = pytest.mark.servers("6.0.5", "6.0.27")


@pytest.fixture
def reader_client(mongod) -> Iterator[MongoClient]:
    client = MongoClient(
        mongod.uri, appname="reader-test", document_class=RawBSONDocument, tz_aware=True
    )
    yield client
    client.close()


def _start(client: MongoClient, db: str) -> dict:
    with client[db]["o"].watch(max_await_time_ms=100) as stream:
        stream.try_next()
        return stream.resume_token


def _read_all(reader: ChangeStreamReader, after_first=None) -> tuple[list, object]:
    events, token = [], None
    for n, reply in enumerate(reader.replies()):
        if not reply.events:
            return events, reply.token_after
        events += reply.events
        token = reply.token_after
        if n == 0 and after_first:
            after_first()
    return events, token


def _fail_next_get_more(client: MongoClient, **data) -> None:
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["getMore"], "appName": "reader-test", **data},
    )


def test_same_events_as_watch(client, reader_client, db_name):
    start = _start(client, db_name)
    client[db_name]["o"].insert_many([{"i": i} for i in range(700)])
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"resumeAfter": start}, [], 100, 300)
    ) as r:
        events, token = _read_all(r)
    reference = direct_events(reader_client[db_name]["o"], start)
    assert [e.raw for e in events] == [e.raw for e in reference]
    # Resuming from the final token finds nothing more: it is past every event.
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"resumeAfter": token}, [], 100, 300)
    ) as r:
        assert _read_all(r)[0] == []


@pytest.mark.parametrize(
    "fault",
    [
        {"errorCode": 43},  # CursorNotFound
        {"closeConnection": True},  # a network error
        {"errorCode": 91, "errorLabels": ["ResumableChangeStreamError"]},
    ],
    ids=["cursor-not-found", "network-error", "labelled-resumable"],
)
def test_resumes_once_after_a_resumable_error_with_nothing_lost(
    fault, client, reader_client, db_name
):
    start = _start(client, db_name)
    client[db_name]["o"].insert_many([{"i": i} for i in range(600)])
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"resumeAfter": start}, [], 50, 300)
    ) as r:
        events, _ = _read_all(r, after_first=lambda: _fail_next_get_more(client, **fault))
        assert r.resumes == 1
    reference = direct_events(reader_client[db_name]["o"], start)
    assert [e["_id"]["_data"] for e in events] == [e["_id"]["_data"] for e in reference]


def test_a_non_resumable_error_is_raised(client, reader_client, db_name):
    start = _start(client, db_name)
    client[db_name]["o"].insert_many([{"i": i} for i in range(300)])
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"resumeAfter": start}, [], 50, 300)
    ) as r:
        with pytest.raises(OperationFailure) as failed:
            _read_all(r, after_first=lambda: _fail_next_get_more(client, errorCode=2))
        assert failed.value.code == 2 and r.resumes == 0


def test_start_after_an_invalidate_follows_the_recreated_collection(client, reader_client, db_name):
    start = _start(client, db_name)
    client[db_name]["o"].insert_one({"before": 1})
    client[db_name]["o"].drop()
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"resumeAfter": start}, [], 50, 300)
    ) as r:
        events = [e for reply in r.replies() for e in reply.events]  # ends: the server closes it
    assert [e["operationType"] for e in events] == ["insert", "drop", "invalidate"]
    client[db_name]["o"].insert_one({"after": 1})
    invalidate = events[-1]["_id"]
    with ChangeStreamReader(
        reader_client, WatchSpec(db_name, "o", {"startAfter": invalidate}, [], 50, 300)
    ) as r:
        after, _ = _read_all(r)
    assert [e["operationType"] for e in after] == ["insert"]
