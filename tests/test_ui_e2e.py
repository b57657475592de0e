"""End to end in a real browser: `dagster dev` serves the asset graph of a database stream,
headless Chromium renders it, runs launched through the UI's GraphQL API fold the shop
workload's three collections into tables of their own, and after a reload of the code location
each collection's Catalog page shows its own columns and row count."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from resources.processes import free_port, terminate_group
from tests.helpers.serving import wait_until_answers
from tidemark.cli.dagster_env import DAGSTER_YAML
from tidemark.cli.workload import run_shop_workload

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
    # Beside it, a database stream that starts with a snapshot of a collection whose name
    # Dagster's own names cannot hold: its first run makes its `$database` table too.
    config.write_text(
        f"streams:\n  - name: shop\n    database: {db_name}\n"
        "    max_await_time_ms: 300\n    schedule: '0 0 1 1 *'\n"
        f"  - name: odd\n    database: {db_name}_odd\n    start: snapshot\n"
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
        wait_until_answers(
            f"http://127.0.0.1:{port}/server_info", server, tmp_path / "dagster-dev.log"
        )
        graphql(port, "mutation { setNuxSeen }")  # the first-visit pop-up would cover the graph
        yield port
    finally:
        terminate_group(server.pid)  # the webserver and its code server
        server.wait()
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


class _Text(HTMLParser):
    """The text nodes of a rendered page, in order (what a reader sees, not the markup)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.texts.append(data.strip())


def texts(dom: str) -> list[str]:
    parser = _Text()
    parser.feed(dom)
    return parser.texts


def catalog_page(texts: list[str]) -> tuple[int, list[str]]:
    """An asset's Catalog page as shown: its row count and the names in its Columns table."""
    row_count = int(texts[texts.index("Row count") + 1].replace(",", ""))
    start = texts.index("Column name")
    end = texts.index("Metadata", start)
    # The table's cells after its three headings: name, type and (optionally) description.
    cells = texts[start + 3 : end]
    types = re.compile(r"^(string|bigint|int|double|boolean|timestamp|date|decimal|struct|array)")
    names = [c for i, c in enumerate(cells) if i + 1 < len(cells) and types.match(cells[i + 1])]
    return row_count, names


