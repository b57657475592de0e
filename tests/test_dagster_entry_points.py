"""Dagster's own entry points, run as an operator would: `dagster job execute` and `dagster
asset materialize` in a subprocess from the venv, with only the variables the README's table
does not give a default for, against the real mongod and a local Spark JVM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from state import StateStore
from tests.helpers.serving import alive, answers, descendants, wait_until_answers

ROOT = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).parent / "dagster"
# The optional variables the issue found required: none of them may be needed.
OPTIONAL = ("TIDEMARK_SPARK_REMOTE", "TIDEMARK_SPARK_MASTER", "SPARK_CONNECT_MODE_ENABLED")


def _environment(tmp_path: Path, uri: str, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OPTIONAL}
    env.update(
        MONGODB_URI=uri,
        TIDEMARK_CONFIG=str(config),
        TIDEMARK_HOME=str(tmp_path / "home"),
        TIDEMARK_STATE_URL=f"sqlite:///{tmp_path / 'state.db'}",
        TIDEMARK_LAKE=str(tmp_path / "lake"),
        DAGSTER_HOME=str(tmp_path / "dagster"),
    )
    (tmp_path / "dagster").mkdir(exist_ok=True)
    return env


def _dagster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DAGSTER), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_jobs_run_through_the_dagster_cli_without_the_optional_variables(
    tmp_path, mongod, client, db_name
):
    config = tmp_path / "streams.yaml"
    config.write_text(
        f"streams:\n  - name: orders\n    database: {db_name}\n    collection: orders\n"
        "    max_await_time_ms: 300\n    replay: {cron: '* * * * *', start: 2026-01-01}\n"
    )
    env = _environment(tmp_path, mongod.uri, config)
    orders = client[db_name]["orders"]
    orders.insert_one({"_id": 0, "seed": True})  # the collection exists before the first drain

    # The first run only registers the stream (`start: now`); the second drains these writes.
    first = _dagster(env, "job", "execute", "-m", "orchestration.definitions", "-j", "orders_drain")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # The replayed window (a minute) must lie inside the oplog, after its first entry (a wait
    # only on a server started this minute); it holds these writes, and the seed's insert
    # when that fell in the same minute (counted below rather than waited out).
    from resources.mongo import oplog_window
    from tidemark.tokens import ts_to_datetime

    oplog_first = ts_to_datetime(oplog_window(client).first)
    while datetime.now(UTC).replace(second=0, microsecond=0) <= oplog_first:
        time.sleep(1)
    written_at = datetime.now(UTC)
    orders.insert_many([{"_id": i, "n": i} for i in range(1, 11)])
    window = written_at.replace(second=0, microsecond=0)
    seed = client.local["oplog.rs"].find_one({"ns": f"{db_name}.orders", "o._id": 0, "op": "i"})
    assert seed is not None
    seeded = ts_to_datetime(seed["ts"]).replace(second=0, microsecond=0) == window

    sync = _dagster(env, "job", "execute", "-m", "orchestration.definitions", "-j", "orders_sync")
    assert sync.returncode == 0, sync.stdout[-3000:] + sync.stderr[-3000:]
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        last = store.last_batch("orders")
        assert last is not None and last.event_count == 10  # the drain committed the inserts
        version = _newest_current(store)
        assert version is not None and version.rows == 10  # and the transform folded them

        # The compaction job failed at start-up unless both Spark variables were set.
        compact = _dagster(
            env, "job", "execute", "-m", "orchestration.definitions", "-j", "orders_compact"
        )
        assert compact.returncode == 0, compact.stdout[-3000:] + compact.stderr[-3000:]

        # A replay partition from the command line, as the README says.
        while datetime.now(UTC) < window + timedelta(minutes=1, seconds=1):
            time.sleep(1)  # the window must have closed before it can be replayed
        key = f"{window:%Y-%m-%d-%H:%M}"
        replay = _dagster(
            env,
            "asset",
            "materialize",
            "-m",
            "orchestration.definitions",
            "--select",
            "orders/replay",
            "--partition",
            key,
        )
        assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
        replays = store.batches("orders", source="replay")
        assert sum(b.event_count for b in replays) == 10 + seeded, replays
    finally:
        store.close()


def _newest_current(store: StateStore):

    return store.transforms.latest_current_run("orders")


@pytest.mark.slow
def test_tidemark_ui_stop_ends_the_whole_dagster_dev_started_in_the_background(tmp_path):
    from resources.processes import free_port

    config = tmp_path / "streams.yaml"
    config.write_text(
        "streams:\n  - {name: orders, database: shop, collection: orders, schedule: '0 0 1 1 *'}\n"
    )
    env = _environment(tmp_path, "mongodb://127.0.0.1:9/?replicaSet=rs0", config)
    env["TIDEMARK_SPARK_MASTER"] = "local[1]"  # no Connect server for the UI's environment
    env.pop("DAGSTER_HOME")  # the home's, as `make ui` has it
    tidemark = str(Path(sys.executable).parent / "tidemark")
    port = free_port()
    log = open(tmp_path / "ui.log", "w")  # noqa: SIM115 - closed below
    # As a script's plain `&` starts it: no session or process group of its own.
    ui = subprocess.Popen(
        [tidemark, "ui", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    started: set[int] = set()
    try:
        wait_until_answers(f"http://127.0.0.1:{port}/server_info", ui, tmp_path / "ui.log")
        started = descendants(ui.pid)
        assert started, "dagster dev runs as a child of tidemark ui"

        stop = subprocess.run(
            [tidemark, "ui", "stop"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert stop.returncode == 0, stop.stderr
        assert "Dagster UI stopped" in stop.stdout
        assert ui.wait(timeout=120) == 0  # `tidemark ui` itself ends with its server
        assert not answers(f"http://127.0.0.1:{port}/server_info")
        assert [pid for pid in started if alive(pid)] == []
        again = subprocess.run(
            [tidemark, "ui", "stop"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert "no Dagster UI was running" in again.stdout
    finally:
        for pid in started | descendants(ui.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ui.kill()
        ui.wait()
        log.close()


BROKEN_FILE = (
    "streams:\n"
    "  - {name: good, database: shop, collection: orders}\n"
    "  - name: bad\n"
    "    database: shop\n"
    "    collection: items\n"
    "    checks: {lag_warn_secondz: 5}\n"
)


def _load_location(monkeypatch, path: Path):
    import importlib

    monkeypatch.setenv("TIDEMARK_CONFIG", str(path))
    sys.modules.pop("orchestration.definitions", None)
    return importlib.import_module("orchestration.definitions").defs


def _check_outcome(defs, key):
    import dagster as dg

    job = defs.resolve_implicit_global_asset_job_def()
    result = job.get_subset(asset_check_selection={key}, asset_selection=set()).execute_in_process(
        instance=dg.DagsterInstance.ephemeral()
    )
    (evaluation,) = [
        e.asset_check_evaluation_data
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    return evaluation


@pytest.mark.fast
def test_a_broken_stream_is_reported_and_the_others_load(monkeypatch, tmp_path):
    import dagster as dg

    config = tmp_path / "streams.yaml"
    config.write_text(BROKEN_FILE)
    defs = _load_location(monkeypatch, config)
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"good_drain", "good_sync", "good_replay", "good_resnapshot"} <= jobs
    assert defs.resolve_schedule_def("good_schedule").job_name == "good_drain"
    assert not any(name.startswith("bad_") for name in jobs)

    # The broken one: a check that fails with the one-paragraph message naming the field...
    key = dg.AssetCheckKey(dg.AssetKey(["bad", "config"]), "config_valid")
    evaluation = _check_outcome(defs, key)
    assert not evaluation.passed
    assert "streams[1] (bad).checks.lag_warn_secondz: unknown key" in evaluation.description
    assert "Traceback" not in evaluation.description
    # ... and a sensor, on by default, that records that failure without a run.
    sensor = defs.resolve_sensor_def("bad_config_error")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), definitions=defs) as ctx:
        tick = sensor(ctx)
    assert "lag_warn_secondz: unknown key" in tick.skip_reason.skip_message
    (recorded,) = tick.asset_events
    assert recorded.asset_key == key.asset_key and not recorded.passed


@pytest.mark.fast
def test_a_streams_file_that_is_not_yaml_is_reported_without_a_traceback(monkeypatch, tmp_path):
    import dagster as dg

    config = tmp_path / "streams.yaml"
    config.write_text("streams:\n  - {name: good, database: shop\n")
    defs = _load_location(monkeypatch, config)
    key = dg.AssetCheckKey(dg.AssetKey(["streams_file", "config"]), "config_valid")
    evaluation = _check_outcome(defs, key)
    assert not evaluation.passed
    assert "is not valid YAML at line" in evaluation.description


@pytest.mark.fast
@pytest.mark.parametrize("where", ["building", "resolving"])
def test_a_stream_whose_definitions_fail_is_reported_and_the_others_load(
    monkeypatch, tmp_path, where
):
    """Whatever fails in one stream's definitions (here a bug planted in them: an exception
    while they are built, or a job Dagster cannot resolve), that stream is reported and the
    others load and run."""
    import dagster as dg

    import orchestration.schedules
    import orchestration.transform_assets

    config = tmp_path / "streams.yaml"
    config.write_text(
        "streams:\n  - {name: good, database: shop, collection: orders}\n"
        "  - {name: bad, database: shop, collection: items}\n"
    )
    if where == "building":
        real = orchestration.transform_assets.transform_asset

        def transform_asset(stream, *args):
            if stream.name == "bad":
                raise ZeroDivisionError("a bug in the bad stream's definitions")
            return real(stream, *args)

        monkeypatch.setattr(orchestration.transform_assets, "transform_asset", transform_asset)
    else:
        real_jobs = orchestration.schedules.stream_jobs

        def stream_jobs(stream):
            unknown = dg.define_asset_job(f"{stream.name}_lost", selection=["no", "such"])
            return real_jobs(stream) + ([unknown] if stream.name == "bad" else [])

        monkeypatch.setattr(orchestration.schedules, "stream_jobs", stream_jobs)
    defs = _load_location(monkeypatch, config)
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"good_drain", "good_sync", "good_replay", "good_resnapshot"} <= jobs
    assert not any(name.startswith("bad_") for name in jobs)
    evaluation = _check_outcome(
        defs, dg.AssetCheckKey(dg.AssetKey(["bad", "config"]), "config_valid")
    )
    assert not evaluation.passed
    assert evaluation.description.startswith("Stream 'bad' has no Dagster definitions")
    assert evaluation.metadata["entry"].value == 1  # its place in the streams file
    assert ("ZeroDivisionError: a bug" if where == "building" else "bad_lost") in (
        evaluation.description
    )
    assert "Traceback" not in evaluation.description
    sensor = defs.resolve_sensor_def("bad_config_error")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_the_cli_works_for_the_valid_streams_and_refuses_the_broken_one(
    monkeypatch, tmp_path, mongod, capsys
):
    from tidemark.cli.commands import main

    config = tmp_path / "streams.yaml"
    config.write_text(BROKEN_FILE)
    for name, value in _environment(tmp_path, mongod.uri, config).items():
        monkeypatch.setenv(name, value)
    assert main(["drain", "good"]) == 0
    out, err = capsys.readouterr()
    assert "good" in out
    assert "stream 'bad' is skipped" in err and "lag_warn_secondz" in err
    assert main(["drain", "bad"]) == 2
    _, err = capsys.readouterr()
    assert "streams[1] (bad).checks.lag_warn_secondz: unknown key" in err
    assert "Traceback" not in err


def test_replay_partitions_start_where_the_oplog_reached_and_a_check_shows_the_reach(
    monkeypatch, tmp_path, mongod, client, raw_client, db_name
):
    import dagster as dg

    from jobs.capture import drain
    from orchestration.definitions import build_definitions
    from orchestration.resources import build_resources
    from resources.mongo import oplog_window
    from tidemark.config import TidemarkConfig
    from tidemark.tokens import ts_to_datetime

    config = tmp_path / "streams.yaml"
    config.write_text(f"streams:\n  - {{name: orders, database: {db_name}, collection: o}}\n")
    state_url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("TIDEMARK_STATE_URL", state_url)
    # No store yet: from replay.start to the window still open, and loading creates none.
    before = f"{datetime.now(UTC):%Y-%m-%d-%H}:00"
    defs = _load_location(monkeypatch, config)
    replay = defs.resolve_assets_def(dg.AssetKey(["orders", "replay"]))
    assert replay.partitions_def.get_first_partition_key() == "2026-01-01-00:00"
    last = replay.partitions_def.get_last_partition_key()  # the open window
    assert last in (before, f"{datetime.now(UTC):%Y-%m-%d-%H}:00")
    assert not (tmp_path / "state.db").exists()

    # A drain notes the oplog's first entry: the next load starts at its window, before the
    # stream's first checkpoint.
    parsed = TidemarkConfig.model_validate({"streams": [{"name": "orders", "database": db_name,
                                                         "collection": "o"}]})  # fmt: skip
    store = StateStore(state_url)
    try:
        drain(parsed.streams[0], raw_client, store, tmp_path / "lake")
    finally:
        store.close()
    first = ts_to_datetime(oplog_window(client).first)
    defs = _load_location(monkeypatch, config)
    replay = defs.resolve_assets_def(dg.AssetKey(["orders", "replay"]))
    assert replay.partitions_def.start == first.replace(minute=0, second=0, microsecond=0)

    # The check on replay: the oplog's first entry and the partitions before it.
    resources = build_resources(
        mongodb_uri=mongod.uri, state_url=state_url, lake_root=str(tmp_path / "lake")
    )
    defs = build_definitions(parsed, resources)  # from the configured start: 2026-01-01
    key = dg.AssetCheckKey(dg.AssetKey(["orders", "replay"]), "oplog_reach")
    evaluation = _check_outcome(defs, key)
    partitions = build_definitions(parsed, resources).resolve_assets_def(key.asset_key)
    starts = [
        partitions.partitions_def.start_time_for_partition_key(k)
        for k in partitions.partitions_def.get_partition_keys()
    ]
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    assert metadata["partitions_out_of_reach"] == sum(s < first for s in starts) > 0
    assert metadata["oplog_first_time"] == first.timestamp()
    assert f"{metadata['partitions_out_of_reach']} of {len(starts)} partitions" in (
        evaluation.description
    )

    # A window the oplog no longer holds, and the open one: partitions whose runs end with
    # Tidemark's message, not Dagster's unknown-partition error.
    replay_only = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={key.asset_key}
    )
    for partition, says in (
        (partitions.partitions_def.get_first_partition_key(), "starts before the oplog's first"),
        (partitions.partitions_def.get_last_partition_key(), "is not closed yet"),
    ):
        run = replay_only.execute_in_process(
            instance=dg.DagsterInstance.ephemeral(), partition_key=partition, raise_on_error=False
        )
        (failure,) = [e for e in run.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        description = failure.step_failure_data.user_failure_data.description
        assert says in description and "Traceback" not in description, description


def _openable(table: Path, tmp_path: Path) -> Path:
    """Where delta-rs can open `table`: a copy when its path holds a percent-escape (a
    non-ASCII collection name's segment), which delta-rs 1.6 decodes when it reads the log
    ("File not found: .../заказы и ключи/current/_delta_log/...json"), through symlinks too.
    The copy is the same files: a Delta table's log names them relative to its root."""
    if "%" not in str(table):
        return table
    copy = tmp_path / "delta-rs" / str(abs(hash(table)))
    if not copy.exists():  # each collection's check opens every change log of the stream
        shutil.copytree(table, copy)
    return copy


def _sync(env: dict[str, str], stream: str) -> None:
    done = _dagster(
        env, "job", "execute", "-m", "orchestration.definitions", "-j", f"{stream}_sync"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_a_database_stream_through_snapshot_drop_and_odd_names_runs_from_the_dagster_cli(
    monkeypatch, tmp_path, mongod, client, raw_client, db_name
):
    """A database stream as a user runs it: it starts with a snapshot, its database is dropped,
    collections come back under names Dagster's own names cannot hold (spaces, Cyrillic, two
    that escape alike), and a window from before its first checkpoint is replayed. Every load
    of the code location keeps loading, and every collection's `current`, read by delta-rs,
    is what find() returns."""
    import dagster as dg

    from resources.mongo import oplog_window
    from tests.helpers.delta_reading import (
        change_logs,
        current_documents,
        current_tables,
        query,
    )
    from tests.helpers.oracle import source_state
    from tidemark.tokens import ts_to_datetime

    config = tmp_path / "streams.yaml"
    config.write_text(
        f"streams:\n  - name: odd\n    database: {db_name}\n    start: snapshot\n"
        "    max_await_time_ms: 300\n    replay: {cron: '* * * * *', start: 2026-01-01}\n"
    )
    env = _environment(tmp_path, mongod.uri, config)
    db = client[db_name]

    # Writes in a window the oplog holds and that closes before the stream's first checkpoint.
    oplog_first = ts_to_datetime(oplog_window(client).first)
    while datetime.now(UTC).replace(second=0, microsecond=0) <= oplog_first:
        time.sleep(1)
    window = datetime.now(UTC).replace(second=0, microsecond=0)
    db["plain"].insert_many([{"_id": i, "n": i} for i in range(3)])
    while datetime.now(UTC) < window + timedelta(minutes=1, seconds=1):
        time.sleep(1)

    _sync(env, "odd")  # the snapshot, then its fold: the stream has its `$database` table
    client.drop_database(db_name)
    odd_names = ("заказы и ключи", "a-b", "a.b")
    for n, name in enumerate(odd_names):
        db[name].insert_many([{"_id": k, "name": name, "k": k} for k in range(n + 1)])
    # Each command below loads the code location with that table (main failed to from here).
    replay = _dagster(
        env, "asset", "materialize", "-m", "orchestration.definitions",
        "--select", "odd/replay", "--partition", f"{window:%Y-%m-%d-%H:%M}",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    # A drain ends at the drop's invalidate (no Spark); the sync drains the new collections
    # and folds all of it, the replayed window included.
    drain = _dagster(env, "job", "execute", "-m", "orchestration.definitions", "-j", "odd_drain")
    assert drain.returncode == 0, drain.stdout[-3000:] + drain.stderr[-3000:]
    _sync(env, "odd")

    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        tables = current_tables(store, tmp_path / "lake", "odd")
        for name in (*odd_names, "plain"):
            table = tables[(db_name, name)]
            logs = [_openable(log, tmp_path) for log in change_logs(table)]
            got = current_documents(_openable(table, tmp_path), logs)
            assert got == source_state(raw_client, db_name, name), name
        # The replayed window's inserts are in `plain`'s change log; the drop keeps them out
        # of its `current` (empty, as find() is).
        changes = tables[(db_name, "plain")].parent / "changes"
        replayed = query(changes, "SELECT operation_type FROM t WHERE source = 'replay'")
        assert [r["operation_type"] for r in replayed] == ["insert"] * 3
    finally:
        store.close()

    # Each table is an asset under its real names, the two that escape alike apart.
    monkeypatch.setenv("TIDEMARK_STATE_URL", env["TIDEMARK_STATE_URL"])
    graph = _load_location(monkeypatch, config).resolve_asset_graph()
    found = {tuple(k.path) for k in graph.get_all_asset_keys()}
    for name in (*odd_names, "plain"):
        assert {("odd", db_name, f"{name}.{kind}") for kind in ("changes", "current")} <= found
    assert ("odd", db_name, "$database.changes") in found
    assert not any(
        k.path[0] == "odd" and k.path[-1] == "config" for k in graph.get_all_asset_keys()
    )
    assert dg.AssetKey(["odd", db_name, "a-b.current"]) in graph.get_all_asset_keys()
