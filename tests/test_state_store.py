"""The state store on SQLite and PostgreSQL: schema versioning, manifest, resets, errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from state import schema
from state.store import BatchRecord, FileEntry, NewPosition, StateStore, new_batch_id
from tidemark.errors import StateStoreError


@pytest.mark.fast
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


def test_manifest_round_trip(store, make_stream):
    stream = make_stream()
    checkpoint = store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, timedelta(minutes=5))
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
        first_cluster_time=5,
        last_cluster_time=9,
        token_after='{"_data": "82C"}',
    )
    store.commit_batch(
        lease, checkpoint.version, batch, NewPosition(token='{"_data": "82C"}', cluster_time=9)
    )
    (stored,) = store.batches(stream.name)
    assert (stored.id, stored.event_count, stored.events_by_type, stored.files) == (
        batch.id,
        3,
        {"insert": 2, "delete": 1},
        batch.files,
    )
    assert stored.epoch == lease.epoch and stored.committed_at is not None
    assert store.committed_paths(stream.name) == {f.path for f in batch.files}
    assert store.checkpoint(stream.name).cluster_time == 9


def test_reset_moves_the_checkpoint_and_keeps_a_history(store, make_stream):
    old = make_stream()
    checkpoint = store.ensure_stream(old)
    lease = store.acquire_lease(old.name, timedelta(minutes=5))
    store.commit_batch(lease, checkpoint.version, None, NewPosition(token='{"_data": "82A"}'))
    new = make_stream(full_document="whenAvailable", current_table=False)
    store.reset_checkpoint(
        lease,
        new,
        NewPosition(start_at_operation_time=7, cluster_time=7),
        "time 2026-01-01",
        "tester",
    )
    moved = store.checkpoint(old.name)
    assert moved.token is None and moved.start_at_operation_time == 7
    assert moved.fingerprint == new.fingerprint()
    (entry,) = store.resets(old.name)
    assert entry["from_token"] == '{"_data": "82A"}' and entry["actor"] == "tester"
    assert entry["old_fingerprint"] == old.fingerprint()
    store.ensure_stream(new)  # the new definition is now the registered one


@pytest.mark.fast
def test_unreachable_database_is_a_clear_error_without_the_password():
    with pytest.raises(StateStoreError) as refused:
        StateStore("postgresql://tm:topsecret@127.0.0.1:1/tidemark?connect_timeout=2")
    message = str(refused.value)
    assert "topsecret" not in message and "tm:***@" in message
    assert "TIDEMARK_STATE_URL" in message
