"""The commit protocol: one transaction per run, fencing, compare-and-set, orphans and gc.
Runs on SQLite and on PostgreSQL (the `store` / `state_url` fixtures); the tests of the state
store and the lake alone are in the fast tier (no mongod: `make_config`)."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from bson import Timestamp

from jobs.capture import drain
from jobs.ops import collect_garbage
from state import NewPosition, StateStore
from state.leases import lease_name, parse_lease_name
from tests.helpers.drain_child import start_drain_child, wait_until_ready
from tests.helpers.lake_reading import committed_table, direct_events
from tidemark.errors import CheckpointConflict, LeaseHeld, LeaseLost
from tidemark.tokens import ResumeToken


def test_sigkill_before_commit_then_exactly_once_and_gc(
    mongod, client, raw_client, store, state_url, lake, make_stream, db_name, tmp_path
):
    stream = make_stream()
    drain(stream, raw_client, store, lake)  # the starting position
    start = store.checkpoint(stream.name)
    client[db_name]["orders"].insert_many([{"i": i} for i in range(300)])

    ready = tmp_path / "ready"
    child = start_drain_child(mongod, state_url, lake, stream, ready)
    orphan_paths = wait_until_ready(ready, child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL

    assert len(orphan_paths) == 6  # 300 events, 50 rows a file: written, never committed
    assert all((lake / p).exists() for p in orphan_paths)
    assert store.checkpoint(stream.name) == start  # the token did not move
    assert store.batch_count(stream.name) == 0

    # The next run takes over the dead run's lease and commits the same events once.
    result = drain(stream, raw_client, store, lake)
    assert result.events == 300
    table = committed_table(store, lake, stream.name)
    reference = direct_events(raw_client[db_name]["orders"], start.token.document)
    assert table.column("event_id").to_pylist() == [e["_id"]["_data"] for e in reference]
    committed = store.committed_paths(stream.name)
    assert committed.isdisjoint(orphan_paths)

    sweeps = collect_garbage(lake, store, min_age_seconds=0)
    assert sorted(sweeps[0].result.removed) == sorted(orphan_paths)
    assert not any((lake / p).exists() for p in orphan_paths)
    assert all((lake / p).exists() for p in committed)
    assert committed_table(store, lake, stream.name).num_rows == 300


def test_two_concurrent_drains_one_fails_fast_no_double_commit(
    mongod, client, raw_client, store, state_url, lake, make_stream, db_name, tmp_path
):
    stream = make_stream()
    drain(stream, raw_client, store, lake)
    client[db_name]["orders"].insert_many([{"i": i} for i in range(120)])

    ready = tmp_path / "ready"
    child = start_drain_child(mongod, state_url, lake, stream, ready)
    wait_until_ready(ready, child)  # the child holds the lease and waits before its commit

    with pytest.raises(LeaseHeld) as refused:
        drain(stream, raw_client, store, lake)
    assert "being drained by another run" in str(refused.value)
    assert stream.name in str(refused.value)

    Path(str(ready) + ".go").touch()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert json.loads(out)["events"] == 120
    assert store.batch_count(stream.name) == 1
    assert committed_table(store, lake, stream.name).num_rows == 120
    # And the stream is free again afterwards.
    assert drain(stream, raw_client, store, lake).events == 0


@pytest.mark.fast
def test_a_run_whose_lease_was_taken_over_cannot_commit(store, make_config):
    stream = make_config()
    checkpoint = store.ensure_stream(stream)
    zombie = store.acquire_lease(stream.name, "capture", timedelta(seconds=-1))  # already expired
    usurper = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    assert usurper.epoch == zombie.epoch + 1

    position = NewPosition(token=ResumeToken({"_data": "82AA"}), cluster_time=Timestamp(0, 1))
    with pytest.raises(LeaseLost):
        store.commit_batch(zombie, checkpoint.version, None, position)
    assert store.checkpoint(stream.name) == checkpoint
    store.commit_batch(usurper, checkpoint.version, None, position)
    assert store.checkpoint(stream.name).token == position.token


@pytest.mark.fast
def test_checkpoint_moves_only_from_the_version_a_run_started_from(store, make_config):
    stream = make_config()
    checkpoint = store.ensure_stream(stream)
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    first = NewPosition(token=ResumeToken({"_data": "82AA"}), cluster_time=Timestamp(0, 1))
    store.commit_batch(lease, checkpoint.version, None, first)
    with pytest.raises(CheckpointConflict):
        store.commit_batch(
            lease, checkpoint.version, None, NewPosition(token=ResumeToken({"_data": "82BB"}))
        )
    assert store.checkpoint(stream.name).token == first.token


@pytest.mark.fast
def test_gc_leaves_a_stream_alone_while_a_run_holds_its_lease(store, make_config, lake):
    stream = make_config()
    store.ensure_stream_row(stream)  # a stream's row is there before its first file
    orphan = lake / "raw" / stream.name / "date=2026-01-01" / "hour=00" / "x-00000.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"orphan")
    lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    sweeps = collect_garbage(lake, store, min_age_seconds=0)
    assert sweeps[0].result is None and "lease" in sweeps[0].note and orphan.exists()
    store.release_lease(lease)
    sweeps = collect_garbage(lake, store, min_age_seconds=0)
    assert sweeps[0].result.removed == [orphan.relative_to(lake).as_posix()]


@pytest.mark.fast
def test_two_store_handles_share_one_lease(state_url, make_config):
    """Leases live in the database, not in the process: a second handle sees the first's."""
    stream = make_config()
    a, b = StateStore(state_url), StateStore(state_url)
    try:
        a.ensure_stream(stream)
        a.acquire_lease(stream.name, "capture", timedelta(minutes=5))
        with pytest.raises(LeaseHeld):
            b.acquire_lease(stream.name, "capture", timedelta(minutes=5))
    finally:
        a.close()
        b.close()


