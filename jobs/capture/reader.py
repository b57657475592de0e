"""A change-stream cursor below `watch()`: aggregate and getMore, one getMore ahead.

pymongo's ChangeStream sends the next getMore only once the current reply is used up, so the
server and the client take turns. This reader runs the cursor in a background thread that
fetches the next reply while the caller converts the current one, and hands out whole replies
(no per-event driver work). A reply is what one aggregate or getMore returns (the spec's
"batch"; in Tidemark a batch is a committed manifest entry).

Where it replaces the driver it follows the drivers' change-streams specification. The state a
stream resumes from, and every rule that changes it, is `jobs.capture.resume.ResumeState`; the
resume process that uses it is here (`_fetch_loop`, `_resume`): only errors of getMore are
resumable, never those of the aggregate itself; one resume attempt per error, in the same
session, killing the old cursor quietly.

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
from pymongo.errors import PyMongoError

from jobs.bson_buffer import INT32, RawDocuments, array_documents, elements, int32_at, int64_at
from jobs.capture.resume import ResumeState
from resources.mongo import RAW_CODEC
from tidemark.tokens import covered_until, next_tick, token_cluster_time

# Splits events over 16 MB into fragments (MongoDB 6.0.9+, 7.0+); it must come last.
SPLIT_STAGE = {"$changeStreamSplitLargeEvent": {}}
# How long a getMore waits when all it can still find is events at the end's very time.
CONFIRM_AWAIT_MS = 50


@dataclass
class Reply:
    """The events of one server reply and the token to resume after all of them."""

    events: RawDocuments  # the reply's buffer: events are decoded only where looked at
    token_after: Any  # postBatchResumeToken if sent, else the last event's _id
    # Nothing more to read for this caller: the server waited maxAwaitTimeMS and found
    # nothing (unless the reader waits for its end only), or every event up to the caller's
    # end has been returned (the postBatchResumeToken covers it: `covered_until`).
    caught_up: bool = False
    # The server closed the cursor with this reply: the stream was invalidated, and
    # `token_after` is the invalidate's token even if the pipeline filtered the event out.
    closed: bool = False


@dataclass
class ReplyCursor:
    """The `cursor` document of one aggregate or getMore reply."""

    id: int
    ns: str
    events: RawDocuments
    post_batch_token: RawBSONDocument | None


def read_cursor(reply: bytes) -> ReplyCursor:
    """The `cursor` of an aggregate or getMore reply, read from its bytes: the reply's events
    are located, not decoded (pymongo would build an object per event here)."""
    cursor = next(value for key, _, value, _ in elements(reply) if key == "cursor")
    found = ReplyCursor(0, "", RawDocuments.of([]), None)
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


@dataclass(frozen=True)
class WatchSpec:
    """What a reader watches and how it asks the server: the namespace (`database` None: the
    cluster; `collection` None: the whole database), the change stream's options (where it
    starts, which documents it asks for), the pipeline, and each reply's size and wait."""

    database: str | None
    collection: str | None
    options: dict[str, Any]
    pipeline: list[dict[str, Any]]
    batch_size: int  # the server's batchSize: events per reply at most
    max_await_time_ms: int
    # Events over 16 MB come as fragments ($changeStreamSplitLargeEvent, the pipeline's last).
    split_large_events: bool = False


