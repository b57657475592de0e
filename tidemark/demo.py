"""`tidemark demo` (and `make demo`): a sample workload, a drain, and a summary of the lake.

On a first run the stream has no position yet and starts "now", so the demo drains once before
writing (that commits the starting token), then writes the workload and drains it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from jobs.drain import DrainResult, drain
from resources.mongo import connect
from tidemark.runtime import Runtime
from tidemark.table import format_table, human_bytes
from tidemark.tokens import ts_to_datetime
from tidemark.workload import run_workload


def run_demo(runtime: Runtime, orders: int = 500, seed: int | None = None) -> list[DrainResult]:
    streams = [s for s in runtime.config.streams if s.scope == "collection"]
    if not streams:
        raise SystemExit("The demo needs a collection stream in the streams config.")
    results = []
    writer = connect(runtime.uri)
    try:
        for stream in streams:
            checkpoint = runtime.store.checkpoint(stream.name)
            if checkpoint is None or not checkpoint.has_position:
                drain(stream, runtime.client, runtime.store, runtime.lake_root)
            assert stream.database and stream.collection
            done = run_workload(
                writer,
                stream.database,
                stream.collection,
                orders=orders,
                seed=seed if seed is not None else runtime.store.batch_count(stream.name) + 7,
            )
            print(
                f"workload on {stream.namespace}: " + ", ".join(f"{v} {k}" for k, v in done.items())
            )
            results.append(drain(stream, runtime.client, runtime.store, runtime.lake_root))
    finally:
        writer.close()
    print()
    print(summary(results, runtime.lake_root))
    print()
    show_tables(runtime, streams)
    return results


def show_tables(runtime: Runtime, streams: list) -> None:
    """Run the Spark transform and print a few rows of `current` and `changes`."""
    from jobs.tables import read_changes, read_current
    from jobs.transform import transform
    from resources.spark import spark_session, stop_if_created

    print("Starting Spark for the transform ...")
    spark, created = spark_session()
    try:
        for stream in streams:
            result = transform(spark, runtime.store, runtime.lake_root, stream)
            print(
                f"transform {stream.name}: version {result.version}, {result.changes_added:,} "
                f"new changes, {result.duplicates_skipped:,} duplicates skipped, "
                f"{result.rows or 0:,} rows in current ({result.duration_s:.1f} s)"
            )
            current = read_current(spark, runtime.store, runtime.lake_root, stream.name)
            doc_fields = [
                name
                for name, dtype in current.dtypes
                if not name.startswith("_tm_") and not dtype.startswith(("struct", "array"))
            ][:6]
            rows = current.select("_tm_coll", *doc_fields).limit(5).collect()
            print(f"\ncurrent ({current.count():,} rows; document fields as columns):")
            print(format_table(["coll", *doc_fields], [[_short(v) for v in r] for r in rows]))
            changes = read_changes(spark, runtime.lake_root, stream.name)
            recent = (
                changes.orderBy(changes.event_id.desc())
                .select("cluster_time", "operation_type", "document_key", "updated_fields")
                .limit(5)
                .collect()
            )
            print(f"\nchanges ({changes.count():,} events, newest first):")
            print(
                format_table(
                    ["cluster time", "operation", "document key", "updated fields"],
                    [[_short(v) for v in r] for r in recent],
                )
            )
    finally:
        stop_if_created(spark, created)


def _short(value: object, width: int = 44) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def summary(results: list[DrainResult], lake_root: Path) -> str:
    rows = []
    for r in results:
        by_type = Counter(r.events_by_type)
        token_time = ts_to_datetime(r.token_cluster_time)
        rows.append(
            [
                r.stream,
                f"{r.events:,}",
                ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items())) or "-",
                len(r.files),
                human_bytes(r.file_bytes),
                f"{token_time:%Y-%m-%d %H:%M:%S} UTC" if token_time else "-",
                r.stop_reason,
                f"{r.duration_s:.2f} s",
            ]
        )
    table = format_table(
        ["stream", "events", "by type", "files", "bytes", "token time", "stopped", "took"], rows
    )
    files = [f"  {lake_root / f.path}" for r in results for f in r.files]
    return "\n".join([table, "", f"raw zone: {lake_root / 'raw'}", *files])
