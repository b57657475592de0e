"""The state store's tables (SQLAlchemy 2 Core) and its schema version.

Timestamps from MongoDB (cluster times) are stored as one 64-bit integer, `time << 32 | inc`,
which sorts like the BSON Timestamp; wall-clock times are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)

SCHEMA_VERSION = 6  # 2: snapshots; 3: current as base + deltas, change log per run;
# 4: the source deployment of a checkpoint (MIGRATIONS adds its columns to a version-3 store);
# 5: Delta Lake tables per collection (their versions per run, and a run's intent);
# 6: the oplog's first entry as a stream's last drain saw it


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every backend (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the state store: use UTC-aware values")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None else None


def utc_now() -> datetime:
    """The wall-clock time every row of the store is stamped with (aware, UTC)."""
    return datetime.now(UTC)


metadata = MetaData()

schema_version = Table(
    "tidemark_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("installed_at", UTCDateTime, nullable=False),
)

streams = Table(
    "tidemark_streams",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("definition", Text, nullable=False),  # JSON of StreamConfig.token_definition()
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The oplog's first entry when the stream last drained (where its replay windows can
    # start, read when the Dagster definitions load); null where the oplog cannot be read.
    Column("oplog_first", BigInteger),
)

checkpoints = Table(
    "tidemark_checkpoints",
    metadata,
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), primary_key=True),
    # Exactly one of token / start_at_operation_time is set once the stream has a position.
    Column("token", Text),  # canonical Extended JSON of the resume token document
    Column("token_is_invalidate", Boolean, nullable=False, default=False),
    Column("start_at_operation_time", BigInteger),
    Column("cluster_time", BigInteger),  # of the position, for lag and oplog headroom
    Column("fingerprint", String(64), nullable=False),
    Column("version", Integer, nullable=False),  # compare-and-set counter
    Column("updated_at", UTCDateTime, nullable=False),
    # The deployment the position came from (tokens.SourceIdentity); NULL until first seen.
    Column("source_kind", String(16)),
    Column("source_set", String(200)),
    Column("source_id", String(64)),
)

leases = Table(
    "tidemark_leases",
    metadata,
    Column("stream", String(100), primary_key=True),  # the lease's name: `leases.lease_name`
    Column("owner", String(200)),  # NULL when released
    Column("host", String(200)),
    Column("pid", Integer),
    Column("epoch", BigInteger, nullable=False),  # fencing token: +1 per acquisition
    Column("acquired_at", UTCDateTime),
    Column("expires_at", UTCDateTime),
)

batches = Table(
    "tidemark_batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), nullable=False, index=True),
    Column("source", String(16), nullable=False),  # records.BatchSource
    Column("epoch", BigInteger, nullable=False),
    Column("event_count", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("first_event_id", Text),
    Column("last_event_id", Text),
    Column("first_cluster_time", BigInteger),
    Column("last_cluster_time", BigInteger),
    Column("events_by_type", Text, nullable=False),  # JSON {operationType: count}
    Column("token_after", Text),  # the checkpoint this batch moved to (incremental only)
    Column("window_start", BigInteger),  # replay windows
    Column("window_end", BigInteger),
    Column("snapshot_id", String(64)),  # snapshot chunks: the snapshot they belong to
    Column("committed_at", UTCDateTime, nullable=False, index=True),
)

batch_files = Table(
    "tidemark_batch_files",
    metadata,
    Column("batch_id", String(64), ForeignKey("tidemark_batches.id"), primary_key=True),
    Column("path", String(1024), primary_key=True),  # relative to the lake root
    Column("rows", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
)

resets = Table(
    "tidemark_resets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream", String(64), nullable=False, index=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("from_token", Text),
    Column("from_cluster_time", BigInteger),
    Column("to_description", Text, nullable=False),
    Column("old_fingerprint", String(64)),
    Column("new_fingerprint", String(64), nullable=False),
)

transform_runs = Table(
    # One per committed transform run. Its number is the SQL column `version` (named when runs
    # were versions of `current`); Python calls it `run`, as it calls `base_version` `base_run`.
    "tidemark_transform_runs",
    metadata,
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), primary_key=True),
    Column("version", Integer, primary_key=True, key="run"),
    Column("path", String(1024)),  # the directory this run wrote for `current` (lake-relative)
    Column("kind", String(16)),  # records.RunKind; None: the run wrote no `current` files
    Column("base_version", Integer, key="base_run"),  # the run whose directory is the base
    Column("written_rows", BigInteger),  # rows in `path` (tombstones and barriers included)
    Column("rows", BigInteger, nullable=False),
    Column("doc_schema", Text, nullable=False),  # Spark StructType JSON of the document columns
    Column("events_folded", BigInteger, nullable=False),
    Column("changes_added", BigInteger, nullable=False),
    Column("changes_path", String(1024)),  # the run's change-log directory (None: it added none)
    Column("first_event_id", Text),  # the range of event ids the run added to the change log
    Column("last_event_id", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("pruned_at", UTCDateTime),
)

transformed_batches = Table(
    "tidemark_transformed_batches",
    metadata,
    Column("batch_id", String(64), ForeignKey("tidemark_batches.id"), primary_key=True),
    Column("stream", String(64), nullable=False, index=True),
    Column("version", Integer, key="run"),  # the run that folded it (None: all duplicates)
    Column("transformed_at", UTCDateTime, nullable=False),
)

curated_tables = Table(
    "tidemark_curated_tables",  # the Delta version of each collection table a committed run made
    metadata,
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), primary_key=True),
    Column("run", Integer, primary_key=True),
    Column("db", String(200), primary_key=True),
    Column("coll", String(400), primary_key=True),  # "" for a database's own events
    Column("kind", String(16), primary_key=True),  # "current" | "changes"
    Column("path", String(1024), nullable=False),  # the Delta table (lake-relative)
    Column("delta_version", BigInteger, nullable=False),
    Column("rows", BigInteger, nullable=False),  # live rows (current) or events (changes)
    Column("doc_schema", Text, nullable=False),  # Spark StructType JSON of its document columns
)

transform_intents = Table(
    "tidemark_transform_intents",  # the run under way: what it folds, written before any Delta
    metadata,  # commit, so a run killed after one is repeated on exactly the same batches
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), primary_key=True),
    Column("run", Integer, nullable=False),
    Column("batch_ids", Text, nullable=False),  # JSON list
    Column("started_at", UTCDateTime, nullable=False),
)

snapshots = Table(
    "tidemark_snapshots",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("stream", String(64), ForeignKey("tidemark_streams.name"), nullable=False, index=True),
    Column("reason", String(200), nullable=False),  # initial | resnapshot: ... | history lost
    Column("cluster_time", BigInteger, nullable=False),  # T: the change stream continues here
    Column("namespaces", Text, nullable=False),  # JSON [[db, coll], ...] in copy order
    Column("namespace_index", Integer, nullable=False),  # the one being copied
    Column("last_key", Text),  # canonical Extended JSON of the last _id copied there
    Column("chunks", Integer, nullable=False),  # compare-and-set counter of committed chunks
    Column("documents", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),  # records.SnapshotStatus
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
)


# What turns a store of version N into version N + 1, in one transaction: only added nullable
# columns so far, which every store of the older version takes as is.
MIGRATIONS: dict[int, list[str]] = {
    3: [
        "ALTER TABLE tidemark_checkpoints ADD COLUMN source_kind VARCHAR(16)",
        "ALTER TABLE tidemark_checkpoints ADD COLUMN source_set VARCHAR(200)",
        "ALTER TABLE tidemark_checkpoints ADD COLUMN source_id VARCHAR(64)",
    ],
    4: [],  # version 5's tables are new: `create_all` adds them to a version-4 store
    5: ["ALTER TABLE tidemark_streams ADD COLUMN oplog_first BIGINT"],
}
