"""Which of a run's events each step of its fold takes: a collection's events are folded in
segments between the namespace events that touch it (its drop, a rename from or to it, its
database's drop, a (re)snapshot of its scope), not at every namespace event of the run.

The fold keeps each key's newest event and a namespace event clears only its own scope, so two
stretches of a collection's events with no namespace event of that collection between them fold
as one: a database stream's run folds each collection once, plus once per namespace event that
touches it, where folding every collection at every namespace event cost a MERGE per
collection per namespace event. A segment that holds no event of any collection is skipped
before any Spark job, from each collection's span of event ids (`spans_of`): a database stream
whose run renames or drops many collections pays for the segments that hold events, not for
every namespace event. The plan is a function of the run's events, so a repeat of a killed run
plans the same steps (a run killed under an earlier plan: FOLD_SLOTS_FROM).
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
# killed under an earlier plan is repeated with each fold step made again, each idempotent (a
# MERGE takes newer events only, a clear deletes below its barrier), never skipped by a number
# that meant another step there. The plans so far: fold steps numbered on from the change log's
# (before segments); 500_000, every segment folded, empty or not; 600_000, empty ones skipped.
FOLD_SLOTS_FROM = 600_000
Span = tuple[str, str]  # the oldest and newest event id of a collection's keyed events
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


def spans_of(keyed: DataFrame) -> dict[Namespace, Span]:
    """Per collection, the span of its keyed events' ids (one small job over held events)."""
    rows = (
        keyed.groupBy(TM_DB, TM_COLL)
        .agg(F.min(TM_EVENT_ID).alias("oldest"), F.max(TM_EVENT_ID).alias("newest"))
        .collect()
    )
    return {(r[TM_DB], r[TM_COLL]): (r.oldest, r.newest) for r in rows}


@dataclass
class Segments:
    """Per collection, the event id of the last namespace event its events were folded up to;
    with `spans` (`spans_of` the run's keyed events), which segments hold none."""

    folded_to: dict[Namespace, str] = field(default_factory=dict)
    spans: dict[Namespace, Span] | None = None  # None: any segment may hold events

    def empty(self, before: str | None = None, scope: Scope | None = None) -> bool:
        """True when `due(..., before, scope)` holds no event, known without a Spark job."""
        if self.spans is None:
            return False
        for ns, (oldest, newest) in self.spans.items():
            outside = scope is not None and not in_scope(ns, scope)
            later = before is not None and oldest >= before
            folded = ns in self.folded_to and newest <= self.folded_to[ns]
            if not (outside or later or folded):
                return False
        return True

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
