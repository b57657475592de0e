"""The Spark transform: after any workload, the current-state table equals the source."""

from __future__ import annotations

import random
import shutil
from datetime import timedelta

import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Regex

from jobs.capture import drain, drain_until_caught_up
from jobs.curated_zone import CHANGES_COLUMNS, current_dir, names, removed_dir
from jobs.transform import exact_documents, read_changes, read_current, stored_schema, transform
from jobs.transform.delta_io import MARK
from jobs.transform.fold import Watched
from jobs.transform.stored_schema import OBJECT_ID_PATHS
from jobs.transform.type_rule import BSON_KIND, OBJECT_ID
from state import BatchRecord, FileEntry, new_batch_id
from tests.helpers.delta_reading import delta_version
from tests.helpers.lake_reading import delta_log, marked_commits, unrecorded_commits
from tests.helpers.oracle import (
    burst,
    current_state,
    drop_and_recreate,
    make_doc,
    removed_rows,
    seed_collection,
    source_state,
    typed_columns_differ,
)
from tests.helpers.typed_rows import decoded
from tidemark.errors import StreamInvalidated, TidemarkError


class _Killed(Exception):
    """The crash a test injects: raised by the test alone, so a Spark or Delta error fails it."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "lake"),
    [
        (11, "local"),
        (41, "s3"),
        # Further seeds of the same oracle (~110 s each): `make soak` runs them.
        pytest.param(23, "local", marks=pytest.mark.repeat),
        pytest.param(37, "local", marks=pytest.mark.repeat),
    ],
    indirect=["lake"],
)
def test_oracle_current_equals_source_after_every_increment(
    seed, spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    rng = random.Random(seed)
    stream = make_stream(budget={"max_events": 7000})  # several runs per increment
    drain(stream, raw_client, sqlite_store, lake)
    seed_collection(client, db_name, "orders", rng)
    drained = 0
    for increment in range(4):
        burst(client, db_name, "orders", rng, 3500)
        if increment == 2:
            drop_and_recreate(client, db_name, "orders", rng)
            burst(client, db_name, "orders", rng, 300)
        drained += drain_until_caught_up(stream, raw_client, sqlite_store, lake)
        result = transform(spark, sqlite_store, lake, stream)
        assert result.run is not None
        # A small run compiles no code (jobs.transform.run_settings), and leaves none of that
        # setting behind for the session's other work.
        assert spark.conf.get("spark.sql.codegen.factoryMode") != "NO_CODEGEN"

        expected = source_state(raw_client, db_name, "orders")
        got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
        assert got.keys() == expected.keys(), f"increment {increment}: keys differ"
        different = [k for k in expected if got[k] != expected[k]]
        assert not different, f"increment {increment}: {len(different)} documents differ"

    assert drained > 10_000  # ~14,300 writes; those that change nothing make no event
    changes = read_changes(spark, sqlite_store, lake, stream.name)
    assert changes.count() == drained  # every event exactly once
    assert changes.select("event_id").distinct().count() == drained
    seen = {r.operation_type for r in changes.select("operation_type").distinct().collect()}
    # The drop of a collection stream's collection ends in an invalidate; the next run goes on
    # with startAfter on the re-created collection.
    assert seen >= {"insert", "update", "replace", "delete", "drop", "invalidate"}


def _redeliver(store, lake, stream: str, original: BatchRecord) -> None:
    """Commit a copy of a committed batch under a new batch id (as a replay would)."""
    redelivered = new_batch_id()
    copies = []
    for n, f in enumerate(original.files):
        target = f.path.rsplit("/", 1)[0] + f"/{redelivered}-{n:05d}.parquet"
        shutil.copy(lake / f.path, lake / target)
        copies.append(FileEntry(target, f.rows, f.bytes))
    lease = store.acquire_lease(stream, "capture", timedelta(minutes=1))
    replay = BatchRecord(
        id=redelivered,
        stream=stream,
        source="replay",
        event_count=original.event_count,
        bytes=original.bytes,
        files=copies,
    )
    store.commit_batch(lease, None, replay, None)
    store.release_lease(lease)


OID = ObjectId("6b09b2d07fd6d42aacd7d70a")


def test_rerun_and_redelivery_change_nothing(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    client[db_name]["orders"].insert_many([{"_id": i, "v": i} for i in range(50)])
    client[db_name]["orders"].update_many({}, {"$inc": {"v": 100}})
    drain(stream, raw_client, sqlite_store, lake)
    first = transform(spark, sqlite_store, lake, stream)
    assert first.run == 1 and first.changes_added == 100
    before = current_state(exact_documents(spark, sqlite_store, lake, stream.name))

    again = transform(spark, sqlite_store, lake, stream)
    assert (again.run, again.batches, again.changes_added) == (None, 0, 0)

    original = sqlite_store.batches(stream.name)[-1]
    _redeliver(sqlite_store, lake, stream.name, original)
    replayed = transform(spark, sqlite_store, lake, stream)
    assert replayed.batches == 1 and replayed.changes_added == 0
    assert replayed.duplicates_skipped == original.event_count and replayed.run is None
    assert read_changes(spark, sqlite_store, lake, stream.name).count() == 100
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == before


def test_current_types_odd_values_and_object_ids_at_any_depth_and_a_delete_leaves_it(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Values with no column (a regex, a UUID) go to the residual; ObjectIds inside
    sub-documents are marked, also when a later run adds them to an existing column (so a
    string there goes to the residual); a delete leaves `current` and is a tombstone of
    `removed`."""
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    rng = random.Random(5)
    tricky = {"_id": "t", "p": {"$price": 3}, "re": Regex("^a", "i"), "b": Binary(b"\x01" * 16, 4)}
    coll.insert_many([make_doc(rng, n) for n in range(40)] + [tricky])
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.update_many({"_id": {"$lt": 20}}, {"$set": {"d": Decimal128("1.50")}})
    coll.update_one({"_id": "t"}, {"$set": {"p.q": 1}})
    coll.insert_one({"_id": "o", "ref": {"id": OID, "ids": [OID]}})  # nested ObjectIds
    coll.delete_one({"_id": 3})
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"

    current = exact_documents(spark, sqlite_store, lake, stream.name)
    assert "_tm_json" not in current.columns and "_tm_deleted" not in current.columns
    assert current.count() == 41
    assert current.schema["ref"].metadata == {OBJECT_ID_PATHS: ['["id"]', '["ids"]']}
    ref = stored_schema.read(current.schema)["ref"].dataType
    assert ref["id"].metadata == ref["ids"].metadata == {BSON_KIND: OBJECT_ID}
    (row,) = current.where("_tm_key LIKE '%\"o\"%'").collect()
    assert (row.ref.id, row.ref.ids) == (str(OID), [str(OID)])
    assert decoded(row._tm_residual) == {"_id": "o"}  # `_id` is a long column here
    assert current_state(current) == source_state(raw_client, db_name, "orders")
    assert typed_columns_differ(current) == []
    assert {"d", "p", "nested"} <= set(current.columns)  # a regex, a UUID: the residual
    assert not {"re", "b"} & set(current.columns)
    tombstones = [(r._tm_coll, r._tm_key) for r in removed_rows(spark, lake, stream.name)]
    assert tombstones == [("orders", '{ "_id" : { "$numberInt" : "3" } }')]
    changes = read_changes(spark, sqlite_store, lake, stream.name)
    assert sorted(changes.columns) == sorted(names(CHANGES_COLUMNS))

    # An ObjectId sub-field a later run adds to the existing `ref`: Delta's schema evolution
    # keeps the column's metadata, so its marker is a table property (the adversary's find).
    coll.insert_one({"_id": "o2", "ref": {"id": OID, "it's": OID}})  # a quote: SQL text
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    coll.insert_one({"_id": "o3", "ref": {"it's": str(OID)}})  # a string, not an ObjectId
    drain(stream, raw_client, sqlite_store, lake)
    assert transform(spark, sqlite_store, lake, stream).kind == "merge"
    current = exact_documents(spark, sqlite_store, lake, stream.name)
    rows = {r._tm_key.split('"')[-2]: r for r in current.where("_tm_key LIKE '%\"o%'").collect()}
    assert (rows["o2"].ref["it's"], decoded(rows["o2"]._tm_residual)) == (str(OID), {"_id": "o2"})
    assert rows["o3"].ref["it's"] is None
    assert decoded(rows["o3"]._tm_residual) == {"_id": "o3", "ref": {"it's": str(OID)}}
    assert typed_columns_differ(current) == []


