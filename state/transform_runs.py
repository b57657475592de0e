"""The transform's half of the store: its committed runs (those that wrote `current` are the
runs a reader may travel back to), and which batches are folded.

A transform run commits like a drain: one fenced transaction (the store's
`fenced_transaction`), compare-and-set on the newest run number, so two transforms of one
stream never both commit, and a batch is folded by exactly one committed run.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Select, delete, func, insert, select, update

from state import manifest, schema
from state.leases import TRANSFORM_LEASE_TTL
from state.records import BatchRecord, CuratedTable, Lease, SnapshotStatus, TransformRun
from state.schema import utc_now
from state.store import StateStore
from tidemark.errors import TransformConflict

_RUN_FIELDS = (
    "stream",
    "run",
    "path",
    "kind",
    "base_run",
    "written_rows",
    "rows",
    "doc_schema",
    "events_folded",
    "changes_added",
    "changes_path",
    "first_event_id",
    "last_event_id",
    "created_at",
)


class TransformState:
    """The transform's view of one state store (it holds the store, and nothing else)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def untransformed_batches(self, stream: str) -> list[BatchRecord]:
        """Committed batches not folded yet, oldest first.

        Chunks of an unfinished snapshot wait for the rest: a namespace is replaced by its
        snapshot as a whole.

        Raises:
            StateStoreError: the database failed.
        """
        b, t, s = schema.batches, schema.transformed_batches, schema.snapshots
        finished: SnapshotStatus = "done"
        folded = select(t.c.batch_id).where(t.c.batch_id == b.c.id).exists()
        waiting = select(s.c.id).where(s.c.id == b.c.snapshot_id, s.c.status != finished).exists()
        query = (
            select(b)
            .where(b.c.stream == stream, ~folded, ~waiting)
            .order_by(b.c.committed_at, b.c.id)
        )
        with self.store.transaction("transform progress") as conn:
            return manifest.batches_of(conn, query)

    def change_log_runs(
        self, stream: str, first_event_id: str | None = None, last_event_id: str | None = None
    ) -> list[TransformRun]:
        """Committed runs that added to the change log, oldest first; only those whose event
        ids overlap [first_event_id, last_event_id] when given.

        Raises:
            StateStoreError: the database failed.
        """
        query = _runs(stream).where(_V.c.changes_path.is_not(None))
        if first_event_id is not None and last_event_id is not None:
            query = query.where(
                _V.c.last_event_id >= first_event_id, _V.c.first_event_id <= last_event_id
            )
        return self._read("change log", query.order_by(_V.c.run))

    def newest_logged_event(self, stream: str) -> str | None:
        """The newest event id a committed run added to the change log (None: none yet).

        Raises:
            StateStoreError: the database failed.
        """
        query = select(func.max(_V.c.last_event_id)).where(_V.c.stream == stream)
        with self.store.transaction("change log") as conn:
            return conn.execute(query).scalar_one_or_none()

    def current_runs(self, stream: str, include_pruned: bool = False) -> list[TransformRun]:
        """The runs that wrote `current` (those a reader may travel back to), oldest first.

        Raises:
            StateStoreError: the database failed.
        """
        query = _runs(stream, wrote_current=True, include_pruned=include_pruned)
        return self._read("run list", query.order_by(_V.c.run))

    def runs(self, stream: str) -> list[TransformRun]:
        """Every committed run, whether it wrote `current` or not, oldest first.

        Raises:
            StateStoreError: the database failed.
        """
        return self._read("run list", _runs(stream).order_by(_V.c.run))

    def latest(self, stream: str) -> TransformRun | None:
        """The newest committed run (its number is the next run's compare-and-set base).

        Raises:
            StateStoreError: the database failed.
        """
        return _first(self._read("run list", _newest(_runs(stream))))

    def latest_current_run(self, stream: str) -> TransformRun | None:
        """The newest run that wrote `current`, pruned or not.

        Raises:
            StateStoreError: the database failed.
        """
        query = _newest(_runs(stream, wrote_current=True, include_pruned=True))
        return _first(self._read("run list", query))

    def intent(self, stream: str) -> tuple[int, list[str]] | None:
        """The run a crashed transform left under way: its number and its batches.

        Raises:
            StateStoreError: the database failed.
        """
        i = schema.transform_intents
        with self.store.transaction("transform intent") as conn:
            row = conn.execute(select(i.c.run, i.c.batch_ids).where(i.c.stream == stream)).first()
        return (row.run, json.loads(row.batch_ids)) if row else None

    def record_intent(self, lease: Lease, stream: str, run: int, batch_ids: list[str]) -> None:
        """Write down the run about to change Delta tables (fenced by the transform lease), so
        that a crash after its first Delta commit is repeated with the same run number over the
        same batches: Delta then skips every commit the first attempt made.

        Raises:
            LeaseLost: the transform lease was taken over.
            StateStoreError: the database failed.
        """
        i = schema.transform_intents
        values = {"run": run, "batch_ids": json.dumps(batch_ids), "started_at": utc_now()}
        with self.store.fenced_transaction("transform intent", lease, TRANSFORM_LEASE_TTL) as conn:
            conn.execute(delete(i).where(i.c.stream == stream))
            conn.execute(insert(i).values(stream=stream, **values))

    def tables(self, stream: str, run: int | None = None) -> list[CuratedTable]:
        """Each collection table of the stream as of committed run `run` (default: the newest):
        the newest record of each at or before it, ordered by database, collection and kind.

        Raises:
            StateStoreError: the database failed.
        """
        c = schema.curated_tables
        query = select(c).where(c.c.stream == stream)
        if run is not None:
            query = query.where(c.c.run <= run)
        with self.store.transaction("curated tables") as conn:
            rows = [CuratedTable(**dict(row._mapping)) for row in conn.execute(query)]
        newest: dict[tuple[str, str, str], CuratedTable] = {}
        for table in sorted(rows, key=lambda t: t.run):
            newest[(table.db, table.coll, table.kind)] = table
        return [newest[key] for key in sorted(newest)]

    def _read(self, what: str, query: Select[Any]) -> list[TransformRun]:
        with self.store.transaction(what) as conn:
            return [TransformRun(**_by_key(row)) for row in conn.execute(query)]

    def commit(
        self,
        lease: Lease,
        stream: str,
        expected_latest: int | None,
        run: TransformRun | None,
        batch_ids: list[str],
        tables: list[CuratedTable] | None = None,
    ) -> None:
        """Commit a transform run in one transaction.

        Rules: the same as a drain's commit (see `StateStore.commit_batch`): nothing is
        committed unless every step succeeds, and a run whose lease was taken over, or that
        started from a run number no longer the newest, commits nothing.

        1. Fence: the transform lease is still this run's (and is extended).
        2. Compare-and-set: the newest run is still `expected_latest` (None: no run yet).
        3. Record the run (`run`; None for a run that only marked batches) and the Delta
           version of each collection table it changed (`tables`).
        4. Mark `batch_ids` as folded (by `run`, or by no run: all duplicates), and
           clear the stream's intent: the run is done.

        Raises:
            LeaseLost: the transform lease was taken over.
            TransformConflict: another transform of the stream committed meanwhile.
            StateStoreError: the database failed; nothing was committed.
        """
        v = schema.transform_runs
        with self.store.fenced_transaction("transform commit", lease, TRANSFORM_LEASE_TTL) as conn:
            latest = conn.execute(
                select(func.max(v.c.run)).where(v.c.stream == stream)
            ).scalar_one_or_none()
            if latest != expected_latest:
                raise TransformConflict(
                    f"Another transform of stream {stream!r} committed run {latest} while this "
                    f"one worked from run {expected_latest}; nothing was committed.",
                    "Run the transform again: it starts from the newest run.",
                )
            if run is not None:
                conn.execute(insert(v).values(**{k: getattr(run, k) for k in _RUN_FIELDS}))
            if tables:
                conn.execute(insert(schema.curated_tables), [vars(t) for t in tables])
            i = schema.transform_intents
            conn.execute(delete(i).where(i.c.stream == stream))
            if batch_ids:
                now = utc_now()
                conn.execute(
                    insert(schema.transformed_batches),
                    [
                        {
                            "batch_id": b,
                            "stream": stream,
                            "run": run.run if run else None,
                            "transformed_at": now,
                        }
                        for b in batch_ids
                    ],
                )

    def mark_pruned(self, stream: str, run: int) -> None:
        """Take run `run` out of the list readers may travel back to (`current_runs`); a later
        run deletes its files.

        Raises:
            StateStoreError: the database failed.
        """
        self._update_run("prune", stream, run, pruned_at=utc_now())

    def prune_beyond(self, stream: str, keep: int) -> None:
        """Mark every run that wrote `current` but the newest `keep` pruned (`mark_pruned`).

        Raises:
            StateStoreError: the database failed.
        """
        kept = self.current_runs(stream)
        for old in kept[: max(0, len(kept) - keep)]:
            self.mark_pruned(stream, old.run)

    def _update_run(self, what: str, stream: str, run: int, **values: Any) -> None:
        with self.store.transaction(what) as conn:
            conn.execute(update(_V).where(_V.c.stream == stream, _V.c.run == run).values(**values))


_V = schema.transform_runs


def _by_key(row: Any) -> dict[str, Any]:
    """A row of the runs table by its columns' Python keys (`run`, not the SQL `version`)."""
    return {column.key: row._mapping[column] for column in _V.columns}


def _runs(stream: str, wrote_current: bool = False, include_pruned: bool = True) -> Select[Any]:
    """The stream's committed runs; only those that wrote `current`, and only those not
    pruned, when asked."""
    query = select(_V).where(_V.c.stream == stream)
    if wrote_current:
        query = query.where(_V.c.path.is_not(None))
    if not include_pruned:
        query = query.where(_V.c.pruned_at.is_(None))
    return query


def _newest(query: Select[Any]) -> Select[Any]:
    return query.order_by(_V.c.run.desc()).limit(1)


def _first(found: list[TransformRun]) -> TransformRun | None:
    return found[0] if found else None
