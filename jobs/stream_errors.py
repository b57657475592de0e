"""Server errors of a change stream, translated into Tidemark errors that say what to do."""

from __future__ import annotations

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from resources.mongo import oplog_window
from tidemark.errors import HistoryLost, MongoConnectionError, ReplicaSetRequired, TidemarkError
from tidemark.tokens import ts_to_datetime

HISTORY_LOST = 286  # ChangeStreamHistoryLost
FATAL = 280  # ChangeStreamFatalError: the resume token is no longer found
INVALID_TOKEN = 260  # InvalidResumeToken
UNAUTHORIZED = 13
NOT_A_REPLICA_SET = (40573, 40602)  # $changeStream on a standalone


def _fmt(ts: Timestamp | None) -> str:
    moment = ts_to_datetime(ts)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "an unknown time"


def translate(
    exc: OperationFailure, stream: str, client: MongoClient, position_time: Timestamp | None
) -> TidemarkError:
    if exc.code in (HISTORY_LOST, FATAL):
        window = oplog_window(client)
        first = (
            f"the oplog's first entry is at {_fmt(window.first)}"
            if window
            else ("the oplog's first entry could not be read")
        )
        return HistoryLost(
            f"Stream {stream!r} cannot resume: its stored position ({_fmt(position_time)}) is "
            f"no longer in the oplog ({first}), so the changes in between are gone from the "
            "server. The checkpoint was left untouched.",
            f"To recover: `tidemark reset {stream} --to-now` skips the gap (the lake misses the "
            "changes made in it); a re-snapshot of the collection restores exactness; and a "
            "larger oplog (replSetResizeOplog) or more frequent runs keep it from happening again.",
        )
    if exc.code == INVALID_TOKEN:
        return TidemarkError(
            f"The server rejected the resume token stored for stream {stream!r} as invalid "
            f"({exc.details.get('errmsg') if exc.details else exc}).",
            f"The state store's checkpoint looks damaged: run `tidemark reset {stream} "
            "--to-time T` with the time to restart from.",
        )
    if exc.code in NOT_A_REPLICA_SET:
        return ReplicaSetRequired(
            "The server refused to open a change stream: change streams need a replica set "
            "or a sharded cluster.",
            "Point MONGODB_URI at a replica set (a one-node replica set is fine).",
        )
    if exc.code == UNAUTHORIZED:
        return MongoConnectionError(
            f"The MongoDB user may not open the change stream of stream {stream!r}: {exc}.",
            "Grant it the `find` and `changeStream` actions on the watched namespaces "
            "(see README, 'Least privilege').",
        )
    return TidemarkError(
        f"The change stream of stream {stream!r} failed on the server: {exc}.",
        "Nothing was committed; the next run starts again from the last checkpoint.",
    )
