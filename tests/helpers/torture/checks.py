"""The oracle: the four checks of the package docstring, one verdict per stream and check."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import PyMongoError

from jobs.curated_zone import OWN_PREFIX, TM_RESIDUAL
from state import StateStore
from tests.helpers.delta_reading import current_rows, current_tables, query
from tests.helpers.lake_reading import read_parquet
from tests.helpers.oracle import canonical, current_key
from tests.helpers.torture.config import SNAPSHOT_OPS
from tests.helpers.torture.reference import Ref, covers, python_fold, reference_events
from tests.helpers.torture.scheduler import FOLD_STREAMS, Sample, Torture
from tests.helpers.typed_rows import row_disagreements
from tidemark.config import StreamConfig
from tidemark.object_path import LakePath
from tidemark.tokens import (
    pack_ts,
    token_from_json,
    unpack_ts,
)

CHECKS = ("current", "changes", "replays", "files", "tokens")


@dataclass
class Verdict:
    stream: str
    check: str
    ok: bool
    detail: str = ""


@dataclass
class Segment:
    start: int  # packed startAtOperationTime of the explicit move that began it
    moved_at: datetime  # when the move was committed (before it: the previous segment)
    end: str | None = None  # the token before the next move (or the final one)


def segments(store: StateStore, name: str, plain_starts: list[int]) -> list[Segment]:
    """Incremental coverage: from each explicit move (resets, snapshots) to the next.

    A snapshot's move starts at the snapshot's time; a reset records only its description,
    so `plain_starts` gives the targets of the plain resets, in order."""
    plain = iter(plain_starts)
    snapshot_times = {s.id: pack_ts(s.cluster_time) for s in store.snapshots(name)}
    found: list[Segment] = []
    for reset in store.resets(name):
        if found:
            found[-1].end = reset["from_token"]
        match = re.match(r"snapshot (\S+)", reset["to_description"])
        start = snapshot_times[match.group(1)] if match else next(plain)
        found.append(Segment(start, reset["at"].replace(tzinfo=UTC)))
    checkpoint = store.checkpoint(name)
    if found and checkpoint is not None:
        found[-1].end = checkpoint.token.to_json() if checkpoint.token else None
    return found


def batch_events(lake: LakePath, batch: Any) -> list[str] | None:
    """The event ids a committed batch lists; None if one of its files is gone."""
    ids: list[str] = []
    for entry in batch.files:
        path = lake / entry.path
        if not path.exists():
            return None
        ids += read_parquet(path, columns=["event_id"]).column("event_id").to_pylist()
    return ids


class Oracle:
    def __init__(self, torture: Torture) -> None:
        self.t = torture
        self.verdicts: list[Verdict] = []
        self.captured: dict[str, int] = {}

    def check_all(self) -> list[Verdict]:
        t = self.t
        for name, stream in t.streams.items():
            segs = self._segments(name)
            batches = t.store.batches(name)
            replays = [b for b in batches if b.source == "replay" and b.window_start is not None]
            starts = [s.start for s in segs] + [pack_ts(b.window_start) for b in replays]
            refs, lost = self._reference(stream, starts, segs)
            if lost:  # the tiny oplog rolled past: only what it still holds is checked
                segs = [s for s in segs if s.start >= lost]
                replays = [b for b in replays if pack_ts(b.window_start) >= lost]
            expected = self._expected(stream, refs, segs, replays)
            self._check_current(name, stream, refs, expected)
            self._check_changes(name, refs, expected, lost)
            self._check_replays(name, stream, refs, replays)
            self._check_files(name, batches)
            self._check_tokens(name, refs, segs, batches)
        return self.verdicts

    def _reference(
        self, stream: StreamConfig, starts: list[int], segs: list[Segment]
    ) -> tuple[list[Ref], int]:
        """The reference events, and the start they are complete from when the oplog lost
        the earlier ones (0: complete)."""
        if not starts:
            return [], 0
        try:
            return reference_events(self.t.raw, stream, min(starts)), 0
        except PyMongoError as exc:
            if getattr(exc, "code", None) not in (280, 286) or not segs:
                raise
            return reference_events(self.t.raw, stream, segs[-1].start), segs[-1].start

    def _segments(self, name: str) -> list[Segment]:
        return segments(self.t.store, name, self.t.reset_starts.get(name, []))

    def _expected(
        self, stream: StreamConfig, refs: list[Ref], segs: list[Segment], replays: list[Any]
    ) -> list[Ref]:
        """The reference events the lake must hold: segment coverage plus replay windows."""
        chosen: dict[str, Ref] = {}
        for seg in segs:
            if seg.end is None:
                continue
            for e in refs:
                if e.ts >= seg.start and covers(seg.end, e):
                    chosen[e.data] = e
        if segs:  # the clean final run must have caught up: the last segment reaches the end
            for e in refs:
                if e.ts >= segs[-1].start:
                    chosen[e.data] = e
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
        for batch in replays:
            for e in refs:
                if pack_ts(batch.window_start) <= e.ts < pack_ts(batch.window_end):
                    chosen[e.data] = e
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
        return sorted(chosen.values(), key=lambda e: e.data)

    def _add(self, name: str, check: str, problems: list[str], note: str = "") -> None:
        detail = "; ".join(problems[:6]) + (
            f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
        )
        self.verdicts.append(Verdict(name, check, not problems, detail or note))

    # 1. current
    def _check_current(
        self, name: str, stream: StreamConfig, refs: list[Ref], expected: list[Ref]
    ) -> None:
        t = self.t
        # Each collection's `current` as any Delta reader sees it (`deltalake`, no Tidemark
        # code): its rows are the live documents, with no rule to apply, and each row's typed
        # columns and residual say what its document says.
        got: dict[tuple[str, str, str], str] = {}
        problems = []
        for (db, coll), path in current_tables(t.store, t.lake, name).items():
            rows = current_rows(path)
            for r in rows:
                key = (db, coll, r["_tm_key"])
                if key in got:
                    problems.append(f"key twice in {path}: {key}")
                got[key] = r["_tm_document"]
                typed = [c for c in r if not c.startswith(OWN_PREFIX)]
                wrong = row_disagreements(r, r["_tm_document"], typed, TM_RESIDUAL)
                if wrong:
                    problems.append(f"{key}'s typed columns: {'; '.join(wrong[:2])}")
        if name in FOLD_STREAMS:
            want, unsure = python_fold(expected, stream.database, stream.collection)
            note = (
                "compared with a Python fold of the reference events (DDL hidden or stopped); "
                f"{len(unsure)} keys last set by an update lookup not compared"
            )
        else:
            want, unsure = self._source(stream), set()
            note = "compared with find()"
        for key in sorted(set(got) | set(want), key=str):
            if key in unsure:
                continue
            if got.get(key) != want.get(key):
                problems.append(
                    f"{key}: current={_short(got.get(key))} expected={_short(want.get(key))}"
                )
        self._add(name, "current", problems, note)

    def _source(self, stream: StreamConfig) -> dict[tuple[str, str, str], str]:
        raw = self.t.raw
        if stream.collection is not None:
            # A collection renamed away leaves a collection stream's scope: its documents
            # leave `current` (README, "The tables"), so only the watched name is compared.
            names = [(stream.database, stream.collection)]
        else:
            dbs = [stream.database] if stream.database else [self.t.db_a, self.t.db_b]
            names = [
                (db, c)
                for db in dbs
                for c in raw[db].list_collection_names()
                if not c.startswith("system.")
            ]
        state = {}
        for db, coll in names:
            for doc in raw[db][coll].find():
                state[(db, coll, current_key(doc.raw))] = canonical(doc.raw)
        return state

    # 2. changes
    def _check_changes(self, name: str, refs: list[Ref], expected: list[Ref], lost: int) -> None:
        rows = [
            row
            for table in self.t.store.transforms.tables(name)
            if table.kind == "changes"
            for row in query(self.t.lake / table.path, "SELECT event_id, operation_type FROM t")
        ]
        logged = [r["event_id"] for r in rows if r["operation_type"] not in SNAPSHOT_OPS]
        self.captured[name] = len(logged)
        counts = Counter(logged)
        want = {e.data: e for e in expected}
        all_refs = {e.data: e for e in refs}
        problems = [f"twice: {i}" for i, n in counts.items() if n > 1]
        missing = [e for d, e in want.items() if d not in counts]
        problems += [
            f"missing {e.op} {e.db}.{e.coll} {e.key} at {unpack_ts(e.ts)} ({e.data[:40]}..)"
            for e in missing
        ]
        # Events older than the oplog's history cannot be judged: only what it still holds is.
        extra = [d for d in counts if d not in want and (not lost or d in all_refs)]
        problems += [
            f"extra {all_refs[d].op if d in all_refs else '(not in the reference)'} {d[:40]}.."
            for d in extra
        ]
        self._add(name, "changes", problems, f"{len(want)} expected events, {len(logged)} logged")

    # 2b. each replay batch holds its whole window (the union above hides a partial window
    # whose events the incremental segments also hold)
    def _check_replays(
        self, name: str, stream: StreamConfig, refs: list[Ref], replays: list[Any]
    ) -> None:
        problems = []
        for batch in replays:
            held = batch_events(self.t.lake, batch)
            if held is None:
                continue  # its files are gone: the files check says so
            want = []
            for e in refs:
                if pack_ts(batch.window_start) <= e.ts < pack_ts(batch.window_end):
                    want.append(e)
                    if e.op == "invalidate" and stream.on_invalidate == "stop":
                        break
            lacking = [e for e in want if e.data not in set(held)]
            if lacking:
                first = lacking[0]
                problems.append(
                    f"replay batch {batch.id} window [{batch.window_start}, "
                    f"{batch.window_end}) holds {len(held)} of {len(want)} events; "
                    f"first missing: {first.op} {first.db}.{first.coll} at {unpack_ts(first.ts)}"
                    f" (last held op: {batch.events_by_type})"
                )
        self._add(name, "replays", problems, f"{len(replays)} replay batches")

    # 3. files
    def _check_files(self, name: str, batches: list[Any]) -> None:
        problems = [
            f"batch {b.id} ({b.source}) lists missing {f.path}"
            for b in batches
            for f in b.files
            if not (self.t.lake / f.path).exists()
        ]
        self._add(name, "files", problems, f"{sum(len(b.files) for b in batches)} files")

    # 4. tokens
    def _check_tokens(
        self, name: str, refs: list[Ref], segs: list[Segment], batches: list[Any]
    ) -> None:
        committed: dict[str, datetime] = {}
        for b in batches:
            if b.source != "incremental":
                continue
            ids = batch_events(self.t.lake, b) or []
            at = b.committed_at.replace(tzinfo=UTC)
            for i in ids:
                committed[i] = min(committed.get(i, at), at)
        samples = [s for s in self.t.samples if s.stream == name]
        samples += [
            Sample(name, b.committed_at.replace(tzinfo=UTC), b.token_after.to_json())
            for b in batches
            if b.source == "incremental" and b.token_after
        ]
        first_seen: dict[str, datetime] = {}
        for s in samples:
            first_seen[s.token] = min(first_seen.get(s.token, s.at), s.at)
        problems = []
        for token, at in sorted(first_seen.items(), key=lambda x: x[1]):
            live = [seg for seg in segs if seg.moved_at < at]
            if not live:
                continue
            start = live[-1].start
            for e in refs:
                if e.ts < start:
                    continue
                if not covers(token, e):
                    break
                when = committed.get(e.data)
                if when is None or when > at:
                    problems.append(
                        f"token {token_from_json(token)['_data'][:26]}.. (seen {at:%H:%M:%S.%f}) "
                        f"covers {e.op} {e.db}.{e.coll} {e.key} at {unpack_ts(e.ts)} "
                        + (
                            "never committed"
                            if when is None
                            else f"committed at {when:%H:%M:%S.%f}"
                        )
                    )
                    break
        self._add(name, "tokens", problems, f"{len(first_seen)} distinct tokens sampled")


def _short(value: str | None) -> str:
    if value is None:
        return "absent"
    return value if len(value) < 90 else value[:87] + "..."
