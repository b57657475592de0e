"""Issue 23, items 10, 11 and 14: `--all` runs every stream whatever one stream's fate,
the CLI finds the home `make` uses, and `status --json` / `tables --json` for scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from state import StateStore
from tests.helpers.cli_env import cli_environment
from tidemark import settings as tm_settings
from tidemark.cli.commands import main


def _two_streams(db_name: str, broken_extra: str = "") -> str:
    """The stream that will fail comes first: the other one must still run after it."""
    return (
        "streams:\n"
        f"  - name: broken\n    database: {db_name}\n    collection: broken\n"
        "    max_await_time_ms: 200\n" + broken_extra + f"  - name: good\n    database: {db_name}\n"
        "    collection: good\n    max_await_time_ms: 200\n"
    )


@pytest.fixture
def env(monkeypatch, tmp_path, mongod, db_name):
    return cli_environment(monkeypatch, tmp_path, mongod.uri, _two_streams(db_name))


def test_drain_all_drains_every_stream_and_reports_the_failed_one(env, client, db_name, capsys):
    assert main(["drain", "--all"]) == 0  # both take their starting position
    # The broken stream's definition changes under its checkpoint: its drain must refuse.
    env["config"].write_text(
        _two_streams(db_name, "    full_document: whenAvailable\n    current_table: false\n")
    )
    client[db_name]["good"].insert_many([{"i": i} for i in range(7)])
    client[db_name]["broken"].insert_many([{"i": i} for i in range(3)])
    capsys.readouterr()

    assert main(["drain", "--all"]) == 2
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"good", "broken"}, out
    assert rows["good"].split()[1] == "7" and "caught_up" in rows["good"]
    assert "FAILED" in rows["broken"]
    assert "stream 'broken' failed:" in err and "changed since its checkpoint" in err
    assert "Traceback" not in err
    store = StateStore(env["state_url"])
    try:
        assert store.batches("good")[-1].event_count == 7  # the good stream committed
    finally:
        store.close()


def test_drain_all_counts_a_broken_entry_of_the_streams_file_as_failed(env, db_name, capsys):
    # `--all` is every stream the file declares: one that does not validate has failed, and
    # the exit code says so, while the valid one drains.
    env["config"].write_text(_two_streams(db_name, "    batch_sise: 10\n"))
    assert main(["drain", "--all"]) == 2
    out, err = capsys.readouterr()
    table = [line for line in out.splitlines()[2:] if not line.startswith("warning:")]
    rows = {line.split()[0]: line for line in table}
    assert set(rows) == {"good"} and "caught_up" in rows["good"], out
    assert "stream 'broken' failed:" in err and "batch_sise" in err
    assert "Traceback" not in err


def test_transform_all_folds_every_stream_and_reports_the_failed_one(
    env, spark, monkeypatch, client, db_name, capsys
):
    monkeypatch.setenv("TIDEMARK_SPARK_MASTER", "local[2]")  # the suite's session
    assert main(["drain", "--all"]) == 0
    client[db_name]["good"].insert_many([{"_id": i, "qty": i} for i in range(5)])
    client[db_name]["broken"].insert_many([{"_id": i, "qty": i} for i in range(4)])
    assert main(["drain", "--all"]) == 0
    for raw in (Path(env["lake"]) / "raw" / "broken").rglob("*.parquet"):
        raw.unlink()  # a committed file lost: Spark's read of it fails on the JVM side
    capsys.readouterr()

    assert main(["transform", "--all"]) == 2
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"good", "broken"}, out
    assert rows["good"].split()[1:4] == ["1", "5", "5"] and "FAILED" in rows["broken"]
    assert "stream 'broken' failed: Spark failed during the transform of stream 'broken'" in err
    assert "Nothing was committed" in err and "Traceback" not in err
    assert "JVM stacktrace" not in err


def test_status_and_tables_json(env, spark, monkeypatch, client, db_name, capsys):
    monkeypatch.setenv("TIDEMARK_SPARK_MASTER", "local[2]")
    assert main(["drain", "--all"]) == 0
    client[db_name]["good"].insert_many([{"_id": i, "name": f"n{i}"} for i in range(11)])
    assert main(["drain", "good"]) == 0
    assert main(["transform", "good"]) == 0
    capsys.readouterr()

    assert main(["status", "--json"]) == 0
    out = capsys.readouterr().out
    status = {s["stream"]: s for s in json.loads(out)["streams"]}  # one document, nothing else
    good = status["good"]
    store = StateStore(env["state_url"])
    try:
        batches = store.batches("good")
        last = batches[-1]
        broken_batches = store.batches("broken")
        checkpoint_time = store.checkpoint("good")
    finally:
        store.close()
    assert checkpoint_time is not None
    assert good["watches"] == f"{db_name}.good" and good["definition"] == "ok"
    assert good["state"] == "ok" and good["warnings"] == []
    assert good["batches"] == len(batches) and good["last_batch"]["events"] == 11
    assert good["last_batch"]["id"] == last.id and good["last_batch"]["bytes"] == last.bytes
    assert isinstance(good["lag_seconds"], int | float) and good["lag_seconds"] >= 0
    assert good["token_time"].endswith("Z") and good["last_batch"]["committed_at"].endswith("Z")
    assert datetime.fromisoformat(good["token_time"]).tzinfo is not None
    assert isinstance(good["oplog_window_seconds"], int | float)
    assert status["broken"]["batches"] == len(broken_batches)
    assert (status["broken"]["last_batch"] is None) == (not broken_batches)

    assert main(["tables", "--json"]) == 0
    tables = {(t["stream"], t["table"]): t for t in json.loads(capsys.readouterr().out)["tables"]}
    assert set(tables) == {("good", "changes"), ("good", "current")}  # broken: no table yet
    current = tables[("good", "current")]
    assert current["run"] == 1 and current["rows"] == 11 and current["format"] == "delta"
    assert (current["db"], current["collection"]) == (db_name, "good")
    location = Path(current["location"])
    assert current["committed_at"].endswith("Z") and (location / "_delta_log").is_dir()
    frame = spark.read.format("delta").option("versionAsOf", current["delta_version"])
    assert frame.load(str(location)).count() == 11
    assert {"name": "name", "type": "string"} in current["columns"]
    assert tables[("good", "changes")]["rows"] == 11


@pytest.mark.fast
def test_the_home_is_the_directory_s_when_it_has_one(monkeypatch, tmp_path):
    user, checkout = tmp_path / "user", tmp_path / "checkout"
    user.mkdir()
    checkout.mkdir()
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.delenv("TIDEMARK_HOME", raising=False)
    monkeypatch.chdir(checkout)
    assert tm_settings.tidemark_home() == user / ".tidemark"
    assert (
        tm_settings.home_notice(tm_settings.tidemark_home()) is None
    )  # nothing to confuse it with

    (checkout / ".tidemark" / "lake").mkdir(parents=True)  # what `make demo` leaves
    assert tm_settings.tidemark_home() == checkout / ".tidemark"
    assert tm_settings.Settings.from_env().lake_root == checkout / ".tidemark" / "lake"
    assert (
        tm_settings.home_notice(tm_settings.tidemark_home()) is None
    )  # no ~/.tidemark: the obvious one

    (user / ".tidemark").mkdir()  # both exist: say which one is used
    notice = tm_settings.home_notice(tm_settings.tidemark_home())
    assert notice is not None and str(checkout / ".tidemark") in notice
    assert str(user / ".tidemark") in notice and "TIDEMARK_HOME" in notice

    # A TIDEMARK_HOME with no state while another home has some: say so.
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "elsewhere"))
    notice = tm_settings.home_notice(tm_settings.tidemark_home())
    assert notice is not None and "holds no state yet" in notice
    (tmp_path / "elsewhere" / "lake").mkdir(parents=True)
    assert tm_settings.home_notice(tm_settings.tidemark_home()) is None


@pytest.mark.fast
def test_the_cli_names_the_home_on_its_first_line(monkeypatch, tmp_path, capsys):
    user, checkout = tmp_path / "user", tmp_path / "checkout"
    (user / ".tidemark").mkdir(parents=True)
    (checkout / ".tidemark" / "spark").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.delenv("TIDEMARK_HOME", raising=False)
    monkeypatch.chdir(checkout)
    assert main(["spark", "status"]) == 1  # no server: the home's, not ~/.tidemark's, is asked
    captured = capsys.readouterr()
    first = captured.err.splitlines()[0]
    assert first.startswith(f"tidemark: Tidemark home: {checkout / '.tidemark'}"), captured.err
    assert "not running" in captured.out


@pytest.mark.fast
def test_a_spark_stop_where_none_was_started_makes_no_home(monkeypatch, tmp_path):
    """Else a stop run anywhere left `~/.tidemark/spark`, a second home with state that every
    later command named in its notice, beside the home in use."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TIDEMARK_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["spark", "stop"]) == 0
    assert not (tmp_path / ".tidemark").exists()


