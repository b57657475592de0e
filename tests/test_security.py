"""Credentials: least privilege is enough, and the password appears in no log line, error,
printed output or metadata value."""

from __future__ import annotations

import logging

import dagster as dg
import pytest
from pymongo import MongoClient

from jobs.ops import missing_namespace
from orchestration.definitions import build_definitions
from orchestration.resources import build_resources
from tests.helpers.credentials import SECRET
from tidemark.cli.commands import main
from tidemark.config import StreamConfig, TidemarkConfig


def test_the_least_privilege_role_drains_and_no_output_holds_the_password(
    auth_mongod, spark, tmp_path, caplog, capsys, monkeypatch
):
    uri = auth_mongod[1]
    caplog.set_level(logging.DEBUG)
    config = TidemarkConfig.model_validate(
        {
            "streams": [
                {
                    "name": "orders",
                    "database": "shop",
                    "collection": "orders",
                    "max_await_time_ms": 300,
                }
            ]
        }
    )
    resources = build_resources(
        mongodb_uri=uri,
        state_url=f"sqlite:///{tmp_path / 'state.db'}",
        lake_root=str(tmp_path / "lake"),
        spark_master="local[2]",
    )
    defs = build_definitions(config, resources)
    job = defs.resolve_job_def("orders_sync")
    instance = dg.DagsterInstance.ephemeral()
    assert job.execute_in_process(instance=instance).success  # the starting position
    with MongoClient(uri.replace(f"capture:{SECRET}", "root:rootpw")) as root:
        root.shop.orders.insert_many([{"_id": i} for i in range(5)])
    run = job.execute_in_process(instance=instance)
    assert run.success  # find + changeStream (+ find on the oplog) are all a drain needs
    materialized = run.get_asset_materialization_events()
    assert {e.asset_key.to_user_string() for e in materialized} == {
        "orders/raw_changes",
        "orders/curated",
        "orders/shop/orders.changes",
        "orders/shop/orders.current",
    }
    raw = next(e for e in materialized if e.asset_key == dg.AssetKey(["orders", "raw_changes"]))
    assert raw.materialization.metadata["events_insert"].value == 5
    # The role has no listCollections: the collection is still seen to exist. (Nor `find` on
    # local.system.replset: that one is warned about, the set told apart by name only.)
    warnings = raw.materialization.metadata["warnings"].value
    assert "does not exist" not in warnings and "local.system.replset" in warnings
    namespace_checks = [
        e.asset_check_evaluation_data.passed
        for e in run.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == "watched_namespace_exists"
    ]
    assert namespace_checks == [True]
    with MongoClient(uri) as capture:  # and a missing one is seen to be missing
        gone = StreamConfig(name="gone", database="shop", collection="nothing")
        assert "does not exist" in (missing_namespace(capture, gone) or "")

    # The CLI too, with the URI in the environment, including a failing command.
    config_file = tmp_path / "streams.yaml"
    config_file.write_text(
        "streams:\n  - {name: orders, database: shop, collection: orders, max_await_time_ms: 300}\n"
    )
    monkeypatch.setenv("MONGODB_URI", uri)
    monkeypatch.setenv("TIDEMARK_CONFIG", str(config_file))
    monkeypatch.setenv("TIDEMARK_STATE_URL", f"sqlite:///{tmp_path / 'state.db'}")
    monkeypatch.setenv("TIDEMARK_LAKE", str(tmp_path / "lake"))
    assert main(["status"]) == 0
    monkeypatch.setenv("MONGODB_URI", uri.replace(SECRET, SECRET + "-wrong"))
    assert main(["status"]) == 2

    everything = [r.getMessage() for r in caplog.records]
    everything += [str(e) for e in run.all_events] + [str(e) for e in materialized]
    everything += [str(v.value) for e in materialized for v in e.materialization.metadata.values()]
    printed = capsys.readouterr()
    everything += [printed.out, printed.err]
    assert "authentication failed" in printed.err
    leaks = [text for text in everything if SECRET in text]
    assert not leaks, leaks[:3]


def test_a_user_without_change_stream_rights_gets_the_privilege_message(
    auth_mongod, tmp_path, sqlite_store, make_stream
):
    from jobs.capture import drain
    from resources.mongo import connect
    from tidemark.errors import MongoConnectionError

    uri = auth_mongod[1]
    stream = make_stream(database="elsewhere", collection="things")  # not granted
    with pytest.raises(MongoConnectionError) as refused:
        drain(stream, connect(uri, raw=True), sqlite_store, tmp_path / "lake")
    assert "`find` and `changeStream`" in str(refused.value)
    assert SECRET not in str(refused.value)
