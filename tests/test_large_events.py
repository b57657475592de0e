"""Events over 16 MB on a server that splits them (mongod 6.0.27, `$changeStreamSplitLargeEvent`):
fragments rejoined into one raw-zone row byte-identical to the reference rebuild, runs that stop
only between whole events, a fragment's token never stored, resumes in the middle of an event
(the reader's own, and a stream opened at a fragment's token), and a run of such events folded
on the default 2 GB Spark server."""

from __future__ import annotations

import random
import signal
import string
import time

import pytest
from bson.raw_bson import RawBSONDocument

from jobs.capture import drain
from jobs.capture._fragments import fragment_of, whole_events
from jobs.capture.capture_pass import PassBounds, capture_pass
from jobs.capture.reader import ChangeStreamReader, WatchSpec
from jobs.capture.writer import RawBatchWriter
from jobs.transform import exact_documents, read_changes, transform
from resources.processes import free_port
from resources.spark_server import start_server, stop_server
from tests.helpers.connect_transform import transform_over_connect
from tests.helpers.delta_reading import changes_event_ids, current_documents, current_tables
from tests.helpers.drain_child import start_drain_child, wait_until_ready
from tests.helpers.lake_reading import committed_table
from tests.helpers.oracle import current_state, source_state
from tests.helpers.split_events import fragment_tokens, rebuild, watched_fragments
from tidemark.errors import FragmentOutOfOrder, SplitStageRequired

pytestmark = pytest.mark.servers("6.0.27")

MB = 1 << 20
LETTERS = bytes(string.ascii_letters.encode()[b % 52] for b in range(256))  # byte -> letter
IMAGES = {"full_document": "required", "full_document_before_change": "required"}


def _images_collection(client, db_name):
    client[db_name].create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    return client[db_name]["orders"]


def _reference(raw_client, db_name, token):
    fragments = watched_fragments(
        raw_client,
        db_name,
        "orders",
        token.document,
        full_document="required",
        full_document_before_change="required",
    )
    return fragments, rebuild(fragments)


def _current_equals_find(spark, store, lake, stream, raw_client, db_name) -> None:
    transform(spark, store, lake, stream)
    current = current_state(exact_documents(spark, store, lake, stream.name))
    assert current == source_state(raw_client, db_name, "orders")


