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
from collections import Counter
from typing import Any

from jobs.curated_zone import OWN_PREFIX
from resources.mongo import connect
from resources.spark import REMOTE_ENV, SparkConfig, spark_session, stop_if_created
from tidemark.cli.runtime import Runtime, resolve_spark_remote
from tidemark.cli.table import format_table, human_bytes
from tidemark.cli.workload import stream_workload
from tidemark.config import StreamConfig


def run_demo(runtime: Runtime, orders: int = 500) -> None:
    # A cluster stream has no database of its own for the workload to write to.
    streams = [s for s in runtime.config.streams if s.scope in ("collection", "database")]
    if not streams:
        raise SystemExit("The demo needs a collection or database stream in the streams config.")
    remote = resolve_spark_remote(runtime.settings)
    if remote:
        # Before `orchestration` (and with it the transform) is imported: see its docstring.
        os.environ[REMOTE_ENV] = remote
    from orchestration.in_process import listed_tables, run_checks, run_sync
    from tidemark.cli.dagster_env import dagster_home

    os.environ.setdefault("DAGSTER_HOME", str(dagster_home(runtime.settings)))
    spark_config = SparkConfig(master=runtime.settings.spark_master or "local[*]", remote=remote)

    def definitions() -> Any:
        from orchestration.in_process import local_definitions

        return local_definitions(
            runtime.config,
            runtime.uri,
            runtime.settings.state_url,
            str(runtime.lake_root),
            spark_master=spark_config.master,
            spark_remote=remote,
        )

    defs = definitions()
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
            done = stream_workload(
                writer, stream, orders=orders, seed=runtime.store.batch_count(stream.name) + 7
            )
            for namespace, ops in done.items():
                print(f"workload on {namespace}: " + ", ".join(f"{v} {k}" for k, v in ops.items()))
            result = run_sync(defs, stream)
            print(
                f"Dagster run {result.run_id[:8]} of {stream.name}_sync: "
                f"{'success' if result.success else 'FAILED'}"
            )
            checked = [result]
            known = listed_tables(defs, stream)
            defs = definitions()  # as a reload of the code location would see the store
            if listed_tables(defs, stream) - known:
                # Collections new to the definitions: the run reported them by their keys; one
                # more run evaluates their checks (no Spark, a few seconds).
                again = run_checks(defs, stream)
                checked.append(again)
                print(
                    f"Dagster run {again.run_id[:8]} of the checks of {stream.name}'s new "
                    f"collections: {'success' if again.success else 'FAILED'}"
                )
            print(f"\n{summary(stream, result, checked)}")
            print(collection_tables(runtime, stream.name))
            show_tables(spark, runtime, stream)
            print()
    finally:
        writer.close()
        stop_if_created(spark, created)
    print(f"raw zone: {runtime.lake_root / 'raw'}")
    print(f"curated zone: {runtime.lake_root / 'curated'}")
    if remote and not runtime.settings.spark_remote:
        print(
            f"Spark: the local Connect server keeps running at {remote} for the next runs "
            "(`tidemark spark status`); `tidemark spark stop` stops it."
        )
    print("See the runs, the asset graph and the checks with `make ui`.")


def summary(stream: StreamConfig, result: Any, checked: list[Any]) -> str:
    """The run in a few lines: what the drain took, what the fold added, each collection's
    `current` as the run left it, and the checks' outcomes (counted over collections)."""
    from orchestration.in_process import check_outcomes, materializations, table_named

    made = materializations(result)
    raw = made.get((stream.name, "raw_changes"), {})
    curated = made.get((stream.name, "curated"), {})
    by_type = ", ".join(
        f"{k.removeprefix('events_')} {v:,}"
        for k, v in sorted(raw.items())
        if k.startswith("events_") and v
    )
    token = raw.get("token_time")
    rows = [
        ["events", f"{raw.get('events', 0):,}  ({by_type or 'none'})"],
        ["files / bytes", f"{raw.get('files', 0)} / {human_bytes(raw.get('file_bytes', 0))}"],
        ["token time", f"{_utc(token)}" if token else "-"],
        ["lag", f"{raw.get('lag_seconds', 0):.0f} s"],
        ["changes added", f"{curated.get('changes_added', 0):,} events"],
    ]
    for path, metadata in sorted(made.items()):
        table = table_named(path, stream)
        if table is not None and table[2] == "current":
            label = "current" if stream.scope == "collection" else f"current {table[1]}"
            rows.append(
                [
                    label,
                    f"Delta version {metadata.get('delta_version', '-')}, "
                    f"{metadata.get('dagster/row_count', 0):,} rows",
                ]
            )
    outcomes: dict[tuple[tuple[str, ...], str], str] = {}
    for run in checked:  # a later run's outcome of a check replaces an earlier one's
        outcomes.update(check_outcomes(run))
    counted = Counter((name, outcome) for (_, name), outcome in outcomes.items())
    checks = ", ".join(
        f"{name} {outcome}" + (f" x{n}" if n > 1 else "")
        for (name, outcome), n in sorted(counted.items())
    )
    rows.append(["checks", checks])
    return format_table([stream.name, ""], rows)


def _utc(timestamp: float) -> str:
    from datetime import UTC, datetime

    from tidemark.tokens import moment_text

    return moment_text(datetime.fromtimestamp(timestamp, UTC))


def collection_tables(runtime: Runtime, stream: str) -> str:
    """Per collection, its Delta tables: what any engine reads (rows, version, path)."""
    from jobs.catalog import tables

    rows = [
        [t.name, t.table, f"{t.rows:,}", t.delta_version, str(t.location)]
        for t in tables(runtime.store, runtime.lake_root, stream)
    ]
    header = ["collection", "table", "rows", "delta version", "Delta table"]
    return f"\n{stream}'s Delta tables:\n" + format_table(header, rows)


def show_tables(spark: Any, runtime: Runtime, stream: StreamConfig) -> None:
    """A few rows of each collection's `current` (its own document fields as columns), then
    the newest events of the stream's `changes`."""
    from jobs.catalog import tables
    from jobs.transform import read_changes, read_current

    found = tables(runtime.store, runtime.lake_root, stream.name)
    for table in found:
        if table.table != "current":
            continue
        current = read_current(
            spark, runtime.store, runtime.lake_root, stream.name, db=table.db, coll=table.coll
        )
        doc_fields = [
            name
            for name, dtype in current.dtypes
            if not name.startswith(OWN_PREFIX) and not dtype.startswith(("struct", "array"))
        ][:6]
        rows = current.select(*doc_fields).limit(5).collect()
        print(f"\n{table.name} current ({table.rows:,} rows; document fields as columns):")
        print(format_table(doc_fields, [[_short(v) for v in r] for r in rows]))
    changes = read_changes(spark, runtime.store, runtime.lake_root, stream.name)
    recent = (
        changes.orderBy(changes.event_id.desc())
        .select("coll", "cluster_time", "operation_type", "document_key", "updated_fields")
        .limit(5)
        .collect()
    )
    events = sum(t.rows for t in found if t.table == "changes")  # the catalog's: no Spark job
    print(f"\n{stream.name} changes ({events:,} events, newest first):")
    print(
        format_table(
            ["coll", "cluster time", "operation", "document key", "updated fields"],
            [[_short(v, 36) for v in r] for r in recent],
        )
    )


def _short(value: object, width: int = 44) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."
