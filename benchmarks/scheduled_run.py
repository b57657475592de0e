"""Scheduled-run benchmark: a Dagster sync run's wall time on a long-lived Spark Connect server.

    .venv/bin/python -m benchmarks.scheduled_run            # 5 runs with 1k new events, 5 quiet
    .venv/bin/python -m benchmarks.scheduled_run --rounds 2 # smoke

Starts a mongod and a Spark Connect server of its own (as `tidemark spark start` does, under a
temporary home), loads `--documents` documents, then times the `orders_sync` job (drain, then
the transform, then the checks) executed in process, as the schedule runs it: once after
`--events` new writes (half inserts, half updates) and once with nothing new, `--rounds`
times each. Prints a markdown table (median and range).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pymongo import MongoClient, UpdateOne

from benchmarks.drain import document
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.spark import REMOTE_ENV, prepare_connect_mode
from resources.spark_server import start_server, stop_server


def _write(client: MongoClient, rng: random.Random, start: int, count: int, existing: int) -> None:
    coll = client.bench.orders
    inserts = count // 2
    coll.insert_many([document(rng, n, 100) for n in range(start, start + inserts)])
    coll.bulk_write(
        [
            UpdateOne({"_id": rng.randrange(existing)}, {"$inc": {"rev": 1}})
            for _ in range(count - inserts)
        ]
    )


def _transform_seconds(result: Any) -> float:
    for event in result.get_asset_materialization_events():
        if event.asset_key.to_user_string() == "orders/curated":
            return float(event.materialization.metadata["duration_s"].value)
    return 0.0


def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="tidemark-sched-") as work:
        home = Path(work) / "home"
        mongod = start_mongod(Path(work) / "data")
        server, started = start_server(home, port=args.port)
        os.environ[REMOTE_ENV] = server.url
        prepare_connect_mode(server.url)  # the mode the first query makes the UDFs in
        import dagster as dg

        from orchestration.definitions import build_definitions
        from orchestration.resources import build_resources
        from tidemark.config import TidemarkConfig

        client = MongoClient(mongod.uri, tz_aware=True)
        try:
            config = TidemarkConfig.model_validate(
                {
                    "streams": [
                        {
                            "name": "orders",
                            "database": "bench",
                            "collection": "orders",
                            "max_await_time_ms": 300,
                        }
                    ]
                }
            )
            resources = build_resources(
                mongodb_uri=mongod.uri,
                state_url=f"sqlite:///{Path(work) / 'state.db'}",
                lake_root=str(Path(work) / "lake"),
                spark_master="local[*]",
                spark_remote=server.url,
            )
            job = build_definitions(config, resources).resolve_job_def("orders_sync")
            instance = dg.DagsterInstance.ephemeral()
            rng = random.Random(args.seed)
            assert job.execute_in_process(instance=instance).success  # the stream starts
            _write(client, rng, 0, args.documents * 2, 1)
            assert job.execute_in_process(instance=instance).success  # the base
            busy: list[tuple[float, float]] = []
            quiet: list[tuple[float, float]] = []
            next_id = args.documents * 2
            for _ in range(args.rounds):
                _write(client, rng, next_id, args.events, args.documents)
                next_id += args.events
                for runs in (busy, quiet):
                    began = time.perf_counter()
                    result = job.execute_in_process(instance=instance)
                    assert result.success
                    runs.append((time.perf_counter() - began, _transform_seconds(result)))
        finally:
            client.close()
            if started:
                stop_server(home)
            stop_mongod(mongod)
    return _table(args, busy, quiet)


def _table(
    args: argparse.Namespace, busy: list[tuple[float, float]], quiet: list[tuple[float, float]]
) -> str:
    def cells(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f}"

    lines = [
        f"### A scheduled sync run on a long-lived Spark Connect server ({args.documents:,} "
        f"documents; Dagster `execute_in_process`: drain, transform, checks)\n",
        "| case | runs | run wall s (median, min, max) | | | transform step s (median, min, max)"
        " | | |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, runs in ((f"{args.events:,} new events", busy), ("nothing new", quiet)):
        walls, steps = [w for w, _ in runs], [s for _, s in runs]
        lines.append(f"| {label} | {len(runs)} | {cells(walls)} | {cells(steps)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--seed", type=int, default=5)
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
