"""Each collection table as a Dagster asset: discovered from the state store, materialized by
the runs that change it, checked per collection; against real mongod, Spark and SQLite."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from orchestration.definitions import build_definitions
from orchestration.discovery import known_tables
from orchestration.resources import build_resources
from tidemark.config import TidemarkConfig


@pytest.fixture
def shop(mongod, spark, tmp_path, db_name):
    """A database stream; `defs(reload=True)` loads the definitions as the code location does,
    with the tables the state store knows by then; `mongodb_uri` replaces the mongod's."""
    config = TidemarkConfig.model_validate(
        {
            "streams": [
                {
                    "name": "shop",
                    "database": db_name,
                    "max_await_time_ms": 300,
                    "checks": {"lag_warn_seconds": 0.5, "lag_error_seconds": 3600},
                }
            ]
        }
    )
    state_url = f"sqlite:///{tmp_path / 'state.db'}"

    def defs(reload: bool = False, mongodb_uri: str | None = None) -> dg.Definitions:
        resources = build_resources(
            mongodb_uri=mongodb_uri or mongod.uri,
            state_url=state_url,
            lake_root=str(tmp_path / "lake"),
            spark_master="local[2]",
        )
        tables = known_tables(state_url, config.streams) if reload else {}
        loaded = build_definitions(config, resources, tables=tables)
        # Checks alone, as the UI's "Execute checks" runs them; the fold and its tables' checks,
        # as the automation runs them.
        only_checks = dg.define_asset_job("only_checks", dg.AssetSelection.all_asset_checks())
        capture = dg.AssetSelection.assets(["shop", "raw_changes"], ["shop", "replay"])
        fold = dg.define_asset_job("fold", dg.AssetSelection.groups("shop") - capture)
        return dg.Definitions.merge(loaded, dg.Definitions(jobs=[only_checks, fold]))

    return defs


def _key(db: str, coll: str, kind: str) -> str:
    return f"shop/{db}/{coll}.{kind}"


def _materialized(run: dg.ExecuteInProcessResult) -> dict[str, dict]:
    return {
        e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
        for e in run.get_asset_materialization_events()
    }


def _checks(run: dg.ExecuteInProcessResult) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    return {
        (
            e.asset_check_evaluation_data.asset_key.to_user_string(),
            e.asset_check_evaluation_data.check_name,
        ): e.asset_check_evaluation_data
        for e in run.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    }


