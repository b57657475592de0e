"""`status`, the drain's summary and a check say when a stream reads nothing for a reason the
operator must know: its namespace does not exist, or it stopped at an invalidate."""

from __future__ import annotations

import dagster as dg
import pytest

from jobs.capture import drain
from orchestration.definitions import build_definitions
from orchestration.resources import build_resources
from tests.helpers.cli_env import cli_environment
from tidemark.cli.commands import main
from tidemark.config import TidemarkConfig


@pytest.fixture
def env(monkeypatch, tmp_path, mongod, db_name):
    def write(extra: str = "", collection: str = "orders") -> None:
        scope = f"    collection: {collection}\n" if collection else ""
        config.write_text(
            f"streams:\n  - name: orders\n    database: {db_name}\n{scope}"
            f"    max_await_time_ms: 200\n{extra}"
        )

    config = cli_environment(monkeypatch, tmp_path, mongod.uri, "")["config"]
    write()
    return write


def test_a_stream_on_a_missing_collection_warns_until_it_is_created(env, client, db_name, capsys):
    assert main(["drain", "orders"]) == 0  # waiting is not a failure
    out = capsys.readouterr().out
    assert f"warning: stream orders: collection {db_name}.orders does not exist" in out
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "WAITING: namespace missing" in out
    assert f"collection {db_name}.orders does not exist" in out

    client[db_name]["orders"].insert_one({"_id": 1})
    assert main(["drain", "orders"]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "caught_up" in out
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "WAITING" not in out and "ok" in out


def test_a_database_stream_on_a_missing_database_warns(env, client, db_name, capsys):
    env(collection="")
    assert main(["status"]) == 0
    assert f"database {db_name} does not exist" in capsys.readouterr().out
    client[db_name]["anything"].insert_one({"_id": 1})
    assert main(["status"]) == 0
    assert "does not exist" not in capsys.readouterr().out


def test_status_says_a_stream_stopped_at_an_invalidate_and_what_to_do(env, client, db_name, capsys):
    env("    on_invalidate: stop\n")
    client[db_name]["orders"].insert_one({"_id": 0})
    assert main(["drain", "orders"]) == 0
    client[db_name]["orders"].insert_one({"_id": 1})
    client[db_name]["orders"].drop()
    assert main(["drain", "orders"]) == 0  # drains up to the invalidate
    capsys.readouterr()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "STOPPED at invalidate" in out
    assert "on_invalidate: continue" in out and "tidemark reset orders --to-now" in out


def test_the_dagster_check_warns_of_a_missing_namespace_and_the_drain_succeeds(
    mongod, tmp_path, client, db_name
):
    config = TidemarkConfig.model_validate(
        {"streams": [{"name": "orders", "database": db_name, "collection": "orders"}]}
    )
    resources = build_resources(
        mongodb_uri=mongod.uri,
        state_url=f"sqlite:///{tmp_path / 'state.db'}",
        lake_root=str(tmp_path / "lake"),
        spark_master="local[2]",
    )
    job = build_definitions(config, resources).resolve_job_def("orders_drain")
    instance = dg.DagsterInstance.ephemeral()

    def check_of(run: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
        (found,) = [
            e.asset_check_evaluation_data
            for e in run.all_events
            if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
            and e.asset_check_evaluation_data.check_name == "watched_namespace_exists"
        ]
        return found

    run = job.execute_in_process(instance=instance)
    assert run.success
    check = check_of(run)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert f"{db_name}.orders does not exist" in (check.description or "")
    (raw,) = [e for e in run.get_asset_materialization_events()]
    assert "does not exist" in raw.materialization.metadata["warnings"].value

    client[db_name]["orders"].insert_one({"_id": 1})
    assert check_of(job.execute_in_process(instance=instance)).passed


def test_the_drain_result_carries_the_warning(
    client, raw_client, sqlite_store, lake, make_stream, db_name
):
    stream = make_stream()
    first = drain(stream, raw_client, sqlite_store, lake)
    assert len(first.warnings) == 1 and "does not exist" in first.warnings[0]
    client[db_name]["orders"].insert_one({"_id": 1})
    assert drain(stream, raw_client, sqlite_store, lake).warnings == []
