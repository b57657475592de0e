"""Small runs of a database stream, interpreted (the rule of `jobs.transform.run_settings`)
against compiled (Spark's code generation, the rule switched off), paired in one session.

    .venv/bin/python -m benchmarks.small_runs                 # 5 collections, 8 rounds
    .venv/bin/python -m benchmarks.small_runs --collections 2 --rounds 2   # smoke

One local Spark session (the shape of an in-process Dagster run and of the test suite), a
mongod, and two database streams over the same `--collections` collections: each round writes
20 inserts, 5 updates and a delete per collection (every third round also drops one collection
and writes to it again), drains both streams, and folds each, alternating which goes first. A
run's wall time and the CPU of this process with its JVM and Python workers are taken around
each `transform` call; round 0 (the first load, while the JVM warms) is left out of the table.
The anchor, on the same Spark in the same sitting: a full recompute of every collection's
newest documents from the change log (`benchmarks.fold_collections`). Prints markdown.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fold_collections import recompute_newest
from benchmarks.row_costs import tree_cpu_seconds
from benchmarks.sitting import Home
from jobs.capture import drain_until_caught_up
from jobs.transform import run_settings, transform
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from resources.spark import SparkConfig, spark_session, stop_if_created
from tidemark.config import load_config

STREAMS = """streams:
  - name: interpreted
    database: small
    max_await_time_ms: 100
  - name: compiled
    database: small
    max_await_time_ms: 100
"""


def _fold(spark: Any, home: Home, stream: Any, compiled: bool) -> tuple[float, float]:
    """One transform of `stream`, its wall and CPU seconds; `compiled`: the rule switched off."""
    small = run_settings.SMALL_RUN_EVENTS
    run_settings.SMALL_RUN_EVENTS = -1 if compiled else small
    try:
        cpu, clock = tree_cpu_seconds(), time.perf_counter()
        transform(spark, home.store, home.lake, stream)
        return time.perf_counter() - clock, tree_cpu_seconds() - cpu
    finally:
        run_settings.SMALL_RUN_EVENTS = small


def _write(db: Any, collections: list[str], round_: int, rng: random.Random) -> None:
    for name in collections:
        coll = db[name]
        coll.insert_many(
            [
                {"_id": round_ * 1000 + i, "x": i, "s": "a" * rng.randint(1, 50), "n": {"a": i}}
                for i in range(20)
            ]
        )
        coll.update_many({"x": {"$lt": 5}}, {"$inc": {"x": 1}})
        coll.delete_many({"x": 7})
    if round_ % 3 == 2:
        dropped = db[collections[round_ % len(collections)]]
        dropped.drop()
        dropped.insert_one({"_id": "again"})


def run(args: argparse.Namespace) -> str:
    seconds: dict[str, list[tuple[float, float]]] = {"interpreted": [], "compiled": []}
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work:
        mongod = start_mongod(Path(work) / "data")
        home = Home(Path(work) / "home", STREAMS)
        config = SparkConfig(master="local[2]", driver_memory=args.driver_memory)
        spark, created = spark_session(config)
        client, raw = connect(mongod.uri), connect(mongod.uri, raw=True)
        try:
            streams = {s.name: s for s in load_config(home.root / "streams.yaml").streams}
            rng = random.Random(args.seed)
            collections = [f"c{i:03d}" for i in range(args.collections)]
            for round_ in range(args.rounds + 1):
                _write(client.small, collections, round_, rng)
                for stream in streams.values():
                    drain_until_caught_up(stream, raw, home.store, home.lake)
                order = ["interpreted", "compiled"][:: 1 if round_ % 2 else -1]
                for name in order:
                    made = _fold(spark, home, streams[name], compiled=name == "compiled")
                    if round_:
                        seconds[name].append(made)
            anchor: list[float] = []
            for _ in range(3):
                target = Path(work) / "recomputed"
                shutil.rmtree(target, ignore_errors=True)
                clock = time.perf_counter()
                recompute_newest(spark, home, "compiled", target)
                anchor.append(time.perf_counter() - clock)
        finally:
            raw.close()
            client.close()
            home.store.close()
            stop_if_created(spark, created)
            stop_mongod(mongod)
    return _table(args, seconds, anchor)


def _table(
    args: argparse.Namespace, seconds: dict[str, list[tuple[float, float]]], anchor: list[float]
) -> str:
    lines = [
        f"### Small runs of a database stream ({args.collections} collections, ~26 changes "
        f"each per run; one local session, {args.driver_memory} driver; runs 1-{args.rounds}, "
        "paired, alternating)\n",
        "| runs | wall s, median | wall s, sum | CPU s, sum |",
        "|---|---:|---:|---:|",
    ]
    for name, made in seconds.items():
        walls = [w for w, _ in made]
        cpu = sum(c for _, c in made)
        lines.append(f"| {name} | {statistics.median(walls):.2f} | {sum(walls):.1f} | {cpu:.1f} |")
    lines.append(
        f"| anchor: full recompute (Spark, in-process) | {statistics.median(anchor):.2f} | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collections", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--seed", type=int, default=3)
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
