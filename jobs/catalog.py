"""What each curated table of a stream is now, and the manifest that lets any engine find it.

The state store is the catalog and stays the truth. After every commit that changes a table
(a transform run, a compaction) its newest committed version is also written, atomically, to
a small JSON manifest at a stable path per table, for engines that know nothing of Tidemark:

    <lake>/curated/<stream>/current/_tidemark_table.json
    <lake>/curated/<stream>/changes/_tidemark_table.json

It names the version, its row count, its schema, and its Parquet files: for `current` the
base and the deltas after it in merge order, with the merge rule; for `changes` every
committed run's files. The leading underscore keeps Spark's and Hive's directory listings
from reading it as data. A manifest is only ever replaced by a whole new one (a temporary
file renamed over it), so a reader sees the old version or the new, never half a file.

It is written after the SQL commit, under the stream's transform lease, from what the store
says is newest at that moment; a crash between the commit and the write leaves the previous
manifest, naming the previous committed version (still readable: a version's directories
outlive it by `keep_versions` and gc's `--min-age`). `publish_if_stale` heals that: every
transform run calls it first (before any Spark, a quiet run included), and `tidemark tables`
calls it too. No Spark here: this module reads SQL rows, directory listings and Parquet
footers.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from jobs.curated_zone import PLAIN_JSON, changes_dir, current_root
from state import StateStore, TransformState
from state.leases import TRANSFORM_LEASE_TTL
from tidemark.errors import LeaseHeld

MANIFEST_NAME = "_tidemark_table.json"
# A manifest being written: a crash can leave one behind, and gc removes it (`jobs.ops.gc`).
MANIFEST_TEMP_PREFIX = ".manifest-"
FORMAT = "tidemark-table/1"
TableName = Literal["current", "changes"]

# The columns every version of `current` has before its document columns (the fold's
# STATE_COLUMNS, as readers see them: `_tm_deleted` only filters, see MERGE_RULE).
CURRENT_COLUMNS = [
    ("_tm_db", "string", "database of the document"),
    ("_tm_coll", "string", "collection of the document"),
    ("_tm_key", "string", "canonical Extended JSON of {_id}; null on a namespace barrier"),
    ("_tm_document", "string", "the whole document, canonical Extended JSON (lossless)"),
    ("_tm_event_id", "string", "the event that set the row (sorts in event order)"),
    ("_tm_cluster_time", "timestamp", "that event's cluster time"),
    ("_tm_json", "string", "the document as plain JSON, source of the field columns"),
    ("_tm_deleted", "boolean", "tombstone or barrier: never shown to readers"),
]
MERGE_RULE = {
    "key": ["_tm_db", "_tm_coll", "_tm_key"],
    "order_by": ["_tm_event_id DESC", "part DESC"],
    "keep": "the first row per key (rows whose _tm_key is null, barriers, are all kept)",
    "then_drop": "_tm_deleted",
    "text": "Over the rows of all parts, keep per key the row with the greatest _tm_event_id "
    "(on a tie, the later part's); then drop rows where _tm_deleted is true. One part: "
    "WHERE NOT _tm_deleted is the table.",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    description: str = ""


@dataclass(frozen=True)
class Part:
    """One directory of a version, in merge order (`part` 0 is the base)."""

    part: int
    version: int
    kind: str
    path: str  # lake-relative directory
    files: list[str]  # lake-relative Parquet files


@dataclass(frozen=True)
class TableState:
    """A curated table's newest committed version, as the state store names it."""

    stream: str
    table: TableName
    version: int
    rows: int
    committed_at: datetime
    location: Path  # the table's directory; the manifest lives in it
    parts: list[Part]
    columns: list[Column] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        return self.location / MANIFEST_NAME

    def to_manifest(self, lake_root: Path) -> dict[str, Any]:
        """The manifest's JSON: paths absolute (readable as they are), and lake-relative."""
        body: dict[str, Any] = {
            "format": FORMAT,
            "stream": self.stream,
            "table": self.table,
            "version": self.version,
            "rows": self.rows,
            "committed_at": self.committed_at.isoformat(),
            "lake_root": str(lake_root),
            "schema": [{"name": c.name, "type": c.type} for c in self.columns],
            "files": [str(lake_root / f) for p in self.parts for f in p.files],
            "parts": [
                {
                    "part": p.part,
                    "version": p.version,
                    "kind": p.kind,
                    "path": p.path,
                    "files": [str(lake_root / f) for f in p.files],
                }
                for p in self.parts
            ],
        }
        if self.table == "current":
            body["merge"] = MERGE_RULE
        else:
            body["hive_partitions"] = ["run", "date"]
            # In the run files or their paths but not in the table (see PLAIN_JSON; `run` only
            # names the directory a run wrote): drop them when reading the files.
            body["drop_columns"] = [PLAIN_JSON, "run"]
        return body


def _files(lake_root: Path, directory: str) -> list[str]:
    root = lake_root / directory
    return sorted(
        p.relative_to(lake_root).as_posix()
        for p in root.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    )