def test_a_run_whose_batches_repeat_events_logs_each_once(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """Most runs' event ids are all new and their rows are written without de-duplication;
    a run whose batches repeat an event, or hold one already logged, still logs it once."""
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i, "v": i} for i in range(30)])
    drain(stream, raw_client, sqlite_store, lake)
    first = sqlite_store.batches(stream.name)[-1]
    _redeliver(sqlite_store, lake, stream.name, first)  # the same events twice in one run
    assert transform(spark, sqlite_store, lake, stream).changes_added == 30

    coll.update_many({"_id": {"$lt": 10}}, {"$inc": {"v": 100}})
    drain(stream, raw_client, sqlite_store, lake)
    _redeliver(sqlite_store, lake, stream.name, first)  # logged already, beside new events
    result = transform(spark, sqlite_store, lake, stream)
    assert (result.changes_added, result.duplicates_skipped) == (10, 30)
    changes = read_changes(spark, sqlite_store, lake, stream.name)
    assert changes.count() == 40 and changes.select("event_id").distinct().count() == 40
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == source_state(raw_client, db_name, "orders")


def test_previous_version_is_the_state_before_the_last_run(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(keep_versions=2)
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    snapshots = {}
    for run in range(1, 4):
        coll.insert_one({"_id": run, "run": run})
        coll.delete_many({"_id": run - 2})
        drain(stream, raw_client, sqlite_store, lake)
        assert transform(spark, sqlite_store, lake, stream).run == run
        snapshots[run] = source_state(raw_client, db_name, "orders")
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name, 2)) == snapshots[2]
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == snapshots[3]
    kept = [v.run for v in sqlite_store.transforms.current_runs(stream.name)]
    assert kept == [2, 3]  # keep_versions=2: version 1 was pruned
    with pytest.raises(TidemarkError, match=r"Run 1 of .* is not kept\. Kept runs: 2, 3 "):
        read_current(spark, sqlite_store, lake, stream.name, 1)


