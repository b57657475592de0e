"""The `tidemark` CLI against a real mongod: drain, status, reset, gc, and errors as messages."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from resources.spark import spark_session
from state import StateStore
from tests.helpers.cli_env import cli_environment
from tidemark.cli.commands import main


@pytest.fixture
def env(monkeypatch, tmp_path, mongod, db_name):
    return cli_environment(
        monkeypatch,
        tmp_path,
        mongod.uri,
        f"streams:\n  - name: orders\n    database: {db_name}\n    collection: orders\n"
        "    max_await_time_ms: 200\n",
    )


def test_drain_and_status(env, client, db_name, capsys):
    assert main(["drain", "orders"]) == 0
    client[db_name]["orders"].insert_many([{"i": i} for i in range(25)])
    assert main(["drain", "--all"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # not a terminal: the summary only, no progress line
    assert "orders" in out and "25" in out and "caught_up" in out
    assert main(["status"]) == 0
    status = capsys.readouterr().out
    assert f"{db_name}.orders" in status and "(25 events)" in status and "ok" in status


def test_changed_definition_then_reset_is_recorded(env, client, db_name, capsys):
    assert main(["drain", "orders"]) == 0
    env["config"].write_text(
        env["config"].read_text() + "    full_document: whenAvailable\n    current_table: false\n"
    )
    assert main(["drain", "orders"]) == 2
    err = capsys.readouterr().err
    assert "changed since its checkpoint" in err and "Traceback" not in err
    assert main(["status"]) == 0
    assert "CHANGED: reset needed" in capsys.readouterr().out

    moment = datetime.now(UTC) - timedelta(seconds=1)
    assert main(["reset", "orders", "--to-time", moment.isoformat()]) == 0
    assert "now starts from" in capsys.readouterr().out
    client[db_name]["orders"].insert_one({"after": "reset"})
    assert main(["drain", "orders"]) == 0
    store = StateStore(env["state_url"])
    history = store.resets("orders")
    assert len(history) == 1 and history[0]["to_description"].startswith("time ")
    assert "(tidemark reset)" in history[0]["actor"]
    assert store.batches("orders")[-1].event_count >= 1
    store.close()


def test_reset_to_the_future_is_refused(env, capsys):
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert main(["reset", "orders", "--to-time", future]) == 2
    assert "in the future" in capsys.readouterr().err


def test_gc_reports_removed_orphans(env, monkeypatch, capsys):
    # A classic master: Connect mode, once set, would hold for the rest of the test process.
    monkeypatch.setenv("TIDEMARK_SPARK_MASTER", "local[2]")
    assert main(["drain", "orders"]) == 0  # registers the stream in this state store
    orphan = Path(env["lake"]) / "raw" / "orders" / "date=2026-01-01" / "hour=00" / "o.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x")

    def no_spark(config):
        raise AssertionError("gc of a stream with no curated table asked for Spark")

    monkeypatch.setattr("tidemark.cli.curated.spark_session", no_spark)
    assert main(["gc", "--min-age", "0"]) == 0
    assert not orphan.exists()
    out = capsys.readouterr().out
    assert "Delta files vacuumed" in out
    # raw files removed, Delta files vacuumed ("-": nothing to vacuum), kept as too young
    assert [c.strip() for c in out.splitlines()[-1].split()][:4] == ["orders", "1", "-", "0"]


def test_errors_are_one_message_not_a_traceback(env, monkeypatch, capsys):
    env["config"].write_text("streams:\n  - name: orders\n    colection: typo\n")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidemark: The streams config") and "unknown key" in err
    assert "Traceback" not in err

    env["config"].write_text("streams:\n  - name: orders\n    database: d\n")
    monkeypatch.setenv("MONGODB_URI", "mongodb://u:pw@127.0.0.1:1/?serverSelectionTimeoutMS=300")
    assert main(["drain", "orders"]) == 2
    err = capsys.readouterr().err
    assert "No MongoDB server answered" in err and ":pw@" not in err

    monkeypatch.setenv("TIDEMARK_STATE_URL", "nonsense")
    assert main(["status"]) == 2
    assert "is not a database URL" in capsys.readouterr().err


def test_transform_then_tables_without_dagster(env, spark, monkeypatch, client, db_name, capsys):
    monkeypatch.setenv("TIDEMARK_SPARK_MASTER", "local[2]")  # the suite's session, not a server
    assert main(["tables"]) == 0
    assert "no table yet" in capsys.readouterr().out
    assert main(["drain", "orders"]) == 0
    client[db_name]["orders"].insert_many([{"_id": i, "qty": i, "name": "n"} for i in range(20)])
    assert main(["drain", "orders"]) == 0
    capsys.readouterr()
    assert main(["transform", "orders"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:6] == ["orders", "1", "20", "20", "1", "(merge)"]

    def no_spark(config):
        raise AssertionError("a transform with nothing new asked for Spark")

    monkeypatch.setattr("tidemark.cli.curated.spark_session", no_spark)
    assert main(["transform", "--all"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("nothing new")

    assert main(["tables"]) == 0
    out = capsys.readouterr().out
    current = next(
        line for line in out.splitlines() if line.startswith("orders ") and " current " in line
    )
    path = Path(env["lake"]) / "curated" / "orders" / db_name / "orders" / "current"
    name, coll, table, delta_version, rows, run, shown = current.split()[:7]
    assert (name, coll, table, rows, run, shown) == (
        "orders",
        f"{db_name}.orders",
        "current",
        "20",
        "1",
        str(path),
    )
    assert current.endswith("3: _id bigint, name string, qty bigint")
    # The path is a plain Delta table: any engine reads it, at the version the CLI names.
    frame = spark.read.format("delta").option("versionAsOf", int(delta_version)).load(str(path))
    assert frame.count() == 20
    changes = next(line for line in out.splitlines() if " changes " in line)
    assert changes.split()[4] == "20"
    monkeypatch.setattr("tidemark.cli.curated.spark_session", spark_session)
    assert main(["gc", "--min-age", "0"]) == 0  # VACUUM keeps what the kept versions read
    assert capsys.readouterr().out.splitlines()[-1].split()[:2] == ["orders", "0"]
    assert spark.read.format("delta").load(str(path)).count() == 20

    store = StateStore(env["state_url"])
    lease = store.acquire_lease("orders", "transform", timedelta(minutes=5))  # a running transform
    try:
        assert main(["transform", "orders"]) == 2
        assert "lease held" in capsys.readouterr().err
    finally:
        store.release_lease(lease)
        store.close()


def test_progress_shows_on_a_terminal(env, client, db_name, monkeypatch, capsys):
    client[db_name]["orders"].insert_many([{"i": i} for i in range(120)])
    leader, follower = os.openpty()
    terminal = os.fdopen(follower, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        assert main(["resnapshot", "orders"]) == 0
    finally:
        terminal.close()
    try:
        shown = os.read(leader, 65536).decode()
    except OSError:  # EIO: the terminal's other end is closed and nothing was written
        shown = ""
    finally:
        os.close(leader)
    # One line that rewrites itself (carriage returns), ending at the whole count.
    assert "\rorders snapshot (copy): 0 / ~120 documents" in shown, shown
    assert "orders snapshot (copy): 120 / ~120 documents" in shown, shown
    assert "120 documents" in capsys.readouterr().out
