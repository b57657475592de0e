"""The transform under real load: late events, sharded keys, stolen leases, readers, backfill."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import bson
import pytest
from sqlalchemy import update

import jobs.transform.apply as transform_module
from jobs.capture import drain, drain_until_caught_up
from jobs.ops import collect_garbage
from jobs.transform import compact, exact_documents, read_current, transform
from resources.mongo import cluster_time
from state import schema
from state.leases import TRANSFORM_LEASE_TTL, lease_name
from tests.helpers.lake_reading import delta_log, marked_commits, unrecorded_commits
from tests.helpers.oracle import capture_events, commit_raw_batch, current_state, source_state
from tidemark.errors import CurrentTableBehind, LeaseLost, TidemarkError

# -- 4: deleted documents never come back -----------------------------------------------------


class _Killed(Exception):
    """The crash a test injects: raised by the test alone, so a Spark or Delta error fails it."""


def test_an_insert_replayed_after_its_delete_does_not_resurrect_the_document(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    before_start = cluster_time(client)
    coll.insert_many([{"_id": 1, "v": "old"}, {"_id": 2, "v": "kept"}])  # before the stream
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)  # starts now: the inserts are not seen
    coll.delete_one({"_id": 1})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    # A replay window from before the stream's start brings the older inserts, late.
    inserts = capture_events(raw_client, db_name, "orders", before_start, 2)
    commit_raw_batch(sqlite_store, lake, stream.name, inserts, "replay")
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")
    assert len(got) == 1  # _id 2 only: the delete is newer than the replayed insert of _id 1


def test_late_events_after_deletes_in_later_runs_and_after_a_compaction_never_resurrect(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    before_start = cluster_time(client)
    coll.insert_many([{"_id": 1, "v": "a"}, {"_id": 2, "v": "b"}, {"_id": 3, "v": "c"}])
    coll.replace_one({"_id": 1}, {"v": "replaced"})
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)  # starts now: those writes are not seen
    coll.insert_one({"_id": 10})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.delete_many({"_id": {"$in": [1, 2]}})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"  # two tombstones

    def check() -> None:
        got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
        assert got == source_state(raw_client, db_name, "orders")

    late = capture_events(raw_client, db_name, "orders", before_start, 4)
    commit_raw_batch(sqlite_store, lake, stream.name, late[:3], "replay")  # inserts 1, 2, 3
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    check()  # 3 arrives; 1 and 2 lose to their tombstones of the run before
    assert compact(spark, sqlite_store, lake, stream).run == 4
    commit_raw_batch(sqlite_store, lake, stream.name, late[3:], "replay")  # the replace of 1
    transform(spark, sqlite_store, lake, stream)
    check()  # the compaction (OPTIMIZE, purge) kept the tombstone of 1


def test_an_insert_replayed_after_its_collection_was_dropped_stays_dropped(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    db = client[db_name]
    before_start = cluster_time(client)
    db.gone.insert_one({"_id": 7, "never": "seen"})  # before the stream; unknown to `current`
    db.kept.insert_one({"_id": 8})
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db.gone.drop()
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    late = capture_events(raw_client, db_name, None, before_start, 2)
    commit_raw_batch(sqlite_store, lake, stream.name, late, "replay")
    transform(spark, sqlite_store, lake, stream)
    rows = read_current(spark, sqlite_store, lake, stream.name).collect()
    assert {(r._tm_coll, r._tm_key) for r in rows} == {
        ("kept", k) for k in source_state(raw_client, db_name, "kept")
    }
    assert "_tm_deleted" not in read_current(spark, sqlite_store, lake, stream.name).columns


# -- 5: one key per document, whatever the documentKey holds -----------------------------------


def _with_shard_key(raw: bytes, **shard_key: object) -> bytes:
    """A real change event whose documentKey also holds shard-key fields, as on a sharded
    collection (`{<shard key fields>, _id}`); everything else is the server's."""
    event = bson.decode(raw)
    event["documentKey"] = {**shard_key, "_id": event["documentKey"]["_id"]}
    return bson.encode(event)


