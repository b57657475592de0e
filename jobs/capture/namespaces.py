"""Which namespaces a stream watches right now: the collections it would capture, and whether
the collection or database it names exists at all.

A change stream on a namespace that does not exist opens without complaint and reports
nothing until the namespace is created; a typo in the streams file looks the same. These
facts let status, the drain's result and a check say so, without failing a stream that is
waiting for its collection on purpose.
"""

from __future__ import annotations

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from tidemark.config import StreamConfig

# Databases a cluster-wide change stream never reports.
_INTERNAL_DATABASES = ("admin", "config", "local")


def watched_collections(client: MongoClient, stream: StreamConfig) -> list[tuple[str, str]]:
    """(database, collection) of each existing collection in the stream's scope (for a
    collection stream its own, whether or not it exists), sorted; views and `system.`
    collections are left out, as the change stream leaves them out."""
    if stream.scope == "collection":
        assert stream.database and stream.collection
        return [(stream.database, stream.collection)]
    # authorized*: a capture user without listDatabases / listCollections (the README's
    # least-privilege role) still gets the names it may read.
    databases = (
        [stream.database]
        if stream.database is not None
        else [
            d
            for d in client.list_database_names(authorizedDatabases=True)
            if d not in _INTERNAL_DATABASES
        ]
    )
    found = []
    for db in databases:
        listed = client[db].list_collections(
            filter={"type": "collection"}, nameOnly=True, authorizedCollections=True
        )
        found += [(db, c["name"]) for c in listed if not c["name"].startswith("system.")]
    return sorted(found)


def missing_namespace(client: MongoClient, stream: StreamConfig) -> str | None:
    """A sentence naming the watched collection or database when it does not exist (None
    when it does, for a cluster stream, or when the server will not say: a user without
    the listCollections privilege sees only what it may read)."""
    if stream.scope == "cluster":
        return None
    assert stream.database is not None
    only = {"name": stream.collection} if stream.scope == "collection" else {}
    try:
        names = client[stream.database].list_collection_names(
            filter=only, authorizedCollections=True
        )
    except PyMongoError:
        return None
    if stream.scope == "collection":
        if stream.collection in names:
            return None
        return (
            f"collection {stream.namespace} does not exist: the stream has nothing to read "
            "until it is created (check the database and collection names in the streams "
            "file if it should exist)"
        )
    if names:
        return None
    return (
        f"database {stream.database} does not exist (it has no collection): the stream has "
        "nothing to read until one is created (check the database name in the streams file "
        "if it should exist)"
    )