def test_a_12_mb_document_with_images_arrives_once_and_whole(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = _images_collection(client, db_name)
    stream = make_stream(**IMAGES)
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    orders.insert_one({"_id": 1, "a": "x" * (12 * MB), "n": 1})
    orders.update_one({"_id": 1}, {"$set": {"n": 2}})  # pre- and post-image: 24 MB
    orders.replace_one({"_id": 1}, {"a": "y" * (12 * MB), "n": 3})
    assert drain(stream, raw_client, sqlite_store, lake).events == 3
    _current_equals_find(spark, sqlite_store, lake, stream, raw_client, db_name)
    orders.delete_one({"_id": 1})
    result = drain(stream, raw_client, sqlite_store, lake)
    assert result.events == 1 and result.stop_reason == "caught_up"
    _current_equals_find(spark, sqlite_store, lake, stream, raw_client, db_name)
    fragments, expected = _reference(raw_client, db_name, start)
    assert sum("splitEvent" in f for f in fragments) >= 4  # update and replace came split
    table = committed_table(sqlite_store, lake, stream.name)
    assert table["operation_type"].to_pylist() == ["insert", "update", "replace", "delete"]
    assert table["raw"].to_pylist() == expected  # byte for byte
    changes = read_changes(spark, sqlite_store, lake, stream.name).select("event_id").collect()
    assert sorted(r.event_id for r in changes) == sorted(table["event_id"].to_pylist())


def test_a_40_mb_event_goes_through_the_raw_zone_and_the_transform(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = _images_collection(client, db_name)
    stream = make_stream(**IMAGES)
    orders.insert_one({"_id": 1, "a": "x" * (13 * MB + MB // 2)})
    drain(stream, raw_client, sqlite_store, lake)
    # The update description, the pre- and the post-image: 13.5 MB each.
    orders.update_one({"_id": 1}, {"$set": {"a": "y" * (13 * MB + MB // 2)}})
    assert drain(stream, raw_client, sqlite_store, lake).events == 1
    (raw,) = committed_table(sqlite_store, lake, stream.name)["raw"].to_pylist()
    assert len(raw) > 40 * MB
    _current_equals_find(spark, sqlite_store, lake, stream, raw_client, db_name)
    (change,) = read_changes(spark, sqlite_store, lake, stream.name).collect()
    assert len(change.full_document) > 13 * MB and len(change.full_document_before_change) > 13 * MB


def _token_data(store, stream) -> str:
    return store.checkpoint(stream.name).token.data


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


def _split_update(client, db_name, raw_client, sqlite_store, lake, stream):
    """A committed position, then one 18 MB update (two fragments) after it."""
    orders = _images_collection(client, db_name)
    orders.insert_one({"_id": 1, "a": "x" * (9 * MB), "n": 0})
    drain(stream, raw_client, sqlite_store, lake)
    start = sqlite_store.checkpoint(stream.name).token
    orders.update_one({"_id": 1}, {"$set": {"n": 1}})
    return start


def _reader(raw_client, stream, start_token, batch_size=1):
    return ChangeStreamReader(
        raw_client,
        WatchSpec(
            stream.database,
            stream.collection,
            {
                "resumeAfter": start_token,
                "fullDocument": "required",
                "fullDocumentBeforeChange": "required",
            },
            [],
            batch_size=batch_size,
            max_await_time_ms=300,
            split_large_events=True,
        ),
    )


def test_the_readers_resume_in_the_middle_of_an_event_completes_it(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(**IMAGES)
    start = _split_update(client, db_name, raw_client, sqlite_store, lake, stream)
    _, expected = _reference(raw_client, db_name, start)
    # The aggregate's reply holds the first fragment (batchSize 1); the first getMore then
    # loses its connection, so the reader resumes from that fragment's token.
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["getMore"], "closeConnection": True},
    )
    seen: list = []

    def recorded(replies):
        for reply in replies:
            seen.append([fragment_of(reply.events.raw(i)) for i in range(len(reply.events))])
            yield reply

    try:
        with _reader(raw_client, stream, start.document) as reader:
            events = []
            for reply in whole_events(recorded(reader.replies()), reader.initial_token):
                events += reply.events.raws()
                if reply.caught_up:
                    break
            resumes = reader.resumes
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert resumes == 1
    assert [f.number for f in seen[0] if f] == [1]  # the resume came between the fragments
    assert events == expected


def test_a_stream_opened_at_a_fragments_token_fails_rather_than_commit_half_an_event(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    from sqlalchemy import update

    from state import schema

    stream = make_stream(**IMAGES)
    start = _split_update(client, db_name, raw_client, sqlite_store, lake, stream)
    fragments, _ = _reference(raw_client, db_name, start)
    inner, _ = fragment_tokens(fragments)
    # The server goes on with the next fragment: the event's first part is missing.
    with (
        _reader(raw_client, stream, {"_data": inner[0]}) as reader,
        pytest.raises(FragmentOutOfOrder, match="fragment 2 of 2"),
    ):
        for reply in whole_events(reader.replies(), reader.initial_token):
            assert not reply.caught_up, "the half event was passed on"
    # A checkpoint holding one (Tidemark never stores one) fails the drain, commits nothing.
    with sqlite_store.engine.begin() as conn:
        conn.execute(update(schema.checkpoints).values(token=f'{{"_data": "{inner[0]}"}}'))
    kept = sqlite_store.checkpoint(stream.name)
    with pytest.raises(FragmentOutOfOrder):
        drain(stream, raw_client, sqlite_store, lake)
    assert sqlite_store.checkpoint(stream.name) == kept
    assert len(sqlite_store.batches(stream.name)) == 0


def _get_more_waiting(client) -> bool:
    ops = client.admin.aggregate(
        [{"$currentOp": {"allUsers": True}}, {"$match": {"command.getMore": {"$exists": True}}}]
    )
    return any(True for _ in ops)


def _exactly_once_after(stream, raw_client, sqlite_store, lake, expected) -> None:
    result = drain(stream, raw_client, sqlite_store, lake)
    assert result.events == len(expected)
    assert committed_table(sqlite_store, lake, stream.name)["raw"].to_pylist() == expected
    assert drain(stream, raw_client, sqlite_store, lake).events == 0


def test_a_drain_killed_between_fragments_leaves_the_event_to_the_next_run_once(
    mongod, client, raw_client, sqlite_store, state_url_sqlite, lake, make_stream, db_name, tmp_path
):
    stream = make_stream(**IMAGES, batch_size=1)
    start = _split_update(client, db_name, raw_client, sqlite_store, lake, stream)
    _, expected = _reference(raw_client, db_name, start)
    # The child's aggregate returns the first fragment (batchSize 1); its getMore for the
    # second waits on the server (5 s) while the child is killed.
    client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={"failCommands": ["getMore"], "blockConnection": True, "blockTimeMS": 5_000},
    )
    try:
        child = start_drain_child(mongod, state_url_sqlite, lake, stream, tmp_path / "ready")
        deadline = time.monotonic() + 60
        while not _get_more_waiting(client):
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert sqlite_store.checkpoint(stream.name).token == start
    _exactly_once_after(stream, raw_client, sqlite_store, lake, expected)


def test_a_drain_killed_after_the_last_fragment_before_its_commit_commits_nothing(
    mongod, client, raw_client, sqlite_store, state_url_sqlite, lake, make_stream, db_name, tmp_path
):
    stream = make_stream(**IMAGES, batch_size=1)
    start = _split_update(client, db_name, raw_client, sqlite_store, lake, stream)
    _, expected = _reference(raw_client, db_name, start)
    ready = tmp_path / "ready"
    child = start_drain_child(mongod, state_url_sqlite, lake, stream, ready)
    written = wait_until_ready(ready, child)  # the whole event is written, not committed
    assert written
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    assert sqlite_store.checkpoint(stream.name).token == start
    _exactly_once_after(stream, raw_client, sqlite_store, lake, expected)


def test_a_split_events_token_needs_the_split_stage_to_resume(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(**IMAGES)
    _split_update(client, db_name, raw_client, sqlite_store, lake, stream)
    assert drain(stream, raw_client, sqlite_store, lake).events == 1  # ends on the split event
    # Turning the option off changes the stream's definition: the fingerprint guard refuses.
    assert make_stream(**IMAGES, split_large_events=False).fingerprint() != stream.fingerprint()
    assert make_stream(**IMAGES).fingerprint() == stream.fingerprint()
    # The server's own refusal, for a run that went past the guard, names the fix.
    with pytest.raises(SplitStageRequired, match="split_large_events: true"):
        capture_pass(
            stream.model_copy(update={"split_large_events": False}),
            raw_client,
            RawBatchWriter(lake, stream.name, "b"),
            {"resumeAfter": sqlite_store.checkpoint(stream.name).token.document},
            PassBounds(lambda ts: False, stream.budget),
            lambda: None,
            position_time=None,
        )


@pytest.mark.own_servers
def test_sixteen_events_of_36_mb_fold_on_the_default_2_gb_server(
    client, raw_client, sqlite_store, lake, make_stream, db_name, tmp_path
):
    """Issue 24, item 7: 12 MB documents, each updated once with pre- and post-images, so
    that each update event is ~36 MB (split by the server, rejoined by the drain). Folded in
    one run, they ran the server's 2 GB driver out of memory until the run held its rows on
    disk and the Parquet writer stopped buffering and keeping copies of them."""
    orders = _images_collection(client, db_name)
    stream = make_stream(**IMAGES, budget={"max_events": None, "max_bytes": None})
    rng = random.Random(24)

    def blob() -> str:  # letters at random: compression does not shrink them much
        return rng.randbytes(12 * MB).translate(LETTERS).decode()  # 0.1 s, not 2 s

    def run() -> dict:
        return transform_over_connect(server.url, sqlite_store, lake, stream)

    server, _ = start_server(tmp_path / "home", port=free_port(), driver_memory="2g")
    try:
        drain(stream, raw_client, sqlite_store, lake)
        for half in (range(8), range(8, 16)):  # drained by halves: the oplog is 256 MB
            for n in half:
                orders.insert_one({"_id": n, "a": blob()})
            drain(stream, raw_client, sqlite_store, lake)
        assert run() == {"added": 16, "rows": 16}
        for half in (range(8), range(8, 16)):
            for n in half:
                orders.update_one({"_id": n}, {"$set": {"a": blob()}})
            assert drain(stream, raw_client, sqlite_store, lake).events == 8
        raws = committed_table(sqlite_store, lake, stream.name)["raw"].to_pylist()
        sizes = [len(r) for r in raws]
        assert sorted(sizes)[-16] > 36 * MB  # the 16 updates, each whole

        assert run() == {"added": 16, "rows": 16}
    finally:
        stop_server(tmp_path / "home")
    # Read as any engine would (deltalake, no JVM): every document whole and newest.
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    assert len(changes_event_ids(sqlite_store, lake, stream.name)) == 32
