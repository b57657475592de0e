"""`tidemark demo` (and `make demo`): a sample workload, then every asset materialized through
Dagster in process, and a summary of what landed in the lake.

On a first run the stream has no position yet and starts "now", so the demo runs the sync job
once before writing (that commits the starting token), then writes the workload and runs it
again. Runs go to the persistent DAGSTER_HOME, so `make ui` shows them afterwards.

Spark is the home's long-lived Connect server unless TIDEMARK_SPARK_REMOTE or
TIDEMARK_SPARK_MASTER says otherwise: the demo starts it when it does not run and leaves it
running, so the next demo and `make ui`'s runs skip the JVM start (the output says how to
stop it).
"""

from __future__ import annotations

import os
from typing import Any

from resources.mongo import connect
from resources.spark import REMOTE_ENV, SparkConfig, spark_session, stop_if_created
from tidemark.cli.runtime import Runtime, resolve_spark_remote
from tidemark.cli.table import format_table, human_bytes
from tidemark.cli.workload import run_workload


def run_demo(runtime: Runtime, orders: int = 500) -> None:
    streams = [s for s in runtime.config.streams if s.scope == "collection"]
    if not streams:
        raise SystemExit("The demo needs a collection stream in the streams config.")
    remote = resolve_spark_remote(runtime.settings)
    if remote:
        # Before `orchestration` (and with it the transform) is imported: see its docstring.
        os.environ[REMOTE_ENV] = remote
    from orchestration.in_process import local_definitions, run_sync
    from tidemark.cli.dagster_env import dagster_home

    os.environ.setdefault("DAGSTER_HOME", str(dagster_home(runtime.settings)))
    spark_config = SparkConfig(master=runtime.settings.spark_master or "local[*]", remote=remote)
    defs = local_definitions(
        runtime.config,
        runtime.uri,
        runtime.settings.state_url,
        str(runtime.lake_root),
        spark_master=spark_config.master,
        spark_remote=remote,
    )
    print(
        f"Spark (the transform's engine): the Connect server at {remote}"
        if remote
        else "Starting Spark (the transform's engine) ...",
        flush=True,
    )
    spark, created = spark_session(spark_config)  # shared with the runs, printed from after
    writer = connect(runtime.uri)
    try:
        for stream in streams:
            checkpoint = runtime.store.checkpoint(stream.name)
            if checkpoint is None or not checkpoint.has_position:
                run_sync(defs, stream)  # the first run takes the starting position
            assert stream.database and stream.collection
            done = run_workload(
                writer,
                stream.database,
                stream.collection,
                orders=orders,
                seed=runtime.store.batch_count(stream.name) + 7,
            )
            print(
                f"workload on {stream.namespace}: " + ", ".join(f"{v} {k}" for k, v in done.items())
            )
            result = run_sync(defs, stream)
            print(
                f"Dagster run {result.run_id[:8]} of {stream.name}_sync: "
                f"{'success' if result.success else 'FAILED'}\n"
            )
            print(summary(stream.name, result))
            print(collection_tables(runtime, stream.name))
            show_tables(spark, runtime, stream.name)
    finally:
        writer.close()
        stop_if_created(spark, created)
    print(f"\nraw zone: {runtime.lake_root / 'raw'}")
    print(f"curated zone: {runtime.lake_root / 'curated'}")
    if remote and not runtime.settings.spark_remote:
        print(
            f"Spark: the local Connect server keeps running at {remote} for the next runs "
            "(`tidemark spark status`); `tidemark spark stop` stops it."
        )
    print("See the runs, the asset graph and the checks with `make ui`.")


def summary(stream: str, result: Any) -> str:
    from orchestration.in_process import check_outcomes, materialization_metadata

    raw = materialization_metadata(result, "raw_changes")
    current = materialization_metadata(result, "current")
    changes = materialization_metadata(result, "changes")
    by_type = ", ".join(
        f"{k.removeprefix('events_')} {v:,}"
        for k, v in sorted(raw.items())
        if k.startswith("events_") and v
    )
    token = raw.get("token_time")
    checks = check_outcomes(result)
    rows = [
        ["events", f"{raw.get('events', 0):,}  ({by_type or 'none'})"],
        ["files / bytes", f"{raw.get('files', 0)} / {human_bytes(raw.get('file_bytes', 0))}"],
        ["token time", f"{_utc(token)}" if token else "-"],
        ["lag", f"{raw.get('lag_seconds', 0):.0f} s"],
        ["changes added", f"{changes.get('changes_added', 0):,} events"],
        ["current", f"version {current.get('version', '-')}, {current.get('rows', 0):,} rows"],
        ["checks", ", ".join(f"{k} {v}" for k, v in sorted(checks.items()))],
    ]
    return format_table([stream, ""], rows)


def _utc(timestamp: float) -> str:
    from datetime import UTC, datetime

    return f"{datetime.fromtimestamp(timestamp, UTC):%Y-%m-%d %H:%M:%S} UTC"


def collection_tables(runtime: Runtime, stream: str) -> str:
    """Per collection, its Delta tables: what any engine reads (rows, version, path)."""
    from jobs.catalog import tables

    rows = [
        [t.name, t.table, f"{t.rows:,}", t.version, str(t.location)]
        for t in tables(runtime.store, runtime.lake_root, stream)
    ]
    header = ["collection", "table", "rows", "delta version", "Delta table"]
    return f"\n{stream}'s Delta tables:\n" + format_table(header, rows)


def show_tables(spark: Any, runtime: Runtime, stream: str) -> None:
    from jobs.transform import read_changes, read_current

    current = read_current(spark, runtime.store, runtime.lake_root, stream)
    doc_fields = [
        name
        for name, dtype in current.dtypes
        if not name.startswith("_tm_") and not dtype.startswith(("struct", "array"))
    ][:6]
    rows = current.select("_tm_coll", *doc_fields).limit(5).collect()
    print(f"\ncurrent ({current.count():,} rows; document fields as columns):")
    print(format_table(["coll", *doc_fields], [[_short(v) for v in r] for r in rows]))
    changes = read_changes(spark, runtime.store, runtime.lake_root, stream)
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


def _short(value: object, width: int = 44) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."
