"""The checks that hold a stream against its source: the row count counts what the pipeline
lets through, and a stream whose namespace does not exist says so."""

from __future__ import annotations

import dagster as dg
import pytest

from jobs.ops import source_count
from orchestration.definitions import build_definitions
from orchestration.resources import build_resources
from tidemark.config import StreamConfig, TidemarkConfig

ACTIVE = [{"$match": {"fullDocument.status": "active"}}]


def _docs(start: int, n: int) -> list[dict]:
    return [
        {"_id": k, "status": "active" if k % 3 == 0 else "archived", "n": k}
        for k in range(start, start + n)
    ]


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }


@pytest.fixture
def dagster_setup(mongod, spark, tmp_path, db_name):
    def make(**stream_fields):
        fields = {"name": "orders", "database": db_name, "collection": "orders"}
        stream = {**fields, "max_await_time_ms": 300, **stream_fields}
        config = TidemarkConfig.model_validate({"streams": [stream]})
        resources = build_resources(
            mongodb_uri=mongod.uri,
            state_url=f"sqlite:///{tmp_path / 'state.db'}",
            lake_root=str(tmp_path / "lake"),
            spark_master="local[2]",
        )
        return config.streams[0], build_definitions(config, resources), resources

    return make


def test_row_count_of_a_filtered_stream_counts_what_its_pipeline_lets_through(
    dagster_setup, client, db_name
):
    _, defs, _ = dagster_setup(pipeline=ACTIVE)
    sync = defs.resolve_job_def("orders_sync")
    instance = dg.DagsterInstance.ephemeral()
    assert sync.execute_in_process(instance=instance).success  # starts the stream
    orders = client[db_name]["orders"]
    orders.insert_many(_docs(0, 60))  # 20 active
    run = sync.execute_in_process(instance=instance)
    check = _checks(run)["row_count_matches_source"]
    assert check.metadata["source_documents"].value == 20
    assert check.metadata["current_rows"].value == 20
    assert check.passed

    # A row `current` lacks (an active document the lake has not seen) is the real error the
    # check must catch; an archived one is none of the stream's business. The checks alone,
    # as the UI's "Execute checks" runs them (no drain, no fold).
    only_checks = dg.define_asset_job("only_checks", dg.AssetSelection.all_asset_checks())
    checks = dg.Definitions.merge(defs, dg.Definitions(jobs=[only_checks]))

    def row_count() -> dg.AssetCheckEvaluation:
        run = checks.resolve_job_def("only_checks").execute_in_process(instance=instance)
        return _checks(run)["row_count_matches_source"]

    orders.insert_one({"_id": 1000, "status": "archived"})
    assert row_count().passed
    orders.insert_one({"_id": 1001, "status": "active"})
    missed = row_count()
    assert not missed.passed
    assert missed.metadata["difference"].value == -1


def test_source_count_by_translation_and_by_pipeline_agree(client, db_name):
    for coll in ("orders", "refunds", "notes"):
        client[db_name][coll].insert_many(_docs(0, 30))  # 10 active each
    client[db_name].create_collection("empty_view", viewOn="orders", pipeline=[])

    def count(**fields):
        return source_count(client, StreamConfig(name="s", database=db_name, **fields))

    translated = count(collection="orders", pipeline=ACTIVE)
    assert (translated.total, translated.how) == (10, "count_documents (filter translated)")
    # The same filter through $expr, and after a $set: the server runs the pipeline.
    by_expr = [{"$match": {"$expr": {"$eq": ["$fullDocument.status", "active"]}}}]
    piped = count(collection="orders", pipeline=by_expr)
    assert (piped.total, piped.how) == (10, "pipeline")
    reshaped = [{"$set": {"fullDocument.rank": {"$mod": ["$fullDocument.n", 2]}}},
                {"$match": {"fullDocument.rank": 0, "fullDocument.status": "active"}}]  # fmt: skip
    assert count(collection="orders", pipeline=reshaped).total == 5  # 0, 6, 12, 18, 24

    # A database stream: a count per collection (views and system collections are not
    # watched), the pipeline's namespace conditions included.
    whole = count(pipeline=ACTIVE)
    assert whole.by_collection == {
        f"{db_name}.notes": 10,
        f"{db_name}.orders": 10,
        f"{db_name}.refunds": 10,
    }
    two = count(pipeline=[{"$match": {"ns.coll": {"$in": ["orders", "notes"]}}}, *ACTIVE])
    assert two.how == "pipeline" and two.total == 20
    assert two.by_collection[f"{db_name}.refunds"] == 0
    plain = count(collection="orders")
    assert (plain.total, plain.how) == (30, "count_documents")
