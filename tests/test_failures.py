"""Failures a user can cause or meet: each is a clear message, and nothing committed is harmed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pymongo import MongoClient

from jobs.capture import drain, replay, replay_window
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from tests.helpers.lake_reading import committed_table
from tests.helpers.oplog import roll_oplog_past
from tidemark.errors import (
    EventTooLarge,
    HistoryLost,
    LakeError,
    MongoConnectionError,
    ReplayRefused,
    ReplicaSetRequired,
    StateStoreError,
    StreamDefinitionChanged,
)
from tidemark.tokens import datetime_to_ts


def test_standalone_server_is_refused_with_the_replica_set_message(tmp_path):
    standalone = start_mongod(tmp_path / "standalone", replica_set=None)
    try:
        with pytest.raises(ReplicaSetRequired) as refused:
            connect(standalone.uri)
        message = str(refused.value)
        assert "change streams need a replica set" in message
        assert "--replSet" in message and "MONGODB_URI" in message
    finally:
        stop_mongod(standalone)


def test_token_older_than_the_oplog_is_a_clear_error_and_the_checkpoint_stays(
    tmp_path, sqlite_store, make_stream, tiny_mongod
):
    writer: MongoClient = connect(tiny_mongod.uri)
    raw = connect(tiny_mongod.uri, raw=True)
    stream = make_stream(database="shop", collection="orders")
    lake = tmp_path / "lake"
    drain(stream, raw, sqlite_store, lake)
    writer.shop.orders.insert_one({"first": True})
    drain(stream, raw, sqlite_store, lake)
    kept = sqlite_store.checkpoint(stream.name)
    batches = sqlite_store.batch_count(stream.name)

    roll_oplog_past(writer, kept.cluster_time)

    with pytest.raises(HistoryLost) as lost:
        drain(stream, raw, sqlite_store, lake)
    message = str(lost.value)
    assert "'orders'" in message and "no longer in the oplog" in message
    assert "oplog's first entry is at" in message
    assert "tidemark reset orders --to-now" in message and "re-snapshot" in message
    assert sqlite_store.checkpoint(stream.name) == kept
    assert sqlite_store.batch_count(stream.name) == batches
    writer.close()
    raw.close()


def test_a_replay_window_that_falls_off_the_oplog_while_read_is_refused(
    tmp_path, sqlite_store, make_stream, monkeypatch, tiny_mongod
):
    """The oplog rolls past a window's start between the window check and the read (the
    check is stood down here to stand for that moment): the server's history-lost answer is
    the replay's own refusal, nothing is committed, and the checkpoint stays."""
    writer: MongoClient = connect(tiny_mongod.uri)
    raw = connect(tiny_mongod.uri, raw=True)
    stream = make_stream(database="shop", collection="orders")
    lake = tmp_path / "lake"
    drain(stream, raw, sqlite_store, lake)
    start = datetime.now(UTC) - timedelta(seconds=1)
    writer.shop.orders.insert_one({"in_the_window": True})
    kept = sqlite_store.checkpoint(stream.name)
    roll_oplog_past(writer, datetime_to_ts(start + timedelta(seconds=2)))
    end = datetime.now(UTC) - timedelta(seconds=1)
    monkeypatch.setattr(replay_window, "check_window", lambda *args: None)
    with pytest.raises(ReplayRefused) as refused:
        replay(stream, raw, sqlite_store, lake, start, end)
    assert "fell off the oplog" in str(refused.value)
    assert sqlite_store.batches(stream.name, source="replay") == []
    assert sqlite_store.checkpoint(stream.name) == kept
    writer.close()
    raw.close()


def test_changed_pipeline_refuses_to_resume_and_names_reset(raw_client, store, lake, make_stream):
    stream = make_stream()
    drain(stream, raw_client, store, lake)
    kept = store.checkpoint(stream.name)
    changed = make_stream(pipeline=[{"$match": {"operationType": "insert"}}])
    with pytest.raises(StreamDefinitionChanged) as refused:
        drain(changed, raw_client, store, lake)
    message = str(refused.value)
    assert 'pipeline: [] -> [{"$match"' in message
    assert "tidemark reset orders --to-now" in message
    assert store.checkpoint(stream.name) == kept


