"""What a drain captures: exactly the change events of its range, every type, nothing twice."""

from __future__ import annotations

import struct
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import bson
import pyarrow.compute as pc
import pytest
from bson import json_util
from pymongo import monitoring

from jobs.capture import drain, drain_until_caught_up
from jobs.capture._events import event_id
from jobs.capture.drain_run import DrainSeams
from jobs.capture.reader import CONFIRM_AWAIT_MS
from jobs.raw_zone import document_json
from resources.mongo import connect
from tests.helpers.lake_reading import committed_table, direct_events
from tidemark.cli.workload import run_workload
from tidemark.tokens import CANONICAL

# The server-version matrix: the embedded 6.0.5 and 6.0.27, which splits large events.
pytestmark = pytest.mark.servers("6.0.5", "6.0.27")


def _prime(stream, raw_client, store, lake):
    """A first run on a new stream starts 'now' and commits the starting token."""
    first = drain(stream, raw_client, store, lake)
    assert first.events == 0
    return store.checkpoint(stream.name).token


def test_raw_zone_equals_direct_watch_over_the_same_range(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    start = _prime(stream, raw_client, sqlite_store, lake)
    run_workload(client, db_name, "orders", orders=400, seed=1)
    result = drain(stream, raw_client, sqlite_store, lake, seams=DrainSeams(flush_rows=97))

    reference = direct_events(raw_client[db_name]["orders"], start.document)
    table = committed_table(sqlite_store, lake, stream.name)
    ids = table.column("event_id").to_pylist()

    assert result.events == len(reference) == table.num_rows > 400
    assert ids == [e["_id"]["_data"] for e in reference]  # same events, same order
    assert len(set(ids)) == len(ids)
    # Byte-for-byte the same events as a plain watch() delivers.
    assert table.column("raw").to_pylist() == [e.raw for e in reference]
    assert dict(Counter(table.column("operation_type").to_pylist())) == result.events_by_type
    assert len(result.files) > 1  # flush_rows forced several files; all in the manifest
    on_disk = {p.relative_to(lake).as_posix() for p in (lake / "raw").rglob("*.parquet")}
    assert on_disk == sqlite_store.committed_paths(stream.name)


def test_quiet_stream_commits_no_file_and_moves_to_the_post_batch_token(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    _prime(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_one({"x": 1})
    drain(stream, raw_client, sqlite_store, lake)
    before = sqlite_store.checkpoint(stream.name)
    batches_before = sqlite_store.batch_count(stream.name)

    # Writes elsewhere move the oplog (and so the postBatchResumeToken) but not this stream.
    client[db_name]["elsewhere"].insert_many([{"y": i} for i in range(5)])
    quiet = drain(stream, raw_client, sqlite_store, lake)

    after = sqlite_store.checkpoint(stream.name)
    assert quiet.events == 0 and quiet.files == [] and quiet.stop_reason == "caught_up"
    assert sqlite_store.batch_count(stream.name) == batches_before
    assert after.version == before.version + 1
    assert after.token.cluster_time > before.token.cluster_time


def test_every_operation_type_and_envelope_field_is_kept(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name].create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    stream = make_stream(
        collection=None,  # database scope: sees drop, rename and dropDatabase
        full_document="updateLookup",
        full_document_before_change="whenAvailable",
        show_expanded_events=True,
    )
    _prime(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_one({"_id": 1, "v": 1})
    coll.update_one({"_id": 1}, {"$set": {"v": 2}})
    coll.replace_one({"_id": 1}, {"v": 3})
    with client.start_session() as session, session.start_transaction():
        coll.insert_one({"_id": 2, "v": 1}, session=session)
        coll.update_one({"_id": 2}, {"$inc": {"v": 1}}, session=session)
    coll.delete_one({"_id": 1})
    coll.create_index("v")
    coll.rename("orders_renamed")
    client[db_name]["orders_renamed"].drop()
    client.drop_database(db_name)

    result = drain(stream, raw_client, sqlite_store, lake)
    rows = committed_table(sqlite_store, lake, stream.name).to_pylist()
    types = [r["operation_type"] for r in rows]
    for expected in (
        "insert",
        "update",
        "replace",
        "delete",
        "createIndexes",
        "rename",
        "drop",
        "dropDatabase",
        "invalidate",
    ):
        assert expected in types, expected
    assert result.stop_reason == "invalidate"  # dropDatabase invalidates a database stream

    update = rows[types.index("update")]
    event = bson.decode(update["raw"])  # the whole event is kept, pre-image included
    assert event["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    # updateLookup happens at read time, after the delete: the post-image is null.
    assert event["fullDocument"] is None
    assert event["updateDescription"]["updatedFields"] == {"v": 2}
    full, before, description, ddl = document_json(update["raw"])
    assert full is None and ddl is None
    assert json_util.loads(before, json_options=CANONICAL) == {"_id": 1, "v": 1}
    assert json_util.loads(description, json_options=CANONICAL) == event["updateDescription"]
    assert update["wall_time"] is not None and update["cluster_time"] is not None
    txn_rows = [r for r in rows if r["txn_number"] is not None]
    assert len(txn_rows) == 2 and all(r["lsid"] for r in txn_rows)
    assert len({r["cluster_time_inc"] for r in txn_rows}) == 1  # one transaction, one op time
    rename = rows[types.index("rename")]
    assert (rename["to_db"], rename["to_coll"]) == (db_name, "orders_renamed")
    create = rows[types.index("createIndexes")]
    assert "indexes" in bson.decode(create["raw"])["operationDescription"]
    # The checkpoint remembers the invalidate, so the next run opens with startAfter.
    assert sqlite_store.checkpoint(stream.name).token_is_invalidate


def test_transaction_events_keep_their_order_in_the_token(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    _prime(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_one({"_id": "doc", "n": 0})
    with client.start_session() as session, session.start_transaction():
        for n in range(1, 8):
            coll.update_one({"_id": "doc"}, {"$set": {"n": n}}, session=session)
    drain(stream, raw_client, sqlite_store, lake)
    table = committed_table(sqlite_store, lake, stream.name)
    updates = table.filter(pc.equal(table.column("operation_type"), "update")).to_pylist()
    assert len(updates) == 7
    assert len({(u["cluster_time"], u["cluster_time_inc"]) for u in updates}) == 1
    # Same cluster time for all: the token's _data alone orders them, as the server sent them.
    values = [bson.decode(u["raw"])["updateDescription"]["updatedFields"]["n"] for u in updates]
    by_token = [v for _, v in sorted(zip([u["event_id"] for u in updates], values, strict=True))]
    assert values == by_token == list(range(1, 8))


def test_budget_stops_a_run_and_the_next_resumes_exactly(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(budget={"max_events": 150})
    start = _prime(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_many([{"i": i} for i in range(400)])
    runs = []
    while True:
        result = drain(stream, raw_client, sqlite_store, lake)
        runs.append((result.events, result.stop_reason))
        if result.stop_reason == "caught_up":
            break
    assert runs == [(150, "budget_events"), (150, "budget_events"), (100, "caught_up")]
    table = committed_table(sqlite_store, lake, stream.name)
    reference = direct_events(raw_client[db_name]["orders"], start.document)
    assert table.column("event_id").to_pylist() == [e["_id"]["_data"] for e in reference]


def test_run_stops_at_its_horizon(client, raw_client, sqlite_store, lake, make_stream, db_name):
    """Events written after the run took its cluster time are left for the next run."""
    stream = make_stream(batch_size=10)
    _prime(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"i": i} for i in range(50)])
    late = []
    # A writer thread keeps writing while the run drains; the run must still end.
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            coll.insert_one({"late": n})
            late.append(n)
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        result = drain(stream, raw_client, sqlite_store, lake)
    finally:
        stop.set()
        thread.join()
    assert result.stop_reason in ("horizon", "caught_up")
    assert result.last_cluster_time <= result.horizon
    assert result.events >= 50
    # Nothing is lost: the next runs pick up everything written after the horizon.
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    total = committed_table(sqlite_store, lake, stream.name).num_rows
    assert total == 50 + len(late)


def test_start_at_a_configured_time(client, raw_client, sqlite_store, lake, make_stream, db_name):
    coll = client[db_name]["orders"]
    coll.insert_one({"before": True})
    coll.insert_many([{"i": i} for i in range(3)])
    stream = make_stream(start=datetime.now(UTC) - timedelta(seconds=60))
    result = drain(stream, raw_client, sqlite_store, lake)
    assert result.events == 4  # both writes lie after the start time


def test_whole_cluster_stream_sees_every_database(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(
        name="everything",
        database=None,
        collection=None,
        pipeline=[{"$match": {"ns.db": {"$in": [db_name, db_name + "_b"]}}}],
    )
    _prime(stream, raw_client, sqlite_store, lake)
    client[db_name]["a"].insert_one({"x": 1})
    client[db_name + "_b"]["b"].insert_one({"x": 2})
    try:
        drain(stream, raw_client, sqlite_store, lake)
        rows = committed_table(sqlite_store, lake, stream.name).to_pylist()
        assert {(r["db"], r["coll"]) for r in rows} == {(db_name, "a"), (db_name + "_b", "b")}
    finally:
        client.drop_database(db_name + "_b")


@pytest.mark.fast
def test_event_id_is_read_from_the_leading_bytes_or_not_at_all():
    token = {"_data": "826B0130DC000001FD2B022C0100"}
    event = bson.encode({"_id": token, "operationType": "insert"})
    assert event_id(event) == token["_data"]
    # Any other layout (a field before _id, a _typeBits token, another type) is declined.
    op = b"\x02operationType\x00" + struct.pack("<i", 7) + b"insert\x00"
    body = op + b"\x03_id\x00" + bson.encode(token)
    id_second = struct.pack("<i", len(body) + 5) + body + b"\x00"
    assert bson.decode(id_second)["_id"] == token and event_id(id_second) is None
    assert event_id(bson.encode({"_id": {"_typeBits": b"\x01", "_data": "82"}})) is None
    assert event_id(bson.encode({"_id": {"_data": 5}})) is None


class _GetMores(monitoring.CommandListener):
    """The getMore commands a client sends: (maxTimeMS, events in the reply)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []
        self._waits: dict[int, int] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "getMore":
            self._waits[event.request_id] = event.command["maxTimeMS"]

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore":
            events = list(event.reply["cursor"]["nextBatch"])
            self.sent.append((self._waits.pop(event.request_id), len(events)))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
def listened(mongod):
    listener = _GetMores()
    client = connect(mongod.uri, raw=True, event_listeners=[listener])
    yield client, listener
    client.close()


def test_a_drain_with_nothing_new_needs_no_get_more(listened, sqlite_store, lake, make_stream):
    """The aggregate's own postBatchResumeToken covers the run's horizon: caught up at once,
    without a getMore waiting maxAwaitTimeMS for nothing."""
    client, listener = listened
    stream = make_stream(max_await_time_ms=5000)
    drain(stream, client, sqlite_store, lake)
    before = sqlite_store.checkpoint(stream.name)
    listener.sent.clear()
    result = drain(stream, client, sqlite_store, lake)
    assert (result.events, result.stop_reason, listener.sent) == (0, "caught_up", [])
    after = sqlite_store.checkpoint(stream.name)
    assert after.token.cluster_time >= before.token.cluster_time


def test_events_sharing_the_horizon_time_are_all_read_without_waiting_for_later_ones(
    listened, client, sqlite_store, lake, make_stream, db_name
):
    """A transaction's events share one cluster time, here the run's horizon, and come in
    several batches. Tokens at that time do not cover it: the run reads on, each getMore
    only confirming (no maxAwaitTimeMS wait), until a token covers the horizon."""
    raw, listener = listened
    stream = make_stream(batch_size=10, max_await_time_ms=5000)
    drain(stream, raw, sqlite_store, lake)
    with client.start_session() as session, session.start_transaction():
        client[db_name]["orders"].insert_many([{"i": i} for i in range(25)], session=session)
    listener.sent.clear()
    result = drain(stream, raw, sqlite_store, lake)
    assert (result.events, result.stop_reason) == (25, "caught_up")
    # The getMores that found nothing only confirmed; those after the first batch at the
    # horizon's time too.
    empty = [wait for wait, events in listener.sent if events == 0]
    assert empty and all(wait == CONFIRM_AWAIT_MS for wait in empty), listener.sent
    table = committed_table(sqlite_store, lake, stream.name)
    assert len(set(table["cluster_time"].to_pylist())) == 1  # one transaction, one time
