"""Which of a run's events each step of its fold takes: a collection's events are folded in
segments between the namespace events that touch it (its drop, a rename from or to it, its
database's drop, a (re)snapshot of its scope), not at every namespace event of the run.

The fold keeps each key's newest event and a namespace event clears only its own scope, so two
stretches of a collection's events with no namespace event of that collection between them fold
as one: a database stream's run folds each collection once, plus once per namespace event that
touches it, where folding every collection at every namespace event cost a MERGE per
collection per namespace event. The plan is a function of the run's events, so a repeat of a
killed run plans the same steps (a run killed under the plan before this one: FOLD_SLOTS_FROM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.curated_zone import TM_COLL, TM_DB, TM_EVENT_ID
from jobs.transform.fold import NAMESPACE_OPERATIONS, Watched

Namespace = tuple[str, str]
# The fold's commits are numbered from here (`delta_io.RunWriter.slot`), one base per plan: a run
# killed under the plan before this one (whose fold steps went on from its change log's numbers)
# is repeated with each fold step made again, each idempotent (a MERGE takes newer events only, a
# clear deletes below its barrier), never skipped by a number that meant another step there.
FOLD_SLOTS_FROM = 500_000
Scope = list[Watched]  # the namespaces a namespace event touches


def namespace_events(events: DataFrame) -> list[Any]:
    """The run's namespace events, oldest first (a few: collected to the driver)."""
    found = (
        events.where(F.col("operation_type").isin(NAMESPACE_OPERATIONS))
        .select("event_id", "operation_type", "db", "coll", "to_db", "to_coll", "cluster_time")
        .collect()
    )
    return sorted(found, key=lambda e: e.event_id)


def scope_of(event: Any, watched: Watched) -> Scope:
    """The namespaces a namespace event clears: a rename's target too when the stream watches
    it (its rows move there)."""
    op = event.operation_type
    if op == "rename":
        scope = [Watched(event.db, event.coll)]
        if watched.contains(event.to_db, event.to_coll):
            scope.append(Watched(event.to_db, event.to_coll))
        return scope
    return [Watched(event.db, None if op == "dropDatabase" else event.coll)]


def in_scope(ns: Namespace, scope: Scope) -> bool:
    return any(part.contains(*ns) for part in scope)


def matching(scope: Scope, db: str = TM_DB, coll: str = TM_COLL) -> Column:
    """`in_scope` as a condition on events whose namespace is in columns `db` and `coll`
    (keyed events' by default; the raw events' are `db` and `coll`). Never null: an event
    whose collection is null (a database's drop) is simply not a collection's."""
    either = F.lit(False)
    for part in scope:
        one = F.lit(True)
        if part.database is not None:
            one = one & F.col(db).eqNullSafe(F.lit(part.database))
        if part.collection is not None:
            one = one & F.col(coll).eqNullSafe(F.lit(part.collection))
        either = either | one
    return either


@dataclass
class Segments:
    """Per collection, the event id of the last namespace event its events were folded up to."""

    folded_to: dict[Namespace, str] = field(default_factory=dict)

    def due(
        self, keyed: DataFrame, before: str | None = None, scope: Scope | None = None
    ) -> DataFrame:
        """The keyed events not folded yet: of the collections in `scope` (None: every one),
        older than the namespace event `before` (None: up to the run's end)."""
        conditions = [] if before is None else [F.col(TM_EVENT_ID) < F.lit(before)]
        if scope is not None:
            conditions.append(matching(scope))
        for ns, lower in sorted(self.folded_to.items()):
            conditions.append(~(matching([Watched(*ns)]) & (F.col(TM_EVENT_ID) <= F.lit(lower))))
        for condition in conditions:
            keyed = keyed.where(condition)
        return keyed

    def passed(self, namespaces: list[Namespace], scope: Scope, event_id: str) -> None:
        """Those of `namespaces` in `scope` are folded up to the namespace event `event_id`."""
        for ns in namespaces:
            if in_scope(ns, scope):
                self.folded_to[ns] = event_id
