"""Transform benchmark: what a `tidemark transform` costs against the size of its change.

    .venv/bin/python -m benchmarks.transform      # 1M documents; 1k, 10k, 100k changes
    .venv/bin/python -m benchmarks.transform --documents 3000 --changes 100 1000  # smoke

The production shape: a long-lived Spark Connect server (`tidemark spark start`, the default
2 GB driver) and each run a whole `tidemark transform` process, timed from its start to its
exit. One collection of ~0.7 KB documents: `--documents` inserts (the first load), then for
each of `--changes` that many updates of random documents, then for each of `--inserts` that
many new documents (an insert-only change: an append-only collection's runs). Each step runs
once, then `--warm` more times from the same state (the state store and the curated tables
copied back), so the table gives the first run and the warm median. A quiet run (nothing
new) is timed too.

Beside them, on the same Spark and in the same sitting, the anchor: a plain full recompute of
`current` from the `changes` tables (the newest event per key, typed columns, written as a new
Delta table). Each row reports the Spark jobs the server ran (its REST API) and the bytes
written to the lake. Last, `current`'s bytes per document against the typed columns alone.
Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymongo import MongoClient, UpdateOne

from benchmarks.drain import document
from benchmarks.sitting import Home, sitting
from jobs.capture import drain_until_caught_up
from state import StateStore
from tidemark.config import StreamConfig

STREAMS = """streams:
  - name: bench
    database: bench
    collection: orders
    keep_versions: 100
    budget: {max_events: null, max_bytes: null, max_seconds: null}
