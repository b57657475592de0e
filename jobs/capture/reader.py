"""A change-stream cursor below `watch()`: aggregate and getMore, one getMore ahead.

pymongo's ChangeStream sends the next getMore only once the current batch is used up, so the
server and the client take turns. This reader runs the cursor in a background thread that
fetches the next batch while the caller converts the current one, and hands out whole batches
(no per-event driver work). It follows the drivers' change-streams specification where it
replaces the driver:

- resumable errors: any non-server error (network, timeout), CursorNotFound (43), and on
  servers >= 4.4 any error labelled ResumableChangeStreamError (below 4.4: the listed codes);
  only errors of getMore are resumable, never those of the aggregate itself;
- one resume attempt per error, in the same session, killing the old cursor quietly;
- the resume point: the cached token (startAfter if the stream began with startAfter and has
  returned nothing yet, else resumeAfter), else the saved operation time, else the original
  command;
- the cached token: after each batch, its postBatchResumeToken if the server sent one, else
  the last event's _id; the token after each event is that event's _id, and after the last
  event of a batch the postBatchResumeToken;
- where the stream stands before any event (`initial_token`): the aggregate's
  postBatchResumeToken only if its first batch is empty. With events in it, that token lies
  past them, so a caller that takes none of them (they are past its end) must stay at the
  token it opened with, or they would be skipped.

A reply whose cursor id is 0 means the server closed the stream: after an invalidate, which a
pipeline may have filtered out, so the closed cursor, not the event, is the signal.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bson import Int64, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from jobs.capture._bson import INT32, RawDocuments, array_documents, elements, int32_at, int64_at
from resources.mongo import RAW_CODEC
from tidemark.tokens import covered_until, next_tick, token_cluster_time

CURSOR_NOT_FOUND = 43
# How long a getMore waits when all it can still find is events at the end's very time.
CONFIRM_AWAIT_MS = 50
# Servers before 4.4 (wire version < 9) do not label resumable errors; the spec lists these.
LEGACY_RESUMABLE_CODES = {
    6,
    7,
    89,
    91,
    189,
    262,
    9001,
    10107,
    11600,
    11602,
    13435,
    13436,
    63,
    150,
    13388,
    234,
    133,
}


def is_resumable(error: Exception, wire_version: int) -> bool:
    if isinstance(error, ConnectionFailure):  # network errors and timeouts
        return True
    if isinstance(error, OperationFailure):
        if error.code == CURSOR_NOT_FOUND:
            return True
        if wire_version >= 9:
            return error.has_error_label("ResumableChangeStreamError")
        return error.code in LEGACY_RESUMABLE_CODES
    return False


@dataclass
class Batch:
    """Events of one server reply and the token to resume after all of them."""

    events: RawDocuments  # one reply's buffer: events are decoded only where looked at
    token_after: Any  # postBatchResumeToken if sent, else the last event's _id
    # Nothing more to read for this caller: the server waited maxAwaitTimeMS and found
    # nothing (unless the reader waits for its end only), or every event up to the caller's
    # end has been returned (the postBatchResumeToken covers it: `covered_until`).
    caught_up: bool = False
    # The server closed the cursor with this reply: the stream was invalidated, and
    # `token_after` is the invalidate's token even if the pipeline filtered the event out.
    closed: bool = False


@dataclass
class CursorReply:
    id: int
    ns: str
    events: RawDocuments
    post_batch_token: RawBSONDocument | None


def read_cursor(reply: bytes) -> CursorReply:
    """The `cursor` of an aggregate or getMore reply, read from its bytes: the batch's events
    are located, not decoded (pymongo would build an object per event here)."""
    cursor = next(value for key, _, value, _ in elements(reply) if key == "cursor")
    found = CursorReply(0, "", RawDocuments.of([]), None)
    for key, bson_type, value, size in elements(reply, cursor):
        if key == "id":
            found.id = (int32_at if bson_type == INT32 else int64_at)(reply, value)[0]
        elif key == "ns":
            found.ns = reply[value + 4 : value + size - 1].decode()
        elif key in ("firstBatch", "nextBatch"):
            found.events = array_documents(reply, value)
        elif key == "postBatchResumeToken":
            found.post_batch_token = RawBSONDocument(reply[value : value + size], RAW_CODEC)
    return found


class _End:
    """Sent when the server closed the cursor (after an invalidate)."""


class ChangeStreamReader:
    """Open with `with`; iterate `batches()`; every batch's events in server order."""

    def __init__(
        self,
        client: MongoClient,
        database: str | None,
        collection: str | None,
        change_stream_options: dict[str, Any],
        pipeline: list[dict[str, Any]],
        batch_size: int,
        max_await_time_ms: int,
        prefetch: int = 2,
        is_past_end: Callable[[Timestamp], bool] | None = None,
        until_end: bool = False,
    ) -> None:
        self.client = client
        self.database = database or "admin"
        self.collection = collection
        self.options = dict(change_stream_options)
        if database is None:
            self.options["allChangesForCluster"] = True
        self.pipeline = pipeline
        self.batch_size = batch_size
        self.max_await_time_ms = max_await_time_ms
        self.is_past_end = is_past_end
        # A replay reads until the stream's tokens pass its end: an empty getMore only says
        # that nothing was majority-committed yet, not that the window is complete.
        self.until_end = until_end
        self.cursor_id = 0
        self.resumes = 0
        self._namespace_coll = collection or "$cmd.aggregate"
        self._cached_token: Any = self.options.get("resumeAfter") or self.options.get("startAfter")
        self.initial_token: Any = self._cached_token
        self._operation_time: Timestamp | None = self.options.get("startAtOperationTime")
        self._returned_any = False
        self._at_end = False  # the last token reached the caller's end, but not past it
        self._wire_version = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._more = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._db = client.get_database(self.database, codec_options=RAW_CODEC)

    # -- the caller's side ---------------------------------------------------------------

    def __enter__(self) -> ChangeStreamReader:
        self._session = self.client.start_session(causal_consistency=False)
        # The aggregate runs here, so its errors (history lost, bad token) surface at once.
        first = self._aggregate()
        if not len(first.events):  # the spec: only an empty first batch's token is cached
            self.initial_token = self._cached_token
        self._thread = threading.Thread(
            target=self._fetch_loop, args=(first,), name="tidemark-getmore", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self) -> Iterator[Batch]:
        """Batches as the server sends them; after a caught-up one (see `Batch`; only those
        can be empty) the next getMore is sent only if the caller asks for more. Ends after
        the server closes the cursor (an invalidate)."""
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is _End:
                return
            yield item
            if item.caught_up:
                self._more.set()  # the caller went on after "caught up": fetch again

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                with contextlib.suppress(queue.Empty):  # unblock a producer on a full queue
                    self._queue.get_nowait()
                self._thread.join(timeout=0.05)
            self._thread = None
        self._kill_cursor()
        if self._session is not None:
            self._session.end_session()
            self._session = None

    # -- the background thread -----------------------------------------------------------

    def _command(self, command: dict[str, Any]) -> RawBSONDocument:
        return self._db.command(command, session=self._session, codec_options=RAW_CODEC)

    def _aggregate(self) -> CursorReply:
        stage = {"$changeStream": self._resume_options()}
        command = {
            "aggregate": self.collection if self.collection else 1,
            "pipeline": [stage, *self.pipeline],
            "cursor": {"batchSize": self.batch_size},
        }
        reply = self._command(command)
        self._wire_version = self._max_wire_version()
        cursor = read_cursor(reply.raw)
        self.cursor_id = cursor.id
        self._namespace_coll = cursor.ns.split(".", 1)[1]
        if self._operation_time is None and "operationTime" in reply:
            self._operation_time = reply["operationTime"]
        self._remember(cursor.events, cursor.post_batch_token)
        return cursor

    def _resume_options(self) -> dict[str, Any]:
        options = {
            k: v
            for k, v in self.options.items()
            if k not in ("resumeAfter", "startAfter", "startAtOperationTime")
        }
        if self._cached_token is not None:
            if "startAfter" in self.options and not self._returned_any:
                options["startAfter"] = self._cached_token
            else:
                options["resumeAfter"] = self._cached_token
        elif self._operation_time is not None:
            options["startAtOperationTime"] = self._operation_time
        return options

    def _max_wire_version(self) -> int:
        try:
            return int(self.client.admin.command("hello").get("maxWireVersion", 0))
        except PyMongoError:
            return 0

    def _remember(self, events: RawDocuments, post_batch_token: Any) -> None:
        token = (
            post_batch_token
            if post_batch_token is not None
            else (events[len(events) - 1]["_id"] if len(events) else self._cached_token)
        )
        self._cached_token = token
        if len(events):
            self._returned_any = True

    def _get_more(self) -> CursorReply:
        reply = self._command(
            {
                "getMore": Int64(self.cursor_id),
                "collection": self._namespace_coll,
                "batchSize": self.batch_size,
                "maxTimeMS": (
                    min(self.max_await_time_ms, CONFIRM_AWAIT_MS)
                    if self._at_end
                    else self.max_await_time_ms
                ),
            }
        )
        cursor = read_cursor(reply.raw)
        self.cursor_id = cursor.id
        return cursor

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fetch_loop(self, first: CursorReply) -> None:
        try:
            if not self._deliver(first, waited=False):
                return
            while not self._stop.is_set():
                if self.cursor_id == 0:
                    self._put(_End)
                    return
                try:
                    cursor = self._get_more()
                except PyMongoError as error:
                    if not is_resumable(error, self._wire_version):
                        raise
                    if not self._resume():
                        return
                    continue
                self._remember(cursor.events, cursor.post_batch_token)
                if not self._deliver(cursor, waited=True):
                    return
        except BaseException as error:  # handed to the caller, raised from batches()
            self._put(error)

    def _deliver(self, cursor: CursorReply, waited: bool) -> bool:
        """Hand a batch over (False once closed). After a caught-up batch, wait until the
        caller asks for more: most stop there, and a getMore already sent would wait
        maxAwaitTimeMS for nothing before close() could finish."""
        token = cursor.post_batch_token
        until = covered_until(token) if token is not None else None
        at = token_cluster_time(token) if token is not None else None
        past_end = until is not None and self.is_past_end is not None and self.is_past_end(until)
        # An event's token at the end's very time: other events at that time (a
        # transaction's) may follow, so one more getMore is due, but it need not wait
        # maxAwaitTimeMS for events after the end.
        self._at_end = (
            not past_end
            and at is not None
            and self.is_past_end is not None
            and self.is_past_end(next_tick(at))
        )
        caught_up = past_end or (waited and not len(cursor.events) and not self.until_end)
        closed = cursor.id == 0
        # An aggregate's empty first batch says nothing; an empty getMore of a reader waiting
        # for its end goes to the caller, who renews its lease and bounds the wait.
        heartbeat = waited and self.until_end
        if not len(cursor.events) and not caught_up and not closed and not heartbeat:
            return True
        if not self._put(Batch(cursor.events, self._cached_token, caught_up, closed)):
            return False
        if caught_up:
            while not self._more.wait(0.05):
                if self._stop.is_set():
                    return False
            self._more.clear()
        return True

    def _resume(self) -> bool:
        """One attempt: kill the old cursor quietly, aggregate from the resume point."""
        self.resumes += 1
        self._kill_cursor()
        return self._deliver(self._aggregate(), waited=False)

    def _kill_cursor(self) -> None:
        if not self.cursor_id:
            return
        # The spec: errors while killing the old cursor are suppressed.
        with contextlib.suppress(PyMongoError):
            self._command({"killCursors": self._namespace_coll, "cursors": [Int64(self.cursor_id)]})
        self.cursor_id = 0
