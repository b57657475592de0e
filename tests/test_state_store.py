"""The state store on SQLite and PostgreSQL: schema versioning, manifest, resets, errors, and
the newest-row reads (last batch, running snapshot, latest run and version)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bson import Timestamp
from sqlalchemy import select, update

from state import (
    BatchRecord,
    CuratedTable,
    FileEntry,
    NewPosition,
    SnapshotRecord,
    StateStore,
    TransformRun,
    new_batch_id,
    schema,
)
from tidemark.errors import StateStoreError
from tidemark.tokens import ResumeToken, SourceIdentity

pytestmark = pytest.mark.fast  # the state store alone: SQLite and PostgreSQL, no mongod


def test_schema_installs_once_and_refuses_another_version(state_url):
    first = StateStore(state_url)
    StateStore(state_url).close()  # opening again is harmless
    with first.engine.begin() as conn:
        conn.execute(update(schema.schema_version).values(version=schema.SCHEMA_VERSION + 1))
    first.close()
    with pytest.raises(StateStoreError) as refused:
        StateStore(state_url)
    assert f"schema version {schema.SCHEMA_VERSION + 1}" in str(refused.value)
    assert "TIDEMARK_STATE_URL" in str(refused.value)


def test_manifest_round_trip(store, make_config):
    stream = make_config()
    checkpoint = store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    batch = BatchRecord(
        id=new_batch_id(),
        stream=stream.name,
        source="incremental",
        event_count=3,
        bytes=300,
        files=[
            FileEntry("raw/orders/date=2026-01-01/hour=00/a-00000.parquet", 2, 10),
            FileEntry("raw/orders/date=2026-01-01/hour=01/a-00001.parquet", 1, 11),
        ],
        events_by_type={"insert": 2, "delete": 1},
        first_event_id="82A",
        last_event_id="82C",
        first_cluster_time=Timestamp(0, 5),
        last_cluster_time=Timestamp(0, 9),
        token_after=ResumeToken({"_data": "82C"}),
    )
    position = NewPosition(token=ResumeToken({"_data": "82C"}), cluster_time=Timestamp(0, 9))
    store.commit_batch(lease, checkpoint.version, batch, position)
    (stored,) = store.batches(stream.name)
    assert (stored.id, stored.event_count, stored.events_by_type, stored.files) == (
        batch.id,
        3,
        {"insert": 2, "delete": 1},
        batch.files,
    )
    assert stored.epoch == lease.epoch and stored.committed_at is not None
    assert store.committed_paths(stream.name) == {f.path for f in batch.files}
    assert store.checkpoint(stream.name).cluster_time == Timestamp(0, 9)
    assert (stored.first_cluster_time, stored.token_after) == (Timestamp(0, 5), batch.token_after)
    # The columns keep what they always kept: packed Timestamps and the token's JSON.
    with store.engine.connect() as conn:
        b, c = schema.batches.c, schema.checkpoints.c
        row = conn.execute(select(b.first_cluster_time, b.last_cluster_time, b.token_after)).one()
        assert tuple(row) == (5, 9, '{"_data": "82C"}')
        row = conn.execute(select(c.token, c.cluster_time)).one()
        assert tuple(row) == ('{"_data": "82C"}', 9)


def test_reset_moves_the_checkpoint_and_keeps_a_history(store, make_config):
    old = make_config()
    checkpoint = store.ensure_stream(old)
    lease = store.acquire_lease(old.name, "capture", timedelta(minutes=5))
    store.commit_batch(
        lease,
        checkpoint.version,
        None,
        NewPosition(token=ResumeToken.from_json('{"_data": "82A"}')),
    )
    new = make_config(full_document="whenAvailable", current_table=False)
    store.reset_checkpoint(
        lease,
        new,
        NewPosition(start_at_operation_time=Timestamp(0, 7), cluster_time=Timestamp(0, 7)),
        "time 2026-01-01",
        "tester",
    )
    moved = store.checkpoint(old.name)
    assert moved.token is None and moved.start_at_operation_time == Timestamp(0, 7)
    assert moved.fingerprint == new.fingerprint()
    (entry,) = store.resets(old.name)
    assert entry["from_token"] == '{"_data": "82A"}' and entry["actor"] == "tester"
    assert entry["old_fingerprint"] == old.fingerprint()
    store.ensure_stream(new)  # the new definition is now the registered one


def test_a_damaged_time_column_fails_only_the_reads_that_decode_it(store, make_config):
    """A stored cluster time out of range (a hand-edited or corrupted store) fails the runs
    that resume from it, but a replay's source check and `tidemark reset`, the way out, read
    only the columns they need."""
    stream = make_config()
    store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    at = NewPosition(start_at_operation_time=Timestamp(7, 1), cluster_time=Timestamp(7, 1))
    store.reset_checkpoint(lease, stream, at, "time T", "tester")
    with store.transaction("damage") as conn:
        c = schema.checkpoints
        conn.execute(update(c).where(c.c.stream == stream.name).values(cluster_time=-5))
    with pytest.raises(ValueError):
        store.checkpoint(stream.name)

    source = SourceIdentity("replica_set", "rs0", "id")
    store.check_source(stream, source)  # a replay's check
    store.reset_checkpoint(lease, stream, at, "time T again", "tester")
    assert store.checkpoint(stream.name).cluster_time == Timestamp(7, 1)


def test_unreachable_database_is_a_clear_error_without_the_password():
    with pytest.raises(StateStoreError) as refused:
        StateStore("postgresql://tm:topsecret@127.0.0.1:1/tidemark?connect_timeout=2")
    message = str(refused.value)
    assert "topsecret" not in message and "tm:***@" in message
    assert "TIDEMARK_STATE_URL" in message


def _batch(batch_id: str, stream: str, path: str) -> BatchRecord:
    return BatchRecord(
        id=batch_id,
        stream=stream,
        source="replay",
        event_count=1,
        bytes=10,
        files=[FileEntry(path, 1, 10)],
    )


def test_last_batch_is_the_newest_committed_of_the_stream(store, make_config):
    orders, users = make_config(), make_config(name="users", collection="users")
    store.ensure_stream(orders)
    store.ensure_stream(users)
    assert store.last_batch(orders.name) is None
    lease = store.acquire_lease(orders.name, "capture", timedelta(minutes=5))
    # Ids sort against commit order: the newest is the newest committed, not the largest id.
    for batch_id in ("z-first", "m-second", "a-third"):
        store.commit_batch(lease, None, _batch(batch_id, orders.name, f"{batch_id}.parquet"), None)
    other = store.acquire_lease(users.name, "capture", timedelta(minutes=5))
    store.commit_batch(other, None, _batch("zz-users", users.name, "users.parquet"), None)
    newest = store.last_batch(orders.name)
    assert newest is not None and newest.id == "a-third"
    assert newest.files == [FileEntry("a-third.parquet", 1, 10)]
    assert newest == store.batches(orders.name)[-1]


def _snapshot(snapshot_id: str, stream: str, started_at: datetime) -> SnapshotRecord:
    return SnapshotRecord.starting(
        snapshot_id, stream, "initial", Timestamp(0, 7), [("db", "orders")], started_at
    )


def test_running_snapshot_is_the_newest_still_running(store, make_config):
    stream = make_config()
    store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    assert store.running_snapshot(stream.name) is None
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for n, snapshot_id in enumerate(("s-z", "s-m", "s-a")):
        store.start_snapshot(
            lease, _snapshot(snapshot_id, stream.name, t0 + timedelta(hours=n)), "t"
        )
    found = store.running_snapshot(stream.name)
    assert found is not None and found.id == "s-a"
    assert found.namespaces == [("db", "orders")]
    newest = replace(store.snapshots(stream.name)[-1], chunks=1)
    store.commit_snapshot_chunk(lease, newest, None, done=True)
    found = store.running_snapshot(stream.name)
    assert found is not None and found.id == "s-m"


def _run(stream: str, number: int, path: str | None, **more: Any) -> TransformRun:
    return TransformRun(
        stream=stream,
        run=number,
        path=path,
        rows=number,
        doc_schema="{}",
        events_folded=1,
        changes_added=1,
        created_at=datetime.now(UTC),
        **more,
    )


def test_tables_at_a_run_are_the_newest_record_of_each_at_or_before_it(store, make_config):
    """Time travel to run N reads each collection's Delta version as of N: a table a later run
    did not touch keeps its older record, one made later does not exist yet."""
    stream = make_config()
    store.ensure_stream(stream)
    runs = store.transforms
    lease = store.acquire_lease(stream.name, "transform", timedelta(minutes=5))

    def table(run: int, coll: str, version: int, rows: int) -> CuratedTable:
        path = f"curated/{stream.name}/db/{coll}/current"
        return CuratedTable(stream.name, run, "db", coll, "current", path, version, rows)

    touched = {1: [("a", 0, 5)], 2: [("a", 1, 6), ("b", 0, 2)], 3: [("b", 1, 3)]}
    for number, changed in touched.items():
        records = [table(number, *t) for t in changed]
        run = _run(stream.name, number, f"curated/{stream.name}", kind="merge")
        runs.commit(lease, stream.name, number - 1 or None, run, [], records)

    def at(run: int | None) -> list[tuple[str, int, int, int]]:
        return [(t.coll, t.run, t.delta_version, t.rows) for t in runs.tables(stream.name, run)]

    assert at(1) == [("a", 1, 0, 5)]
    assert at(2) == [("a", 2, 1, 6), ("b", 2, 0, 2)]
    assert at(3) == at(None) == [("a", 2, 1, 6), ("b", 3, 1, 3)]


def test_change_log_runs_are_found_by_their_event_id_range(store, make_config):
    stream = make_config()
    store.ensure_stream(stream)
    runs = store.transforms
    lease = store.acquire_lease(stream.name, "transform", timedelta(minutes=5))
    for number, (first, last) in enumerate([("a", "c"), ("d", "f"), ("g", "i")], start=1):
        run = _run(stream.name, number, None, changes_path=f"changes/run={number}")
        run = replace(run, first_event_id=first, last_event_id=last)
        runs.commit(lease, stream.name, number - 1 or None, run, [])

    def overlapping(low: str, high: str) -> list[int]:
        return [r.run for r in runs.change_log_runs(stream.name, low, high)]

    assert overlapping("e", "g") == [2, 3]
    assert overlapping("c", "c") == [1] and overlapping("j", "z") == []
    assert [r.run for r in runs.change_log_runs(stream.name)] == [1, 2, 3]
    assert runs.newest_logged_event(stream.name) == "i"
    assert runs.newest_logged_event("no-such-stream") is None


def test_latest_run_and_latest_current_run_are_the_newest(store, make_config):
    stream = make_config()
    store.ensure_stream(stream)
    runs = store.transforms
    assert runs.latest(stream.name) is None and runs.latest_current_run(stream.name) is None
    lease = store.acquire_lease(stream.name, "transform", timedelta(minutes=5))
    runs.commit(lease, stream.name, None, _run(stream.name, 1, "current/v1"), [])
    runs.commit(lease, stream.name, 1, _run(stream.name, 2, "current/v2"), [])
    runs.commit(lease, stream.name, 2, _run(stream.name, 3, None), [])  # change log only
    runs.mark_pruned(stream.name, 2)
    latest = runs.latest(stream.name)
    assert latest is not None and (latest.run, latest.path) == (3, None)
    wrote = runs.latest_current_run(stream.name)  # the newest with a path, pruned or not
    assert wrote is not None and (wrote.run, wrote.path) == (2, "current/v2")
    assert wrote.pruned_at is not None
    assert [v.run for v in runs.current_runs(stream.name)] == [1]
