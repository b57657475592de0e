"""Delta Lake commits of one transform run, each made at most once however often the run is
repeated, and never by a run that lost its lease to a later one.

A run numbers its Delta commits in the order its plan makes them (`RunWriter.slot`: run number
* STEP_SPAN + the commit's place), and every commit carries that number in Delta's own log,
as the commit's `userMetadata` (`tidemark:<stream>:<slot>`). Before a commit the writer reads
the table's log after the version the state store records for it: if a commit of this stream
with this slot or a later one is there, the write is skipped. A run killed after some commits
is repeated with the same number over the same batches (the state store's intent), so it plans
the same commits in the same order: those made before the kill are skipped, the rest made now.
A run whose lease was taken over finds the newer run's marks and writes nothing more. Each slot
is taken whether or not its commit is needed (a table to create, a rewrite that may not be
due), so a repeat's numbering never drifts from the first attempt's.

Why not Delta's `txnAppId`/`txnVersion`, which does the same: Delta looks the mark up by
reconstructing the table's state on Spark, which made a 100-row append take 3-8 s instead of
0.25 s. Reading the few newest commit files is a few milliseconds. The check and the commit
are not one atomic step; the stream's lease (one writer at a time) covers that gap.

Works the same on a classic session and over Spark Connect: only SQL, DataFrame writes and
session settings, no `DeltaTable` API (Delta's Connect plugin is not published).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from tidemark.object_path import LakePath

MARK = "spark.databricks.delta.commitInfo.userMetadata"
STEP_SPAN = 1_000_000  # more commits than a run makes to any one table
# `current`: the change feed lets downstream jobs read only what a run changed.
CURRENT_PROPERTIES = {"delta.enableChangeDataFeed": "true"}
# Deletion vectors: a MERGE or DELETE marks the rows it removes instead of rewriting their
# files. A table gets them once its live files reach the stream's `deletion_vectors_from_bytes`
# (`RunWriter.vectors_when_large`): below that, rewriting the files a MERGE touches costs
# less than the Spark jobs that write the vectors (8 of a small MERGE's 19, BENCHMARKS.md).
DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}
# Column mapping lets a column carry a name Delta otherwise refuses (`needs_column_mapping`).
# Only a table that has such a column gets it: Polars and delta-rs's `to_pyarrow_table` refuse
# to read a table with the feature at all.
COLUMN_MAPPING = {"delta.columnMapping.mode": "name"}
UNMAPPED_REFUSES = frozenset(" ,;{}()\n\t=")
CHANGES_PROPERTIES = {"delta.appendOnly": "true"}
# Table features Delta will not enable in a commit that also writes rows.
EMPTY_FIRST = frozenset({"delta.enableChangeDataFeed", "delta.columnMapping.mode"})
# For kill tests only (tests/helpers/crash_child.py), None otherwise: called as
# COMMIT_HOOK("before" | "after", path, slot) around each marked commit, so a test's child
# process can SIGKILL itself at an exact point of a run (during a MERGE, between two tables).
COMMIT_HOOK: Callable[[str, LakePath, int], None] | None = None


def quoted(name: str) -> str:
    """A SQL identifier for a column named `name` as is."""
    return "`" + name.replace("`", "``") + "`"


def table_ref(path: LakePath) -> str:
    return "delta.`" + str(path).replace("`", "``") + "`"


def current_properties(schema: StructType) -> dict[str, str]:
    """`current`'s properties for a table of `schema`: column mapping only if it needs it."""
    return CURRENT_PROPERTIES | (COLUMN_MAPPING if needs_column_mapping(schema) else {})


def needs_column_mapping(dtype: DataType) -> bool:
    """Whether a column of this type (fields at any depth) has a name Delta refuses in a
    table without column mapping (`UNMAPPED_REFUSES`)."""
    if isinstance(dtype, StructType):
        return any(
            bool(UNMAPPED_REFUSES & set(f.name)) or needs_column_mapping(f.dataType)
            for f in dtype.fields
        )
    if isinstance(dtype, ArrayType):
        return needs_column_mapping(dtype.elementType)
    if isinstance(dtype, MapType):
        return needs_column_mapping(dtype.keyType) or needs_column_mapping(dtype.valueType)
    return False


def table_property(spark: Any, path: LakePath, key: str) -> str | None:
    """One property of the table at `path` (a command, no Spark job), None when unset."""
    rows = spark.sql(f"SHOW TBLPROPERTIES {table_ref(path)}").collect()
    return next((r["value"] for r in rows if r["key"] == key), None)