def current_table(
    store: StateStore, lake_root: Path, stream: str, *, with_files: bool = True
) -> TableState | None:
    """The newest version of `current` (None before the first one); its parts' Parquet files
    listed only `with_files`."""
    tstate = TransformState(store)
    newest = tstate.latest_version(stream)
    if newest is None:
        return None
    parts = tstate.version_parts(stream, newest.version)
    return TableState(
        stream=stream,
        table="current",
        version=newest.version,
        rows=newest.rows,
        committed_at=newest.created_at,
        location=current_root(lake_root, stream),
        parts=[
            Part(
                i,
                p.version,
                p.kind or "",
                p.path or "",
                _files(lake_root, p.path or "") if with_files else [],
            )
            for i, p in enumerate(parts)
        ],
        columns=[Column(*c) for c in CURRENT_COLUMNS] + document_columns(newest.doc_schema),
    )


def changes_table(
    store: StateStore, lake_root: Path, stream: str, *, with_files: bool = True
) -> TableState | None:
    """The change log as its committed runs make it (None before the first one); every run's
    Parquet files listed only `with_files` (the newest run's always: its footer is the schema)."""
    runs = TransformState(store).change_log_runs(stream)
    if not runs:
        return None
    last = len(runs) - 1
    parts = [
        Part(
            i,
            r.version,
            "run",
            r.changes_path or "",
            _files(lake_root, r.changes_path or "") if with_files or i == last else [],
        )
        for i, r in enumerate(runs)
    ]
    newest = runs[-1]
    return TableState(
        stream=stream,
        table="changes",
        version=newest.version,
        rows=sum(r.changes_added for r in runs),
        committed_at=newest.created_at,
        location=changes_dir(lake_root, stream),
        parts=parts,
        columns=_parquet_columns(lake_root, parts),
    )


def tables(
    store: StateStore, lake_root: Path, stream: str, *, with_files: bool = True
) -> list[TableState]:
    """The stream's curated tables that exist yet: `changes`, then `current`."""
    found = [
        changes_table(store, lake_root, stream, with_files=with_files),
        current_table(store, lake_root, stream, with_files=with_files),
    ]
    return [t for t in found if t is not None]


def document_columns(doc_schema: str | None) -> list[Column]:
    """The document columns of a version, from its Spark schema JSON (no Spark needed)."""
    if not doc_schema:
        return []
    fields = json.loads(doc_schema).get("fields", [])
    return [Column(f["name"], _type_name(f["type"])) for f in fields]


def _type_name(spark_type: Any) -> str:
    """Spark's JSON form of a type as its SQL name (`long` -> bigint, nested in kind)."""
    if isinstance(spark_type, str):
        return {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}.get(
            spark_type, spark_type
        )
    kind = spark_type.get("type")
    if kind == "array":
        return f"array<{_type_name(spark_type['elementType'])}>"
    if kind == "map":
        return f"map<{_type_name(spark_type['keyType'])},{_type_name(spark_type['valueType'])}>"
    if kind == "struct":
        inner = ",".join(f"{f['name']}:{_type_name(f['type'])}" for f in spark_type["fields"])
        return f"struct<{inner}>"
    return str(kind)


def _parquet_columns(lake_root: Path, parts: list[Part]) -> list[Column]:
    """The change log's columns, from the newest run's file footer (one small read)."""
    newest = next((p.files for p in reversed(parts) if p.files), [])
    if not newest:
        return []
    schema = pq.read_schema(lake_root / newest[0])
    columns = [Column(f.name, str(f.type)) for f in schema if f.name != PLAIN_JSON]
    return [*columns, Column("date", "date", "Hive partition (date=YYYY-MM-DD)")]


def write_manifest(lake_root: Path, table: TableState) -> Path:
    """Replace `table`'s manifest atomically (a temporary file renamed over it)."""
    target = table.manifest_path
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        prefix=MANIFEST_TEMP_PREFIX, suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(table.to_manifest(lake_root), out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing or unreadable: stale, written again


def publish(store: StateStore, lake_root: Path, stream: str) -> list[TableState]:
    """Write the manifest of each table of `stream` whose manifest does not name its newest
    committed version; the caller holds the stream's transform lease. Cheap when nothing is
    stale (two SQL reads and two small files), so every run calls it. Returns those written."""
    tstate = TransformState(store)
    runs = tstate.change_log_runs(stream)
    newest_current = tstate.latest_version(stream)
    newest = {
        "changes": runs[-1].version if runs else None,
        "current": newest_current.version if newest_current else None,
    }
    locations = {
        "changes": changes_dir(lake_root, stream),
        "current": current_root(lake_root, stream),
    }
    written = []
    for name, build in (("changes", changes_table), ("current", current_table)):
        if newest[name] is None:
            continue
        manifest = read_manifest(locations[name] / MANIFEST_NAME)
        if manifest is not None and manifest.get("version") == newest[name]:
            continue
        table = build(store, lake_root, stream)
        if table is not None:
            write_manifest(lake_root, table)
            written.append(table)
    return written


def publish_if_stale(store: StateStore, lake_root: Path, stream: str) -> list[TableState]:
    """`publish` under the stream's transform lease, for callers outside a transform run
    (`tidemark tables`); nothing when a run holds the lease (it publishes itself)."""
    try:
        lease = store.acquire_lease(f"transform:{stream}", TRANSFORM_LEASE_TTL)
    except LeaseHeld:
        return []
    try:
        return publish(store, lake_root, stream)
    finally:
        store.release_lease(lease)