def test_each_collection_is_an_asset_with_its_own_columns_rows_and_checks(shop, client, db_name):
    instance = dg.DagsterInstance.ephemeral()
    first = shop()
    assert {k.to_user_string() for k in first.resolve_asset_graph().get_all_asset_keys()} == {
        "shop/raw_changes",
        "shop/replay",
        "shop/curated",
    }
    assert first.resolve_job_def("shop_sync").execute_in_process(instance=instance).success
    db = client[db_name]
    db.customers.insert_many([{"_id": i, "name": f"c{i}", "vip": i % 2 == 0} for i in range(5)])
    db.orders.insert_many([{"_id": i, "qty": i, "customer": i % 5} for i in range(8)])
    db.products.insert_many([{"_id": i, "sku": f"p{i}", "price": i / 4} for i in range(3)])

    # Created after these definitions loaded: each table is reported by its own key at once.
    run = first.resolve_job_def("shop_sync").execute_in_process(instance=instance)
    assert run.success
    made = _materialized(run)
    tables = {
        _key(db_name, c, k)
        for c in ("customers", "orders", "products")
        for k in ("changes", "current")
    }
    assert set(made) == {"shop/raw_changes", "shop/curated"} | tables
    listed = _checks(run)[("shop/curated", "collections_listed")]
    assert not listed.passed and listed.metadata["tables_not_listed"].value == 6

    # A reload of the code location lists them as assets, each with its own columns and rows.
    again = shop(reload=True)
    graph = again.resolve_asset_graph()
    assert tables <= {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert graph.get(dg.AssetKey(["shop", db_name, "orders.current"])).parent_keys == {
        dg.AssetKey(["shop", db_name, "orders.changes"])
    }
    for coll, own, rows in (("customers", "vip", 5), ("orders", "qty", 8), ("products", "sku", 3)):
        metadata = made[_key(db_name, coll, "current")]
        columns = {c.name for c in metadata["dagster/column_schema"].columns}
        assert own in columns and metadata["dagster/row_count"] == rows, (coll, columns)
    assert "vip" not in {
        c.name for c in made[_key(db_name, "orders", "current")]["dagster/column_schema"].columns
    }

    # A run that changes one collection materializes its tables and only those.
    db.orders.update_one({"_id": 1}, {"$set": {"qty": 10}})
    db.orders.insert_one({"_id": 100, "qty": 1})
    run = again.resolve_job_def("shop_sync").execute_in_process(instance=instance)
    assert run.success
    made = _materialized(run)
    assert set(made) == {
        "shop/raw_changes",
        "shop/curated",
        _key(db_name, "orders", "changes"),
        _key(db_name, "orders", "current"),
    }
    assert made[_key(db_name, "orders", "current")]["dagster/row_count"] == 9
    checks = _checks(run)
    for coll, rows in (("customers", 5), ("orders", 9), ("products", 3)):
        count = checks[(_key(db_name, coll, "current"), "row_count_matches_source")]
        assert count.passed and count.metadata["current_rows"].value == rows, coll
        assert checks[(_key(db_name, coll, "current"), "schema_drift")].passed
    assert checks[("shop/curated", "collections_listed")].passed

    # The source moves on: the check of that collection sees it, the others still pass.
    db.products.delete_one({"_id": 0})
    checks = _checks(again.resolve_job_def("only_checks").execute_in_process(instance=instance))
    products = checks[(_key(db_name, "products", "current"), "row_count_matches_source")]
    assert not products.passed and products.metadata["difference"].value == 1
    assert checks[(_key(db_name, "orders", "current"), "row_count_matches_source")].passed

    # The fold never needs MongoDB: with it unreachable the step folds and checks, and only the
    # row counts say they could not count.
    db.orders.insert_one({"_id": 101, "qty": 2})
    assert again.resolve_job_def("shop_drain").execute_in_process(instance=instance).success
    away = shop(reload=True, mongodb_uri="mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300")
    run = away.resolve_job_def("fold").execute_in_process(instance=instance)
    assert run.success
    assert _materialized(run)[_key(db_name, "orders", "current")]["dagster/row_count"] == 10
    checks = _checks(run)
    count = checks[(_key(db_name, "orders", "current"), "row_count_matches_source")]
    assert not count.passed and "could not be counted" in (count.description or "")
    assert "127.0.0.1:9" in count.description
    assert checks[(_key(db_name, "orders", "current"), "freshness")].passed


def test_freshness_and_schema_drift_are_checked_per_collection(shop, client, db_name):
    instance = dg.DagsterInstance.ephemeral()
    defs = shop()
    assert defs.resolve_job_def("shop_sync").execute_in_process(instance=instance).success
    db = client[db_name]
    db.orders.insert_many([{"_id": i, "qty": i, "box": {"w": i}} for i in range(4)])
    db.customers.insert_many([{"_id": i, "name": "n"} for i in range(2)])
    assert defs.resolve_job_def("shop_sync").execute_in_process(instance=instance).success
    defs = shop(reload=True)

    # A drain that is not folded yet: every table trails the raw zone by that batch.
    db.orders.insert_one({"_id": 9, "qty": "nine", "box": {"w": 1, "h": 2}})  # box gains h
    assert defs.resolve_job_def("shop_drain").execute_in_process(instance=instance).success
    time.sleep(1)  # past the warn threshold of 0.5 s
    checks = _checks(defs.resolve_job_def("only_checks").execute_in_process(instance=instance))
    stale = checks[(_key(db_name, "customers", "current"), "freshness")]
    assert not stale.passed and stale.metadata["unfolded_batches"].value == 1
    assert stale.severity == dg.AssetCheckSeverity.WARN

    run = defs.resolve_job_def("shop_sync").execute_in_process(instance=instance)
    assert run.success
    checks = _checks(run)
    assert checks[(_key(db_name, "customers", "current"), "freshness")].passed
    drift = checks[(_key(db_name, "orders", "current"), "schema_drift")]
    assert not drift.passed and drift.severity == dg.AssetCheckSeverity.WARN
    box = "box: struct<w:bigint> -> struct<w:bigint,h:bigint>"  # "nine" goes to the residual
    assert box in drift.metadata["schema_changes"].value
    assert checks[(_key(db_name, "customers", "current"), "schema_drift")].passed
    current = _materialized(run)[_key(db_name, "orders", "current")]
    assert current["fields_changed"] == 1 and box in current["schema_changes"]

    db.orders.insert_one({"_id": 10, "qty": "ten", "note": "x"})  # adds a column
    run = defs.resolve_job_def("shop_sync").execute_in_process(instance=instance)
    drift = _checks(run)[(_key(db_name, "orders", "current"), "schema_drift")]
    assert not drift.passed and "added `note`" in drift.metadata["schema_changes"].value
    db.orders.insert_one({"_id": 11, "qty": "eleven", "note": "y"})  # nothing new in the schema
    run = defs.resolve_job_def("shop_sync").execute_in_process(instance=instance)
    assert _checks(run)[(_key(db_name, "orders", "current"), "schema_drift")].passed