def is_table(path: LakePath) -> bool:
    return (path / "_delta_log").is_dir() and any((path / "_delta_log").glob("*.json"))


def table_rows(path: LakePath, since: int, rows: int) -> tuple[int, int]:
    """The table's newest version and its rows, from `rows` at version `since` (-1: none) and
    the row counts Delta records in each later commit (`operationMetrics`): no Spark job, and
    exact for commits a killed attempt made too."""
    newest = table_version(path)
    for version in range(since + 1, newest + 1):
        info = _commit_info(path / "_delta_log" / f"{version:020d}.json")
        metrics = {k: int(v) for k, v in info.get("operationMetrics", {}).items() if v.isdigit()}
        operation = info.get("operation", "")
        mode = info.get("operationParameters", {}).get("mode", "")
        if operation in ("WRITE", "CREATE TABLE AS SELECT"):
            written = metrics.get("numOutputRows", 0)
            rows = rows + written if mode == "Append" else written
        elif operation == "MERGE":
            rows += metrics.get("numTargetRowsInserted", 0)
            rows -= metrics.get("numTargetRowsDeleted", 0)
        elif operation == "DELETE":
            rows -= metrics.get("numDeletedRows", 0)
    return newest, rows


def _commit_info(commit: LakePath) -> dict[str, Any]:
    for line in commit.read_text().splitlines():
        if '"commitInfo"' in line:
            return json.loads(line)["commitInfo"]
    return {}


def table_state(path: LakePath, version: int) -> tuple[int, dict[str, str]] | None:
    """The bytes of the table's live files and its properties at `version`, from the checksum
    Delta writes beside each commit (`NNNNNNNNNNNNNNNNNNNN.crc`): no Spark job. None when
    that version has no checksum (a writer that writes none)."""
    crc = path / "_delta_log" / f"{version:020d}.crc"
    if not crc.exists():
        return None
    state = json.loads(crc.read_text())
    return int(state["tableSizeBytes"]), state.get("metadata", {}).get("configuration", {})


def table_version(path: LakePath) -> int:
    """The newest committed version of the table at `path` (read from its log's listing: each
    commit is one `NNNNNNNNNNNNNNNNNNNN.json`)."""
    versions = [int(p.stem) for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()]
    return max(versions)


