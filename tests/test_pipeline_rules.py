"""A stream's pipeline may filter what it captures, never the events `current` needs to stay
true: deletes and namespace events (drop, rename, dropDatabase, invalidate) always pass."""

from __future__ import annotations

import pytest

from jobs.capture import drain_until_caught_up
from jobs.transform import exact_documents, transform
from tests.helpers.lake_reading import committed_table
from tests.helpers.oracle import canonical, current_key, current_state
from tidemark.config import StreamConfig
from tidemark.errors import ConfigError
from tidemark.pipeline_stages import (
    ALWAYS_PASSING,
    ALWAYS_PASSING_EVENTS,
    capture_pipeline,
    fold_problem,
)

ACTIVE = {"fullDocument.status": "active"}
DATA_OPERATIONS = {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}


def _expected(raw_client, db: str, query: dict) -> dict[str, str]:
    """find(query) on the source, keyed like `current`."""
    state = {}
    for doc in raw_client[db]["orders"].find(query):
        state[current_key(doc.raw)] = canonical(doc.raw)
    return state


def _docs(start: int, n: int) -> list[dict]:
    return [
        {"_id": k, "status": "active" if k % 2 == 0 else "archived", "n": k}
        for k in range(start, start + n)
    ]


@pytest.mark.parametrize(
    "match, query",
    [
        pytest.param(ACTIVE, {"status": "active"}, id="match-on-fullDocument"),
        pytest.param(DATA_OPERATIONS, {}, id="match-on-operationType"),
    ],
)
def test_a_filtered_stream_keeps_current_true_through_deletes_and_a_drop(
    spark, client, raw_client, sqlite_store, lake, make_stream, db_name, match, query
):
    stream = make_stream(pipeline=[{"$match": match}])
    orders = client[db_name]["orders"]
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)  # position: now

    orders.insert_many(_docs(0, 40))
    orders.delete_many({"_id": {"$in": [0, 2, 4, 6, 1, 3]}})  # active and archived ones
    orders.update_one({"_id": 8}, {"$set": {"n": -8}})
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == _expected(raw_client, db_name, query), "after inserts and deletes"

    orders.drop()
    orders.insert_many(_docs(100, 10))
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    transform(spark, sqlite_store, lake, stream)
    got = current_state(exact_documents(spark, sqlite_store, lake, stream.name))
    assert got == _expected(raw_client, db_name, query), "after a drop and re-create"


@pytest.mark.fast
def test_each_match_lets_deletes_and_namespace_events_through():
    stages = [
        {"$match": ACTIVE},
        {"$unset": "fullDocument.email"},
        {"$match": {"$comment": "why", "x": 1}},
    ]
    wrapped = capture_pipeline(stages, current_table=True)
    always = {"operationType": {"$in": list(ALWAYS_PASSING_EVENTS)}}
    gone = {"operationType": "update", "fullDocument": None}
    assert [always, gone] == ALWAYS_PASSING
    assert wrapped[0] == {"$match": {"$or": [ACTIVE, always, gone]}}
    assert wrapped[1] == stages[1]
    # $comment stays at the top level, where MongoDB accepts it.
    assert wrapped[2] == {"$match": {"$or": [{"x": 1}, always, gone], "$comment": "why"}}
    assert set(ALWAYS_PASSING_EVENTS) == {
        "delete",
        "drop",
        "rename",
        "dropDatabase",
        "invalidate",
    }
    # A change log only: the user's pipeline as written.
    assert capture_pipeline(stages, current_table=False) == stages


