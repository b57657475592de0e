"""Adversarial tests of the `current` Delta tables: each fails on a real bug, passes otherwise."""

from __future__ import annotations

import json

import pytest
from bson import Int64

from jobs.capture import drain, drain_until_caught_up
from jobs.transform import compact, exact_documents, read_current, transform
from jobs.transform.delta_io import RunWriter
from resources.mongo import cluster_time
from tests.helpers.delta_reading import current_documents, current_tables
from tests.helpers.lake_reading import marked_commits, unrecorded_commits
from tests.helpers.oracle import (
    capture_events,
    commit_raw_batch,
    current_state,
    removed_rows,
    source_state,
    typed_columns_differ,
)
from tests.helpers.typed_rows import decoded
from tidemark.config import StreamConfig


def _rows_match(spark, store, lake, stream) -> None:
    """Invariant 4: each kept version's stored row count is what a reader counts, for the
    stream and for each of its tables."""
    tstate = store.transforms
    for v in tstate.current_runs(stream.name):
        got = read_current(spark, store, lake, stream.name, v.run).count()
        assert got == v.rows, f"version {v.run} ({v.kind}): rows={v.rows}, read {got}"
        for t in tstate.tables(stream.name, v.run):
            if t.kind == "current":
                frame = read_current(spark, store, lake, stream.name, v.run, db=t.db, coll=t.coll)
                assert frame.count() == t.rows, f"version {v.run}: {t.db}.{t.coll}"