def test_a_type_change_across_documents_loses_no_value_and_rewrites_nothing(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A field's column keeps the type its first run chose (numbers a run mixes in one wide
    numeric column); a later value that does not fit it leaves the column null and goes to
    the row's residual, exactly; no file of the table is rewritten."""
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many(
        [
            # A name Delta's change data feed reads into its own column: the residual keeps it.
            {"_id": 1, "v": 5, "n": 1, "w": {"a": 1}, "_change_type": "x"},
            {"_id": 2, "v": 7, "n": 2.5, "w": {"a": 2}},
        ]
    )
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    first = read_current(spark, sqlite_store, lake, stream.name)
    assert (dict(first.dtypes)["v"], dict(first.dtypes)["n"]) == ("bigint", "double")
    files = {r.path for r in _live_files(spark, lake, stream, db_name)}

    later = [{"_id": 3, "v": "seven", "w": "flat"}, {"_id": 4, "v": 2.5, "n": 3, "w": [1]}]
    fifth = {"_id": 5, "v": Int64(2**40), "w": {"a": 3, "b": True}, "_Commit_Version": 3}
    coll.insert_many([*later, fifth])
    drain(stream, raw_client, sqlite_store, lake)
    result = transform(spark, sqlite_store, lake, stream)
    widened = f"{db_name}.orders.w: struct<a:bigint> -> struct<a:bigint,b:boolean>"
    assert result.schema == {"added": [], "widened": [widened]}  # only a struct's new field
    current = exact_documents(spark, sqlite_store, lake, stream.name)
    assert dict(current.dtypes)["v"] == "bigint" and dict(current.dtypes)["n"] == "double"
    assert files <= {r.path for r in _live_files(spark, lake, stream, db_name)}
    rows = {
        int(r._tm_key.split('"')[-2]): (r.v, r.n, r.w and r.w.asDict(), decoded(r._tm_residual))
        for r in current.select("_tm_key", "v", "n", "w", "_tm_residual").collect()
    }
    assert rows == {
        1: (5, 1.0, {"a": 1, "b": None}, {"_change_type": "x"}),
        2: (7, 2.5, {"a": 2, "b": None}, {}),
        3: (None, None, None, {"v": "seven", "w": "flat"}),
        4: (None, 3.0, None, {"v": 2.5, "w": [1]}),
        5: (2**40, None, {"a": 3, "b": True}, {"_Commit_Version": 3}),
    }
    assert typed_columns_differ(current) == []