def test_snapshot_rows_and_sharded_events_share_one_key_per_document(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    ids = [1, "s", {"a": 1, "b": "x"}, bson.Int64(5)]
    coll.insert_many([{"_id": i, "region": "eu", "n": 0} for i in ids])
    stream = make_stream(start="snapshot")
    assert drain(stream, raw_client, sqlite_store, lake).snapshot.status == "done"

    last = cluster_time(client)  # the snapshot's inserts' time: start just after it
    start = bson.Timestamp(last.time, last.inc + 1)
    coll.update_one({"_id": 1}, {"$set": {"n": 1}})
    coll.update_one({"_id": 1}, {"$set": {"n": 2}})  # after the shard key is refined
    coll.replace_one({"_id": "s"}, {"_id": "s", "region": "eu", "n": 3})
    coll.delete_one({"_id": {"a": 1, "b": "x"}})
    coll.update_one({"_id": bson.Int64(5)}, {"$set": {"n": 4}})
    coll.insert_one({"_id": 9, "region": "us"})
    raws = capture_events(raw_client, db_name, "orders", start, 6)
    refined = {"region": "eu", "zone": 1}
    sharded = [
        _with_shard_key(raw, **(refined if n == 1 else {"region": "eu"}))
        for n, raw in enumerate(raws)
    ]
    assert all(len(bson.decode(r)["documentKey"]) >= 2 for r in sharded)
    commit_raw_batch(sqlite_store, lake, stream.name, sharded, "incremental")
    transform(spark, sqlite_store, lake, stream)

    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")
    assert len(got) == 4


# -- 6: a stolen lease: one committed version, its directory intact ----------------------------


def _expire(store, name: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(schema.leases)
            .where(schema.leases.c.stream == name)
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )


def test_a_transform_whose_lease_is_taken_over_never_touches_the_committed_version(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "v": 0} for i in range(10)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.update_many({"_id": {"$lt": 5}}, {"$set": {"v": 1}})
    drain(stream, raw_client, sqlite_store, lake)

    real_typing = transform_module.with_typed_columns
    taken_over = []
    after: dict[str, str] = {}

    def slow_phase(*args):
        # The first run is still folding when its lease expires and another run takes over:
        # it repeats the run its intent names (the same number, the same batch), commits it,
        # then folds the batch drained meanwhile as the next run, in the same call.
        if not taken_over:
            taken_over.append(True)
            _expire(sqlite_store, lease_name(stream.name, "transform"))
            coll.delete_many({"_id": {"$gte": 8}})
            coll.insert_one({"_id": 20, "v": 2})
            drain(stream, raw_client, sqlite_store, lake)
            result = transform(spark, sqlite_store, lake, stream)
            assert (result.run, result.repeated, result.batches) == (3, True, 2)
            after.update(source_state(raw_client, db_name, "orders"))
        return real_typing(*args)

    monkeypatch.setattr(transform_module, "with_typed_columns", slow_phase)
    with pytest.raises(LeaseLost):
        transform(spark, sqlite_store, lake, stream)
    monkeypatch.undo()

    tstate = sqlite_store.transforms
    assert [v.run for v in tstate.current_runs(stream.name)] == [1, 2, 3]
    assert tstate.intent(stream.name) is None
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == after == source_state(raw_client, db_name, "orders")  # the loser wrote none
    for table in tstate.tables(stream.name):
        assert not unrecorded_commits(lake / table.path, table.delta_version), table.path
        marks = marked_commits(lake / table.path)
        assert len(marks) == len(set(marks)), f"{table.path}: a commit made twice"
    assert transform(spark, sqlite_store, lake, stream).batches == 0  # nothing left waiting


def test_the_transform_renews_its_lease_between_phases(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(5)])
    drain(stream, raw_client, sqlite_store, lake)
    seen = []

    def look():
        with sqlite_store.engine.begin() as conn:
            row = conn.execute(
                schema.leases.select().where(
                    schema.leases.c.stream == lease_name(stream.name, "transform")
                )
            ).one()
        seen.append(row)

    transform(spark, sqlite_store, lake, stream, before_commit=look)
    # Renewed after the fold: the expiry is later than the acquisition's own.
    assert seen[0].expires_at > seen[0].acquired_at + TRANSFORM_LEASE_TTL


# -- 10: a rename out of the watched scope removes the documents --------------------------------


def test_a_collection_streams_collection_renamed_away_leaves_current(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()  # on_invalidate: continue
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i} for i in range(5)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.rename("archived")  # the stream no longer watches these documents
    assert drain(stream, raw_client, sqlite_store, lake).stop_reason == "invalidate"
    coll.insert_one({"_id": 100, "recreated": True})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    rows = read_current(spark, sqlite_store, lake, stream.name).collect()
    assert {(r._tm_coll, r._tm_key) for r in rows} == {
        ("orders", k) for k in source_state(raw_client, db_name, "orders")
    }


