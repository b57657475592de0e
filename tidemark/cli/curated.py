"""The CLI's commands over the curated tables: `tidemark transform` and `tidemark tables`.

`transform` does the Dagster step's work (`jobs.transform.transform`, under the same stream
lease), so an operator can fold without Dagster; Spark starts only for a stream with new
batches. `tables` reads the state store only (no Spark): per collection, the Delta table's
path, version, rows and the run that made it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jobs.catalog import TableState, tables
from jobs.curated_zone import OWN_PREFIX
from resources.spark import (
    SparkConfig,
    discard_session,
    prepare_connect_mode,
    spark_session,
    stop_if_created,
)
from tidemark.cli.progress import terminal_progress
from tidemark.cli.runtime import Runtime, StreamFailures, resolve_spark_remote
from tidemark.cli.table import format_table, iso_utc, print_json
from tidemark.errors import LeaseHeld, SparkServerLost, StreamArgumentMissing


def transform_command(runtime: Runtime, args: argparse.Namespace) -> int:
    if args.all == bool(args.stream):
        raise StreamArgumentMissing("Name one stream to transform, or pass --all.", "")
    streams = runtime.config.streams if args.all else [runtime.config.stream(args.stream)]
    with lazy_spark(runtime) as (session, opened):
        return _transform_streams(runtime, args, streams, session, opened)


@contextmanager
def lazy_spark(runtime: Runtime) -> Iterator[tuple[Callable[[], Any], list[tuple[Any, bool]]]]:
    """A Spark session made on first use (the home's Connect server unless a master is set,
    as `tidemark demo` and `ui` do), stopped at the end if this made it. The process's Spark
    mode is set before the first query makes the transform's UDFs (see prepare_connect_mode)."""
    settings = runtime.settings
    connect = bool(settings.spark_remote or not settings.spark_master)
    prepare_connect_mode("sc://" if connect else None)
    opened: list[tuple[Any, bool]] = []

    def session() -> Any:
        if not opened:
            remote = resolve_spark_remote(settings) if connect else None
            config = SparkConfig(master=settings.spark_master or "local[*]", remote=remote)
            opened.append(spark_session(config))
        return opened[0][0]

    try:
        yield session, opened
    finally:
        for spark, created in opened:
            stop_if_created(spark, created)


def _transform_streams(
    runtime: Runtime,
    args: argparse.Namespace,
    streams: list[Any],
    session: Callable[[], Any],
    opened: list[tuple[Any, bool]],
) -> int:
    from jobs.transform import transform

    def one(stream: Any) -> Any:
        try:
            return transform(
                session, runtime.store, runtime.lake_root, stream, progress=terminal_progress()
            )
        except SparkServerLost:
            # The next stream asks for a fresh session: the home's server is started again
            # (resolve_spark_remote), so one stream's crash does not fail the others.
            for spark, _ in opened:
                discard_session(spark)
            opened.clear()
            raise

    rows = []
    failures = StreamFailures.of(runtime.config) if args.all else StreamFailures()
    for stream in streams:
        try:
            r = one(stream)
        except LeaseHeld as exc:
            if not args.all:
                raise
            rows.append([stream.name, "-", "-", "-", "-", "-", f"skipped: {exc.problem}"])
            continue
        except Exception as exc:  # under --all, one stream's failure stops no other
            if not args.all:
                raise
            failures.failed.append((stream.name, exc))
            rows.append([stream.name, "-", "-", "-", "-", "-", "FAILED (see below)"])
            continue
        made = f"{r.run} ({r.kind})" if r.run is not None else "-"
        rows.append(
            [
                stream.name,
                r.batches,
                f"{r.events_read:,}",
                f"{r.changes_added:,}",
                made,
                f"{r.rows:,}" if r.rows is not None else "-",
                f"{r.duration_s:.2f} s" if r.batches else "nothing new",
            ]
        )
    header = ["stream", "batches", "events", "changes added", "run", "rows", "took"]
    print(format_table(header, rows))
    return failures.report()


def tables_command(runtime: Runtime, as_json: bool = False) -> int:
    rows, documents = [], []
    for stream in runtime.config.streams:
        found = tables(runtime.store, runtime.lake_root, stream.name)
        documents += [_table_json(t) for t in found]
        if not found:
            rows.append(
                [stream.name, "-", "-", "-", "-", "-", "-", "no table yet: run the transform"]
            )
        for t in found:
            rows.append(
                [
                    stream.name,
                    t.name,
                    t.table,
                    t.delta_version,
                    f"{t.rows:,}",
                    t.run,
                    str(t.location),
                    schema_summary(t),
                ]
            )
    if as_json:
        # A stream without a table yet has no entry; stdout holds the one document only.
        print_json({"tables": documents})
    else:
        header = ["stream", "collection", "table", "delta version", "rows", "run", "path"]
        print(format_table([*header, "columns"], rows))
    return 0


def _table_json(table: TableState) -> dict[str, Any]:
    return {
        "stream": table.stream,
        "db": table.db,
        "collection": table.coll,
        "table": table.table,
        "format": "delta",
        "delta_version": table.delta_version,
        "run": table.run,
        "rows": table.rows,
        "committed_at": iso_utc(table.committed_at),
        "location": str(table.location),
        "columns": [{"name": c.name, "type": c.type} for c in table.columns],
    }


def schema_summary(table: TableState, shown: int = 4) -> str:
    """The document columns with their types (all columns for `changes`), a few by name."""
    columns = [c for c in table.columns if not c.name.startswith(OWN_PREFIX)]
    names = ", ".join(f"{c.name} {c.type}" for c in columns[:shown])
    more = f", +{len(columns) - shown} more" if len(columns) > shown else ""
    return f"{len(columns)}: {names}{more}" if columns else "0"