@pytest.mark.fast
def test_a_held_lease_names_the_work_its_holder_does(store, make_config):
    stream = make_config()
    store.ensure_stream(stream)
    for kind, work in (
        ("capture", "being drained"),
        ("transform", "being transformed"),
        ("replay", "being replayed"),
    ):
        store.acquire_lease(stream.name, kind, timedelta(minutes=5))
        with pytest.raises(LeaseHeld) as held:
            store.acquire_lease(stream.name, kind, timedelta(minutes=5))
        message = str(held.value)
        assert f"Stream {stream.name!r} is {work} by another run" in message, message


@pytest.mark.fast
def test_lease_rows_keep_their_names_and_a_lost_lease_names_its_stream_and_work(sqlite_store):
    # The names stores have always held, so a store written by an older release still works.
    for kind, name in (
        ("capture", "orders"),
        ("replay", "replay:orders"),
        ("transform", "transform:orders"),
    ):
        assert lease_name("orders", kind) == name
        assert parse_lease_name(name) == ("orders", kind)
    assert parse_lease_name("incremental:orders") is None

    zombie = sqlite_store.acquire_lease("orders", "transform", timedelta(seconds=-1))
    usurper = sqlite_store.acquire_lease("orders", "transform", timedelta(minutes=5))
    assert (usurper.stream, usurper.kind, usurper.epoch) == ("orders", "transform", 2)
    with pytest.raises(LeaseLost) as lost:
        sqlite_store.renew_lease(zombie, timedelta(minutes=5))
    message = str(lost.value)
    assert "This run's transform lease on stream 'orders' (epoch 1)" in message, message
    assert "transform:orders" not in message
    assert [row["stream"] for row in sqlite_store.lease_rows()] == ["transform:orders"]


@pytest.mark.fast
def test_gc_with_a_state_store_that_never_registered_a_stream_deletes_none_of_its_files(
    tmp_path: Path, sqlite_store
):
    """A host whose TIDEMARK_STATE_URL is not the shared lake's (its own default SQLite, say)
    sees every file of the lake as uncommitted: gc skips a stream its store never registered
    rather than delete another store's committed files."""
    import pyarrow as pa

    from jobs.lake import write_parquet_atomic
    from jobs.ops import collect_garbage
    from jobs.ops.gc import UNKNOWN_STREAM

    lake = tmp_path / "lake"
    committed_elsewhere = lake / "raw" / "orders" / "date=2026-11-24" / "hour=10" / "b-0.parquet"
    write_parquet_atomic(pa.table({"x": [1]}), committed_elsewhere)

    (swept,) = collect_garbage(lake, sqlite_store, min_age_seconds=0)
    assert swept.stream == "orders" and swept.result is None and swept.note == UNKNOWN_STREAM
    assert committed_elsewhere.exists()