def test_a_field_name_with_a_dot_reads_back(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_one({"_id": 1, "a.b": 5, "plain": 1})  # dotted field names: MongoDB 5.0+
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    rows = read_current(spark, sqlite_store, lake, stream.name).collect()
    assert [r["a.b"] for r in rows] == [5]


def test_an_empty_sub_document_reads_the_same_from_the_first_and_a_later_run(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_one({"_id": 1, "meta": {}})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.insert_many([{"_id": 2, "meta": {}}, {"_id": 3, "meta": {"a": 1}}])
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    rows = {
        r._tm_key: (r.meta, r._tm_residual)
        for r in read_current(spark, sqlite_store, lake, stream.name).collect()
    }
    assert len(rows) == 3, rows
    one, two, three = (v for _, v in sorted(rows.items()))  # keys of _id 1, 2, 3 sort so
    # _id 1 (first run, before `meta` had a column) and _id 2 (the MERGE that gave it one)
    # hold the same document: their columns and residuals agree ({} is never a struct of nulls).
    assert one == two, rows
    assert one[0] is None and json.loads(one[1]) == {"meta": {}}, rows
    assert three[0]["a"] == 1 and three[1] is None, rows


def _fold_late(spark, raw_client, store, lake, stream, db_name, since, count, skip=0):
    """Replay `count` events after `since` (before the stream's start), the first `skip` of
    them left out, as a late batch, and fold it."""
    late = capture_events(raw_client, db_name, None, since, skip + count)[skip:]
    commit_raw_batch(store, lake, stream.name, late, "replay")
    return transform(spark, store, lake, stream)


def _collections_match(spark, raw_client, store, lake, stream, db_name, colls) -> None:
    """Every collection `current` holds is one of `colls`, and each of those holds exactly
    what MongoDB does (none: no rows)."""
    rows = exact_documents(spark, store, lake, stream.name).collect()
    got: dict[str, dict] = {}
    for r in rows:
        got.setdefault(r._tm_coll, {})[r._tm_key] = r._tm_document
    want = {c: source_state(raw_client, db_name, c) for c in colls}
    assert got == {c: docs for c, docs in want.items() if docs}


def test_a_replayed_rename_into_a_collection_written_since_keeps_one_row_per_key(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    db = client[db_name]
    before_start = cluster_time(client)
    db.a.insert_one({"_id": 1, "v": "old"})
    db.a.rename("b")  # before the stream's start: unknown to `current`
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db.b.update_one({"_id": 1}, {"$set": {"v": "new"}})
    db.b.insert_one({"_id": 2})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    # Late: the insert into a and the rename.
    result = _fold_late(spark, raw_client, sqlite_store, lake, stream, db_name, before_start, 2)
    assert (result.run, result.kind) == (2, "merge")
    rows = exact_documents(spark, sqlite_store, lake, stream.name)
    got = current_state(rows)  # fails on a key held twice
    assert got == source_state(raw_client, db_name, "b")
    assert {r._tm_coll for r in rows.collect()} == {"b"}  # nothing left in a
    _rows_match(spark, sqlite_store, lake, stream)


def test_a_replayed_rename_into_a_collection_renamed_away_since_follows_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    db = client[db_name]
    before_start = cluster_time(client)
    db.a.insert_one({"_id": 1})
    db.a.rename("b")  # before the stream's start: the late window
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db.b.insert_one({"_id": 2})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    db.b.rename("e")
    db.e.insert_one({"_id": 3})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    # Late: the insert into a and the rename.
    _fold_late(spark, raw_client, sqlite_store, lake, stream, db_name, before_start, 2)
    rows = exact_documents(spark, sqlite_store, lake, stream.name)
    assert {r._tm_coll for r in rows.collect()} == {"e"}  # b and a no longer exist
    assert current_state(rows) == source_state(raw_client, db_name, "e")


def test_a_replayed_insert_into_a_collection_renamed_away_since_follows_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    db = client[db_name]
    before_start = cluster_time(client)
    db.b.insert_one({"_id": 1})  # before the stream's start: the late window
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db.b.insert_one({"_id": 2})
    db.b.rename("e")
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    # Late: the insert into b.
    _fold_late(spark, raw_client, sqlite_store, lake, stream, db_name, before_start, 1)
    rows = exact_documents(spark, sqlite_store, lake, stream.name)
    assert {r._tm_coll for r in rows.collect()} == {"e"}
    assert current_state(rows) == source_state(raw_client, db_name, "e")


def test_a_rebuild_writes_only_what_it_rebuilds_and_follows_a_window_that_starts_renaming(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Two of an adversary's findings about rebuilds (a late event behind a rename):
    - a rebuild replays its collections' whole history, older renames out of them included,
      and their targets keep what they hold now (x1 after a delete, x2 after its drop, x3
      renamed on to y3), never the rows moved there again;
    - a late window whose oldest event is a rename (c -> a4), after a4 -> e4 was folded,
      takes c's documents on to e4."""
    db = client[db_name]
    before_start = cluster_time(client)
    for n in (1, 2, 3):  # the first late window: 11 events
        db[f"b{n}"].insert_many([{"_id": 1}, {"_id": 2}])
        db[f"b{n}"].rename(f"x{n}")
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    db.c.rename("a4")  # the second window, 4 events, starts here
    for n in (1, 2, 3):
        db[f"a{n}"].insert_one({"_id": 100})
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db.x1.delete_one({"_id": 1})
    db.x2.drop()
    db.x3.rename("y3")
    for n in (1, 2, 3):
        db[f"a{n}"].rename(f"b{n}")
    db.a4.rename("e4")
    db.e4.insert_one({"_id": 3})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    _fold_late(spark, raw_client, sqlite_store, lake, stream, db_name, before_start, 11)
    _fold_late(spark, raw_client, sqlite_store, lake, stream, db_name, before_start, 4, skip=11)
    names = [f"{p}{n}" for p in "abx" for n in (1, 2, 3)] + ["y3", "c", "a4", "e4"]
    _collections_match(spark, raw_client, sqlite_store, lake, stream, db_name, names)


def _snapshot_rows(frame) -> dict[str, dict]:
    """A version as readers see it: per key, every column (typed ones included)."""
    rows = frame.collect()
    out = {r._tm_key: r.asDict(recursive=True) for r in rows}
    assert len(out) == len(rows), "a key appears twice in current"
    return out


def _typed_columns_are_the_document(frame, schema_json: str) -> None:
    """Invariant 7: each typed column is the row's document read in the schema the state
    store recorded for the table, and that schema is the table's own."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(schema_json)) if schema_json else StructType([])
    own = [f for f in frame.schema.fields if not f.name.startswith("_tm_")]
    assert [(f.name, f.dataType.simpleString()) for f in own] == [
        (f.name, f.dataType.simpleString()) for f in schema.fields
    ]
    diff = typed_columns_differ(frame, schema)
    assert not diff, f"typed columns differ from the document: {diff[:3]}"


def test_time_travel_counts_and_columns_through_type_changes_optimize_vacuum_and_drop(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Every version reads back as it was; then a run with `keep_versions` lowered to 2 prunes
    the rest, and after gc the two it kept read back. One run serves both: lowering
    `keep_versions` changes only the state store's list, since VACUUM keeps every file younger
    than an hour either way."""
    from jobs.ops import collect_garbage

    coll = client[db_name]["orders"]
    before_start = cluster_time(client)
    coll.insert_many([{"_id": 100 + i, "x": i} for i in range(3)])  # before the stream
    coll.delete_one({"_id": 100})
    stream = make_stream(keep_versions=50)
    drain(stream, raw_client, sqlite_store, lake)
    recorded: dict[int, dict] = {}
    unseen = {'{ "_id" : { "$numberInt" : "101" } }', '{ "_id" : { "$numberInt" : "102" } }'}

    def step(*, compaction: bool = False, stream: StreamConfig = stream) -> None:
        drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        if compaction:
            result = compact(spark, sqlite_store, lake, stream)
        else:
            result = transform(spark, sqlite_store, lake, stream)
            assert result.kind == "merge"
        assert result.run is not None
        frame = exact_documents(spark, sqlite_store, lake, stream.name)
        recorded[result.run] = _snapshot_rows(frame)
        source = source_state(raw_client, db_name, "orders")
        assert current_state(frame) == {k: v for k, v in source.items() if k not in unseen}

    coll.insert_many([{"_id": i, "x": i, "s": {"a": i}} for i in range(6)])
    step()
    coll.update_one({"_id": 1}, {"$set": {"x": "one"}})  # int -> string
    coll.delete_one({"_id": 2})
    coll.insert_one({"_id": 2, "x": 22})  # deleted and re-inserted in one run
    coll.delete_one({"_id": 3})
    step()
    coll.update_one({"_id": 4}, {"$set": {"x": {"deep": [1, 2]}, "s": {"a": "str"}}})
    coll.insert_one({"_id": 3, "x": 33})  # re-inserted after a delta's tombstone
    step()
    step(compaction=True)
    coll.update_one({"_id": 5}, {"$set": {"x": [1, {"k": 2}], "s": [1]}})  # -> array
    coll.delete_one({"_id": 4})
    step()
    late = capture_events(raw_client, db_name, "orders", before_start, 4)  # older events
    commit_raw_batch(sqlite_store, lake, stream.name, late, "replay")
    unseen.clear()  # the replay brought them
    step()
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    coll.drop()
    coll.insert_many([{"_id": 1, "x": 1.5}, {"_id": 7, "x": None}])
    step()
    coll.update_one({"_id": 1}, {"$set": {"x": {"again": True}}})
    step()
    step(compaction=True)
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)

    tstate = sqlite_store.transforms

    def every_kept_version_reads_back(kept: int) -> None:
        assert len(tstate.current_runs(stream.name)) == kept
        for v in tstate.current_runs(stream.name):
            frame = exact_documents(spark, sqlite_store, lake, stream.name, v.run)
            assert _snapshot_rows(frame) == recorded[v.run], f"version {v.run}"
            assert frame.count() == v.rows, f"version {v.run}: rows {v.rows}"
            (table,) = [t for t in tstate.tables(stream.name, v.run) if t.kind == "current"]
            _typed_columns_are_the_document(frame, table.doc_schema)

    every_kept_version_reads_back(len(recorded))
    coll.update_one({"_id": 7}, {"$set": {"x": 7}})
    step(stream=stream.model_copy(update={"keep_versions": 2}))  # a run prunes the rest
    collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
    every_kept_version_reads_back(2)


# Names the fold gives its own columns while it works (`fold.newest_per_key`, `not_cleared`,
# the tombstone join, the census) and the MERGE's table aliases.
HELPER_NAMES = ["_rank", "_tm_rank", "_b_db", "_b_event_id", "_t_event_id", "new", "s", "t"]


def test_document_fields_named_like_the_folds_helper_columns_survive_merges_and_optimize(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_one({"_id": 1, **{name: 7 for name in HELPER_NAMES}})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.insert_one({"_id": 2, **{name: 9 for name in HELPER_NAMES}})
    coll.update_one({"_id": 1}, {"$set": {"t": 8, "s": 8}})  # a MERGE that updates
    coll.delete_one({"_id": 1})  # and one that deletes, newer
    coll.insert_one({"_id": 3, "t": 1})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"

    def columns() -> dict:
        frame = exact_documents(spark, sqlite_store, lake, stream.name)
        rows = sorted(frame.collect(), key=lambda r: r._tm_key)
        assert current_state(frame) == source_state(raw_client, db_name, "orders")
        named = [n for n in HELPER_NAMES if not n.startswith("_tm_")]  # `_tm_*` stay inside
        assert set(named) <= set(frame.columns) and "_tm_rank" not in frame.columns
        return {name: [r[name] for r in rows] for name in named}

    expected = {name: [9, None] for name in HELPER_NAMES if not name.startswith("_tm_")}
    expected["t"] = [9, 1]
    assert columns() == expected
    assert compact(spark, sqlite_store, lake, stream).run == 3
    assert columns() == expected


def test_a_run_of_late_events_that_all_lose_reads_back_and_counts(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    before_start = cluster_time(client)
    coll.insert_many([{"_id": 1, "v": "old"}, {"_id": 2, "v": "old"}])  # before the stream
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.update_many({}, {"$set": {"v": "new"}})
    coll.delete_one({"_id": 2})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    late = capture_events(raw_client, db_name, "orders", before_start, 2)  # the two inserts
    commit_raw_batch(sqlite_store, lake, stream.name, late, "replay")
    result = transform(spark, sqlite_store, lake, stream)
    assert (result.run, result.kind, result.changes_added) == (2, "merge", 2)
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == source_state(
        raw_client, db_name, "orders"
    )
    _rows_match(spark, sqlite_store, lake, stream)
    compact(spark, sqlite_store, lake, stream)
    _rows_match(spark, sqlite_store, lake, stream)


class _Die(Exception):
    pass


def _die() -> None:
    raise _Die


def test_runs_and_compactions_dying_before_commit_with_gc_between_log_each_event_once(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    from jobs.ops import collect_garbage
    from jobs.transform import read_changes

    coll = client[db_name]["orders"]
    stream = make_stream(keep_versions=1)
    drain(stream, raw_client, sqlite_store, lake)
    drained = 0
    for round_ in range(3):
        coll.insert_many([{"_id": f"{round_}-{i}", "n": i} for i in range(4)])
        coll.delete_one({"_id": f"{round_}-0"})
        if round_:
            coll.update_one({"_id": f"{round_ - 1}-1"}, {"$set": {"n": "s"}})
        drained += drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        with pytest.raises(_Die):
            transform(spark, sqlite_store, lake, stream, before_commit=_die)
        collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
        transform(spark, sqlite_store, lake, stream)
        if round_:  # a MERGE to compact
            with pytest.raises(_Die):
                compact(spark, sqlite_store, lake, stream, before_commit=_die)
            collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
            assert compact(spark, sqlite_store, lake, stream).run is not None
        collect_garbage(lake, sqlite_store, min_age_seconds=0, spark=lambda: spark)
        changes = read_changes(spark, sqlite_store, lake, stream.name)
        assert changes.count() == drained
        assert changes.select("event_id").distinct().count() == drained
        assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == (
            source_state(raw_client, db_name, "orders")
        )
        _rows_match(spark, sqlite_store, lake, stream)
    tstate = sqlite_store.transforms
    for table in tstate.tables(stream.name):  # the store agrees with every table's log
        assert not unrecorded_commits(lake / table.path, table.delta_version), table.path
        marks = marked_commits(lake / table.path)
        assert len(marks) == len(set(marks)), f"{table.path}: a commit made twice"


def test_a_run_dying_after_a_rewrite_turned_the_change_feed_off_rewrites_on_its_repeat(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """A table in the layout before the residual is rewritten once, with its change feed off
    for that one commit. The switch is a commit of its own: a repeat must not take it for the
    rewrite."""
    coll = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": i, "n": i} for i in range(3)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    (path,) = current_tables(sqlite_store, lake, stream.name).values()
    before = spark.read.format("delta").load(str(path)).drop("_tm_residual")
    before.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(path))
    coll.update_one({"_id": 1}, {"$set": {"n": "one"}})  # to the residual
    drain(stream, raw_client, sqlite_store, lake)
    switch = RunWriter.set_change_feed

    def dies_once_switched_off(writer, path, enabled):
        switch(writer, path, enabled)
        if not enabled:
            raise _Die

    monkeypatch.setattr(RunWriter, "set_change_feed", dies_once_switched_off)
    with pytest.raises(_Die):
        transform(spark, sqlite_store, lake, stream)
    monkeypatch.undo()
    assert transform(spark, sqlite_store, lake, stream).repeated
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    rows = spark.read.format("delta").load(str(path)).select("_id", "n").collect()
    assert sorted((r._id, r.n) for r in rows) == [(0, 0), (1, None), (2, 2)]


def test_a_resnapshot_after_merges_then_late_events_matches_the_source(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    before_start = cluster_time(client)
    coll.insert_many([{"_id": 100, "v": 1}, {"_id": 101, "v": 1}])
    coll.delete_one({"_id": 100})  # before the stream: only the resnapshot knows 101
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": i, "v": i} for i in range(4)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.delete_one({"_id": 1})
    coll.update_one({"_id": 2}, {"$set": {"v": "two"}})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.insert_one({"_id": 5})
    coll.delete_one({"_id": 3})
    drain(stream, raw_client, sqlite_store, lake, resnapshot=True)
    coll.update_one({"_id": 5}, {"$set": {"v": 5}})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    late = capture_events(raw_client, db_name, "orders", before_start, 3)  # 100, 101, delete 100
    commit_raw_batch(sqlite_store, lake, stream.name, late, "replay")
    transform(spark, sqlite_store, lake, stream)
    compact(spark, sqlite_store, lake, stream)
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == source_state(
        raw_client, db_name, "orders"
    )
    _rows_match(spark, sqlite_store, lake, stream)


def test_setting_a_numeric_field_to_null_in_a_later_run_keeps_its_type(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    coll = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": 1, "n": 5}, {"_id": 2, "n": 6}])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.update_one({"_id": 2}, {"$set": {"n": None}})  # no type change: a null
    drain(stream, raw_client, sqlite_store, lake)
    result = transform(spark, sqlite_store, lake, stream)
    assert result.schema["widened"] == []
    # One run with both documents (a backfill) types `n` as bigint: so must the runs.
    assert dict(read_current(spark, sqlite_store, lake, stream.name).dtypes)["n"] == "bigint"


def test_a_first_load_with_each_key_once_counts_its_tombstones_apart(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A first run whose keys are each once: its live rows are counted without the deletes,
    which are tombstones of `removed`, not rows of `current`."""
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": n, "v": n} for n in range(5)])  # before the stream
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll.insert_many([{"_id": n, "v": n} for n in range(10, 14)])
    coll.delete_many({"_id": {"$in": [0, 1]}})  # keys seen once each: two tombstones
    coll.update_one({"_id": 2}, {"$set": {"v": "new"}})
    drain(stream, raw_client, sqlite_store, lake)
    result = transform(spark, sqlite_store, lake, stream)
    assert (result.kind, result.rows) == ("merge", 5)  # 10-13 and 2; 0 and 1 are tombstones
    tombstones = {r._tm_key for r in removed_rows(spark, lake, stream.name)}
    assert tombstones == {f'{{ "_id" : {{ "$numberInt" : "{n}" }} }}' for n in (0, 1)}
    # 3 and 4 predate the stream and never changed: the stream cannot know them.
    source = source_state(raw_client, db_name, "orders")
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == {
        key: doc for key, doc in source.items() if '"3"' not in key and '"4"' not in key
    }
    _rows_match(spark, sqlite_store, lake, stream)


def test_nested_field_names_that_differ_only_in_case_do_not_stop_the_stream(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """`{"s": {"A": 1, "a": 2}}` is a legal document. Case twins kept the first as a column at
    the top level only: nested, both became fields and Delta refused every run
    (`DELTA_DUPLICATE_COLUMNS_FOUND ... s.a`), so the stream's transform was stuck for good.
    Found by session 13's adversary. Nested, as at the top, the first name is the field and
    the twin goes to the residual, also when it comes in a later run; an array holding a
    twin goes to the residual whole."""
    orders = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_one({"_id": 1, "s": {"A": 1, "a": 2}, "t": [{"B": 1, "b": 2}]})
    orders.insert_one({"_id": 2, "u": {"x": 1}})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    orders.insert_one({"_id": 3, "u": {"X": 3}})  # the twin, a run later
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert current_documents(path) == source_state(raw_client, db_name, "orders")
    rows = {r["_id"]: r for r in read_current(spark, sqlite_store, lake, stream.name).collect()}
    assert rows[1]["s"].asDict() == {"A": 1}
    assert rows[1]["t"] is None and decoded(rows[1]["_tm_residual"]) == {
        "s": {"a": 2},
        "t": [{"B": 1, "b": 2}],
    }
    assert rows[2]["u"].asDict() == {"x": 1} and rows[3]["u"].asDict() == {"x": None}
    assert decoded(rows[3]["_tm_residual"]) == {"u": {"X": 3}}
    assert typed_columns_differ(exact_documents(spark, sqlite_store, lake, stream.name)) == []


def test_a_replacement_that_changes_the_ids_type_but_not_its_value_keeps_one_row(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    orders = client[db_name]["orders"]
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    orders.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
    orders.replace_one({"_id": 1}, {"_id": Int64(1), "v": 1})
    orders.replace_one({"_id": 2}, {"_id": Int64(2), "v": 1})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    orders.update_one({"_id": 1}, {"$set": {"v": 2}})
    orders.delete_one({"_id": 2})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    ((_, path),) = current_tables(sqlite_store, lake, stream.name).items()
    assert sorted(current_documents(path).values()) == sorted(
        source_state(raw_client, db_name, "orders").values()
    )
