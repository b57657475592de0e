"""Server errors of a change stream, translated into Tidemark errors that say what to do."""

from __future__ import annotations

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from jobs.capture._fragments import server_splits
from resources.mongo import oplog_window
from tidemark.errors import (
    ChangeStreamFailed,
    EventTooLarge,
    HistoryLost,
    MongoConnectionError,
    ReplicaSetRequired,
    ResumedFromInvalidate,
    ResumeTokenRejected,
    SplitStageRequired,
    TidemarkError,
)
from tidemark.tokens import moment_text

HISTORY_LOST = 286  # ChangeStreamHistoryLost
FATAL = 280  # ChangeStreamFatalError: the resume token is no longer found
INVALID_TOKEN = 260  # InvalidResumeToken
UNAUTHORIZED = 13
TOO_LARGE = (10334, 17419, 16493)  # BSONObjectTooLarge and kin: an event over 16 MB
NOT_A_REPLICA_SET = (40573, 40602)  # $changeStream on a standalone


def server_message(exc: OperationFailure) -> str:
    """The server's own words (errmsg and code name), without pymongo's dump of the reply."""
    details = exc.details or {}
    message = details.get("errmsg") or str(exc).split(", full error:")[0]
    name = details.get("codeName")
    return f"{message} ({name}, code {exc.code})" if name else f"{message} (code {exc.code})"


def _splits(client: MongoClient) -> bool:
    try:
        return server_splits(client)
    except PyMongoError:
        return False


def _server_version(client: MongoClient) -> str:
    try:
        return str(client.server_info()["version"])
    except PyMongoError:
        return "unknown version"


def translate(
    exc: OperationFailure, stream: str, client: MongoClient, position_time: Timestamp | None
) -> TidemarkError:
    if exc.code == FATAL and "split event" in server_message(exc):
        return SplitStageRequired(
            f"Stream {stream!r} stands after an event the server split (over 16 MB), and "
            f"resuming there needs $changeStreamSplitLargeEvent, which this run did not send "
            f"({server_message(exc)}). Nothing was committed.",
            "Set split_large_events: true for the stream again (and keep a server of 6.0.9 / "
            f"7.0 or later), or `tidemark reset {stream} --to-time T`.",
        )
    if exc.code in (HISTORY_LOST, FATAL):
        window = oplog_window(client)
        first = (
            f"the oplog's first entry is at {moment_text(window.first)}"
            if window
            else ("the oplog's first entry could not be read")
        )
        return HistoryLost(
            f"Stream {stream!r} cannot resume: its stored position "
            f"({moment_text(position_time)}) is no longer in the oplog ({first}), so the "
            "changes in between are gone from the server. The checkpoint was left untouched.",
            f"To recover: `tidemark reset {stream} --to-now` skips the gap (the lake misses the "
            "changes made in it); a re-snapshot of the collection restores exactness; and a "
            "larger oplog (replSetResizeOplog) or more frequent runs keep it from happening again.",
        )
    if exc.code == INVALID_TOKEN and "invalidate" in server_message(exc):
        return ResumedFromInvalidate(
            f"Stream {stream!r} was asked to resume after an invalidate's token "
            f"({server_message(exc)}).",
            "Only startAfter may open a stream past an invalidate.",
        )
    if exc.code == INVALID_TOKEN:
        return ResumeTokenRejected(
            f"The server rejected the resume token stored for stream {stream!r} as invalid "
            f"({server_message(exc)}).",
            f"The state store's checkpoint looks damaged: run `tidemark reset {stream} "
            "--to-time T` with the time to restart from.",
        )
    if exc.code in TOO_LARGE or "BSONObjectTooLarge" in str(exc):
        version = _server_version(client)
        splits = (
            "could split it, but the stream's split_large_events is false"
            if _splits(client)
            else "cannot split such events"
        )
        return EventTooLarge(
            f"A change event of stream {stream!r} is larger than MongoDB's 16 MB limit (a large "
            "document with its post-image and pre-image together), so the server cannot deliver "
            "it; the stream stops before it and nothing was committed.",
            f"This server (MongoDB {version}) {splits}: MongoDB 6.0.9 / 7.0 and later have "
            "$changeStreamSplitLargeEvent, and Tidemark splits and rejoins events there "
            "(split_large_events, on by default). Otherwise: drop "
            "full_document_before_change (or full_document) for this stream, or leave the large "
            "fields out with a $project stage (both change the definition: "
            f"`tidemark reset {stream} --to-time T` afterwards).",
        )
    if exc.code in NOT_A_REPLICA_SET:
        return ReplicaSetRequired(
            "The server refused to open a change stream: change streams need a replica set "
            "or a sharded cluster.",
            "Point MONGODB_URI at a replica set (a one-node replica set is fine).",
        )
    if exc.code == UNAUTHORIZED:
        return MongoConnectionError(
            f"The MongoDB user may not open the change stream of stream {stream!r}: "
            f"{server_message(exc)}.",
            "Grant it the `find` and `changeStream` actions on the watched namespaces "
            "(see README, 'Least privilege').",
        )
    return ChangeStreamFailed(
        f"The change stream of stream {stream!r} failed on the server: {server_message(exc)}.",
        "Nothing was committed; the next run starts again from the last checkpoint.",
    )