@pytest.mark.fast
def test_the_cli_imports_no_transform_before_it_chooses_the_spark_mode():
    """The CLI imports the transform (and with it PySpark) only inside the commands that
    transform, so the others start without loading Spark."""
    assert _imported_by_the_cli(("jobs.transform",)) == []


@pytest.mark.fast
def test_a_transform_or_tables_with_nothing_to_do_never_reaches_mongodb(
    monkeypatch, tmp_path, capsys
):
    """Neither needs MongoDB, so neither starts the embedded mongod (with MONGODB_URI unset,
    the runtime used to start it for every command) nor imports the capture: a quiet run is
    mostly the process's start-up."""
    cli_environment(monkeypatch, tmp_path, "", "streams:\n  - name: orders\n    database: d\n")
    monkeypatch.delenv("MONGODB_URI")
    # As the suite's other in-process runs: Connect mode would outlive the test in the process.
    monkeypatch.setenv("TIDEMARK_SPARK_MASTER", "local[2]")
    assert main(["transform", "orders"]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert main(["tables"]) == 0
    captured = capsys.readouterr()
    assert "MONGODB_URI is not set" not in captured.err
    assert not (tmp_path / "home" / "mongod").exists()
    assert _imported_by_the_cli(("jobs.capture", "jobs.ops")) == []


def _imported_by_the_cli(prefixes: tuple[str, ...]) -> list[str]:
    """The modules under `prefixes` that importing the CLI imports, in a fresh process."""
    probe = (
        "import json, sys, tidemark.cli.commands; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)
