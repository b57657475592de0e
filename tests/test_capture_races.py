"""Capture under concurrency: writes racing a run's start, pipelines that hide invalidates,
replay windows still filling, gc beside a backfill, and lost connections during a replay.

Each test pins one hole an adversarial review found, with the race made deterministic by
holding a real step (a write, a commit) at the point where it happened.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, WriteConcern

import jobs.capture.capture_pass as capture_pass
import jobs.capture.drain_run as drain_module
import jobs.capture.replay_window as replay_module
from jobs.capture import drain, drain_until_caught_up, replay
from jobs.capture.drain_run import DrainSeams
from jobs.capture.reader import ChangeStreamReader, WatchSpec
from jobs.ops import collect_garbage
from resources.mongo import connect
from tests.helpers.lake_reading import committed_table
from tidemark.errors import (
    LeaseHeld,
    MongoConnectionError,
    StreamDefinitionChanged,
    StreamInvalidated,
    WindowNotConfirmed,
)
from tidemark.tokens import ResumeToken

# Hides drops and invalidates: a change log only (with current_table on they pass any $match).
CRUD_ONLY = [{"$match": {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}}]


def _keys(store, lake, stream: str) -> list[str]:
    return committed_table(store, lake, stream).column("document_key").to_pylist()


def _string_key(value: str) -> str:
    return f'{{ "_id" : "{value}" }}'


def test_a_write_between_the_horizon_and_the_aggregate_is_not_skipped(
    client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """The stream is caught up; a write lands after the run took its horizon and before the
    aggregate: its event is past the horizon, so this run takes nothing, and its token must
    not move past the event (the aggregate's postBatchResumeToken lies beyond it)."""
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    real_cluster_time = drain_module.cluster_time

    def horizon_then_a_write(c):
        horizon = real_cluster_time(c)
        client[db_name]["orders"].insert_one({"_id": "raced"})
        return horizon

    monkeypatch.setattr(drain_module, "cluster_time", horizon_then_a_write)
    first = drain(stream, raw_client, sqlite_store, lake)
    monkeypatch.undo()
    assert first.events == 0 and first.stop_reason == "horizon"

    raced_at = client[db_name]["orders"].database.command("ping")["operationTime"]
    checkpoint = sqlite_store.checkpoint(stream.name)
    # The invariant: the committed token covers no event that is not in a committed batch.
    assert checkpoint.token.cluster_time < raced_at
    drain(stream, raw_client, sqlite_store, lake)
    assert _keys(sqlite_store, lake, stream.name) == [_string_key("raced")]


def _invalidate_token(raw_client: MongoClient, db: str, resume_after) -> RawBSONDocument:
    """The token of the closed cursor after a drop, read through a CRUD-only pipeline."""
    spec = WatchSpec(db, "orders", {"resumeAfter": resume_after}, CRUD_ONLY, 100, 300)
    with ChangeStreamReader(raw_client, spec) as reader:
        for reply in reader.replies():
            assert not reply.caught_up, "the stream was not invalidated"
            if reply.closed:
                return reply.token_after
    raise AssertionError("the reader ended without a closed reply")


@pytest.mark.parametrize("scope", ["collection", "database"])
def test_a_pipeline_that_hides_invalidate_follows_the_re_created_collection(
    client, raw_client, sqlite_store, lake, make_stream, db_name, scope
):
    collection = "orders" if scope == "collection" else None
    stream = make_stream(
        pipeline=CRUD_ONLY, collection=collection, on_invalidate="continue", current_table=False
    )
    client[db_name]["orders"].insert_one({"_id": "before"})
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_one({"_id": "old"})
    if scope == "collection":
        client[db_name]["orders"].drop()
    else:
        client.drop_database(db_name)
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    assert sqlite_store.checkpoint(stream.name).token_is_invalidate

    client[db_name]["orders"].insert_one({"_id": "new"})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    assert _keys(sqlite_store, lake, stream.name) == [_string_key("old"), _string_key("new")]


def test_a_pipeline_that_hides_invalidate_stops_clearly_when_asked(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(pipeline=CRUD_ONLY, on_invalidate="stop", current_table=False)
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_one({"_id": "old"})
    client[db_name]["orders"].drop()
    drain(stream, raw_client, sqlite_store, lake)
    with pytest.raises(StreamInvalidated, match="on_invalidate is 'stop'"):
        drain(stream, raw_client, sqlite_store, lake)
    assert _keys(sqlite_store, lake, stream.name) == [_string_key("old")]


def test_a_checkpoint_holding_an_unflagged_invalidate_token_resumes_with_start_after(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Stores written before closed cursors were detected hold the invalidate token as a
    plain one; the server refuses resumeAfter from it, and the next run must recover."""
    stream = make_stream(pipeline=CRUD_ONLY, current_table=False)
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token.document
    client[db_name]["orders"].insert_one({"_id": "before-drop"})  # a collection to drop
    client[db_name]["orders"].drop()
    token = _invalidate_token(raw_client, db_name, start)
    lease = sqlite_store.acquire_lease(stream.name, "capture", timedelta(minutes=1))
    from state import NewPosition

    sqlite_store.commit_batch(
        lease,
        sqlite_store.checkpoint(stream.name).version,
        None,
        NewPosition(token=ResumeToken(token), cluster_time=None),
    )
    sqlite_store.release_lease(lease)
    client[db_name]["orders"].insert_one({"_id": "new"})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    assert _keys(sqlite_store, lake, stream.name) == [_string_key("new")]


def test_a_replay_reads_until_its_window_is_covered_not_to_the_first_empty_reply(
    client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """Events of the window that the server has not made visible yet (majority lag, a lagging
    shard) come after an empty getMore: the window is complete only when the stream's tokens
    pass its end. Here the window ends in the near future and is written into meanwhile."""
    stream = make_stream()
    monkeypatch.setattr(replay_module, "check_window", lambda *args: None)
    start = datetime.now(UTC) - timedelta(seconds=1)
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)

    def wait_until(moment: datetime) -> None:
        threading.Event().wait(max(0.0, (moment - datetime.now(UTC)).total_seconds()))

    def late_writes() -> None:
        for n in range(3):
            wait_until(end - timedelta(seconds=2.5 - n))
            client[db_name]["orders"].insert_one({"_id": f"late{n}"})
        # A write elsewhere after the end moves the stream's tokens past it (an idle replica
        # set's no-op writer would, every 10 s).
        wait_until(end + timedelta(seconds=0.2))
        client[db_name]["elsewhere"].insert_one({})

    writer = threading.Thread(target=late_writes)
    writer.start()
    result = replay(stream, raw_client, sqlite_store, lake, start, end)
    writer.join()
    assert result.events == 3
    assert sorted(_keys(sqlite_store, lake, stream.name)) == [
        _string_key(f"late{n}") for n in range(3)
    ]


def test_gc_never_sweeps_the_files_of_an_in_flight_replay(
    client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    start = datetime.now(UTC) - timedelta(seconds=2)
    client[db_name]["orders"].insert_many([{"_id": n} for n in range(20)])
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    threading.Event().wait((end - datetime.now(UTC)).total_seconds() + 0.2)
    client[db_name]["elsewhere"].insert_one({})  # the stream's tokens pass the window's end

    at_commit, go_on = threading.Event(), threading.Event()
    real_commit = sqlite_store.commit_batch

    def held_commit(*args, **kwargs):
        at_commit.set()
        go_on.wait(60)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(sqlite_store, "commit_batch", held_commit)
    results: list = []
    backfill = threading.Thread(
        target=lambda: results.append(replay(stream, raw_client, sqlite_store, lake, start, end))
    )
    backfill.start()
    assert at_commit.wait(60)
    sweeps = collect_garbage(lake, sqlite_store, min_age_seconds=0)  # age protects nothing
    go_on.set()
    backfill.join(60)
    assert results and results[0].events == 20
    assert sweeps and all(not (s.result and s.result.removed) for s in sweeps)
    for batch in sqlite_store.batches(stream.name):
        for file in batch.files:
            assert (lake / file.path).exists(), f"committed file {file.path} was swept"


def test_a_lost_connection_during_a_replay_is_a_clear_error(
    mongod, client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    stream = make_stream()
    start = datetime.now(UTC) - timedelta(seconds=1)
    client[db_name]["orders"].insert_many([{"_id": n} for n in range(5)])
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    threading.Event().wait((end - datetime.now(UTC)).total_seconds() + 0.2)
    raw = connect(mongod.uri, raw=True, timeout_ms=2000, appname="replay-fault")
    # Every getMore and the resume's aggregate lose their connection.
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 4},
        data={
            "failCommands": ["getMore", "aggregate"],
            "appName": "replay-fault",
            "closeConnection": True,
        },
    )
    try:
        with pytest.raises(MongoConnectionError, match="nothing was committed"):
            replay(stream, raw, sqlite_store, lake, start, end)
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        raw.close()
    assert sqlite_store.batches(stream.name) == []


def _replay_in_thread(stream, raw_client, store, lake, start, end) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = replay(stream, raw_client, store, lake, start, end)
        except Exception as error:  # handed to the test
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _window_with_a_lagging_write(client, db_name: str) -> tuple[datetime, datetime]:
    """A closed window whose last write is not majority-committed (snapshots are stalled with
    the disableSnapshotting fail point until the caller turns it off)."""
    start = datetime.now(UTC) - timedelta(seconds=1)
    client[db_name]["orders"].insert_one({"_id": "majority"})
    client.admin.command("configureFailPoint", "disableSnapshotting", mode="alwaysOn")
    lagging = client[db_name].get_collection("orders", write_concern=WriteConcern(w=1))
    lagging.insert_one({"_id": "lagging"})
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    threading.Event().wait((end - datetime.now(UTC)).total_seconds() + 0.2)
    client[db_name].get_collection("elsewhere", write_concern=WriteConcern(w=1)).insert_one({})
    return start, end


def test_a_replay_waits_for_majority_commits_instead_of_cutting_its_window(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    try:
        start, end = _window_with_a_lagging_write(client, db_name)
        thread, out = _replay_in_thread(stream, raw_client, sqlite_store, lake, start, end)
        threading.Event().wait(2)  # the replay reads empty getMores meanwhile
    finally:
        client.admin.command("configureFailPoint", "disableSnapshotting", mode="off")
    thread.join(120)
    assert "error" not in out, out
    assert out["result"].events == 2
    assert sorted(_keys(sqlite_store, lake, stream.name)) == [
        _string_key("lagging"),
        _string_key("majority"),
    ]


def test_a_replay_whose_end_is_never_confirmed_fails_with_nothing_committed(
    client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    monkeypatch.setattr(capture_pass, "END_WAIT_SECONDS", 2.0)
    stream = make_stream()
    try:
        start, end = _window_with_a_lagging_write(client, db_name)
        thread, out = _replay_in_thread(stream, raw_client, sqlite_store, lake, start, end)
        thread.join(120)  # bounds a hang only: the wait is 2 s
        finished = not thread.is_alive()
    finally:
        client.admin.command("configureFailPoint", "disableSnapshotting", mode="off")
    thread.join(120)
    assert finished, "the replay waited past END_WAIT_SECONDS"
    assert isinstance(out.get("error"), WindowNotConfirmed), out
    assert "nothing was committed" in str(out["error"])
    assert sqlite_store.batches(stream.name) == []


def test_a_definition_changed_during_a_first_drain_is_not_taken_over_by_it(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A run with a new definition that cannot get the lease must change nothing: otherwise
    the running drain commits its token under the new fingerprint, and the new definition
    resumes from a token that skipped what only it would have captured."""
    since = datetime.now(UTC) - timedelta(seconds=2)
    inserts_only = make_stream(
        start=since, pipeline=[{"$match": {"operationType": "insert"}}], current_table=False
    )
    everything = make_stream(start=since, current_table=False)
    orders = client[db_name]["orders"]
    orders.insert_one({"_id": 1})
    orders.update_one({"_id": 1}, {"$set": {"x": 1}})
    refused: list[Exception] = []

    def the_other_definition_runs(_files) -> None:
        with pytest.raises(LeaseHeld) as held:
            drain(everything, raw_client, sqlite_store, lake)
        refused.append(held.value)

    first = drain(
        inserts_only,
        raw_client,
        sqlite_store,
        lake,
        seams=DrainSeams(before_commit=the_other_definition_runs),
    )
    assert refused and first.events == 1
    assert sqlite_store.checkpoint(inserts_only.name).fingerprint == inserts_only.fingerprint()
    with pytest.raises(StreamDefinitionChanged):
        drain(everything, raw_client, sqlite_store, lake)
