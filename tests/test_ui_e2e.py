"""End to end in a real browser: `dagster dev` serves the asset graph, headless Chromium
renders it, and a run launched through the UI's GraphQL API materializes the group."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from resources.embedded_mongo import free_port
from tidemark.cli.dagster_env import DAGSTER_YAML

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("TIDEMARK_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is required (CI) but not installed: apt-get install chromium")
        pytest.skip("headless Chromium is not installed (make test installs it as root)")
    return found


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        json.dumps({"query": query, "variables": variables or {}}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.load(response)
    assert "errors" not in reply, reply
    return reply["data"]


@pytest.fixture
def dagster_dev(tmp_path, mongod, db_name):
    config = tmp_path / "streams.yaml"
    # A yearly schedule: a tick of the default one (every 5 minutes) during the test would
    # launch a run of its own next to the test's.
    config.write_text(
        f"streams:\n  - name: orders\n    database: {db_name}\n    collection: orders\n"
        "    max_await_time_ms: 300\n    schedule: '0 0 1 1 *'\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "MONGODB_URI": mongod.uri,
        "TIDEMARK_CONFIG": str(config),
        "TIDEMARK_HOME": str(tmp_path / "home"),
        "TIDEMARK_STATE_URL": f"sqlite:///{tmp_path / 'state.db'}",
        "TIDEMARK_LAKE": str(tmp_path / "lake"),
        "TIDEMARK_SPARK_MASTER": "local[2]",
        "TIDEMARK_SPARK_REMOTE": "",  # a JVM per run here; tests/test_spark_server.py: Connect
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    (tmp_path / "dagster").mkdir()
    (tmp_path / "dagster" / "dagster.yaml").write_text(DAGSTER_YAML)  # as `tidemark ui` does
    dagster = Path(sys.executable).parent / "dagster"
    log = open(tmp_path / "dagster-dev.log", "w")  # noqa: SIM115 - closed below
    # Its own session (like `set -m`): dagster dev and its children stop together.
    server = subprocess.Popen(
        [
            str(dagster),
            "dev",
            "-w",
            str(ROOT / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log_tail = (tmp_path / "dagster-dev.log").read_text()[-3000:]
                    raise AssertionError(log_tail) from None
                time.sleep(1)
        graphql(port, "mutation { setNuxSeen }")  # the first-visit pop-up would cover the graph
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def browse(port: int, path: str, tmp_path: Path, *extra: str) -> str:
    done = subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=20000",
            "--window-size=1500,800",
            *extra,
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


@pytest.mark.slow
def test_the_ui_lists_the_assets_and_runs_the_group(dagster_dev, tmp_path, client, db_name):
    chromium()
    port = dagster_dev
    dom = browse(port, "/asset-groups", tmp_path, "--dump-dom")
    for asset in ("raw_changes", "changes", "current", "replay"):
        assert f">{asset}<" in dom, f"{asset} not in the rendered asset graph"

    location = graphql(
        port, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"
    )
    (entry,) = location["workspaceOrError"]["locationEntries"]
    launch = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
    selector = {
        "repositoryLocationName": entry["name"],
        "repositoryName": "__repository__",
        "jobName": "orders_sync",
    }

    def run_to_end() -> str:
        reply = graphql(port, launch, {"p": {"selector": selector, "runConfigData": {}}})
        assert reply["launchRun"]["__typename"] == "LaunchRunSuccess", reply
        run_id = reply["launchRun"]["run"]["runId"]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = graphql(
                port,
                "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }",
                {"id": run_id},
            )["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(2)
        raise AssertionError("the run did not finish in 5 minutes")

    assert run_to_end() == "SUCCESS"  # the first run takes the starting position
    client[db_name]["orders"].insert_many([{"_id": i} for i in range(7)])
    assert run_to_end() == "SUCCESS"
    assets = graphql(
        port,
        """{ assetNodes { assetKey { path } assetMaterializations(limit: 1) {
            metadataEntries { label ... on IntMetadataEntry { intValue }
                ... on TableSchemaMetadataEntry { schema { columns { name type } } } } } } }""",
    )
    rows = {
        "/".join(node["assetKey"]["path"]): {
            e["label"]: e.get("intValue", e.get("schema"))
            for m in node["assetMaterializations"]
            for e in m["metadataEntries"]
        }
        for node in assets["assetNodes"]
    }
    assert rows["orders/raw_changes"]["events"] == 7
    assert rows["orders/current"]["rows"] == 7
    # The Catalog's conventions: the row count and the typed columns, document fields included.
    assert rows["orders/current"]["dagster/row_count"] == 7
    columns = {
        c["name"]: c["type"] for c in rows["orders/current"]["dagster/column_schema"]["columns"]
    }
    assert columns["_tm_key"] == "string" and "_id" in columns, columns
    assert "event_id" in {
        c["name"] for c in rows["orders/changes"]["dagster/column_schema"]["columns"]
    }
    page = browse(port, "/assets/orders/current", tmp_path, "--dump-dom")
    assert ">Columns<" in page and ">_tm_key<" in page and ">_id<" in page, "no columns shown"

    screenshot = tmp_path / "graph.png"
    browse(port, "/asset-groups", tmp_path, f"--screenshot={screenshot}", "--hide-scrollbars")
    assert (
        screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    )