"""


@dataclass
class Step:
    label: str
    changes: int
    seconds: float  # the first run, whole process
    warm: list[float] = field(default_factory=list)
    jobs: int = 0
    bytes_written: int = 0
    rows: int | None = None


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


def _recompute(spark: Any, home: Home, store: StateStore, target: Path) -> None:
    """The anchor: `current` from scratch out of the change log, on the same Spark (the
    newest event per key, its typed columns parsed by Spark's `from_json` in the JVM)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    tables = home.store.transforms.tables("bench")
    changes = [t for t in tables if t.kind == "changes"]
    current = next(t for t in tables if t.kind == "current")
    fields = json.loads(current.doc_schema)
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(fields)
    path = home.lake / changes[0].path
    if not path.exists():
        found = sorted(str(p) for p in (home.lake / "curated").rglob("*") if p.is_dir())
        raise RuntimeError(f"{path} missing; have {found[:30]}")
    events = spark.read.format("delta").load(str(path))
    newest = Window.partitionBy("document_key").orderBy(F.col("event_id").desc())
    latest = (
        events.where(F.col("document_key").isNotNull())
        .withColumn("rn", F.row_number().over(newest))
        .where((F.col("rn") == 1) & (F.col("operation_type") != "delete"))
    )
    parsed = F.from_json("full_document", schema)
    typed = latest.select(
        F.col("document_key").alias("_tm_key"),
        "event_id",
        *(parsed.getField(f.name).alias(f.name) for f in schema.fields),
    )
    typed.write.format("delta").mode("overwrite").save(str(target))


def _table_bytes(spark: Any, path: Path) -> tuple[int, int]:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return int(detail["sizeInBytes"]), int(detail["numFiles"])


def run(args: argparse.Namespace) -> str:
    steps: list[Step] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work:
        biggest = max(args.changes, default=0)
        oplog_mb = max(1024, int((args.documents + biggest) * args.doc_kb * 2.5 / 1024) + 512)
        stream = StreamConfig(
            name="bench",
            database="bench",
            collection="orders",
            budget={"max_events": None, "max_bytes": None, "max_seconds": None},
            keep_versions=100,
        )
        with sitting(
            Path(work),
            STREAMS,
            driver_memory=args.driver_memory,
            ui_port=4047,
            oplog_size_mb=oplog_mb,
        ) as here:
            home, client, raw, spark = here.home, here.client, here.raw, here.spark
            server_seconds = here.server_seconds
            drain_until_caught_up(stream, raw, home.store, home.lake)
            rng = random.Random(args.seed)
            filler = max(0, int(args.doc_kb * 1024) - 420)
            plan = [("load", args.documents)] + [("fold", n) for n in args.changes]
            plan += [("insert", n) for n in args.inserts]
            next_id = args.documents
            for kind, count in plan:
                print(f"{kind}: writing {count:,} changes ...", file=sys.stderr, flush=True)
                if kind == "load":
                    for start in range(0, count, 5000):
                        client.bench.orders.insert_many(
                            [
                                document(rng, n, filler)
                                for n in range(start, min(start + 5000, count))
                            ]
                        )
                elif kind == "insert":
                    client.bench.orders.insert_many(
                        [document(rng, n, filler) for n in range(next_id, next_id + count)]
                    )
                    next_id += count
                else:
                    _updates(client, count, args.documents, rng)
                drained = drain_until_caught_up(stream, raw, home.store, home.lake)
                label = {
                    "load": f"first load of {count:,} documents",
                    "fold": f"{count:,} updates into {args.documents:,}",
                    "insert": f"{count:,} inserts into {args.documents:,}",
                }[kind]
                home.keep()
                step = Step(label, drained, 0.0)
                for attempt in range(1 + args.warm):
                    if attempt:
                        home.restore()
                    jobs, written = here.jobs(), home.curated_bytes()
                    seconds, _ = home.transform("bench")
                    if attempt:
                        step.warm.append(seconds)
                    else:
                        step.seconds = seconds
                        step.jobs = here.jobs() - jobs
                        step.bytes_written = home.curated_bytes() - written
                latest = home.store.transforms.latest("bench")
                step.rows = latest.rows if latest else None
                steps.append(step)

            quiet = Step("a quiet run (nothing new)", 0, 0.0)
            jobs = here.jobs()
            quiet.seconds, out = home.transform("bench")
            quiet.warm = [home.transform("bench")[0] for _ in range(args.warm)]
            quiet.jobs = here.jobs() - jobs
            steps.append(quiet)
            if "nothing new" not in out:
                notes.append(f"the quiet run printed: {out!r}")

            anchor = Step("anchor: full recompute of current from changes", 0, 0.0)
            target = Path(work) / "recomputed"
            for attempt in range(1 + args.warm):
                shutil.rmtree(target, ignore_errors=True)
                jobs, clock = here.jobs(), time.perf_counter()
                _recompute(spark, home, home.store, target)
                seconds = time.perf_counter() - clock
                if attempt:
                    anchor.warm.append(seconds)
                else:
                    anchor.seconds, anchor.jobs = seconds, here.jobs() - jobs
            anchor.bytes_written = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
            steps.append(anchor)

            current = next(t for t in home.store.transforms.tables("bench") if t.kind == "current")
            current_path = home.lake / current.path
            size, files = _table_bytes(spark, current_path)
            typed_path = Path(work) / "typed-only"
            frame = spark.read.format("delta").load(str(current_path))
            typed = [c for c in frame.columns if not c.startswith("_tm_")]
            frame.select(*[f"`{c}`" for c in typed]).write.format("delta").save(str(typed_path))
            typed_size, _ = _table_bytes(spark, typed_path)
            spark.sql(f"OPTIMIZE delta.`{current_path}`").collect()
            spark.sql(f"REORG TABLE delta.`{current_path}` APPLY (PURGE)").collect()
            optimized, optimized_files = _table_bytes(spark, current_path)
            rows = current.rows or 1
    return _tables(
        args,
        server_seconds,
        steps,
        (size, files, optimized, optimized_files, typed_size, rows),
        notes,
    )


def _tables(
    args: argparse.Namespace,
    server_seconds: float,
    steps: list[Step],
    sizes: tuple[int, int, int, int, int, int],
    notes: list[str],
) -> str:
    warm = args.warm
    lines = [
        f"### Transform (a whole `tidemark transform` process against a long-lived Spark "
        f"Connect server, {args.driver_memory} driver; one collection of ~{args.doc_kb} KB "
        f"documents; the server's start, {server_seconds:.1f} s, not counted)\n",
        f"| work | events | rows in current after | first run s | warm s (median of {warm}) "
        "| Spark jobs | MB written |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        rows = f"{s.rows:,}" if s.rows is not None else "-"
        median = f"{statistics.median(s.warm):.1f}" if s.warm else "-"
        lines.append(
            f"| {s.label} | {s.changes:,} | {rows} | {s.seconds:.1f} | {median} | {s.jobs} | "
            f"{s.bytes_written / 1e6:,.1f} |"
        )
    size, files, optimized, optimized_files, typed_size, rows = sizes
    lines += [
        "\n### `current`'s bytes on disk\n",
        "| table | files | bytes per document | x the typed columns alone |",
        "|---|---:|---:|---:|",
        f"| after the runs above | {files} | {size / rows:,.0f} | {size / typed_size:.2f} |",
        f"| after OPTIMIZE and purge | {optimized_files} | {optimized / rows:,.0f} | "
        f"{optimized / typed_size:.2f} |",
        f"| typed columns alone (Delta, same rows) | - | {typed_size / rows:,.0f} | 1.00 |",
    ]
    lines += [f"\nNote: {n}" for n in notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--inserts", type=int, nargs="*", default=[1_000])
    parser.add_argument("--doc-kb", type=float, default=0.7)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--warm", type=int, default=2, help="repeats of each step (default 2)")
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
