"""Catalog scale: what many collection assets cost the code location and the Dagster UI.

    .venv/bin/python -m benchmarks.catalog_scale                   # 0, 50 and 200 collections
    .venv/bin/python -m benchmarks.catalog_scale --collections 0 8 --streams 2 --repeats 1

A state store (SQLite) is seeded through the transform's own commit (`TransformState.commit`)
with one run per database stream that made a `changes` and a `current` table for each of its
collections (each `current` with a document schema of its own), spread over `--streams`
database streams. The lake holds no Delta tables: loading the definitions reads the state store
only, and so does the UI.

(a) The definitions: a cold process (a new interpreter imports `orchestration.definitions`
with TIDEMARK_CONFIG and TIDEMARK_STATE_URL set, which loads `defs`, then resolves the
repository, as a code server does), timed from spawn to exit and, inside it, the import and
the resolution; then `location_definitions` plus the resolution repeated in one process.

(b) The UI: `dagster-webserver` alone (no daemon: no sensor or schedule runs beside the
measurement) on that code location. Timed: start until the location is loaded, GraphQL
`assetNodes` (every key), and headless Chromium rendering the Catalog (`/assets`) and the
asset graph of one stream's group until the network is idle (`--dump-dom` under a virtual
time budget; the process's wall time, so it includes the browser's own start, which the
0-collection row shows). Beside each page, what it drew: the Catalog's asset rows in the DOM
(it draws rows as they scroll into view) and the group graph's `current` nodes.

Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from resources.processes import terminate_group

ROOT = Path(__file__).resolve().parent.parent
LOCATION = "orchestration.definitions"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1600,1000",
]  # fmt: skip

# The cold process: what `dagster` code servers do when they load the location.
COLD = """
import json, time
t0 = time.perf_counter()
import orchestration.definitions as d
t1 = time.perf_counter()
repo = d.defs.get_repository_def()
keys = repo.asset_graph.get_all_asset_keys()
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "resolve": t2 - t1, "assets": len(keys)}))
"""

# Repeated loads in one warm process.
WARM = """
import json, os, statistics, sys, time
from orchestration.definitions import location_definitions
times = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    defs = location_definitions(os.environ["TIDEMARK_CONFIG"])
    defs.get_repository_def().asset_graph.get_all_asset_keys()
    times.append(time.perf_counter() - t0)
