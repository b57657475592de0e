"""Asset keys, Dagster names and pools: a stream's own assets, and each collection table's.

A stream has `raw_changes`, `replay` and `curated` (its curated zone as a whole: the step that
folds the raw batches, which every transform run materializes). Each collection table is an
asset of its own, keyed `[stream, db, "<coll>.changes" | "<coll>.current"]`: the Dagster UI
labels a graph node with its key's last part, so that part names the collection and the table
(`[stream, db, coll, "current"]` drew every collection's node as "current"). A database's own
events (dropDatabase) are the table `$database.changes`.

A table has two forms, both made by `table_names` and nowhere else:

- its **key** keeps the real names (Dagster 1.13 accepts any text in a key's parts), so the
  Catalog and lineage show a collection as MongoDB calls it, spaces, Unicode and `$database`
  included; only a key too long for Dagster's storage (its `asset_keys` column is 512
  characters of JSON, escaped to `\\uXXXX`, on PostgreSQL and MySQL) has its collection part
  cut short and marked with `$` and the hash below (no collection name holds a `$`);
- its **name**, for everything Dagster names with `^[A-Za-z0-9_]+$` (the transform step's
  output per table, and the output of each check of it, which Dagster builds from the name):
  `<stream>__<db>__<coll>_<kind>` when the database and collection are plain (letters and
  digits, single inner underscores), which reads back unambiguously; otherwise each other
  character becomes `_`, each part is cut at 64 characters, and a hash of the exact names is
  appended, so two collections that escape alike (`a-b`, `a.b`, `a b`) still differ. A plain
  name ends in its kind, an escaped one in hex digits, so the two kinds never meet.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import dagster as dg

from tidemark.config import StreamConfig

TableKind = Literal["changes", "current"]
# (db, collection, kind) of a collection table; `$database` names a database's own events.
TableName = tuple[str, str, str]

# A part that a name may hold as it is: splitting the name on `__` gives it back.
_PLAIN = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")
_NOT_NAME = re.compile(r"[^A-Za-z0-9]")
# Escaped parts are cut here: the hash keeps them apart, and a run's log stays readable.
PART_LIMIT = 64
# Dagster keeps each asset key's JSON text in a VARCHAR(512) on PostgreSQL and MySQL.
KEY_LIMIT = 512
# 128 bits: names are chosen by whoever creates collections, so a short hash could be met on
# purpose (a birthday search found two 40-bit matches among `c` + punctuation in seconds).
_HASH_CHARS = 32
# What marks a key cut short: MongoDB refuses `$` in a collection name (Tidemark's own
# `$database` is never followed by a hash), so a cut key can never be a real collection's.
_CUT_MARK = "$"


@dataclass(frozen=True)
class TableNames:
    """What Dagster calls one collection table."""

    key: dg.AssetKey  # the real names (see the module's docstring for the one exception)
    name: str  # matches ^[A-Za-z0-9_]+$; different for every table of every stream


def keys(stream: StreamConfig) -> dict[str, dg.AssetKey]:
    return {name: dg.AssetKey([stream.name, name]) for name in ("raw_changes", "replay", "curated")}


def table_names(stream: str, db: str, coll: str, kind: str) -> TableNames:
    """The key and the Dagster name of `stream`'s table `kind` of `db`.`coll` (`$database`:
    the database's own events)."""
    # MongoDB names hold no NUL, so the joined text stands for exactly one table.
    digest = hashlib.sha256("\0".join((stream, db, coll, kind)).encode()).hexdigest()
    digest = digest[:_HASH_CHARS]
    if all(_PLAIN.fullmatch(p) and len(p) <= PART_LIMIT for p in (db, coll)):
        name = f"{stream}__{db}__{coll}_{kind}"
    else:
        db_part, coll_part = (_NOT_NAME.sub("_", p)[:PART_LIMIT] for p in (db, coll))
        name = f"{stream}__{db_part}__{coll_part}_{kind}_{digest}"
    key = dg.AssetKey([stream, db, f"{coll}.{kind}"])
    cut = coll
    while len(key.to_db_string()) > KEY_LIMIT:
        cut = cut[:-1]
        key = dg.AssetKey([stream, db, f"{cut}{_CUT_MARK}{digest}.{kind}"])
    return TableNames(key, name)


def table_key(stream: str, db: str, coll: str, kind: str) -> dg.AssetKey:
    return table_names(stream, db, coll, kind).key


def table_of(key: dg.AssetKey, stream: str) -> TableName | None:
    """(db, collection, kind) of one of `stream`'s collection table keys; None for any other
    key. A collection's name may hold dots: the kind is the last part. (A key cut short for
    Dagster's storage reads back with its cut name.)"""
    if len(key.path) != 3 or key.path[0] != stream:
        return None
    coll, _, kind = key.path[2].rpartition(".")
    return (key.path[1], coll, kind) if coll and kind in ("changes", "current") else None


def pool(stream: StreamConfig) -> str:
    """One concurrency pool per stream (limit 1): a stream never runs twice at once."""
    return f"tidemark_{stream.name}"
