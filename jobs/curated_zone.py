"""The curated zone's layout (no Spark here: `tidemark gc` uses it too).

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
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from tidemark.object_path import LakePath

# The change log's rows carry the full document's plain JSON while a run folds them (`current`
# parses its typed columns from it); it is not a column of any table.
PLAIN_JSON = "_tm_json"

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