def test_a_collection_replaced_by_a_rename_into_it_is_copied_afresh(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A rename onto the watched collection (dropTarget, or an $out) brings documents that were
    never events of a collection stream (the stream sees the rename and its invalidate only),
    from the same database or another one: the drain copies the collection again."""
    other = f"{db_name}_other"
    stream = make_stream()  # on_invalidate: continue
    drain(stream, raw_client, sqlite_store, lake)
    db = client[db_name]
    db.orders.insert_many([{"_id": i, "v": "orders"} for i in range(3)])
    db.staged.insert_many([{"_id": i, "v": "staged"} for i in range(2, 6)])
    client[other].imported.insert_many([{"_id": i, "v": "imported"} for i in range(5, 9)])
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    try:
        db.staged.rename("orders", dropTarget=True)
        db.orders.insert_one({"_id": 100})
        drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
        assert got == source_state(raw_client, db_name, "orders")

        admin = client.admin
        admin.command(
            "renameCollection", f"{other}.imported", to=f"{db_name}.orders", dropTarget=True
        )
        drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
        assert got == source_state(raw_client, db_name, "orders") and len(got) == 4

        # $out onto the collection is the same rename, from a temporary collection.
        db.staged.insert_many([{"_id": i, "v": "rebuilt"} for i in range(20, 23)])
        db.staged.aggregate([{"$match": {}}, {"$out": "orders"}])
        drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
        assert got == source_state(raw_client, db_name, "orders") and len(got) == 3
    finally:
        client.drop_database(other)


def test_a_database_stream_moves_renames_inside_it_and_drops_renames_out_of_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    other = f"{db_name}_other"
    stream = make_stream(collection=None)
    drain(stream, raw_client, sqlite_store, lake)
    db = client[db_name]
    db.a.insert_many([{"_id": i} for i in range(3)])
    db.b.insert_many([{"_id": i} for i in range(4)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    try:
        db.a.rename("inside")
        # Out of the database: the server (6.0) tells the source database's stream a drop.
        client.admin.command("renameCollection", f"{db_name}.b", to=f"{other}.outside")
        drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        rows = read_current(spark, sqlite_store, lake, stream.name).collect()
        assert {(r._tm_db, r._tm_coll, r._tm_key) for r in rows} == {
            (db_name, "inside", k) for k in source_state(raw_client, db_name, "inside")
        }
    finally:
        client.drop_database(other)


# -- 11: gc (VACUUM) keeps the files a kept version or a recent reader needs -------------------


def test_a_reader_of_a_pruned_version_finishes_after_gc_and_kept_versions_read_back(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(keep_versions=2)
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i} for i in range(6)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    expected_first = source_state(raw_client, db_name, "orders")
    reader = exact_documents(spark, sqlite_store, lake, stream.name)  # resolved: version 1
    states = {}

    for run, change in ((2, lambda: coll.delete_many({"_id": {"$lt": 3}})),
                            (3, lambda: coll.insert_one({"_id": 50}))):  # fmt: skip
        change()
        drain(stream, raw_client, sqlite_store, lake)
        result = transform(spark, sqlite_store, lake, stream)
        assert (result.run, result.kind) == (run, "merge")
        states[run] = source_state(raw_client, db_name, "orders")
    with pytest.raises(TidemarkError, match=r"Run 1 of .* is not kept\. Kept runs: 2, 3 "):
        read_current(spark, sqlite_store, lake, stream.name, 1)  # no new reader finds it
    compacted = compact(spark, sqlite_store, lake, stream)  # rewrites every file: OPTIMIZE
    # The first run is the base the merges are counted from: runs 2 and 3 are its debt.
    assert (compacted.run, compacted.deltas) == (4, 2)
    states[4] = states[3]

    # The default --min-age: a reader that resolved a run just before has that long.
    collect_garbage(lake, sqlite_store, min_age_seconds=60, spark=lambda: spark)
    assert current_state(reader) == expected_first  # the old reader still finishes
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    tstate = sqlite_store.transforms
    assert [v.run for v in tstate.current_runs(stream.name)] == [3, 4]
    for run in (3, 4):  # every kept run still reads back
        frame = exact_documents(spark, sqlite_store, lake, stream.name, run)
        assert current_state(frame) == states[run], f"run {run}"


def test_a_compaction_that_dies_before_its_commit_leaves_the_version_current(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "v": 0} for i in range(8)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.update_many({"_id": {"$lt": 4}}, {"$set": {"v": 1}})
    coll.delete_one({"_id": 7})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    expected = source_state(raw_client, db_name, "orders")
    tstate = sqlite_store.transforms
    before = tstate.tables(stream.name)
    states = {
        v.run: current_state(exact_documents(spark, sqlite_store, lake, stream.name, v.run))
        for v in tstate.current_runs(stream.name)
    }

    def die():
        raise _Killed("killed between OPTIMIZE and the commit")

    with pytest.raises(_Killed):
        compact(spark, sqlite_store, lake, stream, before_commit=die)
    assert [(v.run, v.kind) for v in tstate.current_runs(stream.name)] == [
        (1, "merge"),
        (2, "merge"),
    ]
    assert tstate.tables(stream.name) == before  # readers stay on the recorded versions
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == expected
    assert compact(spark, sqlite_store, lake, stream).run == 3  # simply run again
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == expected
    for table in tstate.tables(stream.name):
        assert not unrecorded_commits(lake / table.path, table.delta_version), table.path
    (swept,) = collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    assert swept.curated is not None  # VACUUM ran
    states[3] = expected
    for run, state in states.items():  # gc left every kept run's files
        frame = exact_documents(spark, sqlite_store, lake, stream.name, run)
        assert current_state(frame) == state, f"run {run}"


# -- 13c: turning current_table on needs a fresh copy ------------------------------------------


def test_turning_the_current_table_on_asks_for_a_resnapshot_which_rebuilds_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Runs with `current_table: false` only extend the change log: a later run with it on
    refuses (its `current` tables would miss those runs' events) and names the fix, and a
    resnapshot then gives a `current` equal to the source."""
    log_only = make_stream(current_table=False)
    drain(log_only, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "v": i} for i in range(8)])
    coll.update_many({"_id": {"$lt": 4}}, {"$set": {"v": -1}})
    coll.delete_one({"_id": 7})
    drain(log_only, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, log_only).run is None

    stream = make_stream(current_table=True)
    coll.insert_one({"_id": 30, "v": 30})
    drain(stream, raw_client, sqlite_store, lake)
    with pytest.raises(CurrentTableBehind, match="tidemark resnapshot"):
        transform(spark, sqlite_store, lake, stream)
    drain(stream, raw_client, sqlite_store, lake, resnapshot=True)
    coll.delete_one({"_id": 0})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders") and len(got) == 7