@pytest.mark.slow
def test_the_ui_shows_each_collection_as_its_own_table(dagster_dev, tmp_path, client, db_name):
    chromium()
    port = dagster_dev
    location = graphql(
        port, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"
    )
    (entry,) = location["workspaceOrError"]["locationEntries"]
    group_page = f"/locations/{entry['name']}/asset-groups/shop"
    before = texts(browse(port, group_page, tmp_path, "--dump-dom"))
    for asset in ("raw_changes", "curated", "replay"):
        assert asset in before, f"{asset} not in the rendered asset graph"
    assert "current" not in before  # no collection yet: no table assets

    launch = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""

    def run_to_end(job: str = "shop_sync") -> str:
        selector = {
            "repositoryLocationName": entry["name"],
            "repositoryName": "__repository__",
            "jobName": job,
        }
        reply = graphql(port, launch, {"p": {"selector": selector, "runConfigData": {}}})
        assert reply["launchRun"]["__typename"] == "LaunchRunSuccess", reply
        run_id = reply["launchRun"]["run"]["runId"]
        deadline = time.monotonic() + 600  # a hang guard: a run takes a minute idle
        while time.monotonic() < deadline:
            status = graphql(
                port,
                "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }",
                {"id": run_id},
            )["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(2)
        raise AssertionError("the run did not finish in 10 minutes")

    assert run_to_end() == "SUCCESS"  # the first run takes the starting position
    odd_db, odd_coll = f"{db_name}_odd", "заказы и ключи"
    client[odd_db][odd_coll].insert_many([{"_id": i, "k": i} for i in range(3)])
    try:
        assert run_to_end("odd_sync") == "SUCCESS"  # its snapshot, folded
    finally:
        client.drop_database(odd_db)
    run_shop_workload(client, db_name, orders=20, seed=3)
    source = {c: client[db_name][c].count_documents({}) for c in ("customers", "products")}
    assert run_to_end() == "SUCCESS"

    # Newer than the loaded definitions: the run reported each table by its key already ...
    customers_key = ["shop", db_name, "customers.current"]
    reported = graphql(
        port,
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { __typename
            ... on Asset { definition { id } assetMaterializations(limit: 1) { runId } } } }""",
        {"k": {"path": customers_key}},
    )["assetOrError"]
    assert reported["__typename"] == "Asset" and reported["assetMaterializations"], reported
    assert reported["definition"] is None, "a definition before any reload"
    # ... and a reload of the code location makes them assets of their own.
    graphql(
        port,
        """mutation($n: String!) { reloadRepositoryLocation(repositoryLocationName: $n) {
            __typename } }""",
        {"n": entry["name"]},
    )
    nodes_query = """{ assetNodes { assetKey { path } assetMaterializations(limit: 1) {
        metadataEntries { label ... on IntMetadataEntry { intValue }
            ... on TableSchemaMetadataEntry { schema { columns { name type } } } } } } }"""
    deadline = time.monotonic() + 120
    while True:
        nodes = graphql(port, nodes_query)["assetNodes"]
        if any(n["assetKey"]["path"] == customers_key for n in nodes):
            break
        assert time.monotonic() < deadline, "no collection assets after the reload"
        time.sleep(2)
    rows = {
        "/".join(node["assetKey"]["path"]): {
            e["label"]: e.get("intValue", e.get("schema"))
            for m in node["assetMaterializations"]
            for e in m["metadataEntries"]
        }
        for node in nodes
    }
    # The odd stream's tables, under their real names, next to the shop's.
    assert {f"odd/{odd_db}/{odd_coll}.current", f"odd/{odd_db}/$database.changes"} <= set(rows)
    assert rows[f"odd/{odd_db}/{odd_coll}.current"]["dagster/row_count"] == 3
    tables = {p for p in rows if p.startswith(f"shop/{db_name}/")}
    assert tables == {
        f"shop/{db_name}/{coll}.{kind}"
        for coll in ("customers", "orders", "products")
        for kind in ("changes", "current")
    }, tables
    for coll, count in source.items():
        current = rows[f"shop/{db_name}/{coll}.current"]
        assert current["dagster/row_count"] == count, (coll, current)
        columns = {c["name"] for c in current["dagster/column_schema"]["columns"]}
        assert "_tm_key" in columns and "_id" in columns, columns
    assert "event_id" in {
        c["name"]
        for c in rows[f"shop/{db_name}/orders.changes"]["dagster/column_schema"]["columns"]
    }

    # The graph: a node per collection table, labelled by its key's last part, which names it.
    graph = browse(port, group_page, tmp_path, "--dump-dom")
    shown = texts(graph)
    for coll in ("customers", "orders", "products"):
        assert shown.count(f"{coll}.current") == 1 and shown.count(f"{coll}.changes") == 1, shown
        assert f"/assets/shop/{db_name}/{coll}.current?view=checks" in graph, coll

    # Each collection's Catalog page: its own fields, not another collection's, and its rows.
    own = {"customers": ("email", "loyalty_points"), "products": ("stock", "title")}
    for coll, fields in own.items():
        page = texts(browse(port, f"/assets/shop/{db_name}/{coll}.current", tmp_path, "--dump-dom"))
        row_count, columns = catalog_page(page)
        assert row_count == source[coll], (coll, row_count)
        assert "_tm_key" in columns and "_id" in columns, columns
        assert all(f in columns for f in fields), (coll, columns)
        others = [f for c, fs in own.items() if c != coll for f in fs]
        assert not any(f in columns for f in others), (coll, columns)

    screenshot = tmp_path / "graph.png"
    browse(port, group_page, tmp_path, f"--screenshot={screenshot}", "--hide-scrollbars")
    assert (
        screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    )