def _live_files(spark, lake, stream, db_name):
    from jobs.curated_zone import current_dir

    path = current_dir(lake, stream.name, db_name, "orders")
    return spark.sql(f"SELECT input_file_name() AS path FROM delta.`{path}`").distinct().collect()


def test_a_crash_before_the_commit_leaves_the_previous_version_current(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i} for i in range(10)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    coll.delete_many({"_id": {"$lt": 5}})
    drain(stream, raw_client, sqlite_store, lake)
    tstate = sqlite_store.transforms
    before = tstate.tables(stream.name)

    def crash():
        raise _Killed("killed before the commit")

    with pytest.raises(_Killed):
        transform(spark, sqlite_store, lake, stream, before_commit=crash)
    # The Delta commits are made, the store's are not: readers see the previous run's state.
    assert tstate.intent(stream.name) is not None
    assert [v.run for v in tstate.current_runs(stream.name)] == [1]
    assert tstate.tables(stream.name) == before
    assert len(current_state(exact_documents(spark, sqlite_store, lake, stream.name))) == 10
    assert read_changes(spark, sqlite_store, lake, stream.name).count() == 10
    # The dead attempt's commits are in the tables' logs, unrecorded.
    assert any(unrecorded_commits(lake / t.path, t.delta_version) for t in before)
    made = {t.path: delta_version(lake / t.path) for t in before}

    result = transform(spark, sqlite_store, lake, stream)  # simply run again
    assert result.run == 2 and result.changes_added == 5
    assert tstate.intent(stream.name) is None
    assert current_state(exact_documents(spark, sqlite_store, lake, stream.name)) == source_state(
        raw_client, db_name, "orders"
    )
    assert read_changes(spark, sqlite_store, lake, stream.name).count() == 15
    tables = tstate.tables(stream.name)
    assert {t.kind for t in tables} == {"changes", "current"}
    for path in [*(lake / t.path for t in tables), removed_dir(lake, stream.name)]:
        marks = marked_commits(path)
        assert len(marks) == len(set(marks)), f"{path}: a commit made twice: {marks}"
    for table in tables:
        # Delta skipped the repeat's data commits: none adds a file after the dead attempt's.
        later = [c for c in delta_log(lake / table.path) if c["version"] > made[table.path]]
        assert not [c["version"] for c in later if any("add" in a for a in c["actions"])]
        assert not unrecorded_commits(lake / table.path, table.delta_version), table.path


