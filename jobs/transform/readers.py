"""Tidemark's own readers of the curated tables: a stream's `changes` and `current`, every
collection's together or one collection's, at the newest committed run or an older one, and
each live row's exact document (`exact_documents`, joined from the change log).

Any engine can read one collection's table by pointing at its Delta path; these readers add
what spans tables: the state store says which tables a stream has and which Delta version each
had when a run committed (`run=N` is time travel to run N), so a commit a killed run left
beyond the store's record is never read. Several collections read as one frame carry
`curated_zone.NAMESPACE_COLUMNS` first; a field typed differently in two collections reads as
a string.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from jobs.curated_zone import TM_COLL, TM_DB, TM_DOCUMENT
from jobs.transform.change_log import with_documents
from jobs.transform.delta_io import quoted
from resources.spark_lake import use_lake
from state import CuratedTable, StateStore
from tidemark.errors import CuratedTableMissing
from tidemark.object_path import LakePath


def read_changes(
    spark: Any,
    store: StateStore,
    lake_root: LakePath,
    stream: str,
    db: str | None = None,
    coll: str | None = None,
) -> Any:
    """The change log: one row per event, de-duplicated, partitioned by date."""
    tables = _chosen(store, stream, "changes", None, db, coll, "change log")
    return _union(spark, lake_root, tables, with_namespace=False)


def read_current(
    spark: Any,
    store: StateStore,
    lake_root: LakePath,
    stream: str,
    run: int | None = None,
    *,
    db: str | None = None,
    coll: str | None = None,
) -> Any:
    """The live documents of the stream's collections (or of one), as committed run `run`
    left them (default: the newest)."""
    if run is not None:
        kept = [r.run for r in store.transforms.current_runs(stream)]
        if run not in kept:
            raise CuratedTableMissing(
                f"Run {run} of stream {stream!r}'s current tables is not kept.",
                f"Kept runs: {', '.join(map(str, kept)) or 'none'} (raise keep_versions "
                "in the streams config to keep more).",
            )
    tables = _chosen(store, stream, "current", run, db, coll, "current-state table")
    return _union(spark, lake_root, tables, with_namespace=True)


def exact_documents(
    spark: Any,
    store: StateStore,
    lake_root: LakePath,
    stream: str,
    run: int | None = None,
    *,
    db: str | None = None,
    coll: str | None = None,
) -> Any:
    """`read_current`'s rows, each with `_tm_document`: its document exactly as MongoDB holds
    it (BSON types and field order, as canonical Extended JSON), joined from the change log by
    the event that set the row. Every collection's log of the stream is read, since a rename
    moves rows with the event that set them; Tidemark never deletes a row of `changes`."""
    current = read_current(spark, store, lake_root, stream, run, db=db, coll=coll)
    logs = _chosen(store, stream, "changes", None, None, None, "change log")
    namespaces = [(t.db, t.coll) for t in logs]
    return with_documents(spark, current.drop(TM_DOCUMENT), lake_root, stream, namespaces)


def _chosen(
    store: StateStore,
    stream: str,
    kind: str,
    run: int | None,
    db: str | None,
    coll: str | None,
    what: str,
) -> list[CuratedTable]:
    """The stream's tables of `kind` (of one database or collection when named) at run
    `run`; CuratedTableMissing when there is none."""
    tables = [
        t
        for t in store.transforms.tables(stream, run)
        if t.kind == kind and (db is None or t.db == db) and (coll is None or t.coll == coll)
    ]
    if not tables:
        where = "" if db is None else f" for {db}.{coll}" if coll is not None else f" for {db}"
        raise CuratedTableMissing(
            f"Stream {stream!r} has no {what}{where} yet.", "Run the transform after a drain."
        )
    return tables


def read_table(spark: Any, lake_root: LakePath, table: CuratedTable) -> Any:
    """One collection table at the Delta version its run committed."""
    return (
        spark.read.format("delta")
        .option("versionAsOf", table.delta_version)
        .load(str(lake_root / table.path))
    )


def _union(
    spark: Any, lake_root: LakePath, tables: list[CuratedTable], with_namespace: bool
) -> Any:
    use_lake(spark, lake_root)
    frames = []
    for table in tables:
        frame = read_table(spark, lake_root, table)
        if with_namespace:
            frame = frame.select(
                F.lit(table.db).alias(TM_DB),
                F.lit(table.coll).alias(TM_COLL),
                *(F.col(quoted(c)) for c in frame.columns),
            )
        frames.append(frame)
    if len(frames) == 1:
        return frames[0]
    types: dict[str, set[str]] = {}
    for frame in frames:
        for f in frame.schema.fields:
            types.setdefault(f.name, set()).add(f.dataType.simpleString())
    mixed = {name for name, seen in types.items() if len(seen) > 1}
    result = None
    for frame in frames:
        columns = [
            F.col(quoted(c)).cast("string").alias(c) if c in mixed else c for c in frame.columns
        ]
        frame = frame.select(*columns) if mixed else frame
        result = frame if result is None else result.unionByName(frame, allowMissingColumns=True)
    return result
