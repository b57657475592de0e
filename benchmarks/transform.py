"""Transform benchmark: the Spark fold of change batches into a large current-state table.

    .venv/bin/python -m benchmarks.transform                    # 1M documents, 100k and 1M changes
    .venv/bin/python -m benchmarks.transform --documents 3000 --small 500 --large 3000  # smoke

Loads `--documents` inserts (the first fold builds `current`), then folds `--small` and then
`--large` updates into it; each step drains first, then times the transform alone. Prints a
markdown table; the SparkSession's start (JVM) is reported apart.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from pymongo import MongoClient, UpdateOne

from benchmarks.drain import document
from jobs.capture import drain_until_caught_up
from jobs.transform import transform
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from resources.spark import SparkConfig, spark_session, stop_if_created
from state import StateStore
from tidemark.config import StreamConfig

UNBOUNDED = {"max_events": None, "max_bytes": None, "max_seconds": None}


def _updates(client: MongoClient, count: int, documents: int, rng: random.Random) -> None:
    coll = client.bench.orders
    for start in range(0, count, 5000):
        coll.bulk_write(
            [
                UpdateOne(
                    {"_id": rng.randrange(documents)},
                    {"$set": {"status": rng.choice(["paid", "shipped"])}, "$inc": {"rev": 1}},
                )
                for _ in range(min(5000, count - start))
            ],
            ordered=False,
        )


def run(args: argparse.Namespace) -> str:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work:
        oplog_mb = max(1024, int((args.documents + args.large) * args.doc_kb * 2.5 / 1024) + 512)
        mongod = start_mongod(Path(work) / "data", oplog_size_mb=oplog_mb)
        client = MongoClient(mongod.uri, tz_aware=True)
        raw = connect(mongod.uri, raw=True)
        store = StateStore(f"sqlite:///{Path(work) / 'state.db'}")
        lake = Path(work) / "lake"
        stream = StreamConfig(
            name="bench", database="bench", collection="orders", budget=UNBOUNDED, keep_versions=2
        )
        started = time.perf_counter()
        spark, created = spark_session(SparkConfig(master=args.master, driver_memory="4g"))
        spark.range(1).count()
        jvm_seconds = time.perf_counter() - started
        try:
            drain_until_caught_up(stream, raw, store, lake)
            rng = random.Random(args.seed)
            filler = max(0, int(args.doc_kb * 1024) - 420)
            steps = [("load", args.documents), ("fold", args.small), ("fold", args.large)]
            for kind, count in steps:
                print(f"{kind}: writing {count:,} changes ...", file=sys.stderr, flush=True)
                if kind == "load":
                    for start in range(0, count, 5000):
                        client.bench.orders.insert_many(
                            [
                                document(rng, n, filler)
                                for n in range(start, min(start + 5000, count))
                            ]
                        )
                else:
                    _updates(client, count, args.documents, rng)
                drained = drain_until_caught_up(stream, raw, store, lake)
                began = time.perf_counter()
                result = transform(spark, store, lake, stream)
                seconds = time.perf_counter() - began
                assert result.changes_added == drained, (result, drained)
                rows.append((kind, drained, result.rows, seconds))
        finally:
            stop_if_created(spark, created)
            raw.close()
            client.close()
            store.close()
            stop_mongod(mongod)
    lines = [
        f"### Spark transform (master {args.master}; documents of ~{args.doc_kb} KB; "
        f"SparkSession start, JVM included: {jvm_seconds:.1f} s, not counted below)\n",
        "| step | changes folded | rows in current after | seconds | changes/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, changes, current_rows, seconds in rows:
        label = (
            "initial load (inserts into an empty table)"
            if kind == "load"
            else (f"fold of {changes:,} updates into {args.documents:,} documents")
        )
        lines.append(
            f"| {label} | {changes:,} | {current_rows:,} | {seconds:.1f} | "
            f"{changes / seconds:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--doc-kb", type=float, default=0.5)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--seed", type=int, default=3)
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