print(json.dumps({"median": statistics.median(times), "max": max(times)}))
"""


def streams_file(path: Path, streams: int) -> None:
    # A yearly schedule: no tick of the default one during a measurement.
    path.write_text(
        "streams:\n"
        + "".join(
            f"  - name: s{n}\n    database: catalog_db{n}\n    schedule: '0 0 1 1 *'\n"
            for n in range(1, streams + 1)
        )
    )


def seed(state_url: str, streams: int, collections: int) -> None:
    """One committed transform run per stream, recording two tables per collection."""
    from state import CuratedTable, StateStore, TransformRun
    from state.leases import TRANSFORM_LEASE_TTL
    from tidemark.config import StreamConfig

    store = StateStore(state_url)
    tstate = store.transforms
    try:
        for n in range(1, streams + 1):
            stream = StreamConfig(name=f"s{n}", database=f"catalog_db{n}")
            store.ensure_stream_row(stream)
            mine = [c for c in range(collections) if c % streams == n - 1]
            tables = []
            for c in mine:
                coll = f"coll_{c:03d}"
                schema = json.dumps(
                    {
                        "type": "struct",
                        "fields": [
                            {"name": f"field_{c}_{f}", "type": t, "nullable": True, "metadata": {}}
                            for f, t in enumerate(("string", "long", "double", "timestamp"))
                        ],
                    }
                )
                for kind in ("changes", "current"):
                    tables.append(
                        CuratedTable(
                            stream=stream.name,
                            run=1,
                            db=stream.database or "",
                            coll=coll,
                            kind=kind,  # type: ignore[arg-type]
                            path=f"curated/{stream.name}/{stream.database}/{coll}/{kind}",
                            delta_version=1,
                            rows=1000 + c,
                            doc_schema=schema if kind == "current" else "",
                        )
                    )
            run = TransformRun(
                stream=stream.name,
                run=1,
                path=f"curated/{stream.name}",
                rows=sum(t.rows for t in tables if t.kind == "current"),
                doc_schema="",
                events_folded=0,
                changes_added=0,
                created_at=datetime.now(UTC),
                kind="merge",
                base_run=1,
            )
            lease = store.acquire_lease(stream.name, "transform", TRANSFORM_LEASE_TTL)
            try:
                tstate.commit(lease, stream.name, None, run, [], tables)
            finally:
                store.release_lease(lease)
    finally:
        store.close()


def definitions_times(env: dict[str, str], repeats: int) -> dict[str, float]:
    colds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = _python(COLD, env)
        colds.append({**json.loads(out), "process": time.perf_counter() - t0})
    warm = json.loads(_python(WARM, env, str(max(3, repeats))))
    return {
        "process": statistics.median(c["process"] for c in colds),
        "import": statistics.median(c["import"] for c in colds),
        "resolve": statistics.median(c["resolve"] for c in colds),
        "assets": colds[0]["assets"],
        "warm": warm["median"],
    }


def _python(code: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return done.stdout.strip().splitlines()[-1]


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        json.dumps({"query": query}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.load(response)
    if "errors" in reply:
        raise SystemExit(f"GraphQL: {reply['errors']}")
    return reply["data"]


def ui_times(
    env: dict[str, str], work: Path, collections: int, streams: int, repeats: int
) -> dict[str, object]:
    from resources.processes import free_port

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit(
            "headless Chromium is needed for the UI figures (apt-get install chromium)"
        )
    port = free_port()
    log = open(work / "webserver.log", "w")  # noqa: SIM115 - closed below
    webserver = Path(sys.executable).parent / "dagster-webserver"
    t0 = time.perf_counter()
    server = subprocess.Popen(
        [str(webserver), "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the webserver and its code server stop together
    )
    try:
        status_query = """{ workspaceOrError { ... on Workspace { locationEntries {
            loadStatus locationOrLoadError { __typename } } } } }"""
        while True:
            try:
                entries = graphql(port, status_query)["workspaceOrError"]["locationEntries"]
                if entries and entries[0]["loadStatus"] == "LOADED":
                    break
            except OSError:
                pass
            if server.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit((work / "webserver.log").read_text()[-3000:])
            time.sleep(0.2)
        started = time.perf_counter() - t0
        graphql(port, "mutation { setNuxSeen }")  # the first-visit pop-up would cover pages

        node_times = []
        for _ in range(repeats):
            t1 = time.perf_counter()
            nodes = graphql(port, "{ assetNodes { assetKey { path } } }")["assetNodes"]
            node_times.append(time.perf_counter() - t1)
        last = f"coll_{collections - 1:03d}" if collections else None
        keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
        if last and not any(k.endswith(f"/{last}.current") for k in keys):
            raise SystemExit(f"{last} is not among the asset nodes")

        def render(path: str) -> tuple[float, str]:
            times, dom = [], ""
            for _ in range(repeats):
                t1 = time.perf_counter()
                dom = subprocess.run(
                    [
                        chromium,
                        *CHROMIUM_FLAGS,
                        f"--user-data-dir={work / 'chromium'}",
                        "--virtual-time-budget=30000",
                        "--dump-dom",
                        f"http://127.0.0.1:{port}{path}",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=300,
                ).stdout
                times.append(time.perf_counter() - t1)
            return statistics.median(times), dom

        catalog_s, catalog = render("/assets")
        # The Catalog lists the top folders (one per stream) with how many assets each holds.
        (work / "catalog.html").write_text(catalog)
        # The Catalog is a flat list of full keys ("s1 / catalog_db1 / coll_000.current"),
        # drawn as it scrolls: the rows in the DOM say how much of it the page rendered.
        catalog_rows = len(set(re.findall(r">(s\d+(?: / [^<]+)+)<", catalog)))
        graph_s, graph = render(f"/locations/{LOCATION}/asset-groups/s1")
        (work / "graph.html").write_text(graph)
        s1_collections = len([c for c in range(collections) if c % streams == 0])
        shown = len(re.findall(r">coll_\d+\.current<", graph))
        return {
            "start": started,
            "asset_nodes": statistics.median(node_times),
            "nodes": len(nodes),
            "catalog": catalog_s,
            "catalog_rows": catalog_rows,
            "graph": graph_s,
            "graph_nodes": f"{shown} of {s1_collections}",
        }
    finally:
        terminate_group(server.pid)  # the webserver and its code server
        server.wait()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collections", type=int, nargs="+", default=[0, 50, 200])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-ui", action="store_true", help="the definitions' figures only")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args()

    load_rows, ui_rows = [], []
    for collections in args.collections:
        work = Path(tempfile.mkdtemp(prefix="tidemark-catalog-"))
        try:
            streams_file(work / "streams.yaml", args.streams)
            state_url = f"sqlite:///{work / 'state.db'}"
            seed(state_url, args.streams, collections)
            (work / "dagster").mkdir()
            env = {
                **os.environ,
                "TIDEMARK_CONFIG": str(work / "streams.yaml"),
                "TIDEMARK_STATE_URL": state_url,
                "TIDEMARK_HOME": str(work / "home"),
                "TIDEMARK_LAKE": str(work / "lake"),
                "DAGSTER_HOME": str(work / "dagster"),
            }
            d = definitions_times(env, args.repeats)
            load_rows.append(
                f"| {collections} | {d['assets']} | {d['process']:.2f} | {d['import']:.2f} | "
                f"{d['resolve']:.2f} | {d['warm']:.3f} |"
            )
            if not args.no_ui:
                u = ui_times(env, work, collections, args.streams, args.repeats)
                ui_rows.append(
                    f"| {collections} | {u['nodes']} | {u['start']:.1f} | {u['asset_nodes']:.2f} "
                    f"| {u['catalog']:.1f} | {u['catalog_rows']} "
                    f"| {u['graph']:.1f} | {u['graph_nodes']} |"
                )
        finally:
            if args.keep:
                print(f"kept {work}", file=sys.stderr)
            else:
                shutil.rmtree(work)
    print(
        f"Definitions load, {args.streams} database streams, median of {args.repeats} (seconds):\n"
    )
    print(
        "| collections | assets | cold process | import (loads defs) | resolve repository "
        "| repeated load + resolve |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print("\n".join(load_rows))
    if ui_rows:
        print(
            "\nThe UI (dagster-webserver, headless Chromium), "
            f"median of {args.repeats} (seconds):\n"
        )
        print(
            "| collections | asset nodes | webserver start to location loaded | GraphQL "
            "assetNodes | Catalog `/assets` rendered | asset rows in its DOM | group s1's graph "
            "rendered | `current` nodes drawn |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(ui_rows))


if __name__ == "__main__":
    main()