class ChangeStreamReader:
    """Open with `with`; iterate `replies()`; every reply's events in server order.

    Two threads: the caller's opens the stream (the initial aggregate, in `__enter__`), takes
    replies and closes; the getMore thread does everything in between. They share only the
    queue of replies, the two events (`_stop`, `_more`) and `initial_token`, final before the
    thread starts: the cursor, the resume state and `_at_end` are the getMore thread's once it
    has started, and `close()` touches the cursor again only after joining it.
    """

    def __init__(
        self,
        client: MongoClient,
        spec: WatchSpec,
        *,
        prefetch: int = 2,
        is_past_end: Callable[[Timestamp], bool] | None = None,
        until_end: bool = False,
    ) -> None:
        self.client = client
        self.database = spec.database or "admin"
        self.collection = spec.collection
        self.options = dict(spec.options)
        if spec.database is None:
            self.options["allChangesForCluster"] = True
        # Events over 16 MB come as fragments (`jobs.capture._fragments` joins them): the
        # stage must be the pipeline's last.
        split = spec.split_large_events
        self.pipeline = [*spec.pipeline, SPLIT_STAGE] if split else spec.pipeline
        self.batch_size = spec.batch_size
        self.max_await_time_ms = spec.max_await_time_ms
        self.is_past_end = is_past_end
        # A replay reads until the stream's tokens pass its end: an empty getMore only says
        # that nothing was majority-committed yet, not that the window is complete.
        self.until_end = until_end
        self.cursor_id = 0
        self.resumes = 0
        self._namespace_coll = spec.collection or "$cmd.aggregate"
        self._resume_state = ResumeState.opened(self.options)
        self._at_end = False  # the last token reached the caller's end, but not past it
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._more = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._db = client.get_database(self.database, codec_options=RAW_CODEC)

    # -- the caller's side ---------------------------------------------------------------

    @property
    def initial_token(self) -> Any:
        """Where the stream stands before its first event (final once the stream is open)."""
        return self._resume_state.initial_token

    def __enter__(self) -> ChangeStreamReader:
        self._session = self.client.start_session(causal_consistency=False)
        # The aggregate runs here, so its errors (history lost, bad token) surface at once.
        first = self._aggregate()
        self._thread = threading.Thread(
            target=self._fetch_loop, args=(first,), name="tidemark-getmore", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replies(self) -> Iterator[Reply]:
        """Replies as the server sends them; after a caught-up one (see `Reply`; only those
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

    def _aggregate(self) -> ReplyCursor:
        stage = {"$changeStream": self._resume_state.stage_options(self.options)}
        command = {
            "aggregate": self.collection if self.collection else 1,
            "pipeline": [stage, *self.pipeline],
            "cursor": {"batchSize": self.batch_size},
        }
        reply = self._command(command)
        wire_version = self._max_wire_version()
        cursor = read_cursor(reply.raw)
        self.cursor_id = cursor.id
        self._namespace_coll = cursor.ns.split(".", 1)[1]
        self._resume_state.aggregate_replied(
            cursor.events, cursor.post_batch_token, reply.get("operationTime"), wire_version
        )
        return cursor

    def _max_wire_version(self) -> int:
        try:
            return int(self.client.admin.command("hello").get("maxWireVersion", 0))
        except PyMongoError:
            return 0

    def _get_more(self) -> ReplyCursor:
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

    def _fetch_loop(self, first: ReplyCursor) -> None:
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
                    # The spec's ChangeStream: "A change stream MUST attempt to resume a
                    # single time if it encounters any resumable error per Resumable Error. A
                    # change stream MUST NOT attempt to resume on any other type of error."
                    if not self._resume_state.is_resumable(error):
                        raise
                    if not self._resume():
                        return
                    continue
                self._resume_state.replied(cursor.events, cursor.post_batch_token)
                if not self._deliver(cursor, waited=True):
                    return
        except BaseException as error:  # handed to the caller, raised from replies()
            self._put(error)

    def _deliver(self, cursor: ReplyCursor, waited: bool) -> bool:
        """Hand a reply over (False once closed). After a caught-up reply, wait until the
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
        # An aggregate's empty first reply says nothing; an empty getMore of a reader waiting
        # for its end goes to the caller, who renews its lease and bounds the wait.
        heartbeat = waited and self.until_end
        if not len(cursor.events) and not caught_up and not closed and not heartbeat:
            return True
        reply = Reply(cursor.events, self._resume_state.token, caught_up, closed)
        if not self._put(reply):
            return False
        if caught_up:
            while not self._more.wait(0.05):
                if self._stop.is_set():
                    return False
            self._more.clear()
        return True

    def _resume(self) -> bool:
        """One attempt: kill the old cursor quietly, aggregate from the resume point. An
        error of that aggregate is raised: the spec's "An error on an aggregate command is
        not a resumable error"."""
        self.resumes += 1
        self._kill_cursor()
        # Resume Process: "If the server supports sessions, the resume attempt MUST use the
        # same session as the previous attempt's command." (`_command` always does.)
        return self._deliver(self._aggregate(), waited=False)

    def _kill_cursor(self) -> None:
        if not self.cursor_id:
            return
        # Resume Process: "Any exceptions or errors that occur during the process of killing
        # the cursor should be suppressed".
        with contextlib.suppress(PyMongoError):
            self._command({"killCursors": self._namespace_coll, "cursors": [Int64(self.cursor_id)]})
        self.cursor_id = 0
