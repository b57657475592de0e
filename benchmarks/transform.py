"""Transform benchmark: the Spark transform's cost against the size of the change, not the table.

    .venv/bin/python -m benchmarks.transform    # 1M documents; 10k, 100k, 1M changes; compaction
    .venv/bin/python -m benchmarks.transform --documents 3000 --changes 100 500 3000  # smoke

Loads `--documents` inserts (the first run writes the base of `current`), then for each of
`--changes` writes that many updates of random documents, drains them, and times the
transform alone; then times a compaction of everything since the base. Each step is
measured with the SparkSession already up (its start is reported apart), and reports the
Spark jobs it launched and the bytes it wrote. A second table says where each run's time
went (the transform's own phase clocks). Prints markdown.

Each step then runs `--warm` more times from the same state (the state store restored from a
copy taken before the step; the lake's earlier attempts are left as orphans): the first run
of a query shape pays the JVM's compilation of Spark's code for it, which a long-lived Spark
(`tidemark spark start`) pays once, so the table gives both the first run and the median of
the warm ones.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient, UpdateOne

from benchmarks.drain import document
from jobs.capture import drain_until_caught_up
from jobs.transform import compact, transform
from resources.embedded_mongo import start_mongod, stop_mongod
from resources.mongo import connect
from resources.spark import SparkConfig, spark_session, stop_if_created
from state import StateStore
from tidemark.config import StreamConfig

UNBOUNDED = {"max_events": None, "max_bytes": None, "max_seconds": None}


@dataclass
class Step:
    label: str
    changes: int
    rows: int | None
    seconds: float  # the first run
    jobs: int
    bytes_written: int
    phases: dict[str, float]  # of the last run
    warm: list[float]  # the repeats' seconds


class _Store:
    """The benchmark's state store, which a step can copy and put back to run again."""

    def __init__(self, path: Path) -> None:
        self.path, self.copy = path, path.with_suffix(".before-step")
        self.store = StateStore(f"sqlite:///{path}")

    def keep(self) -> None:
        _backup(self.path, self.copy)

    def restore(self) -> None:
        self.store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        _backup(self.copy, self.path)
        self.store = StateStore(f"sqlite:///{self.path}")


def _backup(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (its write-ahead log included)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


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


def _lake_bytes(lake: Path) -> int:
    return sum(p.stat().st_size for p in (lake / "curated").rglob("*") if p.is_file())


class _Meter:
    """Spark jobs (the classic session's status tracker) and curated bytes of one step."""

    def __init__(self, spark: Any, lake: Path) -> None:
        self.spark, self.lake, self.group = spark, lake, 0

    def __enter__(self) -> _Meter:
        self.group += 1
        self.spark.sparkContext.setJobGroup(f"step-{self.group}", "benchmark step")
        self.bytes_before = _lake_bytes(self.lake)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started
        tracker = self.spark.sparkContext.statusTracker()
        self.jobs = len(tracker.getJobIdsForGroup(f"step-{self.group}"))
        self.bytes_written = _lake_bytes(self.lake) - self.bytes_before


def run(args: argparse.Namespace) -> str:
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work:
        biggest = max(args.changes, default=0)
        oplog_mb = max(1024, int((args.documents + biggest) * args.doc_kb * 2.5 / 1024) + 512)
        mongod = start_mongod(Path(work) / "data", oplog_size_mb=oplog_mb)
        client = MongoClient(mongod.uri, tz_aware=True)
        raw = connect(mongod.uri, raw=True)
        state = _Store(Path(work) / "state.db")
        lake = Path(work) / "lake"
        stream = StreamConfig(
            name="bench",
            database="bench",
            collection="orders",
            budget=UNBOUNDED,
            keep_versions=100,
            compaction={"delta_ratio": 100.0, "max_deltas": 100},  # the benchmark compacts
        )
        started = time.perf_counter()
        spark, created = spark_session(SparkConfig(master=args.master, driver_memory="4g"))
        spark.range(1).count()
        jvm_seconds = time.perf_counter() - started
        meter = _Meter(spark, lake)

        def timed(label: str, changes: int, work: Any) -> tuple[Any, Step]:
            """`work(store)` once, then `args.warm` more times from the same state."""
            state.keep()
            warm: list[float] = []
            for attempt in range(1 + args.warm):
                if attempt:
                    state.restore()
                with meter:
                    result = work(state.store)
                if attempt:
                    warm.append(meter.seconds)
                else:
                    first = (meter.seconds, meter.jobs, meter.bytes_written)
            phases = getattr(result, "seconds", {})
            rows = result.rows
            return result, Step(label, changes, rows, *first, phases, warm)

        try:
            drain_until_caught_up(stream, raw, state.store, lake)
            rng = random.Random(args.seed)
            filler = max(0, int(args.doc_kb * 1024) - 420)
            plan = [("load", args.documents)] + [("fold", n) for n in args.changes]
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
                else:
                    _updates(client, count, args.documents, rng)
                drained = drain_until_caught_up(stream, raw, state.store, lake)
                label = (
                    f"initial load, {count:,} documents"
                    if kind == "load"
                    else f"{count:,} updates into {args.documents:,}"
                )
                result, step = timed(
                    label, drained, lambda store: transform(spark, store, lake, stream)
                )
                assert result.changes_added == drained, (result, drained)
                step.label += f" ({result.kind})" if kind != "load" else ""
                steps.append(step)
            print("compaction ...", file=sys.stderr, flush=True)
            compacted, step = timed(
                "compaction", 0, lambda store: compact(spark, store, lake, stream)
            )
            step.label = (
                f"compaction: base + {compacted.deltas} deltas -> one base "
                f"({compacted.rows_written:,} rows written)"
            )
            steps.append(step)
        finally:
            stop_if_created(spark, created)
            raw.close()
            client.close()
            state.store.close()
            stop_mongod(mongod)
    return _tables(args, jvm_seconds, steps)


def _tables(args: argparse.Namespace, jvm_seconds: float, steps: list[Step]) -> str:
    warm = args.warm
    lines = [
        f"### Spark transform (master {args.master}; documents of ~{args.doc_kb} KB; "
        f"SparkSession start, JVM included: {jvm_seconds:.1f} s, not counted below)\n",
        f"| work | changes | rows in current after | first run s | warm s (median of {warm}) "
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
    phases = ["plan", "spark_session", "change_log", "current", "commit"]
    lines += [
        "\n### Where a run's time goes (seconds, the transform's own phase clocks, last run)\n",
        "| work | " + " | ".join(phases) + " |",
        "|---|" + "---:|" * len(phases),
    ]
    for s in steps:
        if s.phases:
            cells = " | ".join(f"{s.phases.get(p, 0.0):.2f}" for p in phases)
            lines.append(f"| {s.label} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--doc-kb", type=float, default=0.5)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--warm", type=int, default=2, help="repeats of each step (default 2)")
    print(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