@dataclass
class RunWriter:
    """The Delta commits of one run of one stream, numbered; see the module docstring."""

    spark: Any
    lake_root: LakePath
    stream: str
    run: int
    baseline: dict[LakePath, int] = field(default_factory=dict)  # versions the store records
    slots: int = 0
    vectors_from: int = 0  # bytes from which a table gets deletion vectors (0: from its start)

    def new_table(self, properties: dict[str, str]) -> dict[str, str]:
        """The properties a new table of this run is made with: `properties`, and deletion
        vectors when the stream wants them from a table's start."""
        return properties | (DELETION_VECTORS if self.vectors_from == 0 else {})

    def vectors_when_large(self, path: LakePath) -> None:
        """Turn deletion vectors on for the table at `path` once its live files reach
        `vectors_from` bytes (see DELETION_VECTORS). Idempotent and unmarked, as
        `set_change_feed`: whether a repeat of a killed run finds them on or not, its commits
        leave the same rows."""
        ((key, value),) = DELETION_VECTORS.items()
        state = table_state(path, table_version(path))
        if state is None:  # no checksum: Delta computes the same two facts
            detail = self.spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").collect()[0]
            state = int(detail["sizeInBytes"]), dict(detail["properties"] or {})
        size, properties = state
        if properties.get(key) != value and size >= self.vectors_from:
            self.set_property(path, key, value)

    def slot(self) -> int:
        """Take the next commit number (whether or not the commit turns out to be needed)."""
        self.slots += 1
        if self.slots >= STEP_SPAN:
            raise OverflowError("a transform run made more Delta commits than STEP_SPAN")
        return self.run * STEP_SPAN + self.slots

    def made(self, path: LakePath, slot: int) -> bool:
        """True when the table's log holds a commit of this stream at `slot` or later (see
        the module docstring). Read newest first, down to the version the store records or to
        an earlier run's commit (marks only grow), so it reads a few small files."""
        if not is_table(path):
            return False
        prefix = f"tidemark:{self.stream}:"
        floor = self.baseline.get(path, -1)
        for version in range(table_version(path), floor, -1):
            mark = _commit_info(path / "_delta_log" / f"{version:020d}.json").get("userMetadata")
            if not (isinstance(mark, str) and mark.startswith(prefix)):
                continue  # not a run's commit (OPTIMIZE, a new table's empty commit)
            made = int(mark[len(prefix) :])
            if made >= slot:
                return True
            if made < self.run * STEP_SPAN:
                return False
        return False

    @contextmanager
    def _marked(self, path: LakePath, slot: int) -> Iterator[bool]:
        """Yields False when the commit is made already (the caller writes nothing)."""
        if self.made(path, slot):
            yield False
            return
        conf = self.spark.conf
        conf.set(MARK, f"tidemark:{self.stream}:{slot}")
        if COMMIT_HOOK is not None:
            COMMIT_HOOK("before", path, slot)
        try:
            yield True
        finally:
            conf.unset(MARK)
        if COMMIT_HOOK is not None:
            COMMIT_HOOK("after", path, slot)

    def create(
        self,
        frame: Any,
        path: LakePath,
        properties: dict[str, str],
        slot: int,
        partition_by: list[str] | None = None,
    ) -> None:
        """Append `frame` to the table at `path`, made with `properties` when there is none.
        A table with column mapping or the change feed is made empty first, in a commit of
        its own without a mark: Delta refuses to enable them in a commit that writes rows, and
        a table left empty by a kill is merged into like any other. Any other table is made
        by its first marked append (one commit fewer per new table)."""
        writer = frame.write.format("delta").mode("append")
        if not is_table(path):
            if properties.keys() & EMPTY_FIRST:
                empty = frame.limit(0).write.format("delta").options(**properties)
                if partition_by:
                    empty = empty.partitionBy(*partition_by)
                empty.save(str(path))
            else:
                writer = writer.options(**properties)
                if partition_by:
                    writer = writer.partitionBy(*partition_by)
        with self._marked(path, slot) as needed:
            if needed:
                writer.save(str(path))

    def overwrite(self, frame: Any, path: LakePath, slot: int, change_feed: bool = True) -> None:
        """Replace the table's rows and schema (a column's type changed). Delta refuses that
        with the change feed on (a column mapped anew), so the feed is off for the one commit:
        a feed reader across it is told to read the table afresh, which a table whose column
        changed type needs anyway. A table without a feed (`change_feed` false) keeps none."""
        writer = frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        with self._marked(path, slot) as needed:
            if needed:
                if change_feed:
                    self.set_change_feed(path, False)
                writer.save(str(path))
        if change_feed:
            self.set_change_feed(path, True)

    def set_change_feed(self, path: LakePath, enabled: bool) -> None:
        """Turn the table's change feed on or off. Idempotent, so never marked, even inside
        a marked write (`overwrite`): a mark names the one commit that holds a slot's rows."""
        self.set_property(path, "delta.enableChangeDataFeed", "true" if enabled else "false")

    def map_columns(self, path: LakePath) -> None:
        """Turn on column mapping (`COLUMN_MAPPING`) before a column needs it; idempotent and
        unmarked, as `set_change_feed`."""
        ((key, value),) = COLUMN_MAPPING.items()
        self.set_property(path, key, value)

    def set_property(self, path: LakePath, key: str, value: str) -> None:
        """Set one table property; idempotent, so never marked (as `set_change_feed`)."""
        conf = self.spark.conf
        mark = conf.get(MARK, None)
        conf.unset(MARK)
        text = value.replace("\\", "\\\\").replace("'", "\\'")  # a SQL string literal
        try:
            self.spark.sql(
                f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ('{key}' = '{text}')"
            ).collect()
        finally:
            if mark is not None:
                conf.set(MARK, mark)

    def sql(
        self, statement: str, path: LakePath, slot: int, source: Any | None = None
    ) -> list[Any]:
        """Run a DML statement on the table at `path`; `source`, when given, is the view
        `{source}` in the statement names. Returns the statement's result rows ([] when it
        was made already)."""
        with self._marked(path, slot) as needed:
            if not needed:
                return []
            view = None
            if source is not None:
                view = f"tm_source_{self.run}_{slot % STEP_SPAN}"
                source.createOrReplaceTempView(view)
                statement = statement.replace("{source}", view)
            try:
                return self.spark.sql(statement).collect()
            finally:
                if view is not None:
                    self.spark.catalog.dropTempView(view)