def test_a_drain_gets_in_while_gc_vacuums_and_a_transform_waits(
    spark, raw_client, client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """gc holds each lease only around the step that needs it: VACUUM keeps transforms out,
    never drains. The drain runs at the moment VACUUM's step asks for its Spark session, so
    inside it, whatever the timing."""
    from tidemark.errors import LeaseHeld

    stream = make_stream()
    coll = client[db_name]["orders"]
    drain(stream, raw_client, sqlite_store, lake)  # takes the starting position
    coll.insert_many([{"_id": i} for i in range(3)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)  # curated tables: gc will VACUUM them
    coll.insert_one({"_id": 3})
    during_vacuum = []

    def session_for_vacuum():
        during_vacuum.append(drain(stream, raw_client, sqlite_store, lake).events)
        with pytest.raises(LeaseHeld, match="being transformed"):
            transform(spark, sqlite_store, lake, stream)
        return spark

    (swept,) = collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=session_for_vacuum)
    assert swept.curated is not None and swept.result is not None  # both steps ran
    assert during_vacuum == [1]  # the drain committed the insert while VACUUM held its lease

    # A file no version reads, older than the retention (a killed write's), is deleted; a
    # table with nothing to delete gets no VACUUM commits in its log. (Delta keeps every
    # unreferenced file of a table younger than the retention, and ours is at least an hour.)
    monkeypatch.setattr("jobs.transform.vacuum.retention_hours", lambda *_: 0.0)
    tables = sorted(lake / t.path for t in sqlite_store.transforms.tables(stream.name))
    orphan = tables[-1] / "part-00000-orphan-of-a-killed-write.snappy.parquet"  # in `current`
    orphan.write_bytes(b"PAR1")
    old = time.time() - 3 * 24 * 3600
    os.utime(orphan, (old, old))
    (swept,) = collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    deleted = swept.curated or []
    assert orphan.name in {Path(p).name for p in deleted} and not orphan.exists()
    # VACUUM's two commits are in a table's log exactly when it had files to delete there.
    logged = {t: sum("VACUUM" in str(c["actions"]) for c in delta_log(t)) for t in tables}
    assert logged == {t: 2 if any(f"{t}/" in p for p in deleted) else 0 for t in tables}
    assert sorted(logged.values()) == [0, 2]  # `changes` had nothing to delete
