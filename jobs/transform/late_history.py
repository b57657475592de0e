"""Late events behind a rename: which collections a run rebuilds from their whole history.

A late event (older than events earlier runs folded: a replayed window before the stream's
start, a replay folded while the drain lags) meets what came after it through the `removed`
table: a tombstone or a namespace event's barrier hides it (`fold.not_cleared`). That is right
behind a drop, whose documents are gone, but not behind a rename, whose documents moved on: a
late insert into b, folded after b was renamed to e, belongs in e, and a late rename a -> b,
folded after b -> e, carries a's rows on to e. Namespace events folded out of order do not
commute, so such a run rebuilds the collections involved from their change logs, in event
order, onto emptied tables (`apply.Fold.rebuild`), and folds its other events as usual.

Which collections: see `rebuild_set`. A rebuild writes only these tables: an older rename in
their history out to another collection moved what that collection already holds (nothing late
was older than it), so it is not made again there. A run with no late event pays nothing (the
state store answers: its oldest new event against the newest event earlier runs logged); a run
with late events reads the renames of the stream's change logs once, and a rebuild reads the
whole change logs of the collections it rebuilds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.curated_zone import changes_dir
from jobs.transform.change_log import NewEvents, read_logs
from jobs.transform.fold import NAMESPACE_OPERATIONS
from jobs.transform.segments import Namespace
from tidemark.object_path import LakePath


@dataclass(frozen=True)
class Rename:
    event_id: str
    source: Namespace
    target: Namespace


def to_rebuild(
    new: NewEvents,
    newest: str | None,
    logs: list[tuple[str | None, str | None]],
    lake_root: LakePath,
    stream: str,
) -> list[Namespace]:
    """The collections this run rebuilds from their history (none, nearly always). `newest`:
    the newest event id earlier runs logged; `logs`: the namespaces with a change log."""
    if newest is None or new.first_event_id >= newest:
        return []  # nothing older than what was folded: no late event
    collections = sorted({(db, coll) for db, coll in logs if db is not None and coll is not None})
    late: dict[Namespace, str] = {}  # per collection, its oldest late event

    def touch(ns: Namespace, event_id: str) -> None:
        late[ns] = min(late.get(ns, event_id), event_id)

    found = (
        new.frame.where(F.col("event_id") < F.lit(newest))
        .groupBy("db", "coll")
        .agg(F.min("event_id").alias("oldest"))
    )
    for row in found.collect():
        if row.db is None:  # the stream's own (a snapshot's start): every collection
            covered = collections
        elif row.coll is None:  # a database's own (its drop): its collections
            covered = [ns for ns in collections if ns[0] == row.db]
        else:
            covered = [(row.db, row.coll)]
        for ns in covered:
            touch(ns, row.oldest)
    renames = _renames(new.frame.sparkSession, lake_root, stream, collections)
    return rebuild_set(late, renames)


def rebuild_set(late: dict[Namespace, str], renames: list[Rename]) -> list[Namespace]:
    """The collections to rebuild for late events (`late`: each collection's oldest), given
    every rename of the stream: the collections a rename newer than a collection's oldest late
    event moved rows from or to (the rename's own event counts: a late rename moves what it
    renames), and on from there, and every collection ever renamed into one of those."""
    reached = dict(late)  # per collection, since when it holds what the late events touched
    moved: set[Namespace] = set()  # the collections such a rename took rows from or to
    for rename in sorted(renames, key=lambda r: r.event_id):  # documents move in time order
        since = reached.get(rename.source)
        if since is not None and rename.event_id >= since:
            arrived = reached.get(rename.target, rename.event_id)
            reached[rename.target] = min(arrived, rename.event_id)
            moved.update((rename.source, rename.target))
    # None moved: the barriers are right. A late collection no rename moved folds as usual.
    return sorted(_closure(moved, renames)) if moved else []


def _closure(start: set[Namespace], renames: list[Rename]) -> set[Namespace]:
    """`start` and every collection `renames` brought rows into it from, at any depth."""
    found = set(start)
    grew = True
    while grew:
        grew = False
        for rename in renames:
            if rename.target in found and rename.source not in found:
                found.add(rename.source)
                grew = True
    return found


def _renames(spark, lake_root: LakePath, stream: str, logs: list[Namespace]) -> list[Rename]:
    """Every rename in the collections' change logs (a rename is logged by its source)."""

    def renames(_: LakePath, log: DataFrame) -> DataFrame:
        shape = ("event_id", "db", "coll", "to_db", "to_coll")
        return log.where(F.col("operation_type") == "rename").select(*shape)

    paths = [changes_dir(lake_root, stream, *ns) for ns in logs]
    found = read_logs(spark, paths, renames)
    return [
        Rename(r.event_id, (r.db, r.coll), (r.to_db, r.to_coll))
        for r in (found.collect() if found is not None else [])
        if r.to_db is not None and r.to_coll is not None
    ]


def history(
    spark, lake_root: LakePath, stream: str, namespaces: list[Namespace]
) -> DataFrame | None:
    """Every event of `namespaces` from their change logs, with the namespace events of their
    databases (a drop) and of the stream (a snapshot's start) that cover them."""
    own = [changes_dir(lake_root, stream, *ns) for ns in namespaces]
    databases = sorted({db for db, _ in namespaces})
    covering = [changes_dir(lake_root, stream, db, None) for db in databases]
    covering.append(changes_dir(lake_root, stream, None, None))

    def shape(path: LakePath, log: DataFrame) -> DataFrame:
        if path in covering:
            return log.where(F.col("operation_type").isin(NAMESPACE_OPERATIONS))
        return log

    return read_logs(spark, own + covering, shape)