def test_rename_drop_and_drop_database_act_on_whole_namespaces(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(collection=None)  # the whole database
    drain(stream, raw_client, sqlite_store, lake)
    db = client[db_name]
    db.a.insert_many([{"_id": i, "from": "a"} for i in range(5)])
    db.b.insert_many([{"_id": i, "from": "b"} for i in range(3)])
    db.target.insert_one({"_id": 99, "old": True})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    db.a.update_one({"_id": 1}, {"$set": {"touched": True}})
    db.a.rename("target", dropTarget=True)  # target's old document goes, a's move over
    db.target.insert_one({"_id": 5, "after": "rename"})
    db.b.drop()
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
    got = {(r._tm_coll, r._tm_key): r._tm_document for r in rows}
    expected = {("target", k): v for k, v in source_state(raw_client, db_name, "target").items()}
    assert got == expected and len(got) == 6

    client.drop_database(db_name)
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    assert read_current(spark, sqlite_store, lake, stream.name).count() == 0


def test_a_namespace_event_splits_only_its_own_collections_fold(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """A run holding other collections' drop and rename folds each untouched collection in one
    MERGE (`jobs.transform.segments`), and the result is still the source's."""
    stream = make_stream(collection=None)
    drain(stream, raw_client, sqlite_store, lake)
    db = client[db_name]
    for name in ("a", "b", "c", "d"):
        db[name].insert_many([{"_id": i, "n": 0} for i in range(4)])
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    path = {name: current_dir(lake, stream.name, db_name, name) for name in "abcd"}
    before = {name: delta_version(path[name]) for name in "ab"}

    for n, (name, ddl) in enumerate([("c", "drop"), ("d", "rename")], start=1):
        db.a.update_many({}, {"$set": {"n": n}})
        db.b.update_one({"_id": n}, {"$set": {"n": n}})
        db[name].drop() if ddl == "drop" else db[name].rename("e")
    db.a.delete_one({"_id": 0})
    db.b.insert_one({"_id": 9, "n": 9})
    drain(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)

    assert {name: delta_version(path[name]) - before[name] for name in "ab"} == {"a": 1, "b": 1}
    rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
    got: dict[str, dict[str, str]] = {}
    for r in rows:
        got.setdefault(r._tm_coll, {})[r._tm_key] = r._tm_document
    assert got == {name: source_state(raw_client, db_name, name) for name in ("a", "b", "e")}


def _a_c_and_d_folded(spark, client, raw_client, store, lake, make_stream, db_name):
    """A database stream whose first run folded collections a, c and d (4 documents each)."""
    stream = make_stream(collection=None)
    drain(stream, raw_client, store, lake)
    for name in ("a", "c", "d"):
        client[db_name][name].insert_many([{"_id": i, "n": 0} for i in range(4)])
    drain(stream, raw_client, store, lake)
    transform(spark, store, lake, stream)
    return stream


def _killed_then_repeated(spark, store, lake, stream, monkeypatch, hook) -> None:
    """A transform killed by `hook` (a COMMIT_HOOK raising _Killed) under the patches made so
    far, then repeated without them."""
    monkeypatch.setattr("jobs.transform.delta_io.COMMIT_HOOK", hook)
    with pytest.raises(_Killed):
        transform(spark, store, lake, stream)
    monkeypatch.undo()
    spark.conf.unset(MARK)  # a real kill takes the session with it
    assert transform(spark, store, lake, stream).repeated


def test_a_run_killed_under_the_older_fold_plan_is_repeated_whole_by_this_one(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """An upgrade between a kill and its repeat. The plan before per-collection segments
    folded every collection at every namespace event, its fold commits numbered on from the
    change log's: replayed here by scoping every namespace event to the whole stream and
    numbering from 0. It is killed after its second MERGE into a's `current` of three; this
    version's repeat numbers its fold from FOLD_SLOTS_FROM, so it skips none of its own steps."""
    stream = _a_c_and_d_folded(spark, client, raw_client, sqlite_store, lake, make_stream, db_name)
    db = client[db_name]
    for n, name in enumerate(("c", "d"), start=1):
        db.a.update_many({}, {"$set": {"n": n}})
        db.a.insert_one({"_id": 10 + n})
        db[name].drop()
    db.a.update_many({}, {"$set": {"n": 3}})
    db.a.insert_one({"_id": 20})
    drain(stream, raw_client, sqlite_store, lake)

    merges: list[int] = []

    def kill_at_the_second(when: str, path, slot: int) -> None:
        if when == "after" and path == current_dir(lake, stream.name, db_name, "a"):
            merges.append(slot)
            if len(merges) == 2:
                raise _Killed(f"killed after {path} at {slot}")

    monkeypatch.setattr("jobs.transform.apply.scope_of", lambda *_: [Watched()])
    monkeypatch.setattr("jobs.transform.apply.FOLD_SLOTS_FROM", 0)
    _killed_then_repeated(spark, sqlite_store, lake, stream, monkeypatch, kill_at_the_second)
    rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
    assert {r._tm_key: r._tm_document for r in rows} == source_state(raw_client, db_name, "a")


def test_a_run_killed_under_the_plan_that_folded_empty_segments_is_repeated_whole(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, monkeypatch
):
    """An upgrade between a kill and its repeat, from the plan that folded every segment, empty
    ones too (each took a commit number): replayed by making no segment empty and numbering
    from 500_000. The drops of c and d (no event of theirs in the run) make two empty segments
    before a's MERGE and the clear of a's drop; the kill falls between those two. Numbered from
    the same base, this version's later steps on a would take the numbers of the killed run's
    earlier ones and be skipped as made (tried: a's new document was lost)."""
    stream = _a_c_and_d_folded(spark, client, raw_client, sqlite_store, lake, make_stream, db_name)
    db = client[db_name]
    db.c.drop()
    db.d.drop()
    db.a.update_many({}, {"$set": {"n": 1}})
    db.a.drop()
    db.a.insert_one({"_id": 10})
    drain(stream, raw_client, sqlite_store, lake)

    def kill_after_the_first(when: str, path, slot: int) -> None:
        if when == "after" and path == current_dir(lake, stream.name, db_name, "a"):
            raise _Killed(f"killed after {path} at {slot}")

    monkeypatch.setattr("jobs.transform.segments.Segments.empty", lambda *_, **__: False)
    monkeypatch.setattr("jobs.transform.apply.FOLD_SLOTS_FROM", 500_000)
    _killed_then_repeated(spark, sqlite_store, lake, stream, monkeypatch, kill_after_the_first)
    rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
    assert {r._tm_key: r._tm_document for r in rows} == source_state(raw_client, db_name, "a")


@pytest.mark.parametrize("how", ["drop", "rename"])
@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_on_invalidate_stops_or_follows_the_recreated_collection(
    policy, how, spark, client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream(on_invalidate=policy)
    drain(stream, raw_client, sqlite_store, lake)
    coll = client[db_name]["orders"]
    coll.insert_many([{"_id": i} for i in range(5)])
    coll.drop() if how == "drop" else coll.rename("archived")
    assert drain(stream, raw_client, sqlite_store, lake).stop_reason == "invalidate"
    coll.insert_many([{"_id": i, "again": True} for i in range(3)])

    def by_namespace() -> dict[str, dict[str, str]]:
        rows = exact_documents(spark, sqlite_store, lake, stream.name).collect()
        found: dict[str, dict[str, str]] = {}
        for r in rows:
            found.setdefault(r._tm_coll, {})[r._tm_key] = r._tm_document
        return found

    # A drop removes the documents; so does a rename, which takes them out of the one
    # collection this stream watches (README, "The tables").
    moved: dict[str, dict[str, str]] = {}
    if policy == "stop":
        with pytest.raises(StreamInvalidated, match="on_invalidate: continue"):
            drain(stream, raw_client, sqlite_store, lake)
        transform(spark, sqlite_store, lake, stream)
        assert by_namespace() == moved  # right up to the invalidate
        return
    assert drain(stream, raw_client, sqlite_store, lake).events == 3
    transform(spark, sqlite_store, lake, stream)
    assert by_namespace() == {**moved, "orders": source_state(raw_client, db_name, "orders")}