def test_changed_options_before_any_position_just_take_effect(store, make_stream):
    store.ensure_stream(make_stream())  # registered, never drained
    changed = make_stream(full_document="whenAvailable", current_table=False)
    assert store.ensure_stream(changed).fingerprint == changed.fingerprint()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("mongodb://user:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=500", "No MongoDB server"),
        ("mongodb://user:s3cret@", "is not valid"),
        ("http://example.com", "is not valid"),
    ],
)
def test_bad_uri_or_unreachable_host_is_a_clear_error_without_the_password(uri, expected):
    with pytest.raises(MongoConnectionError) as refused:
        connect(uri, timeout_ms=500)
    message = str(refused.value)
    assert expected in message
    assert "s3cret" not in message


def test_wrong_credentials_are_named(mongod, tmp_path):
    auth = start_mongod(tmp_path / "auth", extra_args=("--auth",), replica_set=None)
    try:
        uri = f"mongodb://nobody:wrong@127.0.0.1:{auth.port}/?directConnection=true"
        with pytest.raises(MongoConnectionError) as refused:
            connect(uri, timeout_ms=3000)
        assert "authentication failed" in str(refused.value)
        assert "wrong" not in str(refused.value)
    finally:
        stop_mongod(auth)


def test_lake_that_is_a_file_is_a_clear_error(raw_client, sqlite_store, make_stream, tmp_path):
    lake = tmp_path / "not-a-dir"
    lake.write_text("")
    with pytest.raises(LakeError) as refused:
        drain(make_stream(), raw_client, sqlite_store, lake)
    assert "TIDEMARK_LAKE" in str(refused.value)
    assert sqlite_store.checkpoint("orders") is None  # refused before anything was registered


@pytest.mark.fast
def test_password_never_reaches_the_error(tmp_path: Path):
    with pytest.raises(MongoConnectionError) as refused:
        connect("mongodb://admin:hunter2@127.0.0.1:1/", timeout_ms=300)
    assert "hunter2" not in str(refused.value) and "admin:***@" in str(refused.value)


def test_a_damaged_token_in_the_state_store_is_a_clear_error(
    raw_client, sqlite_store, lake, make_stream
):
    from sqlalchemy import update

    from state import schema

    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    with sqlite_store.engine.begin() as conn:
        conn.execute(update(schema.checkpoints).values(token='{"_data": broken'))
    with pytest.raises(StateStoreError) as refused:
        drain(stream, raw_client, sqlite_store, lake)
    assert "damaged resume token" in str(refused.value)
    assert "tidemark reset orders --to-time" in str(refused.value)
    assert sqlite_store.batch_count(stream.name) == 0


def test_an_event_over_16_mb_is_a_clear_error_and_nothing_is_committed(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    client[db_name].create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    stream = make_stream(full_document="required", full_document_before_change="required")
    drain(stream, raw_client, sqlite_store, lake)
    kept = sqlite_store.checkpoint(stream.name)
    client[db_name]["orders"].insert_one({"_id": 1, "blob": "x" * (9 << 20)})
    client[db_name]["orders"].update_one({"_id": 1}, {"$set": {"small": 1}})
    with pytest.raises(EventTooLarge) as refused:
        drain(stream, raw_client, sqlite_store, lake)
    message = str(refused.value)
    assert "larger than MongoDB's 16 MB limit" in message
    assert "$changeStreamSplitLargeEvent" in message and "full_document_before_change" in message
    assert sqlite_store.checkpoint(stream.name) == kept
    assert sqlite_store.batch_count(stream.name) == 0


@pytest.mark.parametrize(
    "collection",
    ["a/./b/c", "/etc/passwd", "with space. and.dots", "café/ürün/日本", "x\\y", "~/.ssh"],
)
def test_names_from_data_never_reach_a_path(
    collection, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(collection=collection)
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name][collection].insert_many([{"_id": i} for i in range(3)])
    result = drain(stream, raw_client, sqlite_store, lake)
    assert result.events == 3
    stream_dir = (lake / "raw" / "orders").resolve()
    every_file = [p.resolve() for p in lake.rglob("*") if p.is_file()]
    assert every_file and all(stream_dir in p.parents for p in every_file)
    rows = committed_table(sqlite_store, lake, stream.name).to_pylist()
    assert {r["coll"] for r in rows} == {collection}


@pytest.mark.fast
def test_runs_in_threads_of_one_process_probe_the_lake_without_tripping_each_other(tmp_path):
    """The soak found it: two runs in one process shared the write probe's name, and one
    run's cleanup made the other report the lake as not writable."""
    import threading

    from jobs.lake import ensure_writable

    errors: list[Exception] = []

    def probe() -> None:
        for _ in range(300):
            try:
                ensure_writable(tmp_path / "lake")
            except Exception as error:  # collected for the assertion
                errors.append(error)

    threads = [threading.Thread(target=probe) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
