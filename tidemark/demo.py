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
    return results


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