@pytest.mark.fast
def test_namespace_conditions_stay_outside_the_widening():
    """A cluster stream filtered to one database must not take in every other database's
    deletes: a condition on `ns` holds for all the events of the rows `current` keeps."""
    only_ns = {"$match": {"ns.db": {"$in": ["a", "b"]}}}
    assert capture_pipeline([only_ns], current_table=True) == [only_ns]
    both = {"$match": {"ns.coll": "orders", "fullDocument.status": "active"}}
    assert capture_pipeline([both], current_table=True) == [
        {
            "$match": {
                "$and": [
                    {"$or": [{"ns.coll": "orders"}, {"to.coll": "orders"}]},
                    {"$or": [{"fullDocument.status": "active"}, *ALWAYS_PASSING]},
                ]
            }
        }
    ]


@pytest.mark.fast
def test_stages_that_keep_the_namespace_whole_still_load():
    kept = ["operationType", "clusterTime", "documentKey", "to", "fullDocument"]
    nested = {"$project": {"ns": {"db": 1, "coll": 1}, **dict.fromkeys(kept, 1)}}
    assert StreamConfig(name="s", database="d", pipeline=[nested]).pipeline == [nested]


@pytest.mark.fast
def test_the_fingerprint_is_the_users_pipeline_not_the_wrapped_one():
    """Checkpoints stored before the wrapping must still resume: the fingerprint is computed
    from the pipeline as written (the value below is the pre-wrapping fingerprint)."""
    stream = StreamConfig(name="s", database="d", collection="c", pipeline=[{"$match": ACTIVE}])
    assert stream.token_definition()["pipeline"] == [{"$match": ACTIVE}]
    assert stream.fingerprint() == "4545708dbc64d161"


@pytest.mark.fast
@pytest.mark.parametrize(
    "stage, words",
    [
        ({"$redact": "$$PRUNE"}, "$redact"),
        ({"$set": {"operationType": "insert"}}, "operationType"),
        ({"$addFields": {"ns.coll": "other"}}, "ns"),
        (
            {
                "$project": {
                    "operationType": {"$literal": "insert"},
                    "clusterTime": 1,
                    "ns": 1,
                    "documentKey": 1,
                    "to": 1,
                }
            },
            "operationType",
        ),
    ],
)
def test_stages_that_would_hide_or_rewrite_what_the_fold_reads_are_refused(stage, words):
    fields = {"name": "s", "database": "d", "collection": "c", "pipeline": [stage]}
    with pytest.raises(ValueError) as refused:
        StreamConfig.model_validate(fields)
    assert words in str(refused.value)
    assert ("current_table: false" if "$redact" in stage else "it rewrites") in str(refused.value)
    # A change log only ($redact) may: nothing is folded from it.
    if "$redact" in stage:
        assert StreamConfig.model_validate({**fields, "current_table": False})


@pytest.mark.fast
def test_a_refused_pipeline_is_one_config_error_naming_the_fix(tmp_path):
    from tidemark.config import load_config

    path = tmp_path / "streams.yaml"
    path.write_text(
        "streams:\n  - {name: s, database: d, collection: c, pipeline: [{$redact: $$PRUNE}]}\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "current_table: false" in str(refused.value)
    assert fold_problem([{"$match": ACTIVE}, {"$unset": "fullDocument.x"}]) is None


def test_a_namespace_condition_still_keeps_other_collections_out(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    """The widened filter, as the server runs it: the watched collection's deletes and
    drop pass, another collection's stay out."""
    match = {"ns.coll": "orders", "fullDocument.status": "active"}
    stream = make_stream(collection=None, pipeline=[{"$match": match}])
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    for coll in ("orders", "other"):
        client[db_name][coll].insert_many(_docs(0, 4))  # 0 and 2 active
        client[db_name][coll].delete_many({})
    client[db_name]["other"].drop()
    client[db_name]["orders"].drop()
    drain_until_caught_up(stream, raw_client, sqlite_store, lake)
    table = committed_table(sqlite_store, lake, stream.name)
    operations, colls = table.column("operation_type").to_pylist(), table.column("coll").to_pylist()
    seen = sorted(zip(operations, colls, strict=True))
    assert seen == [("delete", "orders")] * 4 + [("drop", "orders")] + [("insert", "orders")] * 2
