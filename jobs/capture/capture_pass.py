"""One capture pass: a change stream opened at a position -> the raw zone's files, not committed.

The incremental drain and the replay of a window are the same pass with other bounds: where
it opens, where its end is, whether a budget applies, and whether an empty getMore may end it.
Both commit what the pass returns themselves (the drain moves its checkpoint, a replay never
does), so everything about reading, stopping and server errors lives here once.

Rules of a pass:
1. Work is per server reply, not per event: the cut for a budget is an index, the end is
   checked on a reply's last event, with a binary search only when it crosses.
2. The token after the pass is where its consumer resumes without a gap or a repeat: the
   token it opened at while nothing is consumed, the last consumed event's id after a cut,
   the reply's postBatchResumeToken after a whole reply.
3. A closed cursor ends the pass as an invalidate, whether or not the pipeline let the
   invalidate event through; its token is then the invalidate's, for a later startAfter.
4. Server errors become Tidemark errors that say nothing was committed; files written so far
   are orphans that `tidemark gc` sweeps once no writer holds the stream.
5. A resume token the server cannot find again (its event's lookup now fails the filter)
   opens the pass at the token's time instead, skipping the events up to it (`_by_time`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from jobs.bson_buffer import RawDocuments
from jobs.capture._fragments import server_splits, whole_events
from jobs.capture.reader import ChangeStreamReader, WatchSpec
from jobs.capture.server_errors import FATAL, translate
from jobs.capture.writer import RawBatchWriter
from state import BatchRecord, BatchSource, FileEntry
from state.leases import CAPTURE_LEASE_TTL
from tidemark.config import Budget, StreamConfig
from tidemark.errors import MongoConnectionError, WindowNotConfirmed
from tidemark.pipeline_stages import capture_pipeline
from tidemark.tokens import ResumeToken, optional_token, token_cluster_time, token_data

# How long a replay waits for the server to confirm its window's end (majority lag).
END_WAIT_SECONDS = 600.0

# Why a pass (and so a drain or a replay) stopped; `DrainResult.stop_reason` reports it.
StopReason = Literal[
    "caught_up",  # the server had nothing more (or every event up to the end was returned)
    "horizon",  # the next event is past the end: the drain's horizon, the replay's window
    "budget_events",  # the stream's budget: max_events consumed
    "budget_bytes",  # max_bytes consumed (the event that crosses it is the last)
    "budget_seconds",  # max_seconds spent
    "invalidate",  # the stream was invalidated (the event, or a closed cursor without it)
    "closed",  # the replies ended without one saying why (a safeguard: a closed one ends it)
    "snapshot_in_progress",  # the drain copied snapshot chunks and stopped before the stream
]


@dataclass
class Capture:
    """What one pass over a change stream consumed."""

    events: int = 0
    bytes: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    first_ts: Timestamp | None = None
    last_ts: Timestamp | None = None
    first_id: str | None = None
    last_id: str | None = None
    token: Any = None  # the resume token after the last event consumed
    stop: StopReason | None = None  # set by every return of `capture`
    invalidated: bool = False
    # (db, coll, to db, to coll) of each rename consumed: a rename into a collection stream's
    # collection brings documents the stream never saw (`renamed_into`).
    renames: list[tuple[str, str, str, str]] = field(default_factory=list)

    def renamed_into(self, stream: StreamConfig) -> bool:
        """True when a rename replaced the collection of a collection stream with another
        collection, whose documents were never events of this stream."""
        if stream.scope != "collection":
            return False  # a database or cluster stream saw those documents (or their copy)
        watched = (stream.database, stream.collection)
        return any(r[:2] != watched and r[2:] == watched for r in self.renames)

    @property
    def resume_token(self) -> ResumeToken | None:
        """`token`, typed: what the checkpoint and the manifest keep."""
        return optional_token(self.token)


@dataclass(frozen=True)
class PassBounds:
    """Where a pass ends: its end (a horizon or a window's end), its budget, and whether an
    invalidate ends it."""

    is_past_end: Callable[[Timestamp], bool]
    budget: Budget
    # A replay's window is complete only once the stream's tokens pass its end; a drain may
    # stop at the first empty getMore (the next run goes on from there).
    until_end: bool = False
    # Go on past an invalidate with startAfter: a replay of a stream set to `on_invalidate:
    # continue` covers the re-created collection, as the drain would.
    follow_invalidate: bool = False


def open_reader(
    client: MongoClient,
    stream: StreamConfig,
    start: dict[str, Any],
    bounds: PassBounds,
) -> ChangeStreamReader:
    options: dict[str, Any] = dict(start)
    if stream.full_document != "default":
        options["fullDocument"] = stream.full_document
    if stream.full_document_before_change != "off":
        options["fullDocumentBeforeChange"] = stream.full_document_before_change
    if stream.show_expanded_events:
        options["showExpandedEvents"] = True
    spec = WatchSpec(
        stream.database,
        stream.collection,
        options,
        # Deletes and namespace events pass the stream's $match stages while it feeds
        # `current` (the pipeline's own rule; its fingerprint is of the stages as written).
        capture_pipeline(stream.mongo_pipeline(), stream.current_table),
        batch_size=stream.batch_size,
        max_await_time_ms=stream.max_await_time_ms,
        split_large_events=stream.split_large_events and server_splits(client),
    )
    return ChangeStreamReader(
        client, spec, is_past_end=bounds.is_past_end, until_end=bounds.until_end
    )


def _cluster_time(event: RawBSONDocument) -> Timestamp:
    return event["clusterTime"]


def _first_past_end(
    events: RawDocuments, end: int, is_past_end: Callable[[Timestamp], bool]
) -> int:
    """Index of the first event past the end (cluster times never go back in a stream)."""
    low, high = 0, end
    while low < high:
        middle = (low + high) // 2
        if is_past_end(_cluster_time(events[middle])):
            high = middle
        else:
            low = middle + 1
    return low


# A rename's operationType element as it sits in BSON: a reply without it holds no rename.
_RENAME = b"\x02operationType\x00\x07\x00\x00\x00rename\x00"


def _renames(events: RawDocuments) -> list[tuple[str, str, str, str]]:
    """The namespaces of the renames among `events` (one search per reply; rarely a walk)."""
    end = int(events.starts[-1] + events.sizes[-1])
    if events.buffer.find(_RENAME, int(events.starts[0]), end) < 0:
        return []
    found = []
    for event in events:
        if event["operationType"] == "rename":
            ns, to = event["ns"], event["to"]
            found.append((ns["db"], ns["coll"], to["db"], to["coll"]))
    return found


def _budget_cut(
    events: RawDocuments, got: Capture, budget: Budget
) -> tuple[int, StopReason | None]:
    take, stop = len(events), None
    if budget.max_events:
        left = budget.max_events - got.events
        if left < take:
            take, stop = max(left, 0), "budget_events"
    if budget.max_bytes:
        sizes = got.bytes + np.cumsum(events.sizes[:take])
        crossing = int(np.searchsorted(sizes, budget.max_bytes))  # first at or above
        if crossing < take:  # the event that crosses the limit is the last
            take, stop = crossing + 1, "budget_bytes"
    return take, stop


def capture(
    reader: ChangeStreamReader,
    writer: RawBatchWriter,
    bounds: PassBounds,
    keep_alive: Callable[[], None],
    got: Capture | None = None,
    counted: Callable[[int], None] | None = None,
    read_through: str | None = None,
) -> Capture:
    """Consume whole replies until caught up, past the end, a budget, or an invalidate;
    events up to the event id `read_through` (a position reopened by its time) are skipped."""
    clock = time.monotonic()
    renewed = waiting_since = clock
    budget = bounds.budget
    if got is None:
        got = Capture()
    got.token = reader.initial_token
    got.stop, got.invalidated = None, False
    # Whole events only: a budget or the end can cut between events, never inside one.
    for reply in whole_events(reader.replies(), got.token):
        events = reply.events
        now = time.monotonic()
        if read_through is not None and len(events):
            seen = _read_before(events, read_through)
            if seen:
                events, waiting_since = events[seen:], now
        if now - renewed > CAPTURE_LEASE_TTL.total_seconds() / 3:
            keep_alive()
            renewed = now
        if not events:
            if reply.closed:  # an invalidate the pipeline filtered out
                got.token, got.invalidated, got.stop = reply.token_after, True, "invalidate"
                return got
            if reply.caught_up:
                # Only caught-up replies are empty (and a replay's heartbeats while it waits
                # for its end): the postBatchResumeToken moves quiet streams forward too.
                got.token, got.stop = reply.token_after, "caught_up"
                return got
            if now - waiting_since > END_WAIT_SECONDS:
                raise WindowNotConfirmed(
                    f"The server did not show the end of the window as passed within "
                    f"{END_WAIT_SECONDS:.0f} s (majority commits lagging?); nothing was "
                    "committed, since the window could be incomplete.",
                    "Check the replica set's health (rs.status()) and run the replay again.",
                )
            continue
        waiting_since = now
        if budget.max_seconds and now - clock >= budget.max_seconds:
            got.stop = "budget_seconds"
            return got
        take, stop = _budget_cut(events, got, budget)
        if take and bounds.is_past_end(_cluster_time(events[take - 1])):
            take, stop = _first_past_end(events, take, bounds.is_past_end), "horizon"
        if take:
            consumed = events[:take]
            writer.add(consumed)
            got.renames += _renames(consumed)
            got.events += take
            got.bytes += consumed.nbytes
            if counted is not None:
                counted(got.events)
            if got.first_id is None:
                got.first_id = consumed[0]["_id"]["_data"]
                got.first_ts = _cluster_time(consumed[0])
            last = consumed[-1]
            got.last_id, got.last_ts = last["_id"]["_data"], _cluster_time(last)
            whole = take == len(events)
            if last["operationType"] == "invalidate":
                got.token, got.invalidated, stop = last["_id"], True, "invalidate"
            elif whole and reply.closed:
                got.token, got.invalidated, stop = reply.token_after, True, "invalidate"
            else:
                got.token = reply.token_after if whole else last["_id"]
        if stop:
            got.stop = stop
            return got
        if reply.caught_up:  # consumed whole: its token is the postBatchResumeToken
            got.stop = "caught_up"
            return got
    got.stop = "closed"
    return got


def capture_pass(
    stream: StreamConfig,
    client: MongoClient,
    writer: RawBatchWriter,
    start: dict[str, Any],
    bounds: PassBounds,
    keep_alive: Callable[[], None],
    *,
    position_time: Timestamp | None,
    counted: Callable[[int], None] | None = None,
) -> Capture:
    """Open the stream at `start` and capture into `writer` (closed on return or error) until
    `bounds` end it; `counted` is told the events consumed so far after each reply (progress).
    """
    got = Capture()
    read_through = None
    try:
        while True:
            try:
                with open_reader(client, stream, start, bounds) as reader:
                    got = capture(reader, writer, bounds, keep_alive, got, counted, read_through)
            except OperationFailure as exc:
                by_time = _by_time(exc, start) if read_through is None and not got.events else None
                if by_time is None:
                    raise
                start, read_through = by_time
                continue
            if not (bounds.follow_invalidate and got.stop == "invalidate"):
                break
            start, read_through = {"startAfter": got.token}, None
    except OperationFailure as exc:
        writer.close()
        raise translate(exc, stream.name, client, position_time) from None
    except PyMongoError as exc:  # the server went away, and one resume attempt failed too
        writer.close()
        raise MongoConnectionError(
            f"MongoDB became unreachable while stream {stream.name!r} was captured "
            f"({type(exc).__name__}: {str(exc).split(', Timeout')[0][:200]}); nothing was "
            "committed.",
            "The next run resumes from the last checkpoint once the server is back.",
        ) from None
    writer.close()
    got.counts = writer.counts
    return got


def _by_time(exc: OperationFailure, start: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The position of `start` as its cluster time and event id, when the server could not
    find its resume token although the oplog still holds it; None for any other failure.

    To resume, the server reads the token's event again, looks its document up again and runs
    the pipeline over it: a filter on fullDocument that the event passed when it was read may
    fail now (its document changed, or came back after a delete under the same _id), and the
    server then answers "the resume token was not found" (code 280) for good. Opened at the
    token's time instead, the events up to it are skipped by id (event ids sort like the
    stream), so nothing is read twice or missed.
    """
    token = start.get("resumeAfter")
    if exc.code != FATAL or token is None or "resume token was not found" not in str(exc):
        return None
    data, at = token_data(token), token_cluster_time(token)
    return ({"startAtOperationTime": at}, data) if data and at is not None else None


def _read_before(events: RawDocuments, read_through: str) -> int:
    """How many of `events` (in stream order) come at or before the event id `read_through`."""
    seen = 0
    while seen < len(events) and events[seen]["_id"]["_data"] <= read_through:
        seen += 1
    return seen


def batch_record(
    batch_id: str,
    stream: str,
    source: BatchSource,
    got: Capture,
    files: list[FileEntry],
    **extra: Any,
) -> BatchRecord:
    """What the pass consumed as a batch of the manifest, also when it consumed nothing (a
    run's result is made from it, `DrainResult.of`; only a batch with events is committed)."""
    return BatchRecord(
        id=batch_id,
        stream=stream,
        source=source,
        event_count=got.events,
        bytes=got.bytes,
        files=files,
        events_by_type=dict(got.counts),
        first_event_id=got.first_id,
        last_event_id=got.last_id,
        first_cluster_time=got.first_ts,
        last_cluster_time=got.last_ts,
        **extra,
    )
