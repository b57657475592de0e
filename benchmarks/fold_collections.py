"""Database-stream benchmark: one run's fold over many small collections, and what deletion
vectors cost it.

    .venv/bin/python -m benchmarks.fold_collections       # 20 collections x 2,000 docs
    .venv/bin/python -m benchmarks.fold_collections --collections 2 --documents 100 \\
        --changes 20 --rounds 1                            # smoke

The production shape of `benchmarks.transform`: a long-lived Spark Connect server and each run
a whole `tidemark transform` process, timed from its start to its exit. Two database streams
watch the same `--collections` collections of `--documents` documents (~0.7 KB): one with
`deletion_vectors_from_bytes: 0` (every table has deletion vectors from its first commit, as
Tidemark wrote them before), one with the default (16 MB: these tables stay below it, so a
MERGE rewrites the files it touches). Each stream's first load is timed, then `--changes`
updates spread evenly over the collections, folded by each stream from the same saved state,
interleaved, `--rounds` times. The anchor, on the same Spark and in the same sitting: a full
recompute of every collection's newest documents from the change log. Prints markdown.
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

from pymongo import UpdateOne

from benchmarks.drain import document
from benchmarks.sitting import Home, sitting
from jobs.capture import drain_until_caught_up
from tidemark.config import load_config

# Two streams over one database; the name says when its tables get deletion vectors.
STREAMS = """streams:
  - name: vectors_always
    database: bench
    deletion_vectors_from_bytes: 0
    keep_versions: 100
    budget: {max_events: null, max_bytes: null, max_seconds: null}
  - name: vectors_when_large
    database: bench
    keep_versions: 100
    budget: {max_events: null, max_bytes: null, max_seconds: null}
"""


def recompute_newest(spark: Any, home: Home, stream: str, target: Path) -> None:
    """The anchor: every collection's newest documents out of its change log, on the same
    Spark, written as one Delta table partitioned by collection."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    tables = home.store.transforms.tables(stream)
    paths = [str(home.lake / t.path) for t in tables if t.kind == "changes" and t.coll]
    events = spark.read.format("delta").load(paths[0])
    for path in paths[1:]:
        events = events.unionByName(spark.read.format("delta").load(path))
    newest = Window.partitionBy("coll", "document_key").orderBy(F.col("event_id").desc())
    latest = (
        events.where(F.col("document_key").isNotNull())
        .withColumn("rn", F.row_number().over(newest))
        .where((F.col("rn") == 1) & (F.col("operation_type") != "delete"))
        .select("coll", "document_key", "event_id", "full_document")
    )
    latest.write.format("delta").partitionBy("coll").mode("overwrite").save(str(target))


def run(args: argparse.Namespace) -> str:
    rows: list[tuple[str, str, list[float], int, int]] = []
    with (
        tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work,
        sitting(Path(work), STREAMS, driver_memory=args.driver_memory, ui_port=4048) as here,
    ):
        home, client, raw, spark = here.home, here.client, here.raw, here.spark
        streams = load_config(home.root / "streams.yaml").streams
        names = [s.name for s in streams]
        for stream in streams:
            drain_until_caught_up(stream, raw, home.store, home.lake)
        rng = random.Random(args.seed)
        collections = [f"c{i:03d}" for i in range(args.collections)]
        for name in collections:
            batch = [document(rng, n, 300) for n in range(args.documents)]
            client.bench[name].insert_many(batch)
        for stream in streams:
            drain_until_caught_up(stream, raw, home.store, home.lake)
        for name in names:
            jobs, written = here.jobs(), home.curated_bytes()
            seconds = home.transform(name)[0]
            rows.append(
                ("first load", name, [seconds], here.jobs() - jobs, home.curated_bytes() - written)
            )
        per = max(1, args.changes // args.collections)
        for name in collections:
            client.bench[name].bulk_write(
                [
                    UpdateOne({"_id": rng.randrange(args.documents)}, {"$inc": {"rev": 1}})
                    for _ in range(per)
                ]
            )
        for stream in streams:
            drain_until_caught_up(stream, raw, home.store, home.lake)
        home.keep()
        folds: dict[str, list[float]] = {name: [] for name in names}
        counted: dict[str, tuple[int, int]] = {}
        for _ in range(args.rounds):
            for name in names:
                home.restore()
                jobs, written = here.jobs(), home.curated_bytes()
                folds[name].append(home.transform(name)[0])
                counted[name] = (here.jobs() - jobs, home.curated_bytes() - written)
        label = f"{per * len(collections):,} updates"
        for name in names:
            rows.append((label, name, folds[name], *counted[name]))
        anchor: list[float] = []
        for _ in range(args.rounds):
            target = Path(work) / "recomputed"
            shutil.rmtree(target, ignore_errors=True)
            jobs, clock = here.jobs(), time.perf_counter()
            recompute_newest(spark, home, names[-1], target)
            anchor.append(time.perf_counter() - clock)
        jobs = here.jobs() - jobs
        rows.append(("anchor: full recompute", "(Spark, in-process)", anchor, jobs, 0))
    return _table(args, rows)


def _table(args: argparse.Namespace, rows: list[tuple[str, str, list[float], int, int]]) -> str:
    lines = [
        f"### A database stream's fold ({args.collections} collections x {args.documents:,} "
        f"documents of ~0.7 KB; whole `tidemark transform` processes on a long-lived Connect "
        f"server, {args.driver_memory} driver; median of {args.rounds} interleaved rounds)\n",
        "| work | stream | seconds (median) | min | max | Spark jobs | MB written |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for work, name, seconds, jobs, written in rows:
        lines.append(
            f"| {work} | {name} | {statistics.median(seconds):.1f} | {min(seconds):.1f} | "
            f"{max(seconds):.1f} | {jobs} | {written / 1e6:,.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collections", type=int, default=20)
    parser.add_argument("--documents", type=int, default=2_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--seed", type=int, default=3)
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
