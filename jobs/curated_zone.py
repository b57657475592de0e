"""The curated zone's layout and its tables' columns (no Spark here: `tidemark gc` and the
catalog use it too).

Every collection a stream sees gets a pair of Delta Lake tables:

    <lake>/curated/<stream>/<db>/<coll>/changes/   its change events, partitioned by date
    <lake>/curated/<stream>/<db>/<coll>/current/   its live documents, one row each
    <lake>/curated/<stream>/<db>/$database/changes/  a database's own events (dropDatabase)
    <lake>/curated/<stream>/_tidemark.state/removed/ tombstones and namespace barriers
    <lake>/curated/<stream>/_tidemark.state/changes/ events of no database (a snapshot's start
                                                     over a whole cluster)

Database and collection names become one path segment each, percent-encoded where a name holds
what a path cannot (`/`, `%`, a leading dot). `$database` and `_tidemark.state` can never be
a collection's or a database's name (MongoDB refuses `$` in a collection name and `.` in a
database name), so they never collide with data. The `removed` table is Tidemark's own: what
keeps a deleted document from coming back when an older event arrives late; readers of
`current` never need it.

Tidemark's own column names are defined here once, each a `TM_*` constant, and the lists of a
table's columns are built from them: the transform writes them, the catalog shows them (with
their types and what they hold) and the readers add them, all from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from tidemark.object_path import LakePath

DATABASE_EVENTS = "$database"  # the collection segment of a database's own events
STATE_DIR = "_tidemark.state"
REMOVED = "removed"


def curated(lake_root: LakePath, stream: str) -> LakePath:
    return lake_root / "curated" / stream


def segment(name: str) -> str:
    """A database or collection name as one path segment that reads back the same."""
    encoded = quote(name, safe=" !#&'()+,;=@[]^_`{}~-")
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def name_of(segment_text: str) -> str:
    return unquote(segment_text)


def collection_dir(lake_root: LakePath, stream: str, db: str | None, coll: str | None) -> LakePath:
    """A collection's directory (`coll` None: the database's own events; `db` None too: the
    stream's own)."""
    if db is None:
        return curated(lake_root, stream) / STATE_DIR
    leaf = DATABASE_EVENTS if coll is None else segment(coll)
    return curated(lake_root, stream) / segment(db) / leaf


def current_dir(lake_root: LakePath, stream: str, db: str, coll: str) -> LakePath:
    return collection_dir(lake_root, stream, db, coll) / "current"


def changes_dir(lake_root: LakePath, stream: str, db: str | None, coll: str | None) -> LakePath:
    return collection_dir(lake_root, stream, db, coll) / "changes"


def removed_dir(lake_root: LakePath, stream: str) -> LakePath:
    return curated(lake_root, stream) / STATE_DIR / REMOVED


# -- the tables' columns ----------------------------------------------------------------------

# Every column name of Tidemark's own starts with this; a document field that does is not made
# a column (`field_census.column_names`), so a document never collides with them.
OWN_PREFIX = "_tm_"
# Delta's change data feed adds these to what it reads, so a table with the feed on refuses them
# as its own columns (RESERVED_CDC_COLUMNS_ON_WRITE): a field so named is not a column either.
CHANGE_FEED_NAMES = frozenset({"_change_type", "_commit_version", "_commit_timestamp"})

TM_KEY = "_tm_key"  # canonical Extended JSON of the document's `{_id}`: the row's key
# TM_KEY's column metadata in a table keyed by the `_id`'s value (`transform.identity`: 1 and
# NumberLong(1) one key). A table without it was written before that rule: the first run that
# writes to it re-keys it in place.
KEY_RULE = {"tidemark.key": "value"}
# The whole document, canonical Extended JSON (null: a delete): a keyed event's, while a run
# folds it, and the exact document `readers.exact_documents` joins to a row from `changes`.
# Not a column of `current` (a table written before issue 38 has it until its next run).
TM_DOCUMENT = "_tm_document"
TM_RESIDUAL = "_tm_residual"  # the document's values no typed column holds (transform.type_rule)
TM_EVENT_ID = "_tm_event_id"  # the event that set the row: its token's `_data`, in event order
TM_CLUSTER_TIME = "_tm_cluster_time"  # that event's cluster time
TM_DB = "_tm_db"  # the row's database (`removed`, and a read over several collections)
TM_COLL = "_tm_coll"  # the row's collection (null in `removed`: a database's barrier)
TM_RUN = "_tm_run"  # the transform run that wrote a `removed` row
# Beside a run's keyed events while it folds them, never a column of a table: whether the
# event removes its document.
TM_DELETED = "_tm_deleted"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Spark SQL's name of the type
    description: str = ""


# The columns every `current` table has before its document columns, in this order.
CURRENT_META = [
    Column(TM_KEY, "string", "canonical Extended JSON of {_id}: the row's key"),
    Column(TM_EVENT_ID, "string", "the event that set the row (sorts in event order)"),
    Column(TM_CLUSTER_TIME, "timestamp", "that event's cluster time"),
    Column(TM_RESIDUAL, "string", "the values no typed column holds, canonical Extended JSON"),
]
# A `changes` table's columns, in the order the change log writes them.
CHANGES_COLUMNS = [
    Column("event_id", "string", "resume token _data: unique, sorts in event order"),
    Column("operation_type", "string"),
    Column("db", "string"),
    Column("coll", "string"),
    Column("cluster_time", "timestamp"),
    Column("cluster_time_inc", "bigint"),
    Column("wall_time", "timestamp"),
    Column("txn_number", "bigint"),
    Column("lsid", "string"),
    Column("to_db", "string", "rename target"),
    Column("to_coll", "string", "rename target"),
    Column("collection_uuid", "string"),
    Column("document_key", "string", "canonical Extended JSON"),
    Column("full_document", "string", "canonical Extended JSON"),
    Column("full_document_before_change", "string", "canonical Extended JSON"),
    Column("update_description", "string", "canonical Extended JSON"),
    Column("updated_fields", "string", "JSON of the updated fields"),
    Column("removed_fields", "array<string>"),
    Column("operation_description", "string"),
    Column("batch_id", "string", "the raw batch the event came from"),
    Column("source", "string", "drain, snapshot or replay"),
    Column("date", "date", "partition: the event's cluster date"),
]
# Before the other columns when several collections' tables are read as one.
NAMESPACE_COLUMNS = [Column(TM_DB, "string", "database"), Column(TM_COLL, "string", "collection")]
# The `removed` table: a tombstone per deleted key, a barrier (TM_KEY null) per namespace event.
REMOVED_COLUMNS = [
    *NAMESPACE_COLUMNS,
    Column(TM_KEY, "string"),
    Column(TM_EVENT_ID, "string"),
    Column(TM_CLUSTER_TIME, "timestamp"),
    Column(TM_RUN, "int"),
]


def names(columns: list[Column]) -> list[str]:
    return [c.name for c in columns]


def columns_ddl(columns: list[Column]) -> str:
    """`columns` as a Spark DDL schema ("name type, ...")."""
    return ", ".join(f"{c.name} {c.type}" for c in columns)
